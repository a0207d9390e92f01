"""``stowplan plan`` predicts with the every-engine profile by default and says so;
``--engine first-order`` is the uncalibrated model; outside the data it gives a range."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stowplan import Constraints, Objective, TargetUnreached
from stowplan.calibration import shipped_calibration
from stowplan.cli import main
from stowplan.cli.calibration_opts import target_named
from tests.common.paths import EXAMPLES

CASE_C = str(EXAMPLES / "fleets" / "case-c.yaml")
MIXED = str(EXAMPLES / "fleets" / "mixed-consumer.yaml")
TWO_H100 = str(EXAMPLES / "fleets" / "two-h100-nodes.yaml")
DEFAULT = "engine generic, calibrated on 101 published runs"


@pytest.fixture(autouse=True)
def _no_user_fits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOWPLAN_HOME", str(tmp_path / "home"))


def _out(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 0
    return " ".join(capsys.readouterr().out.split())  # the console wraps long lines


def _one_stream(text: str) -> float:
    match = re.search(r"\): ([\d.]+) tokens/s for one stream", text)
    assert match is not None, text
    return float(match.group(1))


def test_the_default_is_the_every_engine_profile_and_first_order_is_asked_for_by_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    calibrated = _out(capsys, "plan", "llama3.1:70b-q4", "--nodes", CASE_C)
    assert f"predicted ({DEFAULT}): " in calibrated
    assert f"calibration: {DEFAULT}: generic-default [" in calibrated
    first = _out(capsys, "plan", "llama3.1:70b-q4", "--nodes", CASE_C, "--engine", "first-order")
    assert "predicted (first-order model, uncalibrated): " in first
    assert "calibration:" not in first and "outside the calibration data" not in first
    # Fixed per-block costs and partial bandwidth: the calibrated plan is slower.
    assert _one_stream(calibrated) < 0.9 * _one_stream(first)


def test_json_carries_the_calibration_and_null_for_first_order(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["plan", "llama3.1:8b", "--nodes", MIXED, "--json"]
    assert main(argv) == 0
    pred = json.loads(capsys.readouterr().out)["rationale"]["prediction"]
    assert pred["calibration"].startswith(f"{DEFAULT}: generic-default [")
    assert main([*argv, "--engine", "first-order"]) == 0
    assert json.loads(capsys.readouterr().out)["rationale"]["prediction"]["calibration"] is None


def test_a_gpu_outside_the_data_gives_the_range_of_the_dense_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = _out(capsys, "plan", "llama3.1:70b-q4", "--nodes", CASE_C)
    match = re.search(
        r"outside the calibration data \(GPU RTX 3070\): expect (\d+)–(\d+) tokens/s for one "
        r"stream \(measured/predicted over the (\d+) nearest published runs\)",
        text,
    )
    assert match is not None, text
    low, high, runs = (int(g) for g in match.groups())
    dense = [r for r in shipped_calibration("generic").fitted_runs if not r.moe]
    assert runs == len(dense) == 87
    assert low < _one_stream(text) < high


def test_deepseek_with_expert_parallel_and_mla_is_outside_the_data(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = _out(capsys, "plan", "deepseek-v3", "--nodes", TWO_H100, "--expert-parallel")
    match = re.search(
        r"outside the calibration data \(MLA attention, MoE with expert-parallel\): expect "
        r"(\d+)–(\d+) tokens/s for one stream",
        text,
    )
    assert match is not None, text
    low, high = int(match.group(1)), int(match.group(2))
    # The published MLA expert-parallel run decoded at half its prediction: the range
    # reaches that far below the single number.
    assert low < 0.55 * _one_stream(text) and high > _one_stream(text)


def test_target_names_the_profile_that_chose_the_node_set(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["plan", "llama3.1:70b-q4", "--nodes", MIXED, "--target"]
    text = _out(capsys, *base, "10tok/s")
    assert f"cheapest node set meeting 10 tokens/s ({DEFAULT}): $" in text
    first = _out(capsys, *base, "10tok/s", "--engine", "first-order")
    assert "cheapest node set meeting 10 tokens/s (first-order model, uncalibrated): $" in first
    # 15 tokens/s is reachable by the first-order model's figures only.
    assert "meeting 15 tokens/s" in _out(capsys, *base, "15tok/s", "--engine", "first-order")
    assert main([*base, "15tok/s"]) == 2
    err = capsys.readouterr().err.strip()  # after the search's progress line, if shown
    assert err.startswith("stowplan: error: constraints unsatisfiable: no node set reaches 15")
    assert err.endswith(f"(predicted with {DEFAULT})")


def test_an_unreached_target_keeps_its_numbers_when_the_predicting_model_is_named() -> None:
    c = Constraints(objective=Objective.COST, target_tokens_per_s=5.0)
    with pytest.raises(TargetUnreached) as info, target_named(c):
        raise TargetUnreached(5.0, 2.0, "no node set reaches 5 tokens/s")
    assert (info.value.target, info.value.reach) == (5.0, 2.0)
    assert info.value.reason.startswith("no node set reaches 5 tokens/s (predicted with ")


def test_first_order_with_a_profile_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", "llama3.1:8b", "--nodes", MIXED, "--engine", "first-order"]
    assert main([*argv, "--calibration", str(tmp_path / "p.json")]) == 2
    assert capsys.readouterr().err == (
        "stowplan: error: --engine='first-order': predicts without a profile; drop it to use "
        "--calibration, or drop --calibration\n"
    )


def test_the_html_report_names_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "r.html"
    _out(capsys, "plan", "llama3.1:70b-q4", "--nodes", CASE_C, "--html", str(page))
    html = page.read_text(encoding="utf-8")
    assert f"predicted by the {DEFAULT}" in html
    assert "tokens/s to expect (one stream, outside the calibration data)" in html
    assert f"<li>predicted ({DEFAULT}): " in html
