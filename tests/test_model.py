"""Construction-time validation of the input types: the exact messages users see."""

from __future__ import annotations

import math

import pytest

from stowplan import Constraints, InputError, ModelLayout, NodeDescriptor, plan

MODEL = {
    "name": "m",
    "num_blocks": 4,
    "hidden_dim": 64,
    "bytes_per_activation_elem": 2,
    "block_params_bytes": 100,
    "head_params_bytes": 10,
    "embed_params_bytes": 10,
}
NODE = {
    "id": "a",
    "gpu_name": "RTX 4090",
    "vram_bytes": 1000,
    "flops_estimate": 1.0,
    "link_mbps": 1.0,
}


@pytest.mark.parametrize(
    ("kind", "changes", "message"),
    [
        ("model", {"num_blocks": 0}, "num_blocks=0: must be an integer >= 1"),
        ("model", {"block_params_bytes": -1}, "block_params_bytes=-1: must be an integer >= 0"),
        (
            "model",
            {"head_params_bytes": math.nan},
            "head_params_bytes=nan: must be an integer >= 0",
        ),
        ("model", {"name": ""}, "name='': must be a non-empty string"),
        (
            "model",
            {"block_bytes": (1, 2)},
            "block_bytes='<2 values>': must have num_blocks=4 values",
        ),
        (
            "model",
            {"block_bytes": (100, 100, 100, 120)},
            "block_params_bytes=100: must be the average of block_bytes (105)",
        ),
        ("node", {"vram_bytes": -5}, "a.vram_bytes=-5: must be an integer >= 0"),
        (
            "node",
            {"flops_estimate": math.nan},
            "a.flops_estimate=nan: must be a finite number >= 0",
        ),
        ("node", {"link_mbps": -1.0}, "a.link_mbps=-1.0: must be a finite number >= 0"),
        ("node", {"id": ""}, "id='': must be a non-empty string"),
        (
            "node",
            {"mem_bandwidth_gbps": 0.0},
            "a.mem_bandwidth_gbps=0.0: must be a finite number > 0",
        ),
        ("constraints", {"min_stages": 0}, "min_stages=0: must be an integer >= 1"),
        (
            "constraints",
            {"min_stages": 3, "max_stages": 2},
            "min_stages=3: must be <= max_stages (2)",
        ),
        (
            "constraints",
            {"vram_headroom_frac": 1.0},
            "vram_headroom_frac=1.0: must be a number in [0, 1)",
        ),
        (
            "constraints",
            {"vram_headroom_frac": -0.1},
            "vram_headroom_frac=-0.1: must be a number in [0, 1)",
        ),
        (
            "constraints",
            {"strategy": "fastest"},
            "strategy='fastest': must be one of balance-by-vram, latency, throughput, exact",
        ),
        ("constraints", {"batch": 0}, "batch=0: must be an integer >= 1"),
        (
            "constraints",
            {"objective": "cost"},
            "target_tokens_per_s=None: is required with objective='cost' (e.g. 20)",
        ),
    ],
)
def test_bad_inputs_name_field_value_and_rule(kind: str, changes: dict, message: str) -> None:
    factory = {
        "model": (ModelLayout, MODEL),
        "node": (NodeDescriptor, NODE),
        "constraints": (Constraints, {}),
    }
    cls, base = factory[kind]
    with pytest.raises(InputError) as info:
        cls(**{**base, **changes})
    assert str(info.value) == message


def test_duplicate_node_ids_are_rejected_by_plan() -> None:
    nodes = [NodeDescriptor(**NODE), NodeDescriptor(**NODE)]
    with pytest.raises(InputError, match=r"^nodes\[\]\.id='a': node ids must be unique$"):
        plan(ModelLayout(**MODEL), nodes, Constraints())


def test_input_error_is_a_value_error_with_its_parts() -> None:
    with pytest.raises(ValueError) as info:
        Constraints(batch=-2)
    err = info.value
    assert isinstance(err, InputError)
    assert (err.field, err.value, err.rule) == ("batch", -2, "must be an integer >= 1")


def test_default_strategy_follows_the_workload() -> None:
    assert Constraints().resolved_strategy() == "latency"
    assert Constraints(batch=8).resolved_strategy() == "throughput"
    assert Constraints(batch=8, strategy="balance-by-vram").resolved_strategy() == "balance-by-vram"


def test_kv_bytes_respect_sliding_windows() -> None:
    m = ModelLayout(
        **{**MODEL, "kv_bytes_per_token": (10,) * 4, "kv_window_tokens": (128, None, 128, None)}
    )
    assert [m.kv_bytes(b, 1000, batch=2) for b in range(4)] == [2560, 20000, 2560, 20000]


def test_block_average_is_checked_in_integers_for_huge_blocks() -> None:
    # 2**62 + 3 is not a float: a float average would be 2**62, 3 bytes off.
    big = 2**62 + 3
    layout = ModelLayout(**{**MODEL, "block_params_bytes": big, "block_bytes": (big,) * 4})
    assert layout.block_sizes() == (big,) * 4
    with pytest.raises(InputError) as info:
        ModelLayout(**{**MODEL, "block_params_bytes": big - 2, "block_bytes": (big,) * 4})
    assert str(info.value) == (
        f"block_params_bytes={big - 2}: must be the average of block_bytes ({big})"
    )


def test_block_average_rounds_half_to_even() -> None:
    # mean 100.5 rounds to 100: 99 is within one byte, 102 is not.
    blocks = (100, 101, 100, 101)
    assert ModelLayout(**{**MODEL, "block_params_bytes": 99, "block_bytes": blocks})
    with pytest.raises(InputError):
        ModelLayout(**{**MODEL, "block_params_bytes": 102, "block_bytes": blocks})
