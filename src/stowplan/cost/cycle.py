"""The pipeline's formulas: microbatches, the cycle, tokens/s and $ per token.

``U`` concurrent sequences on ``S`` stages form ``m = min(U, S)`` microbatches of
``b = ⌈U / m⌉`` sequences; every sequence gets one token per cycle, ``cycle =
max(Σ_s t(s) + hops, m · max_s t(s))``, so tokens/s = U / cycle.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "Evaluation",
    "cycle_seconds",
    "microbatches",
    "served_tokens_per_s",
    "usd_per_million_tokens",
]


def served_tokens_per_s(batch: int, time_per_token_s: float, tokens_per_s: float) -> float:
    """What the workload gets: 1/time per token at batch 1, ``tokens_per_s`` above (which
    the cost model computes as U / cycle)."""
    if batch == 1:
        return 1.0 / time_per_token_s if time_per_token_s > 0 else math.inf
    return tokens_per_s


def usd_per_million_tokens(price_per_hour: float | None, tokens_per_s: float) -> float | None:
    """Dollars per million tokens served at ``tokens_per_s`` (None without a price or a
    finite positive rate)."""
    if price_per_hour is None or not 0 < tokens_per_s < math.inf:
        return None
    return price_per_hour / (tokens_per_s * 3600) * 1e6


def microbatches(sequences: int, stages: int) -> tuple[int, int]:
    """``(m, b)``: ``sequences`` concurrent sequences on ``stages`` stages form ``m =
    min(sequences, stages)`` microbatches of ``b = ⌈sequences / m⌉``."""
    m = max(1, min(sequences, stages))
    return m, -(-sequences // m)


def cycle_seconds(stage_time_s: Sequence[float], hops_s: float, num_microbatches: int) -> float:
    """Seconds between two tokens of one sequence: ``max(Σ t + hops, m · max t)``."""
    if not stage_time_s:
        return 0.0
    return max(sum(stage_time_s) + hops_s, num_microbatches * max(stage_time_s))


@dataclass(frozen=True, slots=True, kw_only=True)
class Evaluation:
    """The cost model's numbers for one pipeline (nodes in stage order + block bounds)."""

    stage_time_s: tuple[float, ...]
    """Per stage, seconds per microbatch (of :attr:`microbatch` sequences)."""
    hops_s: float
    batch: int
    """Concurrent sequences U."""
    num_microbatches: int = 1
    microbatch: int = 1

    @property
    def bottleneck_s(self) -> float:
        return max(self.stage_time_s)

    @property
    def cycle_s(self) -> float:
        """Seconds between two tokens of one sequence (:func:`cycle_seconds`)."""
        return cycle_seconds(self.stage_time_s, self.hops_s, self.num_microbatches)

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput of all U sequences: U / cycle."""
        c = self.cycle_s
        return self.batch / c if c > 0 else math.inf

    @property
    def time_per_token_s(self) -> float:
        """Per-sequence time per token: the cycle (at U = 1, every stage in turn plus
        every hop's latency)."""
        return self.cycle_s

    @property
    def served_tokens_per_s(self) -> float:
        """What the workload gets: U / cycle."""
        return self.tokens_per_s
