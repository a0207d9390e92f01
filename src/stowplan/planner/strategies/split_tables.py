"""Stage times the greedy split of :mod:`.throughput` reads, as tables kept per cost model.

The split's bisection on the bottleneck asks the same node, at the same first block, how
far it reaches many times over (once per step, at another bottleneck).  The time of
``[lo, hi)`` on a node is non-decreasing in ``hi`` and so is its memory, so the node's
reach at a bottleneck is one :func:`bisect.bisect_right` into the row of times of
``[lo, lo + 1)``, ``[lo, lo + 2)``, … up to the last that fits, and the next bottleneck
at which it reaches further is the row's next entry.  Nodes of one
:attr:`CostModel.stage_class` share every figure these times read, so they share rows;
nodes of one GPU and room whose transfers differ (each its own link) share the times
before the transfer, which each row then adds.

Every entry is computed with :func:`reach`'s arithmetic (the same float operations in
the same order), so the split is bit for bit the one the plain bisection gives; a row
whose times or memory are not monotone (never seen; it would take a negative figure) is
not kept and the plain bisection answers instead.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from typing import Any

from stowplan.cost import CostModel
from stowplan.planner.strategies.capacity_arrays import numpy_module
from stowplan.planner.strategies.memo import PerModel

__all__ = ["ROW_ARRAY", "SplitTables", "end_time", "next_reach", "reach", "split_tables"]


def reach(cm: CostModel, d: int, lo: int, t_max: float, first: bool) -> int:
    """Largest ``hi`` such that ``[lo, hi)`` as a non-last stage on ``d`` fits; ``lo`` if none.

    :meth:`CostModel.fits` and :meth:`CostModel.stage_time` inlined, with the same
    arithmetic, as a bisection over ``hi``.
    """
    nb = cm.num_blocks
    if lo >= nb:
        return lo
    rp, kp, mp = cm.read_prefix, cm.kv_prefix, cm.mem_prefix
    ib, fl, bs, ss = cm.inv_bw[d], cm.flop_s_per_byte[d], cm.block_s[d], cm.stage_s[d]
    xfer, room, extra = cm.xfer_s[d], cm.usable[d], cm.embed if first else 0
    hi = lo + 1
    if mp[hi] - mp[lo] + extra > room:
        return lo
    weights = rp[hi] - rp[lo]
    t = max((weights + kp[hi] - kp[lo]) * ib, weights * fl)
    if not t + ((hi - lo) * bs + ss) + xfer <= t_max:
        return lo
    good, bad = hi, nb + 1
    while bad - good > 1:
        hi = (good + bad) // 2
        ok = mp[hi] - mp[lo] + extra <= room
        if ok:
            weights = rp[hi] - rp[lo]
            t = max((weights + kp[hi] - kp[lo]) * ib, weights * fl)
            ok = t + ((hi - lo) * bs + ss) + xfer <= t_max
        if ok:
            good = hi
        else:
            bad = hi
    return good


def next_reach(cm: CostModel, d: int, lo: int, hi: int, first: bool) -> float:
    """The least bottleneck at which ``d`` reaches past ``hi`` from ``lo`` (the time of
    ``[lo, hi + 1)`` as a non-last stage, :func:`reach`'s arithmetic); infinite when that
    stage does not fit the node's VRAM or there is no block past ``hi``."""
    if hi >= cm.num_blocks:
        return math.inf
    rp, kp, mp = cm.read_prefix, cm.kv_prefix, cm.mem_prefix
    end = hi + 1
    if mp[end] - mp[lo] + (cm.embed if first else 0) > cm.usable[d]:
        return math.inf
    weights = rp[end] - rp[lo]
    t = max((weights + kp[end] - kp[lo]) * cm.inv_bw[d], weights * cm.flop_s_per_byte[d])
    return t + ((end - lo) * cm.block_s[d] + cm.stage_s[d]) + cm.xfer_s[d]


def end_time(cm: CostModel, d: int, lo: int, first: bool) -> float | None:
    """The time of ``[lo, nb)`` with the head on node ``d`` as the last stage; None when it
    does not fit (:meth:`CostModel.fits` and :meth:`CostModel.stage_time` inlined, same
    arithmetic)."""
    nb, head = cm.num_blocks, cm.head
    rp, kp, mp = cm.read_prefix, cm.kv_prefix, cm.mem_prefix
    if mp[nb] - mp[lo] + (cm.embed if first else 0) + head > cm.usable[d]:
        return None
    weights = rp[nb] - rp[lo] + head
    t = max((weights + kp[nb] - kp[lo]) * cm.inv_bw[d], weights * cm.flop_s_per_byte[d])
    return t + ((nb - lo) * cm.block_s[d] + cm.stage_s[d])


ROW_ARRAY = 24
"""Rows of at least this many entries are computed on arrays."""

_Key = tuple[int, int, bool]
_UNSEEN: list[float] = []
"""A row not built yet (compared by identity)."""


class SplitTables:
    """One cost model's rows of stage times, built per (class, first block, stage 0) on
    first use.

    It keeps the model's figures, not the model (a :class:`PerModel` value must not hold
    its key).
    """

    def __init__(self, cm: CostModel) -> None:
        self.num_blocks = cm.num_blocks
        self.stage_class, self.gpu_class = cm.stage_class, cm.gpu_class
        self._prefixes = (cm.read_prefix, cm.kv_prefix, cm.mem_prefix)
        self._embed, self._head = cm.embed, cm.head
        self._figures = (
            cm.inv_bw,
            cm.flop_s_per_byte,
            cm.block_s,
            cm.stage_s,
            cm.xfer_s,
            cm.usable,
        )
        self._monotone_memory = list(cm.mem_prefix) == sorted(cm.mem_prefix)
        """Whether a stage's memory grows with its blocks (it does: no block frees memory),
        so that the blocks that fit a node from ``lo`` are a run."""
        self._rows: dict[_Key, list[float] | None] = {}
        self._asked: set[_Key] = set()
        """Rows :meth:`reach` was asked about before they were built."""
        self._ends: dict[_Key, float | None] = {}
        self._bases: dict[_Key, Any] = {}
        """:meth:`row`'s times before the transfer, per GPU class, first block and stage 0."""
        np = numpy_module()
        # Every prefix and difference exact as a float, as Python's arithmetic makes them.
        exact = max(map(abs, (*cm.read_prefix, *cm.kv_prefix))) < 2**53
        self._arrays = (
            (np, np.array(cm.read_prefix, dtype=float), np.array(cm.kv_prefix, dtype=float))
            if np is not None and exact and cm.num_blocks >= ROW_ARRAY
            else None
        )
        """The read and KV prefixes as arrays, for long rows (None: rows in Python)."""

    def row(self, d: int, lo: int, first: bool) -> list[float] | None:
        """Times of ``[lo, hi)`` on ``d`` as a non-last stage for ``hi = lo + 1, …`` while
        it fits; None where they or the memory are not monotone in ``hi``."""
        key = (self.stage_class[d], lo, first)
        if key in self._rows:
            return self._rows[key]
        if not self._monotone_memory:
            self._rows[key] = None
            return None
        xfer = self._figures[4][d]
        # Nodes of one GPU and room (of their own transfers) share the times before it.
        shared = (self.gpu_class[d], lo, first)
        base = self._bases.get(shared)
        if base is None:
            base = self._bases[shared] = self._base_row(d, lo, first)
        if isinstance(base, list):
            out = [t + xfer for t in base]
            monotone = out == sorted(out)
        else:
            t = base + xfer
            monotone = bool((t[1:] >= t[:-1]).all())
            out = t.tolist()
        found = self._rows[key] = out if monotone else None
        return found

    def _base_row(self, d: int, lo: int, first: bool) -> Any:
        """:meth:`row`'s times before the transfer (those of every node of ``d``'s GPU
        figures and room): a list, or for long rows an array (the same operations in the
        same order; the prefixes' differences are exact as floats, as Python's
        int-to-float conversion makes them)."""
        ib, fl, bs, ss, _, room = (f[d] for f in self._figures)
        nb = self.num_blocks
        rp, kp, mp = self._prefixes
        extra = self._embed if first else 0
        # The blocks from ``lo`` that fit: a run, the memory growing with the blocks.
        m0 = mp[lo]
        cap = lo + bisect_left(range(lo + 1, nb + 1), True, key=lambda c: mp[c] - m0 + extra > room)
        r0, k0 = rp[lo], kp[lo]
        if self._arrays is not None and cap - lo >= ROW_ARRAY:
            np, rpa, kpa = self._arrays
            w = rpa[lo + 1 : cap + 1] - r0
            k = np.arange(1, cap - lo + 1, dtype=float)
            return np.maximum((w + kpa[lo + 1 : cap + 1] - k0) * ib, w * fl) + (k * bs + ss)
        # ``w`` is the stage's weights, as :func:`reach` names them.
        return [
            max(((w := rp[hi] - r0) + kp[hi] - k0) * ib, w * fl) + ((hi - lo) * bs + ss)
            for hi in range(lo + 1, cap + 1)
        ]

    def end(self, cm: CostModel, d: int, lo: int, first: bool) -> float | None:
        """:func:`end_time`, kept per class."""
        key = (self.stage_class[d], lo, first)
        if key in self._ends:
            return self._ends[key]
        found = self._ends[key] = end_time(cm, d, lo, first)
        return found

    def reach(self, cm: CostModel, d: int, lo: int, t_max: float, first: bool) -> tuple[int, float]:
        """:func:`reach`, and :func:`next_reach` at it (infinite where ``d`` reaches the
        end of the model)."""
        key = (self.stage_class[d], lo, first)
        times = self._rows.get(key, _UNSEEN)
        if times is _UNSEEN:
            if key not in self._asked:
                # Asked once so far: a bisection of its own costs less than the row (most
                # are never asked again); the second ask builds it.
                self._asked.add(key)
                times = None
            else:
                times = self.row(d, lo, first)
        if times is None:
            hi = reach(cm, d, lo, t_max, first)
            return hi, next_reach(cm, d, lo, hi, first)
        k = bisect_right(times, t_max)
        return lo + k, times[k] if k < len(times) else math.inf


split_tables = PerModel(SplitTables)
"""The tables of a cost model, built on first use."""
