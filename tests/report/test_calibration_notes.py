"""Prediction notes name their model; outside the data they give the range to expect."""

from __future__ import annotations

from stowplan.calibration import CoverageVerdict
from stowplan.report.calibration import annotate_notes, coverage_note, range_text
from stowplan.report.html import render_html
from tests.common.report_sample import sample_plan

LABEL = "engine generic, calibrated on 101 published runs"
OUTSIDE = CoverageVerdict(
    label=LABEL,
    known=True,
    outside=("MoE with expert-parallel",),
    low_tokens_per_s=40.2,
    high_tokens_per_s=95.4,
    nearest_runs=15,
)
NOTES = (
    "stage 0 on a: 1.00 ms/step",
    "predicted: 24.32 tokens/s for one stream (41.11 ms/token)",
    "cheapest node set meeting 10 tokens/s: $0.45/h for 19.51 tokens/s (MILP)",
    "KV capacity 297 tokens",
)


def test_the_prediction_and_the_target_notes_name_the_model_and_the_range_follows() -> None:
    notes = annotate_notes(NOTES, OUTSIDE)
    assert notes == (
        "stage 0 on a: 1.00 ms/step",
        f"predicted ({LABEL}): 24.32 tokens/s for one stream (41.11 ms/token)",
        "outside the calibration data (MoE with expert-parallel): expect 40–95 tokens/s for "
        "one stream (measured/predicted over the 15 nearest published runs)",
        f"cheapest node set meeting 10 tokens/s ({LABEL}): $0.45/h for 19.51 tokens/s (MILP)",
        "KV capacity 297 tokens",
    )


def test_inside_the_data_or_uncalibrated_only_the_label_is_added() -> None:
    inside = CoverageVerdict(label=LABEL, known=True)
    assert annotate_notes(NOTES[:2], inside)[1] == (
        f"predicted ({LABEL}): 24.32 tokens/s for one stream (41.11 ms/token)"
    )
    first = CoverageVerdict(label="first-order model, uncalibrated", known=False)
    assert coverage_note(first) is None
    assert annotate_notes(NOTES[:2], first)[1].startswith(
        "predicted (first-order model, uncalibrated): 24.32"
    )
    # Without a prediction note the label still appears, once.
    assert annotate_notes(("KV capacity 297 tokens",), OUTSIDE) == (
        "KV capacity 297 tokens",
        f"prediction: {LABEL}",
        "outside the calibration data (MoE with expert-parallel): expect 40–95 tokens/s for "
        "one stream (measured/predicted over the 15 nearest published runs)",
    )


def test_ranges_read_in_whole_tokens_from_ten_on_and_batches_say_so() -> None:
    assert range_text(OUTSIDE) == "40–95"
    small = CoverageVerdict(
        label=LABEL, known=True, outside=("batch 8",), low_tokens_per_s=4.26,
        high_tokens_per_s=1480.4, nearest_runs=1,
    )  # fmt: skip
    assert range_text(small) == "4.3–1,480"
    assert coverage_note(small, batch=8) == (
        "outside the calibration data (batch 8): expect 4.3–1,480 tokens/s for 8 concurrent sequences in all "
        "(measured/predicted over the 1 nearest published run)"
    )


def test_the_html_report_names_the_model_and_shows_the_range() -> None:
    plan, fleet = sample_plan()
    page = render_html(plan, fleet, notes=("predicted (x): 1 tokens/s",), verdict=OUTSIDE)
    assert f"predicted by the {LABEL}" in page
    assert "40–95</b><span>tokens/s to expect (one stream, outside the calibration data)" in page
    assert "<li>predicted (x): 1 tokens/s</li>" in page
    plain = render_html(plan, fleet)
    assert "predicted by the" not in plain and "tokens/s to expect" not in plain
