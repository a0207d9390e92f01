"""Terminal rendering of plans with rich."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from stowplan.model import NodeDescriptor
from stowplan.plan import Plan
from stowplan.units import format_bytes

__all__ = ["render_plan"]


def render_plan(plan: Plan, nodes: Sequence[NodeDescriptor], console: Console) -> None:
    """Print the plan: one row per stage, then the rationale notes."""
    by_id = {n.id: n for n in nodes}
    title = f"{plan.model_name or 'model'}: {plan.num_stages} stage(s), {plan.rationale.strategy}"
    table = Table(title=title, title_justify="left")
    for col in ("stage", "node", "gpu", "blocks", "anchors", "vram used", "usable", "util"):
        table.add_column(col, justify="right" if col in {"stage", "util"} else "left")
    for a in plan.assignments:
        node = by_id.get(a.node_id)
        usable = a.usable_vram_bytes
        util = f"{a.estimated_vram_bytes / usable:.1%}" if usable else "-"
        anchors = ",".join(x for x, o in (("embed", a.owns_embed), ("head", a.owns_head)) if o)
        table.add_row(
            str(a.stage),
            a.node_id,
            node.gpu_name if node else "?",
            f"[{a.block_range[0]}, {a.block_range[1]}) ×{a.num_blocks}",
            anchors or "-",
            format_bytes(a.estimated_vram_bytes),
            format_bytes(usable) if usable is not None else "-",
            util,
        )
    console.print(table)
    for note in plan.rationale.notes:
        console.print(f"  • {note}", highlight=False)
