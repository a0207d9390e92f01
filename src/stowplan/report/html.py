"""One self-contained HTML page of a plan: memory bars, bottleneck chart, rationale.

The page loads nothing: styles and the one script are inline and a
Content-Security-Policy forbids every fetch. The script checks that the page
drew one bar per stage and writes the result into ``<body data-check>`` and
the title, so a headless browser can confirm the page rendered.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from stowplan.calibration.coverage import CoverageVerdict
from stowplan.cost.cycle import microbatches
from stowplan.files.fileio import write_text_atomic
from stowplan.model import ModelLayout, NodeDescriptor
from stowplan.plan import Plan
from stowplan.planner.baselines import BaselineResult
from stowplan.quantities.units import format_bytes
from stowplan.report.calibration import range_text
from stowplan.report.segments import MemoryPart, NodeMemory, node_memory
from stowplan.stages.gpu_lists import stage_place_text, uses_gpu_lists

__all__ = ["html_page", "render_html", "write_html_report"]

_COLOURS = {
    MemoryPart.EMBED: "#b04fc4",
    MemoryPart.BLOCKS: "#3f6fd8",
    MemoryPart.EXPERTS: "#2e9e5b",
    MemoryPart.HEAD: "#d9a21b",
    MemoryPart.KV: "#27a9c2",
    MemoryPart.FREE: "#e4e7ec",
    MemoryPart.HEADROOM: "repeating-linear-gradient(45deg,#f4f5f7 0 4px,#dde0e5 4px 8px)",
}

_CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d2330;
margin:0;background:#f7f8fa}
main{max-width:1180px;margin:0 auto;padding:20px 28px 32px}
h1{font-size:22px;margin:0 0 2px}h2{font-size:16px;margin:26px 0 10px}
.sub{color:#5a6272;margin:0 0 14px}
.cards{display:flex;gap:12px;flex-wrap:wrap}
.card{background:#fff;border:1px solid #e1e4ea;border-radius:8px;padding:8px 14px;min-width:150px}
.card b{display:block;font-size:18px}.card span{color:#5a6272;font-size:12px}
section{background:#fff;border:1px solid #e1e4ea;border-radius:8px;padding:4px 18px 16px;
margin-top:16px}
.row{display:grid;grid-template-columns:170px 1fr 220px;gap:14px;align-items:center;
margin:6px 0}
.who b{display:block}.who span,.fig span{color:#5a6272;font-size:12px}
.fig{text-align:right;font-variant-numeric:tabular-nums}
.track{height:26px}
.node-bar,.time-bar{display:flex;height:26px;border-radius:5px;overflow:hidden;
border:1px solid #c9ced8}
.seg{height:100%;color:#fff;font-size:11px;white-space:nowrap;overflow:hidden;
text-overflow:clip;padding:5px 4px 0}
.seg.free,.seg.headroom{color:#5a6272}
.legend{display:flex;gap:16px;flex-wrap:wrap;font-size:12px;color:#3a4150;margin:10px 0 2px}
.legend i{display:inline-block;width:12px;height:12px;border-radius:3px;margin-right:5px;
vertical-align:-2px}
.time-bar{background:#3f6fd8;border:0}.time-bar.bottleneck{background:#d2453b}
table{border-collapse:collapse;font-variant-numeric:tabular-nums}
td,th{padding:4px 14px 4px 0;text-align:left;vertical-align:top}
th{color:#5a6272;font-weight:600}
ul{margin:6px 0;padding-left:20px}li{margin:2px 0}
.check{color:#8a91a0;font-size:11px;margin-top:18px}
"""

_SCRIPT = """
(function () {
  var want = Number(document.body.getAttribute('data-expected-nodes'));
  var got = document.querySelectorAll('.node-bar').length;
  var ok = got === want;
  document.body.setAttribute('data-check', ok ? 'ok' : 'mismatch');
  document.title = document.title + (ok ? ' [check: ok]' : ' [check: mismatch]');
  document.getElementById('self-check').textContent =
    'rendered ' + got + ' of ' + want + ' node bars';
  console.log('stowplan-report-check: ' + (ok ? 'ok' : 'mismatch') + ' ' + got + '/' + want);
})();
"""


def _fmt(value: object, key: str = "") -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) and key.endswith("_bytes"):
        return format_bytes(value)
    if isinstance(value, float):
        if key.endswith("_s") and abs(value) < 1:
            return f"{value * 1e3:.3g} ms"
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return ", ".join(_fmt(v, key) for v in value) or "–"
    return str(value)


