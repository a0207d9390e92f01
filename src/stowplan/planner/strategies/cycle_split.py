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
    cm: CostModel,
    order: Sequence[int],
    beat: float = math.inf,
    *,
    settle: bool = False,
    most: int = CYCLE_SPLIT_STAGES,
    kept: dict[tuple[Any, ...], Any] | None = None,
) -> tuple[list[int], list[int]] | None:
    """The split of ``order`` (node indices of ``cm``, each one stage, in order) of least
    cycle on ``cm`` (whose microbatch is the stage count's), as ``(order, bounds)``; None
    where no split fits, where none has a cycle below ``beat`` (seconds; the least time
    per token and its hops tell first), or the order has fewer than two or more than
    ``most`` stages (:data:`CYCLE_SPLIT_STAGES` unless given).  With ``settle``, of the
    splits of that cycle (within a relative :data:`TIED`) one with the most KV room in
    its tightest stage, and of those one of least slowest stage
    (:mod:`~stowplan.planner.tiebreak`'s first rule, then the searches' order).
    ``kept``, where given, keeps the positions' tables by what they depend on
    (:func:`_key`) for the next call on the same ``cm``: orders that differ by a node or
    two moved share the others'."""
    stages, nb = len(order), cm.num_blocks
    if not 2 <= stages <= min(most, nb):
        return None
    np = numpy_module()
    m, _ = microbatches(cm.batch, stages)
    keys = [_key(cm, order, p) for p in range(stages)]
    every = {} if kept is None else kept
    for p, key in enumerate(keys):
        if key not in every:
            every[key] = _position(np, cm, order, p)
    built = {key: every[key] for key in keys}
    tables = [built[key] for key in keys]
    hops = sum(cm.hop_s(order[p], order[(p + 1) % stages]) for p in range(stages))
    ends = np.zeros(nb + 1, dtype=np.int64)
    """The first position's traced starts (every stage 0 starts at block 0)."""

    def least_trip(
        cap: float, traced: bool = True, room: float = -math.inf, rooms: list[Any] | None = None
    ) -> tuple[float, list[Any]]:
        """The least Σ t with every stage within ``cap`` (and KV room ``room``, per
        position ``rooms``), and (``traced``) per position the block each end was
        reached from.  Positions alike share their limited table; the first reads its
        row from block 0 alone, the last its column to the last block."""
        limited: dict[tuple[Any, ...], Any] = {}

        def table(p: int) -> Any:
            if cap == math.inf and rooms is None:
                return tables[p]
            if keys[p] not in limited:
                t = tables[p]
                if cap != math.inf:
                    t = np.where(t <= cap, t, math.inf)
                if rooms is not None:
                    t = np.where(rooms[p] >= room, t, math.inf)
                limited[keys[p]] = t
            return limited[keys[p]]

        g = table(0)[0]
        came: list[Any] = [ends]
        for p in range(1, stages - 1):
            sums = g[:, None] + table(p)
            if traced:
                came.append(sums.argmin(axis=0))
            g = sums.min(axis=0)
        sums = g + table(stages - 1)[:, nb]
        j = int(sums.argmin())
        if traced:
            came.append(np.full(nb + 1, j, dtype=np.int64))
        return float(sums[j]), came

    def first_holding(values: Any, holds: Any) -> int:
        """The index of the first of ``values`` where ``holds``, bisected (it holds at
        every value after one where it holds; the last index where it holds at none)."""
        lo, hi = 0, values.size - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if holds(float(values[mid])):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def least(values: Any, holds: Any) -> float:
        """The first of ``values`` where ``holds``, which holds at the last."""
        return float(values[first_holding(values, holds)])

    sorted_times: list[Any] = []

    def stage_values() -> Any:
        """:func:`_values` of the tables, sorted once per call (the least cycle's bisection
        and the tie rule's both read them)."""
        if not sorted_times:
            sorted_times.append(_values(np, built.values()))
        return sorted_times[0]

    def settled(cycle: float, came: list[Any]) -> tuple[list[int], list[int]]:
        """The split ``came`` traces (of cycle ``cycle``), or with ``settle`` one of most
        KV room and then least slowest stage of those within the cycle: a split keeps
        it exactly when ``m`` times its slowest stage and its time per token with the
        hops do, and the least time per token within a limit on the stages and a least
        KV room rises as the limit falls and the room rises (each bisected over the
        values the stages take, from the split's own)."""
        if not settle:
            return _traced(order, came, nb)
        tied = cycle * (1 + TIED)
        cap = tied / m
        made: dict[tuple[Any, ...], Any] = {}
        for p, key in enumerate(keys):
            if key not in made:
                made[key] = _rooms(np, cm, order, p)
        rooms = [made[key] for key in keys]
        room = -math.inf
        own = _along(rooms, came, nb, min)
        if math.isfinite(own):
            values = _values(np, made.values())
            values = values[values >= own][::-1]
            room = least(values, lambda r: least_trip(cap, False, r, rooms)[0] + hops <= tied)
        values = stage_values()
        values = values[values <= cap]
        if values.size == 0:
            return _traced(order, came, nb)
        top = least(values, lambda c: least_trip(c, False, room, rooms)[0] + hops <= tied)
        return _traced(order, least_trip(top, True, room, rooms)[1], nb)

    trip, came = least_trip(math.inf)
    if not math.isfinite(trip) or trip + hops >= beat:
        return None
    top = _slowest(tables, came, nb)
    if m * top <= trip + hops:
        return settled(trip + hops, came)  # the least time per token decides
    if m * top >= beat:
        # A split below ``beat`` keeps every stage within beat / m, and its time per
        # token within that limit must leave room for the hops.
        top = beat / m
        if least_trip(top, traced=False)[0] + hops >= beat:
            return None
    floor = (trip + hops) / m
    values = stage_values()
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

    lo = first_holding(values, crossed)
    best: tuple[float, list[Any]] | None = None
    for i in {lo, lo - 1} - {-1}:
        cap = float(values[i])
        t, at = least_trip(cap)
        if not math.isfinite(t):
            continue
        cycle = max(m * _slowest(tables, at, nb), t + hops)
        if best is None or cycle < best[0]:
            best = (cycle, at)
    return None if best is None else settled(*best)


