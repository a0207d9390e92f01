"""The fractional relaxation of :func:`~stowplan.planner.exact.pipelines.fluid_bound`, with
each cost model's figures computed once.

A certificate bounds many stage counts and ranges of them on the few cost models of
their microbatches, and most of the relaxation depends only on the model: the blocks'
rates and room per node, the best single node, the greedy fill of the fastest nodes,
the cheapest hops.  Here those are kept per cost model, and the slowest-stage bound
per stage limit, so a certificate computes each once.  The numbers are the same floats
as :func:`~stowplan.planner.exact.pipelines.fluid_bound`'s, computed by the same
expressions in the same order.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence

from stowplan.cost import CostModel
from stowplan.cost.model import most_within
from stowplan.model import Metric
from stowplan.planner.exact.trip_nodes import heaviest, kept_figures
from stowplan.planner.problem import Problem
from stowplan.planner.strategies.capacity_arrays import ARRAY_NODES, fluid_capacity, numpy_module
from stowplan.planner.strategies.memo import PerModel

__all__ = ["fractional_bound", "heavy_fractional_bound"]

_STEPS = 60
"""Most bisection steps of the slowest-stage bound."""


def fractional_bound(problem: Problem, cm: CostModel, objective: Metric) -> float:
    """A valid lower bound (seconds) on the objective, from a fractional relaxation: the
    value of :func:`~stowplan.planner.exact.pipelines.fluid_bound`.

    Every block is taken as small as the smallest; blocks flow to nodes fractionally up
    to their VRAM; the embed, head and the roles are dropped except for the hop terms
    every multi-stage pipeline pays.
    """
    return _bound(problem, cm, objective, _figures_of(cm))


def _bound(problem: Problem, cm: CostModel, objective: Metric, figures: _Figures) -> float:
    """The relaxation's bound on ``figures`` (of every block, or of the heaviest), the
    whole model on one node (of every block's figures) where it is less."""
    single = _figures_of(cm).single() if problem.min_stages <= 1 else math.inf
    if problem.max_stages < 2 or len(cm.nodes) < 2:
        return single
    if objective == Metric.LATENCY:
        return min(single, figures.trip(max(2, problem.min_stages, figures.fewest)))
    return min(single, figures.slowest(max(problem.max_stages, 2)))


class _Figures:
    """One cost model's figures of the relaxation: per node the seconds per (smallest)
    block and the fractional blocks its VRAM holds, and what is derived from them; with
    ``kept`` (block indices), of those blocks alone (the smallest of them, the most of
    them in any window that fits)."""

    def __init__(self, cm: CostModel, kept: Sequence[int] | None = None) -> None:
        self.cm = cm
        n = len(cm.nodes)
        if kept is None:
            nb = cm.num_blocks
            rd, kvr, mem = cm.smallest_block()
            window = cm.max_window()
        else:
            nb = len(kept)
            counted, rd, kvr, mem = kept_figures(cm, kept)
            window = most_within(cm.mem_prefix, counted, cm.usable)
        self.nb = nb
        """The blocks counted."""
        read = rd + kvr  # :meth:`CostModel.block_seconds` of each node, inlined
        self.rate = [
            max(read * ib, rd * fl) + bs
            for ib, fl, bs in zip(cm.inv_bw, cm.flop_s_per_byte, cm.block_s, strict=True)
        ]
        self.room = [min(window[d], nb if mem <= 0 else cm.usable[d] / mem) for d in range(n)]
        self.fewest = _fewest_by_room(self.room, nb)
        """The fewest nodes whose fractional room holds every block (n + 1 if none do)."""
        self._single: float | None = None
        self._fill: tuple[float, list[float], list[float], float] | None = None
        self._trips: dict[int, float] = {}
        self._slowest: dict[int, float] = {}
        self._capacity: tuple[list[float], list[float], float] | None = None

    def single(self) -> float:
        """The fastest node's time holding the whole model alone (inf when none can)."""
        if self._single is None:
            cm, nb = self.cm, self.cm.num_blocks
            need = cm.stage_bytes(0, nb, True, True)  # what :meth:`CostModel.fits` compares
            best = math.inf
            for d, room in enumerate(cm.usable):
                if need <= room:
                    v = cm.stage_time(d, 0, nb, True, True)
                    if v < best:
                        best = v
            self._single = best
        return self._single

    def trip(self, k: int) -> float:
        """The time-per-token bound of pipelines of at least ``k`` stages: the blocks on
        the fastest nodes first, the ``k`` cheapest fixed stage costs, ``k − 1``
        transfers and the cheapest head."""
        found = self._trips.get(k)
        if found is None:
            total, fixed, xfer, head = self._fill_figures()
            hops = sum(fixed[:k]) + sum(xfer[: k - 1])
            found = self._trips[k] = total + hops + head
        return found

    def _fill_figures(self) -> tuple[float, list[float], list[float], float]:
        """The fill of the fastest nodes, the fixed stage costs and the transfers sorted,
        and the head's least time."""
        if self._fill is None:
            cm, rate, room = self.cm, self.rate, self.room
            n = len(cm.nodes)
            left = float(self.nb)
            total = 0.0
            for d in sorted(range(n), key=lambda d: rate[d]):
                take = min(left, room[d])
                total += take * rate[d]
                left -= take
                if left <= 0:
                    break
            fixed = sorted(lat + ss for lat, ss in zip(cm.latency_s, cm.stage_s, strict=True))
            head = min(cm.head * min(cm.inv_bw[d], cm.flop_s_per_byte[d]) for d in range(n))
            self._fill = (total, fixed, sorted(cm.xfer_s), head)
        return self._fill

    def slowest(self, top: int) -> float:
        """The slowest-stage bound of pipelines of at most ``top`` stages: the least time
        at which the ``top`` largest fractional interior capacities and the best end
        gain hold every block, by bisection."""
        found = self._slowest.get(top)
        if found is None:
            found = self._slowest[top] = self._bisect(self._capacity_at(top))
        return found

    def _capacity_at(self, top: int) -> Callable[[float], float]:
        cm = self.cm
        if self._capacity is None:
            nb, rate, room = self.nb, self.rate, self.room
            n = len(rate)
            lim = [min(room[d], float(nb)) for d in range(n)]
            inv = [1.0 / rate[d] if rate[d] else math.inf for d in range(n)]
            hi = max(nb * r for r in rate) + max(cm.xfer_s) + max(cm.stage_s) + 1.0
            self._capacity = (lim, inv, hi)
        lim, inv, _ = self._capacity
        kinds = Counter(zip(cm.xfer_s, cm.stage_s, inv, lim, strict=True))
        if len(kinds) < min(ARRAY_NODES, len(lim)):
            # Few kinds of node (a fleet of identical nodes is one): the count over kinds.
            return _kinds_capacity(kinds, top)
        if len(lim) >= ARRAY_NODES and numpy_module() is not None:
            counted: Callable[[float], float] = fluid_capacity(
                cm.xfer_s, cm.stage_s, inv, lim, top
            )  # the same counts
            return counted
        return _pure_capacity(cm.xfer_s, cm.stage_s, inv, lim, top)

    def _bisect(self, capacity: Callable[[float], float]) -> float:
        assert self._capacity is not None
        nb = self.nb
        lo, hi = 0.0, self._capacity[2]
        for _ in range(_STEPS):
            if hi - lo <= 1e-9 * hi:
                break
            m = (lo + hi) / 2
            if capacity(m) >= nb:
                hi = m
            else:
                lo = m
        return lo


def _pure_capacity(
    xs: Sequence[float],
    ss: Sequence[float],
    inv: Sequence[float],
    lim: Sequence[float],
    top: int,
) -> Callable[[float], float]:
    """The fractional capacity count at ``tm`` on lists (see
    :func:`~stowplan.planner.strategies.capacity_arrays.fluid_capacity`)."""

    def capacity(tm: float) -> float:
        mid = [
            min(max(tm - x - s, 0.0) * v, c) if v != math.inf else c
            for x, s, v, c in zip(xs, ss, inv, lim, strict=True)
        ]
        end = [
            min(max(tm - s, 0.0) * v, c) if v != math.inf else c
            for s, v, c in zip(ss, inv, lim, strict=True)
        ]
        mid_sorted = sorted(mid, reverse=True)[:top]
        gain = max(e - m for e, m in zip(end, mid, strict=True))
        return sum(math.floor(x + 1e-9) for x in mid_sorted) + math.floor(gain + 1e-9) + 1

    return capacity


def _kinds_capacity(
    kinds: Counter[tuple[float, float, float, float]], top: int
) -> Callable[[float], float]:
    """:func:`_pure_capacity`'s count over kinds of node, each ``(transfer, stage cost,
    inverse rate, limit)`` with how many nodes share it: the same count (the ``top``
    largest interior capacities are whole numbers once floored, so their sum is exact in
    any order)."""
    listed = list(kinds.items())

    def capacity(tm: float) -> float:
        mid: list[tuple[int, int]] = []
        gain = -math.inf
        for (x, s, v, c), count in listed:
            m = min(max(tm - x - s, 0.0) * v, c) if v != math.inf else c
            e = min(max(tm - s, 0.0) * v, c) if v != math.inf else c
            gain = max(gain, e - m)
            mid.append((math.floor(m + 1e-9), count))
        mid.sort(reverse=True)
        held, left = 0, top
        for blocks, count in mid:
            if left <= 0:
                break
            held += blocks * min(count, left)
            left -= count
        return held + math.floor(gain + 1e-9) + 1

    return capacity


def _fewest_by_room(room: Sequence[float], nb: int) -> int:
    """The fewest nodes whose fractional block room holds ``nb`` blocks (len+1 if none do)."""
    held = 0.0
    for k, r in enumerate(sorted(room, reverse=True), start=1):
        held += r
        if held >= nb - 1e-9:
            return k
    return len(room) + 1


_figures_of = PerModel(_Figures)


def _heavy_figures(cm: CostModel) -> _Figures | None:
    kept = heaviest(cm)
    if kept is None:
        return None
    heavy, every = _Figures(cm, kept), _figures_of(cm)
    # Sought where some node holds a smaller share of the heaviest blocks than of every
    # block (its room counts small blocks); elsewhere the small blocks are not what
    # loosens the relaxation of every block, and this one is not sought.
    nb = cm.num_blocks
    if all(h * nb >= e * len(kept) for h, e in zip(heavy.room, every.room, strict=True)):
        return None
    return heavy


_heavy_of = PerModel(_heavy_figures)
"""Per cost model whose blocks differ in memory, the relaxation of its heaviest blocks
alone (None where blocks are alike)."""


def heavy_fractional_bound(problem: Problem, cm: CostModel, objective: Metric) -> float | None:
    """:func:`fractional_bound` of the model's heaviest blocks alone, where blocks differ
    in memory (None where they do not): every pipeline holds them all, a stage at most
    as many as its room fits of them (the small blocks no longer make every stage's
    room generous), and each takes at least the least of their times; a stage holding
    none of them still pays its hop (and, last, the head).  A bound as well; the larger
    of the two holds."""
    figures = _heavy_of(cm)
    return None if figures is None else _bound(problem, cm, objective, figures)
