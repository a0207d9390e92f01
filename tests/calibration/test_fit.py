"""Fitting recovers known figures from synthetic measurements."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stowplan.calibration import (
    DeviceCalibration,
    Figure,
    Measurement,
    Provenance,
    fit_device,
    stage_time_s,
)
from stowplan.calibration.profile import assumed
from stowplan.errors import InputError

PRIOR = DeviceCalibration(
    device="*",
    bandwidth_fraction={"default": Figure(value=0.8, source="prior")},
    block_overhead_s=Figure(value=2e-5, source="prior"),
    hop_overhead_s=Figure(value=1e-5, source="prior"),
    compute_efficiency=Figure(value=0.83, source="prior"),
)
BW = 1000.0


def _truth(f16: float, q4: float, block: float, hop: float) -> DeviceCalibration:
    return DeviceCalibration(
        device="truth",
        bandwidth_fraction={
            "default": Figure(value=f16),
            "f16": Figure(value=f16),
            "q4": Figure(value=q4),
        },
        block_overhead_s=Figure(value=block),
        hop_overhead_s=Figure(value=hop),
    )


def _measure(
    truth: DeviceCalibration, read: int, blocks: int, dtype: str, hops: int = 0, tp: int = 1
) -> Measurement:
    """The run ``truth`` would measure on ``tp`` GPUs of BW GB/s each."""
    t = stage_time_s(
        read_bytes=read,
        params=0,
        num_blocks=blocks,
        bandwidth_gbps=BW * tp,
        tflops=0.0,
        dtype=dtype,
        hops=hops,
        tensor_parallel=tp,
        device=truth,
    )
    return Measurement(
        tokens_per_s=1 / t,
        read_bytes=read,
        num_blocks=blocks,
        dtype=dtype,
        hops=hops,
        tensor_parallel=tp,
    )


def _runs(truth: DeviceCalibration) -> list[Measurement]:
    runs = []
    for size_gb, blocks in ((1.0, 16), (4.0, 32), (14.0, 32), (40.0, 80)):
        for dtype, scale in (("F16", 1.0), ("Q4_0", 0.28)):
            for hops in (0, 1, 3):
                runs.append(_measure(truth, round(size_gb * scale * 1e9), blocks, dtype, hops))
    return runs


@given(
    f16=st.floats(0.4, 1.0),
    q4=st.floats(0.3, 1.0),
    block=st.floats(0.0, 3e-4),
    hop=st.floats(0.0, 2e-3),
)
def test_fit_recovers_the_figures_that_generated_the_runs(
    f16: float, q4: float, block: float, hop: float
) -> None:
    result = fit_device(
        _runs(_truth(f16, q4, block, hop)),
        bandwidth_gbps=BW,
        prior=PRIOR,
        device="gpu",
        prior_weight=1e-8,
    )
    d = result.device
    assert d.fraction("F16").value == pytest.approx(f16, rel=2e-3)
    assert d.fraction("Q4_0").value == pytest.approx(q4, rel=2e-3)
    assert d.block_overhead_s.value == pytest.approx(block, abs=2e-7)
    assert d.hop_overhead_s.value == pytest.approx(hop, abs=2e-6)
    assert max(abs(e) for e in result.relative_errors) < 1e-3


def test_fitted_figures_say_so_and_untouched_ones_keep_their_source() -> None:
    result = fit_device(
        _runs(_truth(0.7, 0.5, 1e-4, 0.0)),
        bandwidth_gbps=BW,
        prior=PRIOR,
        device="gpu",
        source="my runs",
    )
    d = result.device
    assert d.fraction("q4").provenance is Provenance.FITTED
    assert d.fraction("q4").source == "my runs"
    # What the runs did not determine keeps the prior's value, labelled assumed.
    assert d.bandwidth_fraction["default"].provenance is Provenance.ASSUMED
    assert d.bandwidth_fraction["default"].source == "prior (table): prior"
    assert d.compute_efficiency == assumed(PRIOR.compute_efficiency)
    assert d.compute_efficiency.value == PRIOR.compute_efficiency.value


def test_the_prior_labels_stay_when_asked() -> None:
    d = fit_device(
        _runs(_truth(0.7, 0.5, 1e-4, 0.0)),
        bandwidth_gbps=BW,
        prior=PRIOR,
        device="gpu",
        label_assumed=False,
    ).device
    assert d.bandwidth_fraction["default"] == PRIOR.bandwidth_fraction["default"]
    assert d.compute_efficiency == PRIOR.compute_efficiency


def test_one_f16_decode_run_fits_only_what_it_measures() -> None:
    """One run on one GPU, f16, no hops: its fraction and the block cost are fitted; the
    other dtype classes, the hop, the collective and the compute figures are assumed."""
    prior = DeviceCalibration(
        device="gpu",
        bandwidth_fraction={
            "default": Figure(value=0.8, provenance=Provenance.TABLE, source="datasheet"),
            "f16": Figure(value=0.7, provenance=Provenance.FITTED, source="published runs"),
            "q8": Figure(value=0.6, provenance=Provenance.FITTED, source="published runs"),
        },
        block_overhead_s=Figure(value=1e-4, provenance=Provenance.FITTED, source="published"),
        hop_overhead_s=Figure(value=1e-5, provenance=Provenance.FITTED, source="published"),
        collective_overhead_s=Figure(value=7e-6, provenance=Provenance.TABLE, source="x"),
        compute_efficiency=Figure(value=0.6, provenance=Provenance.TABLE, source="y"),
    )
    run = Measurement(tokens_per_s=50.0, read_bytes=16 * 10**9, num_blocks=32, dtype="bf16")
    d = fit_device([run], bandwidth_gbps=BW, prior=prior, device="gpu").device
    labels = {
        **{f"fraction {c}": f.provenance for c, f in d.bandwidth_fraction.items()},
        "block": d.block_overhead_s.provenance,
        "hop": d.hop_overhead_s.provenance,
        "collective": d.collective_overhead_s.provenance,
        "compute": d.compute_efficiency.provenance,
    }
    fitted, assumed_ = Provenance.FITTED, Provenance.ASSUMED
    assert labels == {
        "fraction f16": fitted,
        "block": fitted,
        "fraction default": assumed_,
        "fraction q8": assumed_,
        "hop": assumed_,
        "collective": assumed_,
        "compute": assumed_,
    }
    assert d.fraction("q8").value == 0.6
    assert d.fraction("q8").source == "prior (fitted): published runs"


def test_a_single_run_is_split_by_the_prior_and_reproduced() -> None:
    run = Measurement(tokens_per_s=100.0, read_bytes=7_000_000_000, num_blocks=32, dtype="Q8_0")
    result = fit_device([run], bandwidth_gbps=BW, prior=PRIOR, device="gpu")
    assert result.predicted_tokens_per_s[0] == pytest.approx(100.0, rel=1e-3)
    assert 0 < result.device.fraction("q8").value <= 4.0
    assert result.device.hop_overhead_s == assumed(PRIOR.hop_overhead_s)


def test_fixed_costs_never_go_negative() -> None:
    # Faster-than-bandwidth small runs would want a negative block cost.
    runs = [
        Measurement(
            tokens_per_s=1 / (r * 1.0),
            read_bytes=round(r * BW * 1e9 * 0.9),
            num_blocks=n,
            dtype="F16",
        )
        for r, n in ((0.001, 100), (0.01, 2))
    ]
    d = fit_device(runs, bandwidth_gbps=BW, prior=PRIOR, device="gpu", prior_weight=1e-8).device
    assert d.block_overhead_s.value >= 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"measurements": []}, "measurements=0: need at least one decode measurement"),
        ({"bandwidth_gbps": 0.0}, "bandwidth_gbps=0.0: must be a finite number > 0"),
    ],
)
def test_bad_fit_inputs(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {
        "measurements": [Measurement(tokens_per_s=1.0, read_bytes=1, num_blocks=1)],
        "bandwidth_gbps": BW,
        "prior": PRIOR,
        "device": "gpu",
    }
    args.update(kwargs)
    with pytest.raises(InputError) as exc:
        fit_device(**args)  # type: ignore[arg-type]
    assert str(exc.value) == message


def test_measurement_rejects_non_positive_speed() -> None:
    with pytest.raises(InputError) as exc:
        Measurement(tokens_per_s=0.0, read_bytes=1, num_blocks=1, label="run1")
    assert str(exc.value) == "run1.tokens_per_s=0.0: must be a finite number > 0"


@given(
    frac=st.floats(0.4, 1.0),
    block=st.floats(1e-6, 3e-4),
    coll=st.floats(0.0, 1e-4),
)
def test_fit_recovers_the_collective_cost_of_tensor_parallel_runs(
    frac: float, block: float, coll: float
) -> None:
    truth = DeviceCalibration(
        device="truth",
        bandwidth_fraction={"default": Figure(value=frac)},
        block_overhead_s=Figure(value=block),
        collective_overhead_s=Figure(value=coll),
    )
    runs = [
        _measure(truth, round(size_gb * 1e9), blocks, "bf16", tp=tp)
        for size_gb, blocks in ((2.0, 16), (16.0, 32), (140.0, 80))
        for tp in (1, 2, 4, 8)
    ]
    result = fit_device(runs, bandwidth_gbps=BW, prior=PRIOR, device="x", prior_weight=1e-6)
    d = result.device
    assert d.fraction("bf16").value == pytest.approx(frac, rel=2e-3)
    assert d.block_overhead_s.value == pytest.approx(block, rel=2e-3, abs=2e-8)
    assert d.collective_overhead_s.value == pytest.approx(coll, rel=2e-3, abs=2e-8)
    assert d.collective_overhead_s.provenance is Provenance.FITTED
    assert result.median_abs_error < 1e-3


def test_single_gpu_runs_keep_the_prior_collective_cost() -> None:
    prior = DeviceCalibration(
        device="*",
        bandwidth_fraction={"default": Figure(value=0.8)},
        collective_overhead_s=Figure(value=7e-6, source="prior"),
    )
    runs = [
        Measurement(tokens_per_s=50.0, read_bytes=16 * 10**9, num_blocks=32, dtype="bf16"),
        Measurement(tokens_per_s=180.0, read_bytes=4 * 10**9, num_blocks=16, dtype="bf16"),
    ]
    d = fit_device(runs, bandwidth_gbps=BW, prior=prior, device="x").device
    assert d.collective_overhead_s == assumed(prior.collective_overhead_s)


def test_measurement_refuses_a_tensor_parallel_degree_below_one() -> None:
    with pytest.raises(InputError, match="tensor_parallel"):
        Measurement(tokens_per_s=1.0, read_bytes=1, num_blocks=1, tensor_parallel=0)