_LABELS = {
    "batch": "sequences in flight",
    "tokens_per_s": "tokens/s (all sequences)",
    "time_per_token_s": "time per token (one stream)",
    "stage_time_s": "time per step, by stage",
    "bottleneck_stage": "slowest stage",
    "kv_capacity_tokens": "KV capacity (tokens)",
    "cost_per_hour": "$ per hour",
    "usd_per_million_tokens": "$ per million tokens",
    "assumed": "inputs assumed",
    "calibration": "calibration",
    "objective": "objective",
    "value": "plan's value",
    "bound": "optimum or bound",
    "exact": "exact optimum",
    "gap": "gap to the bound",
    "method": "how the bound was found",
}
"""Human names of the prediction's and certificate's fields."""


def _field_rows(item: object) -> list[tuple[str, str]]:
    """``item``'s fields as (human name, value with its unit) rows."""
    rows = []
    for k, v in _as_mapping(item).items():
        if k == "gap" and isinstance(v, float):
            text = f"{v:.2%}"
        elif k in {"cost_per_hour", "usd_per_million_tokens"} and isinstance(v, float):
            text = f"${v:,.2f}"
        elif k == "tokens_per_s" and isinstance(v, float):
            text = f"{v:,.2f}"
        else:
            text = _fmt(v, k)
        rows.append((_LABELS.get(k, k.replace("_", " ")), text))
    return rows


def _as_mapping(item: object) -> dict[str, Any]:
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        return {f.name: getattr(item, f.name) for f in dataclasses.fields(item)}
    if isinstance(item, Mapping):
        return {str(k): v for k, v in item.items()}
    return {"value": item}


def _segment(part: MemoryPart, n_bytes: int, total: int, bar_pct: float) -> str:
    pct = 100.0 * n_bytes / total if total else 0.0
    label = f"{part.value} {format_bytes(n_bytes)}"
    # Show the label only where it fits: about 1.2 % of the track per character.
    text = escape(label) if pct * bar_pct / 100.0 >= len(label) * 1.2 else ""
    cls = part.name.lower()
    return (
        f'<div class="seg {cls}" style="width:{pct:.3f}%;background:{_COLOURS[part]}" '
        f'title="{escape(label)}">{text}</div>'
    )


def _node_row(row: NodeMemory, widest: int, tensor_parallel: int) -> str:
    total = row.capacity_bytes
    width = 100.0 * total / widest if widest else 100.0
    segs = "".join(_segment(s.part, s.bytes, total, width) for s in row.segments)
    lo, hi = row.block_range
    who = f"stage {row.stage}" + (f" · {escape(row.gpu_name)}" if row.gpu_name else "")
    who += f" · tp{tensor_parallel}" if tensor_parallel > 1 else ""
    place = f"{row.node_id} {row.gpus}" if row.gpus else row.node_id
    experts = f" + {row.num_experts} experts" if row.num_experts else ""
    usable = f" of {format_bytes(row.usable_bytes)}" if row.usable_bytes else ""
    return (
        f'<div class="row"><div class="who"><b>{escape(place)}</b><span>{who}</span></div>'
        f'<div class="track"><div class="node-bar" data-node="{escape(row.node_id)}" '
        f'style="width:{width:.3f}%">{segs}</div></div>'
        f'<div class="fig">{format_bytes(row.used_bytes)}{usable} used<br>'
        f"<span>blocks [{lo}, {hi}) = {hi - lo}{experts}</span></div></div>"
    )


def _memory_section(plan: Plan, rows: list[NodeMemory]) -> str:
    widest = max(r.capacity_bytes for r in rows)
    legend = "".join(
        f'<span><i style="background:{_COLOURS[p]}"></i>{escape(p.value)}</span>'
        for p in MemoryPart
    )
    degrees = [a.tensor_parallel for a in plan.assignments]
    body = "".join(_node_row(r, widest, tp) for r, tp in zip(rows, degrees, strict=True))
    return f'<section><h2>Memory per node</h2><div class="legend">{legend}</div>{body}</section>'


