"""Fuzz GGUF files and the engine exports: a result or a stowplan error, never anything else."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from stowplan.errors import StowplanError
from stowplan.exports import FAMILIES, Engine, export_plan
from stowplan.model import Constraints, ModelLayout, NodeDescriptor
from stowplan.planner import plan
from stowplan.quantities.limits import MAX_BLOCKS
from tests.common.fuzz import fuzz, typed
from tests.common.gguf_files import lying_gguf, write_gguf
from tests.common.strategies import constraints, models, node_lists

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")

UINT32 = st.one_of(st.integers(0, 64), st.sampled_from([0, 1, 2**31, 2**32 - 1]))
"""Metadata integers: small ones that make a layout, and the extremes."""
KEYS = ("block_count", "embedding_length", "attention.head_count", "attention.head_count_kv")


@st.composite
def gguf_files(draw: st.DrawFn) -> bytes:
    """The bytes of a small GGUF file written by the ``gguf`` package, perhaps then cut or
    overwritten in places."""
    arch = draw(st.sampled_from(["llama", "qwen2", "mystery"]))
    fields = draw(st.dictionaries(st.sampled_from([*KEYS, "expert_count"]), UINT32, max_size=5))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.gguf"
        write_gguf(path, arch, fields, draw(st.integers(0, 3)))
        blob = bytearray(path.read_bytes())
    if draw(st.booleans()):
        blob = blob[: draw(st.integers(0, len(blob)))]
    for _ in range(draw(st.integers(0, 3))):
        if blob:
            blob[draw(st.integers(0, len(blob) - 1))] = draw(st.integers(0, 255))
    return bytes(blob)


NOT_UTF8_ARCH = (
    b"GGUF\x03\x00\x00\x00"
    + (0).to_bytes(8, "little")
    + (1).to_bytes(8, "little")
    + (20).to_bytes(8, "little")
    + b"general.architecture"
    + (8).to_bytes(4, "little")
    + (5).to_bytes(8, "little")
    + b"\x80lama"
    + bytes(24)
)


@fuzz
@given(st.one_of(gguf_files(), st.binary(max_size=64)))
@example(NOT_UTF8_ARCH)  # a metadata string that is not UTF-8
def test_a_gguf_file_gives_a_bounded_report_or_a_stowplan_error(blob: bytes) -> None:
    from stowplan.models.gguf import gguf_report

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.gguf"
        path.write_bytes(blob)
        report = typed(gguf_report, path)
    if report is not None:
        assert 1 <= report.layout.num_blocks <= MAX_BLOCKS


def test_a_gguf_block_count_of_a_billion_is_refused(tmp_path: Path) -> None:
    from stowplan.models.gguf import gguf_report

    path = tmp_path / "m.gguf"
    write_gguf(path, "llama", {"block_count": 10**9, "embedding_length": 64}, 1)
    with pytest.raises(StowplanError, match="block_count"):
        gguf_report(path)


@fuzz
@given(
    models,
    node_lists(max_size=4),
    constraints,
    st.sampled_from(list(Engine)),
    st.one_of(st.none(), st.sampled_from(sorted(FAMILIES)), st.text(max_size=8)),
)
def test_every_exporter_gives_a_result_or_a_stowplan_error(
    model: ModelLayout,
    nodes: list[NodeDescriptor],
    c: Constraints,
    engine: Engine,
    family: str | None,
) -> None:
    p = typed(plan, model, nodes, c)
    if p is None:
        return
    result = typed(export_plan, p, engine, nodes=nodes, layout=model, family=family)
    if result is not None:
        assert result.engine is engine
        assert sum(result.block_counts) == sum(p.block_counts())


@pytest.mark.parametrize("lie", ["offset past EOF", "overlap", "tensor count"])
def test_a_lying_gguf_is_checked_against_its_own_length_and_counts(
    tmp_path: Path, lie: str
) -> None:
    from stowplan.models.gguf import gguf_report

    path = lying_gguf(tmp_path, lie)
    with pytest.raises(StowplanError) as info:
        gguf_report(path)
    assert str(path) in str(info.value)
    honest = tmp_path / "honest"
    honest.mkdir()
    write_gguf(honest / "m.gguf", "llama", {"block_count": 2, "embedding_length": 64}, 3)
    assert gguf_report(honest / "m.gguf").layout.num_blocks == 2
