"""Reading expert load and co-activation statistics from JSON and .npy files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from stowplan import ExpertLayout, InputError
from stowplan.moe.stats import (
    CoActivation,
    ExpertLoad,
    load_coactivation,
    load_expert_load,
    zipf_load,
)

LAYOUT = ExpertLayout(
    num_experts=4, experts_per_token=2, expert_params_bytes=10, moe_blocks=(1, 2, 3)
)


def write(tmp_path: Path, name: str, data: object) -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


def test_load_rows_in_moe_block_order(tmp_path: Path) -> None:
    rows = [[1, 2, 3, 4], [4, 3, 2, 1], [0, 0, 0, 0]]
    for data in (rows, {"layers": rows}):
        load = load_expert_load(write(tmp_path, "load.json", data))
        assert load.per_block(LAYOUT) == ((1, 2, 3, 4), (4, 3, 2, 1), (1, 1, 1, 1))


def test_load_keyed_by_block_index(tmp_path: Path) -> None:
    data = {"blocks": {"3": [0, 0, 0, 9], "1": [9, 0, 0, 0], "2": [0, 9, 0, 0]}}
    load = load_expert_load(write(tmp_path, "load.json", data))
    assert load.per_block(LAYOUT)[0] == (9, 0, 0, 0)
    assert load.per_block(LAYOUT)[2] == (0, 0, 0, 9)


def test_load_from_eplb_npy(tmp_path: Path) -> None:
    p = tmp_path / "load.npy"
    np.save(p, np.arange(12, dtype=np.int64).reshape(3, 4))
    assert load_expert_load(p).per_block(LAYOUT)[1] == (4.0, 5.0, 6.0, 7.0)


def test_coactivation_pairs_are_merged_and_ordered(tmp_path: Path) -> None:
    data = {"layers": [[[1, 0, 5], [0, 1, 2], [2, 3, 1]], [], [[3, 3, 7]]]}
    co = load_coactivation(write(tmp_path, "co.json", data))
    assert co.per_block(LAYOUT) == (((0, 1, 7.0), (2, 3, 1.0)), (), ())


def test_coactivation_from_npy_adds_both_triangles(tmp_path: Path) -> None:
    m = np.zeros((3, 4, 4))
    m[0, 0, 1] = 3
    m[0, 1, 0] = 2
    m[2, 3, 2] = 4
    p = tmp_path / "co.npy"
    np.save(p, m)
    assert load_coactivation(p).per_block(LAYOUT) == (((0, 1, 5.0),), (), ((2, 3, 4.0),))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            [[1, 2, 3, 4]],
            "expert_load='<1 rows>': must have one row per MoE block (3), or name the blocks",
        ),
        ([[1, 2, 3]] * 3, "expert_load[0]='<3 experts>': must have num_experts=4 values"),
        ([[1, -2, 3, 4]] * 3, "expert_load[0][]=-2: must be a finite number >= 0 (file {path})"),
        (
            {"blocks": {"1": [1] * 4, "2": [1] * 4}},
            "expert_load.blocks=3: is a MoE block with no statistics",
        ),
        (
            {"rows": []},
            'expert_load=\'dict\': must be a list of rows, {"layers": [...]} or {"blocks": {...}} '
            "(file {path})",
        ),
    ],
)
def test_bad_load_files_name_the_field(tmp_path: Path, data: object, message: str) -> None:
    path = write(tmp_path, "load.json", data)
    with pytest.raises(InputError) as info:
        load_expert_load(path).per_block(LAYOUT)
    assert str(info.value) == message.replace("{path}", str(path))


def test_a_flat_coactivation_list_names_the_file_field_and_shape(tmp_path: Path) -> None:
    path = write(tmp_path, "co.json", [[0, 1, 2, 5]])
    with pytest.raises(InputError) as info:
        load_coactivation(path)
    assert str(info.value) == (
        "coactivation[0][0]=0: must be [expert, expert, count]; expected per MoE block a list "
        f"of [expert, expert, count] triples (file {path})"
    )
    path = write(tmp_path, "co2.json", {"layers": [[[0, 1, 2, 5]]]})
    with pytest.raises(InputError) as info:
        load_coactivation(path)
    assert str(info.value).startswith("coactivation[0][0]=[0, 1, 2, 5]: must be [expert, ")


def test_a_coactivation_npy_that_is_not_square_names_the_file_and_shape(tmp_path: Path) -> None:
    path = tmp_path / "co.npy"
    np.save(path, np.ones((58, 256, 3)))
    with pytest.raises(InputError) as info:
        load_coactivation(path)
    assert str(info.value) == (
        "--coactivation='<float64 array of shape [58, 256, 3]>': must be a numeric array of "
        f"shape [layers, experts, experts] (file {path})"
    )


def test_bad_coactivation_entries_are_refused() -> None:
    with pytest.raises(InputError) as info:
        CoActivation(rows=(((0, 9, 1.0),), (), ())).per_block(LAYOUT)
    assert str(info.value) == "coactivation[0]=(0, 9): expert indices must be < num_experts=4"
    with pytest.raises(InputError) as info:
        CoActivation(rows=(((0, 1),),))
    assert str(info.value) == "coactivation[0][0]=(0, 1): must be [expert, expert, count]"


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"--expert-load='.*missing.json': cannot be read"):
        load_expert_load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(InputError, match="is not valid JSON"):
        load_expert_load(bad)
    p = tmp_path / "load.npy"
    np.save(p, np.zeros((2, 3, 4)))
    with pytest.raises(InputError) as info:
        load_expert_load(p)
    assert str(info.value) == (
        "--expert-load='<float64 array of shape [2, 3, 4]>': must be a numeric array of shape "
        f"[layers, experts] (file {p})"
    )


def test_zipf_load_is_seeded_and_skewed() -> None:
    a, b = zipf_load(2, 8, seed=1), zipf_load(2, 8, seed=1)
    assert a == b
    assert sorted(a.rows[0], reverse=True) == [1 / (r + 1) for r in range(8)]
    assert isinstance(a, ExpertLoad)
