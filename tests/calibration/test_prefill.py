"""Calibrated prefill: the shipped runs, the fit per device, the range outside the data and
the leave-one-out fidelity."""

from __future__ import annotations

import statistics

import pytest

from stowplan.calibration.prefill import (
    PrefillRun,
    leave_one_out,
    prefill_efficiency,
    published_prefill_runs,
)


def run(gpu: str, tokens_per_s: float, params: int = 10**9) -> PrefillRun:
    return PrefillRun(
        engine="llamacpp",
        gpu_name=gpu,
        model="m",
        quant="F16",
        params=params,
        blocks=10,
        attention_width=1000,
        prompt_tokens=512,
        tokens_per_s=tokens_per_s,
        source="test",
    )


def test_every_shipped_run_names_its_source_and_a_positive_speed() -> None:
    runs = published_prefill_runs()
    assert len(runs) >= 12
    assert all(r.source.startswith("https://github.com/") for r in runs)
    assert all(r.tokens_per_s > 0 and r.prompt_tokens == 512 for r in runs)


def test_a_run_measures_2n_plus_attention_flops_per_token() -> None:
    # 2 x 1e9 + 2 x 10 x 512 x 1000 = 2.01024e9 FLOPs a token; at 1000 tokens/s 2.01 TFLOP/s.
    assert run("RTX 4090", 1000).achieved_tflops == pytest.approx(2.01024)


def test_a_device_with_runs_gets_their_median_and_range() -> None:
    runs = [run("NVIDIA GeForce RTX 4090", t) for t in (1000, 2000, 4000)]
    fit = prefill_efficiency("NVIDIA GeForce RTX 4090", runs=runs)
    assert fit is not None and fit.fitted
    assert fit.tflops == pytest.approx(2 * 2.01024)
    assert (fit.low_tflops, fit.high_tflops) == pytest.approx((2.01024, 4 * 2.01024))
    assert fit.efficiency == pytest.approx(2 * 2.01024 / 165.2)


def test_outside_the_data_other_devices_share_of_peak_gives_value_and_range() -> None:
    runs = [run("NVIDIA GeForce RTX 4090", 1000), run("NVIDIA GeForce RTX 4090", 3000)]
    fit = prefill_efficiency("NVIDIA A100 80GB PCIe", runs=runs)
    assert fit is not None and not fit.fitted
    shares = [2.01024 / 165.2, 3 * 2.01024 / 165.2]
    assert fit.efficiency == pytest.approx(statistics.median(shares))
    assert (fit.low_tflops, fit.high_tflops) == pytest.approx((shares[0] * 312, shares[1] * 312))
    assert "outside the data" in fit.source


def test_apple_devices_without_a_peak_scale_by_bandwidth_among_apple_runs() -> None:
    runs = [run("Apple M2 Ultra", 1000), run("NVIDIA GeForce RTX 4090", 1000)]
    fit = prefill_efficiency("Apple M2 Max", runs=runs)
    assert fit is not None and fit.efficiency is None
    assert fit.tflops == pytest.approx(2.01024 / 800 * 400)


def test_a_device_with_no_runs_and_no_figure_gets_none() -> None:
    assert prefill_efficiency("Mystery GPU 9000", runs=[run("RTX 4090", 1000)]) is None


def test_leave_one_out_predicts_the_published_runs_within_25_percent_median() -> None:
    pairs = leave_one_out()
    errors = [abs(p - r.tokens_per_s) / r.tokens_per_s for r, p in pairs if p is not None]
    assert len(errors) == len(pairs)
    assert statistics.median(errors) <= 0.25
