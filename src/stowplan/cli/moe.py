"""``stowplan plan`` for mixture-of-experts models: blocks, then experts (--expert-load)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from stowplan.cli.common import out_console
from stowplan.expert_stats import load_coactivation, load_expert_load
from stowplan.model import Constraints, ModelLayout, NodeDescriptor
from stowplan.plan import plan_to_json
from stowplan.planner.experts import expert_summary, plan_with_experts
from stowplan.report.experts import render_experts
from stowplan.report.terminal import render_plan

__all__ = ["plan_moe"]


def plan_moe(
    layout: ModelLayout,
    fleet: Sequence[NodeDescriptor],
    constraints: Constraints,
    expert_load: Path | None,
    coactivation: Path | None,
    as_json: bool,
) -> None:
    """Plan ``layout`` with its experts placed; print the plan JSON or the tables."""
    load = load_expert_load(expert_load) if expert_load is not None else None
    co = load_coactivation(coactivation) if coactivation is not None else None
    result = plan_with_experts(layout, fleet, constraints, load, co)
    if as_json:
        out_console.file.write(plan_to_json(result))
        return
    render_plan(result, fleet, out_console)
    if layout.experts is not None:
        render_experts(result, expert_summary(result, layout, fleet, load, co), out_console)
