"""How a plan's prediction names its calibration, and what to expect outside the data.

The planner's rationale notes say what the cost model predicts; these functions add,
for the terminal and the HTML report, which model predicted it (``predicted (engine
generic, calibrated on 101 published runs): …`` or ``predicted (first-order model,
uncalibrated): …``), which profile chose a ``--target`` node set, and, when the plan
lies outside the profile's data, the range :func:`~stowplan.calibration.assess_coverage`
gives.  Pure text; nothing is printed here.
"""

from __future__ import annotations

from collections.abc import Sequence

from stowplan.calibration.coverage import CoverageVerdict
from stowplan.plan import Plan

__all__ = ["annotate_notes", "coverage_note", "headline_tokens_per_s", "range_text"]

_PREDICTED = "predicted"
_CHEAPEST = "cheapest node set"


def headline_tokens_per_s(plan: Plan) -> float | None:
    """The figure a range is given for: one stream's tokens/s at batch 1, all sequences'
    tokens/s above (None without a prediction)."""
    p = plan.rationale.prediction
    if p is None:
        return None
    if p.batch == 1:
        return 1.0 / p.time_per_token_s if p.time_per_token_s > 0 else None
    return p.tokens_per_s if p.tokens_per_s > 0 else None


def _figure(x: float) -> str:
    """Whole tokens/s from 10 on (``41``, ``1,480``), two significant figures below
    (``4.3``, ``0.81``)."""
    if x >= 10:
        return f"{x:,.0f}"
    return f"{x:.2g}"


def range_text(verdict: CoverageVerdict) -> str | None:
    """``40–95`` (tokens/s) for a verdict outside the data, else None."""
    if verdict.low_tokens_per_s is None or verdict.high_tokens_per_s is None:
        return None
    return f"{_figure(verdict.low_tokens_per_s)}–{_figure(verdict.high_tokens_per_s)}"


def coverage_note(verdict: CoverageVerdict, batch: int = 1) -> str | None:
    """``outside the calibration data (MoE with expert-parallel): expect 40–95 tokens/s for
    one stream (measured/predicted over the 15 nearest published runs)``; None inside the
    data or where the profile records no runs."""
    span = range_text(verdict)
    if not verdict.outside or span is None:
        return None
    what = "for one stream" if batch == 1 else f"for {batch} concurrent sequences in all"
    runs = f"{verdict.nearest_runs} nearest published run{'s' * (verdict.nearest_runs != 1)}"
    return (
        f"outside the calibration data ({', '.join(verdict.outside)}): expect {span} tokens/s "
        f"{what} (measured/predicted over the {runs})"
    )


def _tag(note: str, prefix: str, tag: str) -> str | None:
    """``note`` with ``(tag)`` after ``prefix``'s first clause, when it starts with it."""
    if not note.startswith(prefix):
        return None
    head, sep, rest = note.partition(":")
    if not sep:
        return f"{note} ({tag})"
    return f"{head} ({tag}):{rest}"


def annotate_notes(
    notes: Sequence[str], verdict: CoverageVerdict, batch: int = 1
) -> tuple[str, ...]:
    """The rationale ``notes`` with the prediction named by ``verdict.label``, the
    ``--target`` note naming the profile that chose the node set the same way, and the
    coverage note
    (:func:`coverage_note`) right after the prediction.

    A prediction note that does not start with ``predicted`` is left as it is and a
    ``prediction: LABEL`` note is added instead.
    """
    out: list[str] = []
    named = False
    extra = coverage_note(verdict, batch)
    for note in notes:
        tagged = _tag(note, _PREDICTED, verdict.label)
        if tagged is not None and not named:
            named = True
            out.append(tagged)
            if extra:
                out.append(extra)
            continue
        target = _tag(note, _CHEAPEST, verdict.label)
        out.append(target if target is not None else note)
    if not named:
        out.append(f"prediction: {verdict.label}")
        if extra:
            out.append(extra)
    return tuple(out)
