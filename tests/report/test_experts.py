"""The expert table: compressed expert lists, load and speed shares."""

from __future__ import annotations

from rich.console import Console

from stowplan import Constraints, ExpertInputs, plan
from stowplan.moe.stats import zipf_load
from stowplan.planner.experts import expert_summary
from stowplan.report.experts import compress_indices, render_experts
from tests.common.moe import HETERO, toy_moe


def test_indices_compress_to_ranges() -> None:
    assert compress_indices([7, 0, 1, 2, 5, 8]) == "0-2,5,7-8"
    assert compress_indices([]) == ""


def test_expert_table_shows_every_stage_with_its_share() -> None:
    model = toy_moe()
    load = zipf_load(5, 16, seed=2)
    p = plan(
        model,
        HETERO,
        Constraints(strategy="balance-by-vram"),
        experts=ExpertInputs(load=load, placement="expert-parallel"),
    )
    summary = expert_summary(p, model, HETERO, load)
    console = Console(record=True, width=200)
    render_experts(p, summary, console)
    text = console.export_text()
    for a, row in zip(p.assignments, summary.nodes, strict=True):
        assert a.node_id in text
        assert f"{row.load_share:.1%}" in text
    assert "5 blocks × " in text
    assert f"mean {summary.imbalance_mean:.3f}" in text
