"""A small, self-contained numpy decode of block-shaped matrices, single-stage and pipelined.

Each block holds four matrices shaped like a transformer layer's projections
(``h×3h`` attention in, ``h×h`` attention out, ``h×4h`` up, ``4h×h`` down); a
decode step multiplies a ``batch×h`` activation through every block, so it
reads every weight once, as real decode does.  The pipelined run places a
block range on each stage thread, passes activations through queues, and
keeps ``microbatches`` independent sequences in flight.  It measures this
CPU; calibration fits and ranking checks compare predictions against it.

numpy is imported lazily (extra ``probe``).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stowplan.errors import DependencyError, InputError

__all__ = [
    "PipelineRun",
    "block_bytes",
    "make_blocks",
    "measure_read_bandwidth_gbps",
    "run_pipeline",
    "time_decode",
]

_MATRICES_PER_H2 = 3 + 1 + 4 + 4
"""h*3h + h*h + h*4h + 4h*h = 12 h^2 weights per block."""


def _np() -> Any:
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy is in the dev extra
        raise DependencyError("numpy", "probe") from None
    return numpy


def block_bytes(hidden: int, itemsize: int = 4) -> int:
    """Weight bytes of one block of width ``hidden``."""
    return _MATRICES_PER_H2 * hidden * hidden * itemsize


def make_blocks(
    num_blocks: int, hidden: int, *, seed: int = 0, dtype: str = "float32"
) -> list[tuple[Any, ...]]:
    """``num_blocks`` blocks of ``dtype`` matrices, scaled to keep activations bounded."""
    if num_blocks < 1 or hidden < 8:
        raise InputError("blocks", (num_blocks, hidden), "need num_blocks >= 1 and hidden >= 8")
    np = _np()
    rng = np.random.default_rng(seed)
    shapes = ((hidden, 3 * hidden), (hidden, hidden), (hidden, 4 * hidden), (4 * hidden, hidden))
    return [
        tuple(
            (rng.standard_normal(s, dtype=np.float32) / np.float32(np.sqrt(s[0]))).astype(dtype)
            for s in shapes
        )
        for _ in range(num_blocks)
    ]


def _step(blocks: Sequence[tuple[Any, ...]], x: Any) -> Any:
    np = _np()
    h = x.shape[1]
    if blocks:
        x = x.astype(blocks[0][0].dtype, copy=False)  # a stage computes in its weights' dtype
    for w_in, w_out, w_up, w_down in blocks:
        qkv = x @ w_in
        x = x + qkv[:, :h] @ w_out
        x = x + np.maximum(x @ w_up, 0) @ w_down
        x = x / (np.sqrt((x * x).mean(axis=1, keepdims=True)) + 1e-6)
    return x


def time_decode(
    blocks: Sequence[tuple[Any, ...]], *, tokens: int = 8, batch: int = 1, repeats: int = 3
) -> float:
    """Seconds per decode step through all ``blocks`` on one thread.

    Every step is timed on its own and the fastest of ``tokens * repeats``
    steps is returned: on a shared machine interference only ever adds time,
    so the least-disturbed step is the device's speed.
    """
    np = _np()
    h = blocks[0][0].shape[0]
    x = np.ones((batch, h), dtype=np.float32)
    x = _step(blocks, x)  # warm-up
    samples = []
    for _ in range(tokens * repeats):
        t0 = time.perf_counter()
        x = _step(blocks, x)
        samples.append(time.perf_counter() - t0)
    return float(min(samples))


def measure_read_bandwidth_gbps(size_bytes: int = 256 * 1024**2, repeats: int = 5) -> float:
    """Best-of-``repeats`` read bandwidth (GB/s) summing a float32 array of ``size_bytes``."""
    np = _np()
    a = np.ones(size_bytes // 4, dtype=np.float32)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - t0)
    return float(a.nbytes / best / 1e9)


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineRun:
    """A measured pipelined decode."""

    bounds: tuple[int, ...]
    """Stage boundaries: stage s owns blocks [bounds[s], bounds[s+1])."""
    microbatches: int
    tokens: int
    wall_s: float
    token_latencies_s: tuple[float, ...] = ()
    """Per step: time from entering stage 0 to leaving the last stage."""

    @property
    def tokens_per_s(self) -> float:
        """Pipelined throughput over the whole run."""
        return self.tokens / self.wall_s

    @property
    def time_per_token_s(self) -> float:
        """The fastest single-step latency (interference only ever adds time)."""
        return min(self.token_latencies_s)


def run_pipeline(
    blocks: Sequence[tuple[Any, ...]],
    bounds: Sequence[int],
    *,
    tokens: int = 16,
    microbatches: int | None = None,
    timeout_s: float = 60.0,
) -> PipelineRun:
    """Decode ``tokens`` steps through stage threads split at ``bounds``.

    ``microbatches`` independent sequences (default: one per stage) are in
    flight; each finished step of a sequence feeds its next step to stage 0.
    """
    np = _np()
    bounds = tuple(bounds)
    if bounds[0] != 0 or bounds[-1] != len(blocks) or list(bounds) != sorted(set(bounds)):
        raise InputError("bounds", bounds, f"must rise strictly from 0 to {len(blocks)}")
    stages = len(bounds) - 1
    m = microbatches or stages
    h = blocks[0][0].shape[0]
    queues: list[queue.Queue[tuple[int, Any] | None]] = [queue.Queue() for _ in range(stages + 1)]

    def worker(s: int) -> None:
        mine = blocks[bounds[s] : bounds[s + 1]]
        while True:
            item = queues[s].get()
            if item is None:
                queues[s + 1].put(None)
                return
            seq, x = item
            queues[s + 1].put((seq, _step(mine, x)))

    threads = [threading.Thread(target=worker, args=(s,), daemon=True) for s in range(stages)]
    for t in threads:
        t.start()
    # Warm-up: one step per sequence, untimed.
    xs = [np.full((1, h), 1.0 + i, dtype=np.float32) for i in range(m)]
    for i, x in enumerate(xs):
        queues[0].put((i, x))
    for _ in range(m):
        queues[stages].get(timeout=timeout_s)
    issued = 0
    started: dict[int, float] = {}
    latencies: list[float] = []
    t0 = time.perf_counter()
    for i in range(min(m, tokens)):
        started[i] = time.perf_counter()
        queues[0].put((i, xs[i]))
        issued += 1
    for _ in range(tokens):
        seq, x = queues[stages].get(timeout=timeout_s)  # type: ignore[misc]
        now = time.perf_counter()
        latencies.append(now - started[seq])
        if issued < tokens:
            started[seq] = time.perf_counter()
            queues[0].put((seq, x))
            issued += 1
    wall = time.perf_counter() - t0
    queues[0].put(None)
    for t in threads:
        t.join(timeout=timeout_s)
    return PipelineRun(
        bounds=bounds,
        microbatches=m,
        tokens=tokens,
        wall_s=wall,
        token_latencies_s=tuple(latencies),
    )