def _time_section(plan: Plan) -> str:
    """Each stage's time per step, drawn to one scale, and what sets the cycle: one
    token passing every stage in turn plus the hops (the trip), or m microbatches on the
    slowest stage, whichever is longer."""
    prediction = plan.rationale.prediction
    if prediction is None or not prediction.stage_time_s:
        return ""
    times = prediction.stage_time_s
    m, _ = microbatches(prediction.batch, len(times))
    cycle = prediction.time_per_token_s
    paced = m * max(times)
    # cycle = max(Σ t + hops, m × slowest): the trip binds when it exceeds m × slowest.
    trip = cycle > paced * (1 + 1e-9) or m == 1
    hops = max(0.0, cycle - sum(times)) if trip else None
    top = max([*times, hops or 0.0]) or 1.0
    rows = []
    for i, t in enumerate(times):
        node = stage_place_text(plan.assignments[i]) if i < len(plan.assignments) else "?"
        slow = i == prediction.bottleneck_stage and not trip
        cls = "time-bar bottleneck" if slow else "time-bar"
        tag = " · bottleneck" if slow else ""
        rows.append(
            f'<div class="row"><div class="who"><b>{escape(node)}</b><span>stage {i}{tag}'
            f'</span></div><div class="track"><div class="{cls}" '
            f'style="width:{100.0 * t / top:.3f}%"></div></div>'
            f'<div class="fig">{_fmt(t, "stage_time_s")}</div></div>'
        )
    if hops is not None:
        rows.append(
            '<div class="row"><div class="who"><b>hops</b><span>latency, every stage to '
            'the next and back</span></div><div class="track"><div class="time-bar" '
            f'style="width:{100.0 * hops / top:.3f}%"></div></div>'
            f'<div class="fig">{_fmt(hops, "stage_time_s")}</div></div>'
        )
        title = (
            "Time per token: every stage in turn, then the hops "
            f"(sum {_fmt(cycle, 'time_per_token_s')})"
        )
    else:
        title = (
            f"Time per stage per microbatch: {m} microbatches on the slowest stage set the "
            f"pace ({_fmt(cycle, 'time_per_token_s')} per token of each sequence)"
        )
    return f"<section><h2>{escape(title)}</h2>" + "".join(rows) + "</section>"


def _table(pairs: Sequence[tuple[str, str]]) -> str:
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in pairs)
    return f"<table>{rows}</table>"


def _rationale_section(plan: Plan, notes: Sequence[str] | None = None) -> str:
    r = plan.rationale
    parts = [f"<section><h2>Rationale · {escape(r.strategy)}</h2>"]
    shown = r.notes if notes is None else notes
    if shown:
        parts.append("<ul>" + "".join(f"<li>{escape(n)}</li>" for n in shown) + "</ul>")
    if r.prediction is not None:
        parts.append("<h2>Prediction</h2>")
        parts.append(_table(_field_rows(r.prediction)))
    if r.certificate is not None:
        c = r.certificate
        verdict = "provably optimal" if c.exact and c.gap == 0 else f"within {c.gap:.2%} of bound"
        parts.append(f"<h2>Certificate · {escape(verdict)}</h2>")
        parts.append(_table(_field_rows(c)))
    parts.append("</section>")
    return "".join(parts)


def _baselines_section(plan: Plan, baselines: Sequence[BaselineResult]) -> str:
    """This plan and each peer rule's, as the same cost model predicts them."""
    if not baselines:
        return ""
    rows: list[tuple[str, str, str, str]] = []
    pred = plan.rationale.prediction
    if pred is not None:
        rows.append(
            (
                f"stowplan {plan.rationale.strategy}",
                str(plan.num_stages),
                f"{pred.tokens_per_s:.3g}",
                _fmt(pred.time_per_token_s, "time_per_token_s"),
            )
        )
    for b in baselines:
        if b.tokens_per_s is None or b.time_per_token_s is None:
            rows.append((b.name, "–", "does not fit", "does not fit"))
        else:
            rows.append(
                (
                    b.name,
                    str(b.num_stages),
                    f"{b.tokens_per_s:.3g}",
                    _fmt(b.time_per_token_s, "time_per_token_s"),
                )
            )
    head = "".join(
        f"<th>{h}</th>"
        for h in ("rule", "stages", "tokens/s (all sequences)", "time per token, each")
    )
    body = "".join(
        "<tr class='baseline'>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>"
        for r in rows
    )
    return (
        "<section><h2>Baselines side by side (same cost model)</h2>"
        f"<table><tr>{head}</tr>{body}</table></section>"
    )


