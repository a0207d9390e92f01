"""The least cycle of one order of nodes, each a stage in that order, over every split of
the blocks (:func:`least_cycle_split`).

The cycle of ``S`` stages is ``max(m · slowest, Σ t + hops)``.  The searches split an
order by one side at a time (the least slowest stage, or the least time per token), and
where the two pull apart neither split is the best: the least time per token whose every
stage is within a limit ``C`` falls as ``C`` rises while ``m · C`` rises, and the least
cycle is where they cross.  Per limit the least time per token is a dynamic programme
over the positions (each a matrix of its stage times, inf above ``C`` or where the blocks
do not fit: a column minimum per position); the limits are the stage times themselves,
between the one where ``m · C`` reaches the least time per token at all and the slowest
stage of the split of least time per token (beyond it the time per token falls no
further), searched by bisection.  Each stage's transfer is the one it pays: over the
GPUs' link to a stage on another GPU group of its node, else over its network link.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from stowplan.cost import CostModel, microbatches
from stowplan.planner.strategies.capacity_arrays import numpy_module
from stowplan.planner.strategies.split_arrays import stage_seconds

__all__ = ["CYCLE_SPLIT_STAGES", "least_cycle_split"]

CYCLE_SPLIT_STAGES = 24
"""Orders of at most this many stages are split for their least cycle (a position costs a
matrix of the blocks squared, and a bisection a dozen programmes)."""


def least_cycle_split(
    cm: CostModel, order: Sequence[int], beat: float = math.inf
) -> tuple[list[int], list[int]] | None:
    """The split of ``order`` (node indices of ``cm``, each one stage, in order) of least
    cycle on ``cm`` (whose microbatch is the stage count's), as ``(order, bounds)``; None
    where no split fits, where none has a cycle below ``beat`` (seconds; the least time
    per token and its hops tell first), or the order has fewer than two or more than
    :data:`CYCLE_SPLIT_STAGES` stages."""
    stages, nb = len(order), cm.num_blocks
    if not 2 <= stages <= min(CYCLE_SPLIT_STAGES, nb):
        return None
    np = numpy_module()
    m, _ = microbatches(cm.batch, stages)
    tables = [_position(np, cm, order, p) for p in range(stages)]
    hops = sum(cm.hop_s(order[p], order[(p + 1) % stages]) for p in range(stages))

    def least_trip(cap: float, traced: bool = True) -> tuple[float, list[Any]]:
        """The least Σ t with every stage within ``cap``, and (``traced``) per position
        the block each end was reached from."""
        g = np.full(nb + 1, math.inf)
        g[0] = 0.0
        came: list[Any] = []
        for table in tables:
            sums = g[:, None] + (
                table if cap == math.inf else np.where(table <= cap, table, math.inf)
            )
            if traced:
                came.append(sums.argmin(axis=0))
            g = sums.min(axis=0)
        return float(g[nb]), came

    trip, came = least_trip(math.inf)
    if not math.isfinite(trip) or trip + hops >= beat:
        return None
    top = _slowest(tables, came, nb)
    if m * top <= trip + hops:
        return _traced(order, came, nb)  # the least time per token decides
    if m * top >= beat:
        # A split below ``beat`` keeps every stage within beat / m, and its time per
        # token within that limit must leave room for the hops.
        top = beat / m
        if least_trip(top, traced=False)[0] + hops >= beat:
            return None
    floor = (trip + hops) / m
    values = np.unique(np.concatenate([t[np.isfinite(t)] for t in tables]))
    values = values[values <= top]
    if values.size == 0:
        return None
    # The limits at or above the crossing's least (and the largest below it: its cycle
    # is its time per token, the least of those below).
    first = max(0, int(np.searchsorted(values, floor, side="left")) - 1)
    values = values[first:]

    def crossed(cap: float) -> bool:
        t, _ = least_trip(cap, traced=False)
        return math.isfinite(t) and m * cap >= t + hops

    lo, hi = 0, values.size - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if crossed(float(values[mid])):
            hi = mid
        else:
            lo = mid + 1
    best: tuple[float, list[Any]] | None = None
    for i in {lo, lo - 1} - {-1}:
        cap = float(values[i])
        t, at = least_trip(cap)
        if not math.isfinite(t):
            continue
        cycle = max(m * _slowest(tables, at, nb), t + hops)
        if best is None or cycle < best[0]:
            best = (cycle, at)
    return None if best is None else _traced(order, best[1], nb)


def _position(np: Any, cm: CostModel, order: Sequence[int], p: int) -> Any:
    """Position ``p``'s stage times from block ``j`` (rows) to ``k`` (columns), with its
    transfer to the next position's node (none from the last) and its embed or head; inf
    where ``k ≤ j``, the stage does not fit, or the first position does not start at 0
    (the last end at ``nb``)."""
    nb, d = cm.num_blocks, order[p]
    first, last = p == 0, p == len(order) - 1
    lo = np.arange(nb + 1)[:, None]
    hi = np.arange(nb + 1)[None, :]
    t = stage_seconds(np, cm, d, lo, hi, first=first, last=last)
    if not last:
        nxt = order[p + 1]
        t = t + (cm.intra_xfer_s[d] if cm.same_node(d, nxt) else cm.xfer_s[d])
    if first:
        t = np.where(lo == 0, t, math.inf)
    if last:
        t = np.where(hi == nb, t, math.inf)
    return t


def _slowest(tables: list[Any], came: list[Any], nb: int) -> float:
    """The slowest stage of the split ``came`` traces."""
    k, slowest = nb, 0.0
    for table, at in zip(reversed(tables), reversed(came), strict=True):
        j = int(at[k])
        slowest = max(slowest, float(table[j, k]))
        k = j
    return slowest


def _traced(order: Sequence[int], came: list[Any], nb: int) -> tuple[list[int], list[int]]:
    """The pipeline ``came`` traces back from the last block."""
    bounds = [nb]
    k = nb
    for at in reversed(came):
        k = int(at[k])
        bounds.append(k)
    return list(order), bounds[::-1]
