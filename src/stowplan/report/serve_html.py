"""One self-contained HTML page of a serve plan: the replicas and their latency curves.

Per replica: its nodes and stages, U*, TTFT(U*), TPOT(U*), TTFT0, the binding
constraint, tokens/s, requests/s and $/h; then TTFT(U) and TPOT(U) for U = 1 … U*
(:func:`~stowplan.report.serve_curve.replica_curve`) as inline SVG, each with its
limit drawn across.  Every drawn line carries its numbers (``data-users``,
``data-seconds``) so a reader — or a test — can check them against the formulas.
Like the plan page it loads nothing; its script checks that two curves per replica
were drawn, each through as many points as it lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from pathlib import Path

from stowplan.files.fileio import write_text_atomic
from stowplan.model import Constraints, ModelLayout, NodeDescriptor
from stowplan.report.html import html_page
from stowplan.report.serve_curve import CurvePoint, replica_curve
from stowplan.report.serving import serve_summary
from stowplan.serve_plan import ReplicaPlan, ServePlan
from stowplan.stages.gpu_lists import stage_place_text

__all__ = ["CHART", "render_serve_html", "write_serve_html_report"]

CHART = {"width": 520, "height": 230, "left": 64, "right": 16, "top": 16, "bottom": 40}
"""The SVG chart's size and margins, pixels."""

_CSS = """
.charts{display:flex;gap:18px;flex-wrap:wrap}
svg.curve-chart{background:#fff;border:1px solid #e1e4ea;border-radius:6px}
svg text{font:11px system-ui,sans-serif;fill:#5a6272}
polyline.curve{fill:none;stroke-width:2}
polyline.ttft{stroke:#3f6fd8}polyline.tpot{stroke:#2e9e5b}
line.slo{stroke:#d2453b;stroke-dasharray:6 4;stroke-width:1.5}
line.axis{stroke:#9aa1ad}
circle.at-most{fill:#1d2330}
"""

_SCRIPT = """
(function () {
  var want = Number(document.body.getAttribute('data-expected-replicas'));
  var curves = document.querySelectorAll('polyline.curve');
  var ok = curves.length === 2 * want;
  curves.forEach(function (c) {
    var n = c.getAttribute('data-users').trim().split(/\\s+/).length;
    if (c.points.numberOfItems !== n) { ok = false; }
  });
  document.body.setAttribute('data-check', ok ? 'ok' : 'mismatch');
  document.title = document.title + (ok ? ' [check: ok]' : ' [check: mismatch]');
  document.getElementById('self-check').textContent =
    'rendered ' + curves.length + ' curves for ' + want + ' replicas';
  console.log('stowplan-report-check: ' + (ok ? 'ok' : 'mismatch') + ' ' + curves.length);
})();
"""


def _seconds(value: float) -> str:
    return f"{value * 1e3:.3g} ms" if value < 1 else f"{value:.3g} s"


def _price(value: float | None) -> str:
    return "–" if value is None else f"${value:,.2f}"


def _x(users: int, top: int) -> float:
    c = CHART
    span = c["width"] - c["left"] - c["right"]
    return c["left"] + span * (users - 1) / max(1, top - 1)


def _y(seconds: float, y_max: float) -> float:
    c = CHART
    span = c["height"] - c["top"] - c["bottom"]
    return c["top"] + span * (1 - seconds / y_max)


