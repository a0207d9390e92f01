"""The HTML page of a serve plan: every replica's figures, and TTFT/TPOT-vs-users curves
whose points are the issue's formulas (checked against the independent referee)."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

from stowplan import ModelLayout, NodeDescriptor, ServePlan, Workload, serve
from stowplan.cli import main
from stowplan.report.serve_curve import curve_users, replica_curve
from stowplan.report.serve_html import CHART, render_serve_html, write_serve_html_report
from tests.common.chromium import CHROMIUM, chromium
from tests.common.serving_referee import Load, Referee

MB, GB = 10**6, 10**9
MODEL = ModelLayout(
    name="dense",
    num_blocks=4,
    hidden_dim=2048,
    bytes_per_activation_elem=2,
    block_params_bytes=1500 * MB,
    head_params_bytes=750 * MB,
    embed_params_bytes=750 * MB,
    kv_bytes_per_token=(20_000,) * 4,
    total_params=3750 * MB,
    active_params=3750 * MB,
)
FLEET = [
    NodeDescriptor(
        id=f"n{i}",
        gpu_name=gpu,
        vram_bytes=vram * GB,
        mem_bandwidth_gbps=bw,
        flops_estimate=tf,
        link_mbps=10_000.0,
        link_latency_ms=1.0,
        price_per_hour=price,
    )
    for i, (gpu, vram, bw, tf, price) in enumerate(
        [
            ("RTX 4090", 24, 1000.0, 160.0, 0.4),
            ("RTX 3090", 24, 900.0, 70.0, 0.25),
            ("L4", 6, 300.0, 120.0, 0.3),
            ("L4", 6, 300.0, 120.0, 0.3),
        ]
    )
]
LOAD = Load(prompt_tokens=1024, output_tokens=128, ttft_s=1.5, tpot_s=0.06)
WORKLOAD = Workload(prompt_tokens=1024, output_tokens=128, ttft_s=1.5, tpot_s=0.06)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split()]


def _curves(page: str) -> dict[tuple[int, str], tuple[list[int], list[float], list[float]]]:
    """(replica, kind) → (users, seconds, y pixels) of each drawn curve."""
    out = {}
    for m in re.finditer(
        r"<polyline class='curve (\w+)' data-replica='(\d+)' data-users='([^']*)' "
        r"data-seconds='([^']*)' points='([^']*)'/>",
        page,
    ):
        kind, i, users, seconds, points = m.groups()
        ys = [float(p.split(",")[1]) for p in points.split()]
        out[(int(i), kind)] = ([int(u) for u in users.split()], _floats(seconds), ys)
    return out


@pytest.fixture(scope="module")
def served() -> ServePlan:
    return serve(MODEL, FLEET, WORKLOAD)


def test_the_fixture_serves_several_replicas_one_of_them_a_pipeline(served):
    assert len(served.replicas) >= 2
    assert any(r.plan.num_stages > 1 for r in served.replicas)


def test_curve_points_are_the_formulas_for_every_user_count(served):
    ref = Referee(MODEL, FLEET, LOAD)
    index = {n.id: i for i, n in enumerate(FLEET)}
    page = render_serve_html(served, MODEL)
    curves = _curves(page)
    assert len(curves) == 2 * len(served.replicas)
    for i, r in enumerate(served.replicas):
        stages = r.plan.assignments
        order = [index[a.node_id] for a in stages]
        bounds = [a.block_range[0] for a in stages] + [stages[-1].block_range[1]]
        users, ttft, _ = curves[(i, "ttft")]
        users_b, tpot, _ = curves[(i, "tpot")]
        assert users == users_b == list(range(1, r.users + 1))
        for u, a, b in zip(users, ttft, tpot, strict=True):
            assert a == pytest.approx(ref.ttft(order, bounds, u), rel=1e-9)
            assert b == pytest.approx(ref.tpot(order, bounds, u), rel=1e-9)
        # The curve ends at the replica's own U*, where serve() reported these figures,
        # and one more user breaks the limit the replica names.
        assert (ttft[-1], tpot[-1]) == pytest.approx((r.ttft_s, r.tpot_s), rel=1e-12)
        assert ttft[-1] <= WORKLOAD.ttft_s and tpot[-1] <= WORKLOAD.tpot_s
        assert not ref.meets(order, bounds, r.users + 1)


def test_curves_are_drawn_where_their_numbers_say_and_the_limits_across(served):
    page = render_serve_html(served, MODEL)
    span = CHART["height"] - CHART["top"] - CHART["bottom"]
    charts = re.findall(r"data-kind='(\w+)' data-y-max='([^']+)'", page)
    limits = re.findall(r"<line class='slo (\w+)' [^>]*data-seconds='([^']+)'/>", page)
    assert (
        [k for k, _ in limits] == [k for k, _ in charts] == ["ttft", "tpot"] * len(served.replicas)
    )
    assert {k: float(v) for k, v in limits} == {"ttft": 1.5, "tpot": 0.06}
    curves = _curves(page)
    for n, (kind, y_max) in enumerate(charts):
        _, seconds, ys = curves[(n // 2, kind)]
        for s, y in zip(seconds, ys, strict=True):
            assert y == pytest.approx(CHART["top"] + span * (1 - s / float(y_max)), abs=0.006)


def test_replica_rows_carry_every_figure(served):
    page = render_serve_html(served, MODEL)
    rows = re.findall(r"<tr class='replica' data-replica='(\d+)'[^>]*>(.*?)</tr>", page)
    assert len(rows) == len(served.replicas)
    for (_i, cells), r in zip(rows, served.replicas, strict=True):
        text = re.findall(r"<td>([^<]*)</td>", cells)
        assert text[1] == " ".join(r.node_ids)
        assert text[2] == str(r.plan.num_stages)
        assert text[3] == f"{r.users:,}"
        assert text[7] == r.binding.value
        assert text[8] == f"{r.tokens_per_s:,.1f}"
        assert text[9] == f"{r.requests_per_s:.3g}"
        assert f"data-users='{r.users}' data-ttft-s='{r.ttft_s!r}'" in page
    assert f"{served.users:,} users" in page
    assert not re.search(r"(src|href)\s*=|https?:|url\(", page)


def test_many_users_are_sampled_evenly_with_both_ends():
    assert curve_users(5) == (1, 2, 3, 4, 5)
    drawn = curve_users(1000, limit=50)
    assert drawn[0] == 1 and drawn[-1] == 1000 and len(drawn) == 50
    gaps = {b - a for a, b in itertools.pairwise(drawn)}
    assert max(gaps) - min(gaps) <= 1


def test_a_calibrated_serve_plan_draws_its_calibrated_curve(tmp_path, capsys):
    """The CLI's page, with the generic calibration the CLI uses by default, ends each
    curve at the figures the same run printed as JSON."""
    fleet = tmp_path / "fleet.json"
    fleet.write_text(
        json.dumps(
            [
                {
                    "id": n.id,
                    "gpu_name": n.gpu_name,
                    "vram_bytes": n.vram_bytes,
                    "mem_bandwidth_gbps": n.mem_bandwidth_gbps,
                    "flops_estimate": n.flops_estimate,
                    "link_mbps": n.link_mbps,
                    "link_latency_ms": n.link_latency_ms,
                    "price_per_hour": n.price_per_hour,
                }
                for n in FLEET[:2]
            ]
        )
    )
    out = tmp_path / "serve.html"
    args = ["serve", "llama3.1:8b", "--nodes", str(fleet), "--prompt", "1024"]
    args += ["--output", "128", "--ttft", "1.5s", "--tpot", "60ms", "--html", str(out)]
    assert main([*args, "--json"]) == 0
    sp = ServePlan.from_json(capsys.readouterr().out)
    curves = _curves(out.read_text())
    assert len(curves) == 2 * len(sp.replicas) >= 2
    for i, r in enumerate(sp.replicas):
        assert curves[(i, "ttft")][1][-1] == pytest.approx(r.ttft_s, rel=1e-12)
        assert curves[(i, "tpot")][1][-1] == pytest.approx(r.tpot_s, rel=1e-12)
    # The first-order model gives other figures: the page used the run's calibration.
    first = replica_curve(_layout("llama3.1:8b"), sp.replicas[0], sp.workload)
    assert first[-1].tpot_s != pytest.approx(sp.replicas[0].tpot_s, rel=1e-6)


def _layout(name: str) -> ModelLayout:
    from stowplan.models import resolve_model

    return resolve_model(name)


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (.ci/run installs it)")
def test_serve_report_renders_in_headless_chromium_with_every_curve(tmp_path, served):
    page = write_serve_html_report(tmp_path / "serve.html", served, MODEL)
    url = Path(page).resolve().as_uri()
    dom = chromium(tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-check="ok"' in dom.stdout
    n = len(served.replicas)
    assert f"rendered {2 * n} curves for {n} replicas" in dom.stdout
    assert "Uncaught" not in dom.stderr and "Refused to" not in dom.stderr
    shot = tmp_path / "serve.png"
    run = chromium(tmp_path, f"--screenshot={shot}", url)
    assert run.returncode == 0, run.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