def _cards(plan: Plan, rows: list[NodeMemory], verdict: CoverageVerdict | None = None) -> str:
    cards = [("stages", str(plan.num_stages))]
    if uses_gpu_lists(plan):
        cards.append(("GPUs", str(sum(a.tensor_parallel for a in plan.assignments))))
    cards += [
        ("blocks", str(sum(plan.block_counts()))),
        ("memory used", format_bytes(sum(r.used_bytes for r in rows))),
    ]
    p = plan.rationale.prediction
    if p is not None:
        cards += [
            (
                f"tokens/s ({p.batch} sequence{'s' if p.batch > 1 else ''})",
                f"{p.tokens_per_s:.3g}",
            ),
            ("time per token, each sequence", _fmt(p.time_per_token_s, "time_per_token_s")),
        ]
        span = range_text(verdict) if verdict is not None else None
        if span is not None:
            what = "one stream" if p.batch == 1 else f"batch {p.batch}"
            cards.append((f"tokens/s to expect ({what}, outside the calibration data)", span))
        if p.kv_capacity_tokens is not None:
            cards.append(("KV capacity (tokens)", f"{p.kv_capacity_tokens:,}"))
        if p.cost_per_hour is not None:
            cards.append(("$ per hour", f"{p.cost_per_hour:.3g}"))
    if plan.context_tokens is not None:
        cards.append(("context budget", f"{plan.context_tokens:,} tokens"))
    return (
        '<div class="cards">'
        + "".join(
            f"<div class='card'><b>{escape(v)}</b><span>{escape(k)}</span></div>" for k, v in cards
        )
        + "</div>"
    )


def _heading(plan: Plan, name: str) -> str:
    """``llama3.1:8b on 3 nodes``; with GPU lists ``… on 2 nodes (16 GPUs, 2 stages)``."""
    if not uses_gpu_lists(plan):
        return f"{name} on {plan.num_stages} node{'s' * (plan.num_stages != 1)}"
    nodes = len({a.node_id for a in plan.assignments})
    gpus = sum(a.tensor_parallel for a in plan.assignments)
    stages = f"{plan.num_stages} stage{'s' * (plan.num_stages != 1)}"
    return f"{name} on {nodes} node{'s' * (nodes != 1)} ({gpus} GPUs, {stages})"


def render_html(
    plan: Plan,
    nodes: Sequence[NodeDescriptor] = (),
    *,
    layout: ModelLayout | None = None,
    title: str | None = None,
    baselines: Sequence[BaselineResult] = (),
    notes: Sequence[str] | None = None,
    verdict: CoverageVerdict | None = None,
) -> str:
    """The report page as one HTML string (no external resources).

    ``baselines`` (from :func:`stowplan.planner.baselines.compare_plans`) are shown beside the
    plan's own prediction when given; ``notes`` replace the rationale's notes
    (:func:`stowplan.report.calibration.annotate_notes`); ``verdict`` names the model that
    predicted in the subtitle and, outside its data, adds the range to expect.
    """
    rows = node_memory(plan, nodes, layout)
    name = plan.model_name or "model"
    heading = title or _heading(plan, name)
    order = " → ".join(stage_place_text(a) for a in plan.assignments)
    body = (
        f"<p class='sub'>{escape(plan.rationale.strategy)} · pipeline {escape(order)}"
        + (f" · predicted by the {escape(verdict.label)}" if verdict is not None else "")
        + "</p>"
        + _cards(plan, rows, verdict)
        + _memory_section(plan, rows)
        + _time_section(plan)
        + _baselines_section(plan, baselines)
        + _rationale_section(plan, notes)
    )
    return html_page(heading, body, f"data-expected-nodes='{len(rows)}'", _SCRIPT)


def html_page(heading: str, body: str, body_attrs: str, script: str, css: str = "") -> str:
    """A self-contained page: the report's styles (and ``css``), ``heading`` as its title
    and first line, ``body`` and the self-check ``script`` (which writes into
    ``#self-check``); a Content-Security-Policy forbids every fetch."""
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; "
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<title>stowplan · {escape(heading)}</title><style>{_CSS}{css}</style></head>"
        f"<body {body_attrs}><main>"
        f"<h1>{escape(heading)}</h1>" + body + "<p class='check' id='self-check'></p></main>"
        f"<script>{script}</script></body></html>\n"
    )


def write_html_report(
    path: str | Path,
    plan: Plan,
    nodes: Sequence[NodeDescriptor] = (),
    *,
    layout: ModelLayout | None = None,
    baselines: Sequence[BaselineResult] = (),
    notes: Sequence[str] | None = None,
    verdict: CoverageVerdict | None = None,
) -> Path:
    """Write :func:`render_html` to ``path`` atomically; return the path."""
    target = Path(path)
    page = render_html(
        plan, nodes, layout=layout, baselines=baselines, notes=notes, verdict=verdict
    )
    write_text_atomic(target, page)
    return target
