"""Terminal rendering of plans with rich.

Strings that come from the user (node ids, GPU and model names, notes) are
printed as :class:`~rich.text.Text` or with ``markup=False``, so a ``[`` in
them is shown, not read as markup, whatever console is passed in.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from stowplan.baselines import BaselineResult
from stowplan.model import NodeDescriptor
from stowplan.plan import Plan
from stowplan.report.segments import MemoryPart, node_memory
from stowplan.units import format_bytes

__all__ = ["render_comparison", "render_node_bars", "render_plan"]


def render_plan(plan: Plan, nodes: Sequence[NodeDescriptor], console: Console) -> None:
    """Print the plan: one row per stage, then the rationale notes."""
    by_id = {n.id: n for n in nodes}
    title = f"{plan.model_name or 'model'}: {plan.num_stages} stage(s), {plan.rationale.strategy}"
    table = Table(title=Text(title), title_justify="left")
    for col in ("stage", "node", "gpu", "blocks", "anchors", "vram used", "usable", "util"):
        # Node ids (an offer's id) fold rather than lose characters in a narrow terminal.
        table.add_column(
            col,
            justify="right" if col in {"stage", "util"} else "left",
            overflow="fold" if col == "node" else "ellipsis",
        )
    for a in plan.assignments:
        node = by_id.get(a.node_id)
        usable = a.usable_vram_bytes
        util = f"{a.estimated_vram_bytes / usable:.1%}" if usable else "-"
        anchors = ",".join(x for x, o in (("embed", a.owns_embed), ("head", a.owns_head)) if o)
        table.add_row(
            str(a.stage),
            Text(a.node_id),
            Text(_gpus(node)),
            Text(f"[{a.block_range[0]}, {a.block_range[1]}) ×{a.num_blocks}"),
            anchors or "-",
            format_bytes(a.estimated_vram_bytes),
            format_bytes(usable) if usable is not None else "-",
            util,
        )
    console.print(table)
    render_node_bars(plan, nodes, console)
    for note in plan.rationale.notes:
        console.print(f"  • {note}", highlight=False, markup=False)


def _gpus(node: NodeDescriptor | None) -> str:
    """The node's GPU, with their count when it has several (``4× RTX 4090``)."""
    if node is None:
        return "?"
    return f"{node.num_gpus}× {node.gpu_name}" if node.num_gpus > 1 else node.gpu_name


def render_comparison(plan: Plan, baselines: Sequence[BaselineResult], console: Console) -> None:
    """Print stowplan's plan and each peer rule's, as the same cost model predicts them."""
    pred = plan.rationale.prediction
    table = Table(title="compared with peer rules (same cost model)", title_justify="left")
    for col in ("rule", "stages", "tokens/s (pipelined)", "ms/token (single)"):
        table.add_column(col, justify="left" if col == "rule" else "right")
    if pred is not None:
        table.add_row(
            f"stowplan {plan.rationale.strategy}",
            str(plan.num_stages),
            f"{pred.tokens_per_s:.2f}",
            f"{pred.time_per_token_s * 1e3:.2f}",
        )
    for b in baselines:
        if b.tokens_per_s is None or b.time_per_token_s is None:
            table.add_row(b.name, "-", "does not fit", "does not fit")
        else:
            table.add_row(
                b.name,
                str(b.num_stages),
                f"{b.tokens_per_s:.2f}",
                f"{b.time_per_token_s * 1e3:.2f}",
            )
    console.print(table)


BAR_WIDTH = 48
"""Characters of the widest node's bar; other bars are drawn to the same scale."""

_STYLE = {
    MemoryPart.EMBED: ("█", "magenta"),
    MemoryPart.BLOCKS: ("█", "blue"),
    MemoryPart.EXPERTS: ("█", "green"),
    MemoryPart.HEAD: ("█", "yellow"),
    MemoryPart.KV: ("█", "cyan"),
    MemoryPart.FREE: ("░", "bright_black"),
    MemoryPart.HEADROOM: ("·", "bright_black"),
}


def _bar(segments: Sequence[tuple[MemoryPart, int]], scale: float) -> Text:
    """Segments as coloured characters; every non-empty used part gets at least one."""
    text = Text()
    carried = 0.0
    for part, n_bytes in segments:
        exact = n_bytes / scale + carried
        width = round(exact)
        if width == 0 and part not in (MemoryPart.FREE, MemoryPart.HEADROOM):
            width = 1
        carried = exact - width
        char, style = _STYLE[part]
        text.append(char * width, style=style)
    return text


def render_node_bars(plan: Plan, nodes: Sequence[NodeDescriptor], console: Console) -> None:
    """One bar per node: what its memory holds, drawn to one scale, with a legend."""
    rows = node_memory(plan, nodes)
    width = max(len(r.node_id) for r in rows)
    bar_width = max(12, min(BAR_WIDTH, console.width - width - 34))
    scale = max(r.capacity_bytes for r in rows) / bar_width
    console.print()
    for r in rows:
        line = Text(f"  {r.node_id:<{width}} ")
        bar = _bar([(s.part, s.bytes) for s in r.segments], scale)
        bar.pad_right(bar_width - len(bar))
        line.append_text(bar)
        lo, hi = r.block_range
        experts = f" +{r.num_experts}e" if r.num_experts else ""
        line.append(
            f" {format_bytes(r.used_bytes)}/{format_bytes(r.capacity_bytes)} [{lo},{hi}){experts}"
        )
        console.print(line)
    legend = Text("  ")
    for part in MemoryPart:
        char, style = _STYLE[part]
        legend.append(char, style=style)
        legend.append(f" {part.value}  ")
    console.print(legend)
