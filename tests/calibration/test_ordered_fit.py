"""Fitting GPU families jointly in datasheet order: the figures come out in order, and the
devices' own fits are kept where they already are."""

from __future__ import annotations

from stowplan.calibration import Measurement, fit_device
from stowplan.calibration.order import Datasheet
from stowplan.calibration.ordered_fit import DeviceRuns, fit_in_order
from stowplan.calibration.profile import DeviceCalibration, Figure

FAST = Datasheet(bandwidth_gbps=2000.0, tflops=700.0)
SLOW = Datasheet(bandwidth_gbps=1000.0, tflops=160.0)
GB = 1_000_000_000
PRIOR = DeviceCalibration(
    device="*",
    bandwidth_fraction={"default": Figure(value=0.8, source="prior")},
    block_overhead_s=Figure(value=2e-5, source="prior"),
    hop_overhead_s=Figure(value=1e-5, source="prior"),
    compute_efficiency=Figure(value=0.83, source="prior"),
)


def _runs(block_us: float, fraction: float, bw: float) -> tuple[Measurement, ...]:
    """Runs of 3 and 14 GB over 28 and 40 blocks on a ``bw`` GB/s device."""
    return tuple(
        Measurement(
            tokens_per_s=1 / (size / (bw * 1e9 * fraction) + blocks * block_us * 1e-6),
            read_bytes=round(size * 1000 / bw),
            num_blocks=blocks,
            dtype="q4_k_m",
        )
        for size, blocks in ((3 * GB, 28), (14 * GB, 40))
    )


def _device(runs: tuple[Measurement, ...]) -> DeviceRuns:
    return DeviceRuns(
        measurements=runs,
        bandwidth_gbps=1000.0,
        prior=PRIOR,
        max_fraction=1.0,
    )


def test_devices_already_in_order_keep_their_own_fits() -> None:
    fast, slow = _runs(10.0, 0.8, 2000.0), _runs(20.0, 0.8, 1000.0)
    assert fit_in_order([_device(fast), _device(slow)], [FAST, SLOW]) == [{}, {}]


def test_a_faster_device_with_a_larger_block_cost_gets_figures_in_order() -> None:
    # The datacenter card's build pays 120 us a block, the consumer card's 20 us.
    fast, slow = _runs(120.0, 0.9, 2000.0), _runs(20.0, 0.8, 1000.0)
    held = fit_in_order([_device(fast), _device(slow)], [FAST, SLOW])
    entries = [
        fit_device(
            runs,
            bandwidth_gbps=1000.0,
            prior=PRIOR,
            device=name,
            max_fraction=1.0,
            fixed=h or None,
        ).device
        for runs, name, h in ((fast, "fast", held[0]), (slow, "slow", held[1]))
    ]
    fast_e, slow_e = entries
    assert fast_e.block_overhead_s.value <= slow_e.block_overhead_s.value * (1 + 1e-6)
    q4_fast = FAST.bandwidth_gbps * fast_e.fraction("q4_k_m").value
    q4_slow = SLOW.bandwidth_gbps * slow_e.fraction("q4_k_m").value
    assert q4_fast >= q4_slow * (1 - 1e-4)
    # The consumer card, with the smaller cost, keeps most of its fit: the block cost the
    # pair shares lies nearer its 20 us than the pair's mean, 70 us.
    assert slow_e.block_overhead_s.value < 70e-6
