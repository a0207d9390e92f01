"""Ranking check: the calibrated model orders real pipelined numpy runs as they measure.

Two emulated devices on this CPU: a fast one holding float32 blocks and a slow
one holding float64 blocks (twice the bytes per block).  Candidate plans split
8 blocks between them at 7/1, 4/4 and 1/7; each device's figures are fitted
from its own single-stage runs, the plans are then run as real two-stage
pipelines and their predicted order must match the measured one.
"""

from __future__ import annotations

import pytest

from stowplan.calibration import Measurement, fit_device, shipped_calibration, stage_time_s
from stowplan.calibration.numpy_decode import (
    block_bytes,
    make_blocks,
    run_pipeline,
    time_decode,
)

np = pytest.importorskip("numpy")

HIDDEN = 256
BANDWIDTH_GBPS = 10.0  # any scale: the fitted fraction absorbs it


def _fit(blocks: list[tuple[object, ...]], itemsize: int, name: str):  # type: ignore[no-untyped-def]
    prior = shipped_calibration("generic").devices[0]
    runs = [
        Measurement(
            tokens_per_s=1 / time_decode(blocks[:n], tokens=6, repeats=2),  # type: ignore[arg-type]
            read_bytes=n * block_bytes(HIDDEN, itemsize),
            num_blocks=n,
        )
        for n in (2, 8)
    ]
    return fit_device(runs, bandwidth_gbps=BANDWIDTH_GBPS, prior=prior, device=name).device


SPLITS = (7, 4, 1)
ROUNDS = 5


def _predicted(dev_fast: object, dev_slow: object, k: int) -> float:
    return stage_time_s(
        read_bytes=k * block_bytes(HIDDEN, 4),
        params=0,
        num_blocks=k,
        bandwidth_gbps=BANDWIDTH_GBPS,
        tflops=0.0,
        hops=1,
        device=dev_fast,  # type: ignore[arg-type]
    ) + stage_time_s(
        read_bytes=(8 - k) * block_bytes(HIDDEN, 8),
        params=0,
        num_blocks=8 - k,
        bandwidth_gbps=BANDWIDTH_GBPS,
        tflops=0.0,
        hops=1,
        device=dev_slow,  # type: ignore[arg-type]
    )


def test_predicted_order_of_splits_is_the_order_of_the_bytes_each_token_reads() -> None:
    # Deterministic: the bytes a token reads through each split, counted from the
    # arrays the pipeline runs, order the splits as the calibrated model predicts.
    fast = make_blocks(8, HIDDEN)
    slow = make_blocks(8, HIDDEN, seed=1, dtype="float64")
    dev_fast, dev_slow = _fit(fast, 4, "fast"), _fit(slow, 8, "slow")
    read = {k: sum(a.nbytes for b in fast[:k] + slow[k:] for a in b) for k in SPLITS}
    predicted = {k: _predicted(dev_fast, dev_slow, k) for k in SPLITS}
    assert read == {
        k: k * block_bytes(HIDDEN, 4) + (8 - k) * block_bytes(HIDDEN, 8) for k in SPLITS
    }
    assert sorted(SPLITS, key=read.__getitem__) == [7, 4, 1]
    assert sorted(SPLITS, key=predicted.__getitem__) == [7, 4, 1]


def test_measured_ratio_of_splits_agrees_with_the_predicted_ratio() -> None:
    # Wall-clock, made robust: the splits run interleaved, round after round, so load on
    # a shared machine falls on all of them; the medians' ratio (1/7 over 7/1) is compared
    # with the predicted one within a factor of 2 (never their order on a single run).
    fast = make_blocks(8, HIDDEN)
    slow = make_blocks(8, HIDDEN, seed=1, dtype="float64")
    dev_fast, dev_slow = _fit(fast, 4, "fast"), _fit(slow, 8, "slow")
    runs: dict[int, list[float]] = {k: [] for k in SPLITS}
    for _ in range(ROUNDS):
        for k in SPLITS:
            run = run_pipeline(fast[:k] + slow[k:], (0, k, 8), tokens=12, microbatches=1)
            runs[k].append(run.time_per_token_s)
    measured = float(np.median(runs[1]) / np.median(runs[7]))
    predicted = _predicted(dev_fast, dev_slow, 1) / _predicted(dev_fast, dev_slow, 7)
    assert predicted > 1
    assert 0.5 <= measured / predicted <= 2.0, (measured, predicted, runs)
