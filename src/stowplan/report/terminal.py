"""Terminal rendering of plans with rich.

Strings that come from the user (node ids, GPU and model names, notes) are
printed as :class:`~rich.text.Text` or with ``markup=False``, so a ``[`` in
them is shown, not read as markup, whatever console is passed in.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from stowplan.model import NodeDescriptor
from stowplan.plan import Plan
from stowplan.planner.baselines import BaselineResult
from stowplan.quantities.units import format_bytes
from stowplan.report.segments import MemoryPart, node_memory
from stowplan.stages.gpu_lists import stage_place_text

__all__ = ["render_comparison", "render_node_bars", "render_plan"]


def used_of(used: int, usable: int | None) -> str:
    """``300.8/476.8 GiB`` (one unit when both share it), ``900 MiB/1.2 GiB``, or the used
    bytes alone when the budget is unknown."""
    left = format_bytes(used)
    if usable is None:
        return left
    right = format_bytes(usable)
    number, _, unit = left.partition(" ")
    if right.endswith(f" {unit}"):
        return f"{number}/{right}"
    return f"{left}/{right}"


def render_plan(
    plan: Plan,
    nodes: Sequence[NodeDescriptor],
    console: Console,
    *,
    notes: Sequence[str] | None = None,
) -> None:
    """Print the plan: one row per stage (its node, and the GPUs of the node it runs on
    when it lists them: ``n0 gpu0-3 tp4``), then the memory bars and the rationale notes
    (``notes`` instead when given: :func:`stowplan.report.calibration.annotate_notes`).

    The table stays within 80 columns for the usual node names.
    """
    by_id = {n.id: n for n in nodes}
    title = f"{plan.model_name or 'model'}: {plan.num_stages} stage(s), {plan.rationale.strategy}"
    table = Table(
        title=Text(title),
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
    for col in ("stage", "node", "gpu", "blocks", "anchors", "vram used/usable", "util"):
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
            Text(stage_place_text(a)),
            Text(node.gpu_name if node else "?"),
            Text(f"[{a.block_range[0]},{a.block_range[1]}) ×{a.num_blocks}"),
            anchors or "-",
            used_of(a.estimated_vram_bytes, usable),
            util,
        )
    console.print(table)
    render_node_bars(plan, nodes, console)
    for note in plan.rationale.notes if notes is None else notes:
        print_bullet(console, note)
    idle = idle_note(plan, nodes)
    if idle:
        print_bullet(console, idle)


def print_bullet(console: Console, text: str, width: int | None = None) -> None:
    """``  • text``, its wrapped lines indented under the text (a hanging indent), at the
    console's width or ``width``; no line carries trailing spaces."""
    room = max(20, (width or console.width) - 4)
    lines = textwrap.wrap(text, room, break_long_words=False, break_on_hyphens=False) or [""]
    for i, line in enumerate(lines):
        console.print(Text(("  • " if i == 0 else "    ") + line), soft_wrap=True)


def idle_note(plan: Plan, nodes: Sequence[NodeDescriptor]) -> str | None:
    """Which nodes (and GPUs of used nodes) the plan leaves idle, and why; None if none."""
    used: dict[str, set[int] | None] = {}
    for a in plan.assignments:
        gpus = used.setdefault(a.node_id, set())
        if gpus is not None:
            if a.gpu_indices:
                gpus.update(a.gpu_indices)
            else:
                used[a.node_id] = None  # the whole node
    parts = [n.id for n in nodes if n.id not in used]
    for n in nodes:
        gpus = used.get(n.id)
        if gpus and n.num_gpus > len(gpus):
            free = sorted(set(range(n.num_gpus)) - gpus)
            parts.append(f"{n.id} GPU{'s' if len(free) > 1 else ''} {','.join(map(str, free))}")
    if not parts:
        return None
    one = len(parts) == 1
    return (
        f"unused: {', '.join(parts)} (the plan's {plan.rationale.strategy} objective is no "
        f"better with {'it' if one else 'them'}, or {'it' if one else 'they'} cannot hold a "
        "stage)"
    )


def render_comparison(plan: Plan, baselines: Sequence[BaselineResult], console: Console) -> None:
    """Print stowplan's plan and each peer rule's, as the same cost model predicts them."""
    pred = plan.rationale.prediction
    table = Table(title="compared with peer rules (same cost model)", title_justify="left")
    for col in ("rule", "stages", "tokens/s (all sequences)", "ms/token (each)"):
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


def _bar(segments: Sequence[tuple[MemoryPart, int]], scale: float, most: int) -> Text:
    """Segments as coloured characters, at most ``most`` of them; every non-empty used
    part gets at least one (the widest segments give up the characters that costs)."""
    widths = []
    carried = 0.0
    for part, n_bytes in segments:
        exact = n_bytes / scale + carried
        width = max(0, round(exact))
        if width == 0 and n_bytes > 0 and part not in (MemoryPart.FREE, MemoryPart.HEADROOM):
            width = 1
        carried = exact - width
        widths.append(width)
    while sum(widths) > most and max(widths, default=0) > 1:
        widths[widths.index(max(widths))] -= 1
    text = Text()
    for (part, _), width in zip(segments, widths, strict=True):
        char, style = _STYLE[part]
        text.append(char * width, style=style)
    return text


def render_node_bars(plan: Plan, nodes: Sequence[NodeDescriptor], console: Console) -> None:
    """One bar per stage: what the memory of its node (or of its GPUs of the node) holds,
    drawn to one scale, with a legend."""
    rows = node_memory(plan, nodes)
    labels = [f"{r.node_id} {r.gpus}" if r.gpus else r.node_id for r in rows]
    width = max(len(label) for label in labels)
    tails = []
    for r in rows:
        lo, hi = r.block_range
        experts = f" +{r.num_experts}e" if r.num_experts else ""
        tails.append(
            f" {format_bytes(r.used_bytes)}/{format_bytes(r.capacity_bytes)} [{lo},{hi}){experts}"
        )
    # The bars shrink so that label, bar and figures fit the console's width on one line.
    room = console.width - width - 3 - max(len(t) for t in tails)
    bar_width = max(12, min(BAR_WIDTH, room))
    scale = max(r.capacity_bytes for r in rows) / bar_width
    console.print()
    for r, label, tail in zip(rows, labels, tails, strict=True):
        line = Text(f"  {label:<{width}} ")
        bar = _bar([(s.part, s.bytes) for s in r.segments], scale, bar_width)
        bar.pad_right(bar_width - len(bar))
        line.append_text(bar)
        line.append(tail)
        console.print(line)
    legend = Text("  ")
    for part in MemoryPart:
        char, style = _STYLE[part]
        legend.append(char, style=style)
        legend.append(f" {part.value}  ")
    console.print(legend)