TIED = 1e-12
"""Cycles within this relative difference tie (float sums of one time in another order)."""


def _values(np: Any, tables: Any) -> Any:
    """The finite entries of ``tables`` (stage times, KV rooms), each once, ascending."""
    return np.unique(np.concatenate([t[np.isfinite(t)] for t in tables]))


def _key(cm: CostModel, order: Sequence[int], p: int) -> tuple[Any, ...]:
    """What position ``p``'s stage times and KV room depend on: its node's figures, its
    role (first, last) and the link to the next position's node."""
    d, last = order[p], p == len(order) - 1
    xfer = 0.0 if last else cm.intra_xfer_s[d] if cm.same_node(d, order[p + 1]) else cm.xfer_s[d]
    return (
        cm.inv_bw[d],
        cm.flop_s_per_byte[d],
        cm.block_s[d],
        cm.stage_s[d],
        cm.usable[d],
        xfer,
        p == 0,
        last,
    )


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
    return _along(tables, came, nb, max)


def _along(tables: list[Any], came: list[Any], nb: int, pick: Any) -> float:
    """``pick`` (min or max) of ``tables``' entries along the split ``came`` traces."""
    k, found = nb, []
    for table, at in zip(reversed(tables), reversed(came), strict=True):
        j = int(at[k])
        found.append(float(table[j, k]))
        k = j
    return float(pick(found))


def _rooms(np: Any, cm: CostModel, order: Sequence[int], p: int) -> Any:
    """Position ``p``'s KV room from block ``j`` (rows) to ``k`` (columns): the tokens of
    KV its free memory holds beside its weights, as
    :meth:`~stowplan.cost.CostModel.kv_capacity_tokens` counts a stage (whole tokens, in
    integers); inf where the stage holds no KV or the model has no KV figure."""
    nb, d = cm.num_blocks, order[p]
    if not cm.has_kv_figure:
        return np.full((nb + 1, nb + 1), math.inf)
    first, last = p == 0, p == len(order) - 1
    lo = np.arange(nb + 1)[:, None]
    hi = np.arange(nb + 1)[None, :]
    weights = np.array(cm.mem_prefix, dtype=np.int64) - np.array(cm.kv_held_prefix, dtype=np.int64)
    used = weights[hi] - weights[lo] + ((cm.embed if first else 0) + (cm.head if last else 0))
    per = np.array(cm.kv_token_prefix, dtype=np.int64)
    tokens = per[hi] - per[lo]
    free = np.maximum(cm.usable[d] - used, 0)
    room = free // np.where(tokens > 0, tokens, 1)
    return np.where(tokens > 0, room.astype(np.float64), math.inf)


def _traced(order: Sequence[int], came: list[Any], nb: int) -> tuple[list[int], list[int]]:
    """The pipeline ``came`` traces back from the last block."""
    bounds = [nb]
    k = nb
    for at in reversed(came):
        k = int(at[k])
        bounds.append(k)
    return list(order), bounds[::-1]