def _chart(i: int, kind: str, points: Sequence[CurvePoint], limit: float, top: int) -> str:
    """One SVG chart: ``kind`` (``ttft`` or ``tpot``) against users, its limit dashed."""
    values = [p.ttft_s if kind == "ttft" else p.tpot_s for p in points]
    y_max = 1.1 * max(limit, *values)
    c = CHART
    w, h = c["width"], c["height"]
    coords = " ".join(
        f"{_x(p.users, top):.2f},{_y(v, y_max):.2f}" for p, v in zip(points, values, strict=True)
    )
    users = " ".join(str(p.users) for p in points)
    seconds = " ".join(repr(v) for v in values)
    name = "TTFT" if kind == "ttft" else "TPOT"
    x0, x1 = c["left"], w - c["right"]
    y0 = h - c["bottom"]
    y_limit = _y(limit, y_max)
    last = points[-1]
    ticks = "".join(
        f"<text x='{_x(u, top):.1f}' y='{y0 + 16}' text-anchor='middle'>{u:,}</text>"
        for u in sorted({1, top})
    )
    return (
        f"<svg class='curve-chart' width='{w}' height='{h}' viewBox='0 0 {w} {h}' "
        f"role='img' data-replica='{i}' data-kind='{kind}' data-y-max='{y_max!r}' "
        f"aria-label='{name} against concurrent users, replica {i}'>"
        f"<line class='axis' x1='{x0}' y1='{y0}' x2='{x1}' y2='{y0}'/>"
        f"<line class='axis' x1='{x0}' y1='{c['top']}' x2='{x0}' y2='{y0}'/>"
        f"<text x='{x0 - 6}' y='{y0}' text-anchor='end'>0</text>"
        f"<text x='{x0 - 6}' y='{y_limit + 4:.1f}' text-anchor='end'>{_seconds(limit)}</text>"
        f"{ticks}<text x='{(x0 + x1) / 2:.1f}' y='{h - 6}' text-anchor='middle'>"
        f"concurrent users</text>"
        f"<text x='{x0 + 6}' y='{c['top'] + 10}'>{name} (limit {_seconds(limit)})</text>"
        f"<line class='slo {kind}' x1='{x0}' y1='{y_limit:.2f}' x2='{x1}' y2='{y_limit:.2f}' "
        f"data-seconds='{limit!r}'/>"
        f"<polyline class='curve {kind}' data-replica='{i}' data-users='{users}' "
        f"data-seconds='{seconds}' points='{coords}'/>"
        f"<circle class='at-most' cx='{_x(last.users, top):.2f}' "
        f"cy='{_y(values[-1], y_max):.2f}' r='3.5'><title>U = {last.users}: "
        f"{name} {_seconds(values[-1])}</title></circle></svg>"
    )


def _replica_table(sp: ServePlan) -> str:
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "#",
            "nodes",
            "stages",
            "users (U*)",
            "TTFT",
            "TPOT",
            "prefill alone",
            "binds",
            "tokens/s",
            "requests/s",
            "$ per hour",
        )
    )
    rows = []
    for i, r in enumerate(sp.replicas):
        cells = (
            str(i),
            " ".join(r.node_ids),
            str(r.plan.num_stages),
            f"{r.users:,}",
            _seconds(r.ttft_s),
            _seconds(r.tpot_s),
            _seconds(r.prefill_s),
            r.binding.value,
            f"{r.tokens_per_s:,.1f}",
            f"{r.requests_per_s:.3g}",
            _price(r.price_per_hour),
        )
        rows.append(
            f"<tr class='replica' data-replica='{i}' data-users='{r.users}' "
            f"data-ttft-s='{r.ttft_s!r}' data-tpot-s='{r.tpot_s!r}' "
            f"data-binding='{r.binding.value}'>"
            + "".join(f"<td>{escape(c)}</td>" for c in cells)
            + "</tr>"
        )
    return f"<section><h2>Replicas</h2><table><tr>{head}</tr>{''.join(rows)}</table></section>"


