"""The terminal view draws one memory bar per node, to one scale."""

from __future__ import annotations

from rich.console import Console

from stowplan.report.segments import MemoryPart, node_memory
from stowplan.report.terminal import render_plan
from tests.common.report_sample import sample_plan


def test_segments_add_up_to_each_stages_estimate():
    plan, fleet = sample_plan()
    for row, a in zip(node_memory(plan, fleet), plan.assignments, strict=True):
        used = sum(
            s.bytes for s in row.segments if s.part not in (MemoryPart.FREE, MemoryPart.HEADROOM)
        )
        assert used == a.estimated_vram_bytes
        assert sum(s.bytes for s in row.segments) == row.capacity_bytes
    parts = {s.part for s in node_memory(plan, fleet)[0].segments}
    assert MemoryPart.EMBED in parts and MemoryPart.HEAD not in parts


def test_render_plan_prints_a_bar_per_node_and_the_legend():
    plan, fleet = sample_plan()
    console = Console(width=100, record=True, color_system=None)
    render_plan(plan, fleet, console)
    text = console.export_text()
    bars = [ln for ln in text.splitlines() if "█" in ln and "[" in ln and "GiB/" in ln]
    assert [ln.split()[0] for ln in bars] == [a.node_id for a in plan.assignments]
    # One scale: the 48 GiB A6000's bar is twice as long as a 24 GiB card's.
    lengths = {ln.split()[0]: len(ln.split()[1]) for ln in bars}
    assert lengths["us-a6000"] == 2 * lengths["eu-4090"]
    assert "kv reserve" in text and "headroom" in text
