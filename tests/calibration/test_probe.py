"""Device entries from a hardware passport, read through the calibration layer's protocols."""

from __future__ import annotations

import pytest

from stowplan.calibration import Provenance, assumed, probe_entries, shipped_calibration
from tests.common.passports import Cap, passport


def test_a_gpu_gets_its_measured_rate_over_the_spec_peak_and_a_cpu_the_rate_itself() -> None:
    prior = shipped_calibration("llamacpp")
    gpu, cpu = probe_entries(passport(Cap("gpu0", 900.0), Cap("cpu", 20.0)), prior)
    assert (gpu.device, gpu.match) == ("rtx-4090", ("rtx", "4090"))
    f32 = gpu.fraction("f32")
    assert (f32.value, f32.provenance) == (round(900 / 1008, 4), Provenance.MEASURED)
    assert f32.value == 0.8929
    assert f32.source == (
        "stowplan probe: synthetic f32 GEMV 50000x50000, 11.111 ms median of 5, 900.0 GB/s, "
        "passport 0123456789ab / spec 1008 GB/s"
    )
    # Every other figure is the prior's entry for the device, labelled assumed.
    shipped = prior.for_device("RTX 4090")
    assert shipped is not None
    assert gpu.fraction("q4_0") == assumed(shipped.fraction("q4_0"))
    assert gpu.fraction("q4_0").provenance is Provenance.ASSUMED
    assert gpu.fraction("q4_0").source.startswith("prior (fitted): ")
    assert gpu.block_overhead_s == assumed(shipped.block_overhead_s)
    assert gpu.hop_overhead_s == assumed(shipped.hop_overhead_s)
    assert gpu.compute_efficiency == assumed(shipped.compute_efficiency)
    assert cpu.device == "ryzen-9-7950x"
    assert cpu.fraction("f32").value == 1.0
    assert cpu.fraction("f32").source.endswith("; no spec peak: the measured rate is the bandwidth")


def test_a_decode_run_gives_the_f16_fraction_and_the_measured_block_cost() -> None:
    run = Cap("gpu0", 900.0, decode_gbps=806.4, decode_block_s=4e-5)
    (gpu,) = probe_entries(passport(run), shipped_calibration("vllm"))
    f16 = gpu.fraction("bf16")
    assert (f16.value, f16.provenance) == (0.8, Provenance.MEASURED)
    assert (gpu.block_overhead_s.value, gpu.block_overhead_s.provenance) == (
        4e-5,
        Provenance.MEASURED,
    )
    assert gpu.block_overhead_s.source == (
        "stowplan probe decode run: f16 block GEMVs, 806.4 GB/s, 40.0 us/block, "
        "passport 0123456789ab"
    )


@pytest.mark.parametrize(("gbps", "expected"), [(5000.0, 4.0), (1008.0, 1.0)])
def test_the_measured_fraction_is_capped(gbps: float, expected: float) -> None:
    (gpu,) = probe_entries(passport(Cap("gpu0", gbps)), shipped_calibration("generic"))
    assert gpu.fraction("f32").value == expected