def _replica_section(i: int, r: ReplicaPlan, sp: ServePlan, points: Sequence[CurvePoint]) -> str:
    w = sp.workload
    stages = "".join(
        f"<li>stage {a.stage}: {escape(stage_place_text(a))} · blocks "
        f"[{a.block_range[0]}, {a.block_range[1]})"
        + (f" · tp{a.tensor_parallel}" if a.tensor_parallel > 1 else "")
        + "</li>"
        for a in r.plan.assignments
    )
    top = max(1, r.users)
    return (
        f"<section class='replica-curves' data-replica='{i}'>"
        f"<h2>Replica {i} · {r.users:,} users · {escape(' → '.join(r.node_ids))}</h2>"
        f"<ul>{stages}</ul>"
        f"<p class='sub'>U* = {r.users:,}: one more request would break the "
        f"{escape(r.binding.value)} limit. TTFT(U) = TTFT0 + cycle(U), TPOT(U) = cycle(U) "
        f"+ U·TTFT0/O with TTFT0 = {_seconds(r.prefill_s)} and O = {w.output_tokens:,}.</p>"
        "<div class='charts'>"
        + _chart(i, "ttft", points, w.ttft_s, top)
        + _chart(i, "tpot", points, w.tpot_s, top)
        + "</div></section>"
    )


def _cards(sp: ServePlan) -> str:
    c = sp.certificate
    cards = [
        ("users", f"{sp.users:,}"),
        ("replicas", str(len(sp.replicas))),
        ("requests/s", f"{sp.rate_per_s:.3g}"),
        ("output tokens/s", f"{sp.tokens_per_s:,.0f}"),
        ("$ per hour", f"${sp.price_per_hour:,.2f}"),
        (f"gap to the bound ({c.objective.value})", f"{c.gap:.1%}"),
    ]
    if sp.usd_per_million_output_tokens is not None:
        cards.append(("$ per million output tokens", f"${sp.usd_per_million_output_tokens:.3g}"))
    return (
        '<div class="cards">'
        + "".join(
            f"<div class='card'><b>{escape(v)}</b><span>{escape(k)}</span></div>" for k, v in cards
        )
        + "</div>"
    )


def render_serve_html(
    sp: ServePlan,
    model: ModelLayout,
    constraints: Constraints | None = None,
    *,
    nodes: Sequence[NodeDescriptor] | None = None,
    prediction: str | None = None,
) -> str:
    """The serve plan's page as one HTML string (no external resources).

    ``model`` and ``constraints`` are those ``serve()`` was given (the curves are
    recomputed from them, calibration included); ``nodes`` describes the replicas'
    nodes (default: the descriptors each replica's plan recorded); ``prediction`` names
    what predicted, for the subtitle.
    """
    w = sp.workload
    heading = f"{sp.model_name}: {len(sp.replicas)} replica(s) serving {sp.users:,} users"
    sub = (
        f"{w.prompt_tokens:,} prompt + {w.output_tokens:,} output tokens a request · "
        f"TTFT ≤ {_seconds(w.ttft_s)} · TPOT ≤ {_seconds(w.tpot_s)}"
        + (f" · {prediction}" if prediction else "")
    )
    sections = [
        _replica_section(i, r, sp, replica_curve(model, r, w, constraints, nodes=nodes))
        for i, r in enumerate(sp.replicas)
    ]
    summary = "".join(f"<li>{escape(line)}</li>" for line in serve_summary(sp))
    body = (
        f"<p class='sub'>{escape(sub)}</p>"
        + _cards(sp)
        + _replica_table(sp)
        + "".join(sections)
        + f"<section><h2>Totals and certificate</h2><ul>{summary}</ul></section>"
    )
    return html_page(
        heading, body, f"data-expected-replicas='{len(sp.replicas)}'", _SCRIPT, css=_CSS
    )


def write_serve_html_report(
    path: str | Path,
    sp: ServePlan,
    model: ModelLayout,
    constraints: Constraints | None = None,
    *,
    nodes: Sequence[NodeDescriptor] | None = None,
    prediction: str | None = None,
) -> Path:
    """Write :func:`render_serve_html` to ``path`` atomically; return the path."""
    target = Path(path)
    page = render_serve_html(sp, model, constraints, nodes=nodes, prediction=prediction)
    write_text_atomic(target, page)
    return target
