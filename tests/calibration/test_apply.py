"""The calibrated stage time: first-order without a profile, each term with one."""

from __future__ import annotations

import pytest

from stowplan.calibration import DeviceCalibration, Figure, calibrate_stage, stage_time_s

DEVICE = DeviceCalibration(
    device="x",
    bandwidth_fraction={"default": Figure(value=0.8), "q4": Figure(value=0.5)},
    block_overhead_s=Figure(value=1e-4),
    hop_overhead_s=Figure(value=2e-3),
    compute_efficiency=Figure(value=0.5),
)


def test_without_a_profile_it_is_the_first_order_model() -> None:
    est = calibrate_stage(
        read_bytes=10**9,
        params=5 * 10**8,
        num_blocks=32,
        bandwidth_gbps=1000.0,
        tflops=100.0,
        hops=1,
    )
    assert est.memory_s == pytest.approx(1e-3)
    assert est.compute_s == pytest.approx(1e-5)
    assert est.time_s == pytest.approx(1e-3)
    assert not est.calibrated and est.bound == "memory"


def test_each_calibration_term_applies() -> None:
    t = stage_time_s(
        read_bytes=10**9,
        params=0,
        num_blocks=10,
        bandwidth_gbps=1000.0,
        tflops=0.0,
        dtype="Q4_K_M",
        hops=2,
        device=DEVICE,
    )
    assert t == pytest.approx(1e-3 / 0.5 + 10 * 1e-4 + 2 * 2e-3)
    t16 = stage_time_s(
        read_bytes=10**9,
        params=0,
        num_blocks=0,
        bandwidth_gbps=1000.0,
        tflops=0.0,
        dtype="bf16",
        device=DEVICE,
    )
    assert t16 == pytest.approx(1e-3 / 0.8)


def test_compute_bound_stage_uses_compute_efficiency() -> None:
    est = calibrate_stage(
        read_bytes=10**6,
        params=10**9,
        num_blocks=0,
        bandwidth_gbps=1000.0,
        tflops=100.0,
        batch=64,
        device=DEVICE,
    )
    assert est.bound == "compute"
    assert est.compute_s == pytest.approx(2 * 10**9 * 64 / (100e12 * 0.5))


def test_bad_inputs_are_named() -> None:
    with pytest.raises(ValueError, match=r"bandwidth_gbps=0.0: must be > 0"):
        stage_time_s(read_bytes=1, params=0, num_blocks=1, bandwidth_gbps=0.0, tflops=0.0)


def test_node_factors_pick_the_matching_entry_and_describe_their_provenance() -> None:
    from stowplan.calibration import describe_calibration, node_calibration, shipped_calibration

    cal = shipped_calibration("llamacpp")
    rtx = node_calibration(cal, "NVIDIA GeForce RTX 3090", "q4_0")
    entry = cal.for_device("RTX 3090")
    assert entry is not None
    assert rtx.device == "rtx-3090"
    # Applied in datasheet order with the spec table's GPUs: the stored figures, to 0.1 %.
    assert rtx.bandwidth_fraction == pytest.approx(entry.fraction("Q4_0").value, rel=1e-3)
    assert rtx.block_overhead_s == pytest.approx(entry.block_overhead_s.value, rel=1e-3)
    assert node_calibration(None, "RTX 3090", "bf16") == type(rtx)()
    text = describe_calibration(cal, ["RTX 3090", "RTX 3090", "H100"], "q4_0")
    assert text == (
        "engine llamacpp, calibrated on 35 published runs: "
        "llamacpp-default [rtx-3090: bandwidth fitted, block fitted, hop fitted, compute table; "
        "*: bandwidth fitted, block fitted, hop fitted, compute table]"
    )
