"""Calibrated prefill: the share of the 16-bit peak published prompt-processing runs
reach applies to a node's FLOPs in TTFT0; first order and engines without runs keep the
decode rate; serve names the figure, its range and its source."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stowplan import Constraints, NodeDescriptor, Workload, serve
from stowplan.calibration.prefill import prefill_efficiency
from stowplan.calibration.store import shipped_calibration
from stowplan.cost import CostModel
from stowplan.cost.serving import pipeline_prefill
from stowplan.models import resolve_model

NODE = NodeDescriptor(
    id="g0", gpu_name="RTX 4090", vram_bytes=24 * 2**30, flops_estimate=165.0, link_mbps=1000
)
MODEL = resolve_model("llama3.1:8b")


def _ttft0(calibration, node=NODE, prompt=2048):
    cm = CostModel(MODEL, [node], Constraints(calibration=calibration))
    return cm, pipeline_prefill(cm, [0], [0, MODEL.num_blocks], prompt).ttft0_s


def test_first_order_prefill_runs_at_the_decode_compute_rate():
    cm, _ = _ttft0(None)
    assert cm.inv_prefill_flops == cm.inv_flops
    assert cm.prefill_sources == (None,)


def test_the_fitted_share_of_the_peak_applies_to_the_nodes_flops():
    eff = prefill_efficiency("RTX 4090", "llamacpp")
    assert eff is not None and eff.fitted and eff.efficiency is not None
    cm, t = _ttft0(shipped_calibration("generic"))
    assert cm.inv_prefill_flops[0] == pytest.approx(1 / (165e12 * eff.efficiency))
    assert cm.prefill_sources[0] is not None and "fitted" in cm.prefill_sources[0]
    _, t0 = _ttft0(None)
    # A 2,048-token prompt of an 8B model is compute-bound on this card: TTFT0 scales
    # by the efficiency exactly.
    assert t == pytest.approx(t0 / eff.efficiency, rel=1e-9)
    # A node twice as fast computes the prompt twice as fast.
    _, t2 = _ttft0(shipped_calibration("generic"), replace(NODE, flops_estimate=330.0))
    assert t2 == pytest.approx(t / 2, rel=1e-9)


def test_an_engine_without_published_prefill_runs_keeps_the_decode_rate():
    cm, _ = _ttft0(shipped_calibration("vllm"))
    assert cm.inv_prefill_flops == cm.inv_flops
    sp = serve(
        MODEL,
        [NODE],
        Workload(prompt_tokens=512, output_tokens=128, ttft_s=2.0, tpot_s=0.1),
        Constraints(calibration=shipped_calibration("vllm")),
    )
    assert any("the decode compute rate (no published vllm prefill runs" in n for n in sp.notes)


def test_serve_names_the_prefill_figure_its_range_and_source():
    w = Workload(prompt_tokens=2048, output_tokens=256, ttft_s=1.0, tpot_s=0.05)
    sp = serve(MODEL, [NODE], w, Constraints(calibration=shipped_calibration("generic")))
    (line,) = [n for n in sp.notes if n.startswith("prefill on RTX 4090")]
    eff = prefill_efficiency("RTX 4090", "llamacpp")
    assert f"{eff.tflops:.3g} TFLOP/s a GPU" in line
    assert f"range {eff.low_tflops:.3g}–{eff.high_tflops:.3g}" in line
    assert "fitted: median of" in line
    # The replica's TTFT0 is the calibrated one.
    _, t = _ttft0(shipped_calibration("generic"))
    assert sp.replicas[0].prefill_s == pytest.approx(t, rel=1e-9)
