"""Terminal rendering of expert placement: per node blocks, experts per block, load share."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from stowplan.plan import Plan
from stowplan.planner.experts import ExpertSummary

__all__ = ["compress_indices", "render_experts"]

_SHOWN_BLOCKS = 2


def compress_indices(values: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` → ``"0-2,5,7-8"``."""
    out: list[str] = []
    items = sorted(values)
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(out)


def _experts_cell(per_block: Sequence[tuple[int, tuple[int, ...]]]) -> str:
    if not per_block:
        return "-"
    counts = [len(es) for _, es in per_block]
    lo, hi = min(counts), max(counts)
    per = f"{lo}" if lo == hi else f"{lo}–{hi}"
    head = f"{len(per_block)} blocks × {per}: "
    shown = " ".join(f"b{b}[{compress_indices(es)}]" for b, es in per_block[:_SHOWN_BLOCKS])
    more = len(per_block) - _SHOWN_BLOCKS
    return head + shown + (f" … +{more} blocks" if more > 0 else "")


def render_experts(plan: Plan, summary: ExpertSummary, console: Console) -> None:
    """Print one row per stage node: blocks, experts owned per block, load vs speed share."""
    table = Table(title="experts", title_justify="left")
    for col in ("stage", "node", "blocks", "experts owned (per block)", "load", "speed"):
        table.add_column(col, justify="right" if col in {"stage", "load", "speed"} else "left")
    for a, row in zip(plan.assignments, summary.nodes, strict=True):
        table.add_row(
            str(a.stage),
            Text(a.node_id),
            Text(f"[{a.block_range[0]}, {a.block_range[1]})"),
            Text(_experts_cell(row.per_block)),
            f"{row.load_share:.1%}",
            f"{row.speed_share:.1%}",
        )
    console.print(table)
    if summary.block_local:
        console.print(
            "  block-local: every MoE block's experts run on its own stage's node "
            "(no expert traffic); the stage split balances the work",
            highlight=False,
        )
        return
    console.print(
        f"  imbalance (max/mean load relative to speed): mean {summary.imbalance_mean:.3f}, "
        f"worst block {summary.imbalance_max:.3f}; {summary.num_placed} expert copies "
        f"({summary.num_replicas} replicas); speed = {summary.speed_source}",
        highlight=False,
    )
    console.print(
        f"  cross-node expert transfers per token: {summary.transfers_per_token:.2f}",
        highlight=False,
    )
