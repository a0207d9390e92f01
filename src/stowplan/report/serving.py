"""Terminal rendering of a :class:`~stowplan.serve_plan.ServePlan`: one row per replica.

Within 80 columns: a replica's nodes fold onto further lines when they are many.
Strings from the user (node ids, notes) are printed as :class:`~rich.text.Text`.
"""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from stowplan.model import gpu_group_id
from stowplan.report.terminal import print_bullet
from stowplan.serve_plan import ReplicaPlan, ServeObjective, ServePlan

__all__ = ["render_serve_plan", "serve_summary"]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f}ms" if seconds < 1 else f"{seconds:,.2f}s"


def _price(p: float | None) -> str:
    return "-" if p is None else f"{p:.2f}"


UNUSED_SHOWN = 8
"""Unused nodes the terminal names; past that it gives their count and the first few."""


def serve_summary(sp: ServePlan) -> list[str]:
    """The lines under the table: totals, certificate, unused nodes, notes."""
    w = sp.workload
    per_user = 1 / w.tpot_s
    lines = [
        f"total: {sp.users:,} users, {sp.rate_per_s:.3g} requests/s, "
        f"{sp.tokens_per_s:,.0f} output tokens/s, ${sp.price_per_hour:.2f}/h"
        + (
            f", ${sp.usd_per_million_output_tokens:.3g} per million output tokens"
            if sp.usd_per_million_output_tokens is not None
            else ""
        ),
        f"workload: {w.prompt_tokens:,} prompt + {w.output_tokens:,} output tokens, "
        f"TTFT <= {_ms(w.ttft_s)}, TPOT <= {_ms(w.tpot_s)} ({per_user:.3g} tokens/s a user)",
    ]
    c = sp.certificate
    if c.objective is ServeObjective.USERS:
        lines.append(
            f"certificate (users): {c.value:,.0f} vs at most {c.bound:,.0f}, gap {c.gap:.1%}"
            f"{' (optimal)' if c.exact else ''} [{c.method}]"
        )
    else:
        target = f"{w.users:,} users" if w.users is not None else f"{w.rate_per_s:g} requests/s"
        lines.append(
            f"certificate (price for {target}): ${c.value:.2f}/h vs at least "
            f"${c.bound:.2f}/h, gap {c.gap:.1%}{' (optimal)' if c.exact else ''} [{c.method}]"
        )
    unused = sp.unused_nodes
    if len(unused) > UNUSED_SHOWN:
        lines.append(
            f"unused nodes: {len(unused)} ({', '.join(unused[: UNUSED_SHOWN - 1])}, …; "
            "--json lists them all)"
        )
    elif unused:
        lines.append("unused nodes: " + ", ".join(unused))
    lines += list(sp.notes)
    return lines


def _node_labels(r: ReplicaPlan) -> list[str]:
    """The replica's nodes, in stage order; a node it uses only part of as its GPUs
    (``n0/gpu2-3``): replicas side by side on one node."""
    gpus_of = {n.id: n.num_gpus for n in r.plan.nodes}
    used: dict[str, set[int]] = {}
    for a in r.plan.assignments:
        used.setdefault(a.node_id, set()).update(a.gpu_indices)
    out = []
    for nid, gpus in used.items():
        total = gpus_of.get(nid)
        ordered = sorted(gpus)
        if not ordered or total is None or len(ordered) >= total:
            out.append(nid)
        elif ordered == list(range(ordered[0], ordered[0] + len(ordered))):
            out.append(gpu_group_id(nid, ordered[0], len(ordered)))
        else:
            out.append(f"{nid}/gpu{','.join(map(str, ordered))}")
    return out


def render_serve_plan(sp: ServePlan, console: Console) -> None:
    """Print one row per replica (nodes, stages, U*, TTFT, TPOT, tokens/s, requests/s,
    binding, $/h), then :func:`serve_summary`."""
    title = f"{sp.model_name}: {len(sp.replicas)} replica(s), {sp.users:,} users"
    table = Table(
        title=Text(title),
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
    )
    table.add_column("#", justify="right")
    table.add_column("nodes", overflow="fold", max_width=22)
    table.add_column("st", justify="right")
    table.add_column("users", justify="right")
    table.add_column("TTFT", justify="right")
    table.add_column("TPOT", justify="right")
    table.add_column("tok/s", justify="right")
    table.add_column("req/s", justify="right")
    table.add_column("binds")
    table.add_column("$/h", justify="right")
    for i, r in enumerate(sp.replicas):
        table.add_row(
            str(i),
            Text(" ".join(_node_labels(r))),
            str(r.plan.num_stages),
            f"{r.users:,}",
            _ms(r.ttft_s),
            _ms(r.tpot_s),
            f"{r.tokens_per_s:,.0f}",
            f"{r.requests_per_s:.3g}",
            r.binding.value,
            _price(r.price_per_hour),
        )
    console.print(table, width=80)
    for line in serve_summary(sp):
        print_bullet(console, line, width=80)
