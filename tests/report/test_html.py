"""The HTML report: self-contained, one bar per node, and it renders in a real browser."""

from __future__ import annotations

import json
import re

import pytest

from stowplan.cli import main
from stowplan.report.html import render_html, write_html_report
from tests.common.chromium import CHROMIUM, chromium
from tests.common.paths import EXAMPLES
from tests.common.report_sample import sample_baselines, sample_plan


def test_report_is_self_contained_and_shows_every_part():
    plan, fleet = sample_plan()
    baselines = sample_baselines(fleet)
    page = render_html(plan, fleet, baselines=baselines)
    assert page.count('class="node-bar"') == plan.num_stages
    # One stream: the token passes every stage in turn, then the hops; no stage sets
    # the pace alone.
    assert page.count('class="time-bar') == plan.num_stages + 1
    assert page.count("time-bar bottleneck") == 0
    assert "Time per token: every stage in turn, then the hops" in page
    pred = plan.rationale.prediction
    hops = pred.time_per_token_s - sum(pred.stage_time_s)
    assert hops >= 0 and f"{hops * 1e3:.3g} ms</div>" in page
    assert "Baselines side by side" in page
    # One row for this plan and one per peer rule, each with the rule's predicted rate.
    assert page.count("<tr class='baseline'>") == 1 + len(baselines)
    for b in baselines:
        rate = "does not fit" if b.tokens_per_s is None else f"{b.tokens_per_s:.3g}"
        assert f"<td>{b.name}</td><td>" in page and f"<td>{rate}</td>" in page
    assert "Certificate · within 3.00% of bound" in page
    # Nothing is fetched: no URL of any scheme, and the policy forbids it anyway.
    assert not re.search(r"(src|href)\s*=|https?:|url\(", page)
    assert "default-src 'none'" in page


def test_plan_html_option_writes_the_report(tmp_path, capsys):
    out = tmp_path / "sub" / "report.html"
    fleet = EXAMPLES / "fleets" / "case-a.yaml"
    args = ["plan", "llama3.1:8b", "--nodes", str(fleet), "--min-stages", "2", "--html", str(out)]
    assert main([*args, "--json"]) == 0
    stages = json.loads(capsys.readouterr().out)["topology"]["num_stages"]
    page = out.read_text()
    assert stages == 2
    assert page.count('class="node-bar"') == stages
    assert page.count('class="time-bar') == stages + 1  # every stage, then the hops
    # --html computes the peer rules itself (no --compare needed) and shows them.
    assert "Baselines side by side" in page
    assert page.count("<tr class='baseline'>") == 5  # this plan + exo, vllm, accelerate, v1


def test_report_without_baselines_has_no_baseline_section():
    plan, fleet = sample_plan()
    assert "Baselines side by side" not in render_html(plan, fleet)


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (.ci/run installs it)")
def test_report_renders_in_headless_chromium_with_every_node_bar(tmp_path):
    plan, fleet = sample_plan()
    page = write_html_report(
        tmp_path / "report.html", plan, fleet, baselines=sample_baselines(fleet)
    )
    url = page.resolve().as_uri()
    dom = chromium(tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-check="ok"' in dom.stdout
    assert f"rendered {plan.num_stages} of {plan.num_stages} node bars" in dom.stdout
    # The page's own check message reached the console log, and nothing else went wrong.
    assert "stowplan-report-check: ok" in dom.stderr
    console = [ln for ln in dom.stderr.splitlines() if "CONSOLE" in ln]
    assert not [ln for ln in console if "stowplan-report-check" not in ln], console
    assert "Uncaught" not in dom.stderr and "Refused to" not in dom.stderr
    shot = tmp_path / "report.png"
    run = chromium(tmp_path, f"--screenshot={shot}", url)
    assert run.returncode == 0, run.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 20_000


def test_under_many_sequences_the_slowest_stage_sets_the_pace(tmp_path, capsys):
    out = tmp_path / "report.html"
    fleet = EXAMPLES / "fleets" / "case-a.yaml"
    args = ["plan", "llama3.1:8b", "--nodes", str(fleet), "--min-stages", "2", "--batch", "16"]
    assert main([*args, "--html", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    pred = doc["rationale"]["prediction"]
    page = out.read_text()
    m = min(16, doc["topology"]["num_stages"])
    if pred["time_per_token_s"] <= m * max(pred["stage_time_s"]) * (1 + 1e-9):
        assert f"{m} microbatches on the slowest stage set the pace" in page
        assert page.count("time-bar bottleneck") == 1
        assert page.count('class="time-bar') == doc["topology"]["num_stages"]
    else:  # the trip binds even with every microbatch in flight
        assert "every stage in turn, then the hops" in page
