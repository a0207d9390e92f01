"""``plan --json --compare``: one document holding the plan (as ``plan --json`` writes
it), the expected range the terminal states in words and every peer rule's plan with
the figures the comparison table prints."""

from __future__ import annotations

import json
from itertools import pairwise

import pytest

from stowplan import Constraints
from stowplan.calibration.coverage import CoverageVerdict
from stowplan.calibration.store import shipped_calibration
from stowplan.cli import main
from stowplan.files.fleets import load_nodes
from stowplan.models import resolve_model
from stowplan.planner.baselines import compare_plans
from stowplan.report.calibration import coverage_note

FLEET = (
    "nodes:\n"
    "  - {id: a, gpu_name: RTX 4090, vram_bytes: 24GB, link_mbps: 1000, link_latency_ms: 20}\n"
    "  - {id: b, gpu_name: RTX 5090, vram_bytes: 32GB, link_mbps: 1000, link_latency_ms: 10}\n"
    "  - {id: c, gpu_name: RTX 3090, vram_bytes: 24GB, link_mbps: 1000, link_latency_ms: 10}\n"
)


def _run(capsys, *args: str) -> str:
    assert main(["plan", *args]) == 0
    return capsys.readouterr().out


def test_json_with_compare_carries_the_plan_the_range_and_the_peers(capsys, tmp_path) -> None:
    fleet = tmp_path / "f.yaml"
    fleet.write_text(FLEET)
    args = ("llama3.1:70b-q4_0", "--nodes", str(fleet), "--context", "4096")
    doc = json.loads(_run(capsys, *args, "--json", "--compare"))
    plain = json.loads(_run(capsys, *args, "--json"))
    assert doc["kind"] == "stowplan.plan-comparison" and doc["version"] == 1
    assert doc["plan"] == plain  # the plan itself is unchanged
    # The peers: the same rules and figures as the library's comparison.
    nodes = load_nodes(fleet)
    c = Constraints(context_tokens=4096, calibration=shipped_calibration("generic"))
    peers = compare_plans(resolve_model("llama3.1:70b-q4_0"), nodes, c)
    assert [b["rule"] for b in doc["baselines"]] == [p.name for p in peers]
    for got, want in zip(doc["baselines"], peers, strict=True):
        assert got["fits"] == (want.pipeline is not None and want.tokens_per_s is not None)
        if got["fits"]:
            assert got["tokens_per_s"] == pytest.approx(want.tokens_per_s, rel=1e-12)
            assert got["stages"] == want.num_stages == len(got["stages_detail"])
            blocks = [s["blocks"] for s in got["stages_detail"]]
            assert blocks[0][0] == 0 and blocks[-1][1] == 80
            assert all(a[1] == b[0] for a, b in pairwise(blocks))
        else:
            assert got["tokens_per_s"] is None and got["stages_detail"] == []
    # The RTX 5090 lies outside the generic profile's runs: the range is stated, and the
    # note the terminal prints gives the same figures.
    rng = doc["expected_range"]
    assert rng is not None and rng["low_tokens_per_s"] < rng["high_tokens_per_s"]
    assert "GPU RTX 5090" in rng["outside"]
    notes = doc["plan"]["rationale"]["notes"]
    (said,) = [n for n in notes if n.startswith("outside the calibration data")]
    verdict = CoverageVerdict(
        label=doc["calibration"],
        known=True,
        outside=tuple(rng["outside"]),
        low_tokens_per_s=rng["low_tokens_per_s"],
        high_tokens_per_s=rng["high_tokens_per_s"],
        nearest_runs=rng["runs"],
    )
    assert said == coverage_note(verdict)
    assert doc["calibration"].startswith("engine generic")
