"""The throughput search's capacity test on arrays, for fleets of many nodes.

:mod:`~stowplan.planner.strategies.throughput` finds the least bottleneck T at which
the capacity test passes by bisecting over the stage times of every node class.  On
a fleet of ``ARRAY_NODES`` nodes or more (1,024 single-GPU nodes with links of their
own make as many classes) each step of that search is a pass over every class; here
the classes' stage times are rows of a padded 2-D array and a step is a few array
operations.  The answers are the same numbers as the pure path's: capacities are
counts of the same floats (a row is non-decreasing, so a count is the bisection),
and the test's sums are of the same integers.

numpy is imported on first use (``import stowplan`` stays light); without it
:func:`numpy_module` is None and the pure path runs.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, overload

from stowplan.planner.strategies.interior import Interior

__all__ = [
    "ARRAY_NODES",
    "ENUMERATE",
    "CapacityArrays",
    "RoleRows",
    "first_seen_groups",
    "fluid_capacity",
    "numpy_module",
]

ARRAY_NODES = 16
"""From this many nodes the capacity test runs on arrays."""

ENUMERATE = 4096
"""Candidate bottlenecks listed and sorted outright once this few remain."""

_NUMPY: list[Any] = []


def numpy_module() -> Any:
    """numpy, imported on first use; None when it is not installed."""
    if not _NUMPY:
        try:
            import numpy
        except ImportError:  # pragma: no cover - numpy ships with the exact extra
            _NUMPY.append(None)
        else:
            _NUMPY.append(numpy)
    return _NUMPY[0]


def first_seen_groups(table: Any) -> tuple[Any, Any]:
    """The columns of a 2-D float array alike in every row, grouped: per column its group,
    numbered in the order the groups first come, and per group its first column (both
    int arrays).  Values compare as floats (``==``), as the keys of a dict of tuples of
    them do."""
    np = numpy_module()
    n = table.shape[1]
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    order = np.lexsort(table[::-1])
    ranked = table[:, order]
    starts = np.ones(n, dtype=bool)
    starts[1:] = (ranked[:, 1:] != ranked[:, :-1]).any(axis=0)
    begin = np.flatnonzero(starts)
    firsts = np.minimum.reduceat(order, begin)
    by_first = np.argsort(firsts)
    number = np.empty(len(begin), dtype=np.int64)
    number[by_first] = np.arange(len(begin))
    group = np.empty(n, dtype=np.int64)
    group[order] = number[np.cumsum(starts) - 1]
    return group, firsts[by_first]


class RoleRows(NamedTuple):
    """Stage-time lists of node classes, each distinct list once: ``base[base_of[c]]``
    are the times of blocks ``[0, k)``, k = 1, 2, … on class ``c`` without its transfer,
    ``tail[tail_of[c]]`` those of its last k blocks with the head."""

    base: Sequence[Sequence[float]]
    base_of: Sequence[int]
    tail: Sequence[Sequence[float]]
    tail_of: Sequence[int]


_UNABLE = 2**63 - 1
"""The key of a class that cannot take the role: above every packed key."""

_ROLE_ROWS = [[0], [1], [0], [1]]
"""Per row of the end keys, its role (0: first, 1: last)."""

_LEAST = -(2**62)
"""Below every leader key: a class already picked."""

Caps = tuple[list[int], list[int], list[int]]
"""Per class: blocks it holds as an interior stage, as stage 0 and as the last stage."""


def _rows(np: Any, lists: Sequence[Sequence[float]], of: Sequence[int]) -> tuple[Any, Any]:
    """Per class, its list (``lists[of[c]]``) as a row of one array padded with inf, and
    its length."""
    width = max((len(r) for r in lists), default=0)
    table = np.full((len(lists), max(width, 1)), np.inf)
    for i, r in enumerate(lists):
        table[i, : len(r)] = r
    lengths = np.array([len(r) for r in lists], dtype=np.int64)
    at = np.asarray(of, dtype=np.int64)
    return table[at], lengths[at]


class _Probe:
    """The capacity test's figures at one bottleneck, whatever the stage limit: the class
    capacities, the interior by value (None when no class can take an end role), the
    best first plus the best last capacity, and the end pairs once listed (the leading
    ones, and all of them)."""

    __slots__ = ("best_ends", "caps", "interior", "leading", "pairs")

    def __init__(
        self, caps: tuple[Any, Any, Any], interior: Interior | None, best_ends: int
    ) -> None:
        self.caps = caps
        self.interior = interior
        self.best_ends = best_ends
        self.pairs: list[tuple[int, int, int, int]] | None = None
        self.leading: list[tuple[int, int, int, int]] | None = None


class _Bracket:
    """The least feasible bottleneck's bracket: capacities where the test fails, and the
    least bottleneck known to pass with its capacities."""

    __slots__ = ("hi_caps", "hi_t", "lo_caps")

    def __init__(
        self, lo_caps: tuple[Any, Any, Any], hi_t: float, hi_caps: tuple[Any, Any, Any]
    ) -> None:
        self.lo_caps, self.hi_t, self.hi_caps = lo_caps, hi_t, hi_caps


class _Spans:
    """Per class, the stage-time columns between a bracket's failing and passing
    capacities (``[a, b)``), for the base times (0) and the tail times (2) apart: the rows
    that have some, their bounds, weights (columns × class size) and the total weight.
    Stage 0 and interior capacities change only where the base times do."""

    def __init__(self, np: Any, bracket: _Bracket, weight: Any) -> None:
        lo, hi = bracket.lo_caps, bracket.hi_caps
        self.rows0 = np.flatnonzero(hi[0] > lo[0])
        self.rows2 = np.flatnonzero(hi[2] > lo[2])
        self.a0, self.b0 = lo[0][self.rows0], hi[0][self.rows0]
        self.a2, self.b2 = lo[2][self.rows2], hi[2][self.rows2]
        self.w0 = (self.b0 - self.a0) * weight[self.rows0]
        self.w2 = (self.b2 - self.a2) * weight[self.rows2]
        self.count = int(self.w0.sum()) + int(self.w2.sum())


class _Listed:
    """Capacities at candidates listed between a failing and a passing bound: a class
    holds its failing count plus its listed times within the candidate."""

    def __init__(
        self,
        np: Any,
        lo_caps: tuple[Any, Any, Any],
        k_first: Any,
        base: tuple[Any, Any],
        tail: tuple[Any, Any],
    ) -> None:
        self.np = np
        self.lo_caps, self.k_first = lo_caps, k_first
        self.of0, self.values0 = base
        self.of2, self.values2 = tail
        self.k = len(k_first)

    def caps(self, t: float) -> tuple[Any, Any, Any]:
        """Class capacities within ``t`` (interior, first, last)."""
        np, k = self.np, self.k
        mids = self.lo_caps[0] + np.bincount(self.of0[self.values0 <= t], minlength=k)
        lasts = self.lo_caps[2] + np.bincount(self.of2[self.values2 <= t], minlength=k)
        return mids, np.minimum(mids, self.k_first), lasts


def _pairs_of(
    caps: tuple[Any, Any, Any], ends_first: list[tuple[int, int]], ends_last: list[tuple[int, int]]
) -> list[tuple[int, int, int, int]]:
    """Every pair of a first and a last end (node position, class) on distinct nodes, as
    (capacity as first, as last, and the two classes' interior capacities)."""
    mid, first, last = caps
    first_at = {c: int(first[c]) for _, c in ends_first}
    last_at = {c: int(last[c]) for _, c in ends_last}
    mid_at = {c: int(mid[c]) for _, c in ends_first + ends_last}
    return [
        (first_at[cf], last_at[cl], mid_at[cf], mid_at[cl])
        for f, cf in ends_first
        for lst, cl in ends_last
        if f != lst
    ]


class _Singletons(Sequence[list[int]]):
    """Per class its one node position, as a list of members."""

    def __init__(self, positions: list[int]) -> None:
        self.positions = positions

    def __len__(self) -> int:
        return len(self.positions)

    @overload
    def __getitem__(self, c: int) -> list[int]: ...

    @overload
    def __getitem__(self, c: slice) -> list[list[int]]: ...

    def __getitem__(self, c: int | slice) -> list[int] | list[list[int]]:
        if isinstance(c, slice):
            return [[p] for p in self.positions[c]]
        return [self.positions[c]]


class CapacityArrays:
    """Per class, its stage times as array rows (the figures the capacity test counts).

    ``rows`` holds each class's base times (blocks ``[0, k)`` without its transfer
    ``xfer[c]``: the stage-0 and interior role) and tail times (the last k blocks with the
    head: the last role); ``k_first[c]`` is the most blocks it holds beside the embed;
    ``members[c]`` its node positions sorted by id (None when every class is one node),
    ``ids`` the node id of every position, ``cls`` the class of every position.
    """

    def __init__(
        self,
        rows: RoleRows,
        xfer: Sequence[float],
        k_first: Sequence[int],
        members: Sequence[Sequence[int]] | None,
        ids: Sequence[int],
        cls: Sequence[int],
    ) -> None:
        np = numpy_module()
        self.np = np
        base_rows, self.base_len = _rows(np, rows.base, rows.base_of)
        # The stage times as the pure path compares them: ``v + xfer``, the same floats.
        self.stage = base_rows + np.asarray(xfer, dtype=np.float64)[:, None]
        self.tail, self.tail_len = _rows(np, rows.tail, rows.tail_of)
        self._stage_columns = np.ascontiguousarray(self.stage.T)
        self._tail_columns = np.ascontiguousarray(self.tail.T)
        self.k_first = np.asarray(k_first, dtype=np.int64)
        self.ids = ids
        self.cls = np.asarray(cls, dtype=np.int64)
        """Per node position, its class."""
        self.node_ids = np.asarray(ids, dtype=np.int64)
        self.singletons = members is None or len(members) == len(ids)
        """Whether every class is one node (then a picked class is its own candidate)."""
        if members is None:
            firsts = np.empty(len(self.cls), dtype=np.int64)
            firsts[self.cls] = np.arange(len(self.cls))
            members = _Singletons(firsts.tolist())
            self.sizes = np.ones(len(firsts), dtype=np.int64)
        else:
            firsts = np.array([m[0] for m in members], dtype=np.int64)
            self.sizes = np.array([len(m) for m in members], dtype=np.int64)
        self.members: Sequence[Sequence[int]] = members
        """Per class, its node positions sorted by id (None given: every class one node)."""
        self.first_ids = self.node_ids[firsts]
        self.id_span = int(self.node_ids.max(initial=0)) + 1
        """Node ids are below this: the ends' keys pack an id under the capacities."""
        self._probes: dict[tuple[float, int], _Probe] = {}
        """The capacity test's figures per bottleneck probed (and block count)."""
        self._least: dict[tuple[int, int], float] = {}
        """Per (block count, stage limit), the least bottleneck :meth:`least_feasible` found."""

    def class_caps(self, t: float, strict: bool) -> tuple[Any, Any, Any]:
        """Per class, blocks held within ``t`` (``< t`` when strict): interior, first, last."""
        np = self.np
        # Counted down the columns of the transposed rows (a class per column): the same
        # counts, summed faster.
        within = np.less if strict else np.less_equal
        count = (
            within(rows, t).sum(0, dtype=np.int32).astype(np.int64)
            for rows in (self._stage_columns, self._tail_columns)
        )
        mids, lasts = count
        if t == math.inf and not strict:  # the padding counts too: a row holds its length
            mids, lasts = np.minimum(mids, self.base_len), np.minimum(lasts, self.tail_len)
        return mids, np.minimum(mids, self.k_first), lasts

    def caps(self, t: float, strict: bool) -> Caps:
        """:meth:`class_caps` as lists."""
        mids, firsts, lasts = self.class_caps(t, strict)
        return mids.tolist(), firsts.tolist(), lasts.tolist()

    def _ends(
        self, first: Any, last: Any, mid: Any, nb: int
    ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """End candidates (node position, class) as stage 0 and as the last stage: in each
        role the four largest capacities and the four least losses against the interior
        role, ties to the least node id (of classes able to take the role); each list
        sorted by id."""
        np = self.np
        roles = np.stack((first, last))
        span, ids = self.id_span, self.first_ids
        short = nb - roles
        # (−role, id) and (mid − role, −role, id), each packed into one integer; rows: by
        # capacity as first, as last, by loss as first, as last.
        keys = np.concatenate(
            (short * span + ids, ((mid - roles + nb) * (nb + 1) + short) * span + ids)
        )
        able = roles > 0
        keys = np.where(np.concatenate((able, able)), keys, _UNABLE)
        k = keys.shape[1]
        if k > 4:
            picked = np.argpartition(keys, 3, axis=1)[:, :4]
        else:
            picked = np.broadcast_to(np.arange(k), (4, k))
        role_at = roles[_ROLE_ROWS, picked]
        valid = (role_at > 0).tolist()
        picked_l = picked.tolist()
        members = self.members
        if self.singletons:
            # One node per class: the picked classes' own nodes are the candidates.
            return self._by_id(
                {
                    (members[c][0], c)
                    for row in (0, 2)
                    for c, ok in zip(picked_l[row], valid[row], strict=True)
                    if ok
                }
            ), self._by_id(
                {
                    (members[c][0], c)
                    for row in (1, 3)
                    for c, ok in zip(picked_l[row], valid[row], strict=True)
                    if ok
                }
            )
        role_l, mid_l = role_at.tolist(), mid[picked].tolist()
        ids_of = self.ids
        out: tuple[set[tuple[int, int]], set[tuple[int, int]]] = (set(), set())
        for row in range(4):
            ranked: list[tuple[int, ...]]
            cands = [
                (c, r, m)
                for c, r, m, ok in zip(
                    picked_l[row], role_l[row], mid_l[row], valid[row], strict=True
                )
                if ok
            ]
            if row >= 2:
                ranked = heapq.nsmallest(
                    4,
                    [(m - r, -r, ids_of[i], i, c) for c, r, m in cands for i in members[c][:4]],
                )
            else:
                ranked = heapq.nsmallest(
                    4, [(-r, ids_of[i], i, c) for c, r, _ in cands for i in members[c][:4]]
                )
            out[row % 2].update((e[-2], e[-1]) for e in ranked)
        return self._by_id(out[0]), self._by_id(out[1])

    def _by_id(self, ends: set[tuple[int, int]]) -> list[tuple[int, int]]:
        """(node position, class) pairs sorted by node id."""
        ids_of = self.ids
        return sorted(ends, key=lambda ic: ids_of[ic[0]])

    def _probe(self, caps: tuple[Any, Any, Any], nb: int) -> _Probe:
        """What the capacity test needs at these capacities whatever the stage limit."""
        np = self.np
        mid, first, last = caps
        best_first, best_last = int(first.max()), int(last.max())
        if not best_first or not best_last:
            return _Probe(caps, None, 0)  # no class able to take a role: no end candidate
        # Nodes per interior capacity (0 left out), largest capacity first.
        if self.singletons:
            per_value = np.bincount(mid)
        else:
            per_value = np.bincount(mid, weights=self.sizes).astype(np.int64)
        per_value[0] = 0
        present = np.flatnonzero(per_value)[::-1]
        counts = per_value[present]
        interior = Interior(
            present.tolist(), np.cumsum(counts).tolist(), np.cumsum(counts * present).tolist()
        )
        # The largest capacity in each role is among that role's end candidates.
        return _Probe(caps, interior, best_first + best_last)

    def _pairs(self, probe: _Probe, nb: int) -> list[tuple[int, int, int, int]]:
        """The end pairs the test tries: (capacity as first, as last, and the two nodes'
        interior capacities), of distinct nodes."""
        if probe.pairs is None:
            mid, first, last = probe.caps
            probe.pairs = _pairs_of(probe.caps, *self._ends(first, last, mid, nb))
        return probe.pairs

    def _leading_pairs(self, probe: _Probe, nb: int) -> list[tuple[int, int, int, int]]:
        """Some of the pairs :meth:`_pairs` lists, found cheaply: the two largest
        capacities in each role (ties to the least id) are among its end candidates."""
        if probe.leading is None:
            _, first, last = probe.caps
            probe.leading = _pairs_of(probe.caps, *self._leaders(first, last, nb))
        return probe.leading

    def _leaders(
        self, first: Any, last: Any, nb: int
    ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """Per role (first, last), the two nodes (position, class) of largest capacity in
        it, ties to the least id, of those able to take it."""
        return self._role_leaders(first), self._role_leaders(last)

    def _role_leaders(self, role: Any) -> list[tuple[int, int]]:
        """The two nodes (position, class) of largest capacity in ``role``, ties to the
        least id, of those able to take it: among the members of the two best classes."""
        # Capacity first, then the least first id: one key, largest best.
        key = role * self.id_span - self.first_ids
        best = int(key.argmax())
        key[best] = _LEAST
        classes = [best, int(key.argmax())] if len(key) > 1 else [best]
        ids_of, members = self.ids, self.members
        ranked = sorted(
            (-r, ids_of[i], i, c)
            for c, r in zip(classes, role[classes].tolist(), strict=True)
            if r > 0
            for i in members[c][:2]
        )
        return [(i, c) for *_, i, c in ranked[:2]]

    def _probe_passes(self, probe: _Probe, nb: int, max_stages: int) -> bool:
        """:meth:`passes` from a probe's figures."""
        interior = probe.interior
        if interior is None:
            return False
        k_inner = max_stages - 2
        # Leaving two ends out of the interior never raises its sum: no pair can pass
        # when the best ends with the whole top cannot.
        if probe.best_ends + interior.top(min(k_inner, interior.size)) < nb:
            return False
        # Whether some pair passes: the leading pairs first (listing every end candidate
        # costs more, and is needed only when none of them does).
        return any(
            interior.pair_passes(f, lst, mf, ml, k_inner, nb)
            for pairs in (self._leading_pairs, self._pairs)
            for f, lst, mf, ml in pairs(probe, nb)
        )

    def passes(self, caps: tuple[Any, Any, Any], nb: int, max_stages: int) -> bool:
        """Whether the capacity test passes at these class capacities: a first node, a
        last node and the ``max_stages − 2`` largest interior capacities among the rest
        hold every block."""
        return self._probe_passes(self._probe(caps, nb), nb, max_stages)

    def _passes_at(
        self, t: float, nb: int, max_stages: int, count: Callable[[float], tuple[Any, Any, Any]]
    ) -> tuple[bool, tuple[Any, Any, Any]]:
        """:meth:`passes` at the capacities of bottleneck ``t`` (``count(t)`` gives them),
        and those capacities.  What does not depend on the stage limit is kept per ``t``:
        the searches of several limits on one model probe many of the same bottlenecks."""
        probe = self._probes.get((t, nb))
        if probe is None:
            probe = self._probes[(t, nb)] = self._probe(count(t), nb)
        return self._probe_passes(probe, nb, max_stages), probe.caps

    def _caps_at(self, t: float) -> tuple[Any, Any, Any]:
        """:meth:`class_caps` within ``t`` (not strict)."""
        return self.class_caps(t, strict=False)

    def least_feasible(self, nb: int, max_stages: int) -> tuple[float, list[int]] | None:
        """The least candidate bottleneck T at which the capacity test passes, and the
        order it picks at T (node ids); None when it fails with no bound at all.

        Candidates are the stage times; while more than :data:`ENUMERATE` remain between
        the failing and the passing capacities, a weighted median of the remaining
        ranges' middle values halves them; then they are listed and bisected.  Where the
        answers of other stage limits settle it (:meth:`_settled`), no search is run.
        """
        found = self._settled(nb, max_stages) or self._least_searched(nb, max_stages)
        if found is not None and math.isfinite(found[0]):
            self._least[(nb, max_stages)] = found[0]
        return found

    def _settled(self, nb: int, max_stages: int) -> tuple[float, list[int]] | None:
        """:meth:`least_feasible` read off the answers of other stage limits, where they
        settle it (None where they do not).

        The test passing at some capacities with ``s`` stages passes with more (the
        interior sums more of the same capacities), and passing at some capacities it
        passes at larger ones (later bottlenecks): so the least bottleneck is at least
        that of a larger limit and at most that of a smaller one.  It is the former where
        the test passes there, and the latter where the test fails just below it (at the
        capacities counted strictly below, which every smaller candidate's are within).
        The order is then the one picked at that bottleneck's capacities, as the search
        picks it.
        """
        more = [t for (b, s), t in self._least.items() if b == nb and s > max_stages]
        if more:
            lower = max(more)
            ok, caps = self._passes_at(lower, nb, max_stages, self._caps_at)
            if ok:
                return lower, self._picked(caps, nb, max_stages)
        fewer = [t for (b, s), t in self._least.items() if b == nb and s < max_stages]
        if fewer:
            upper = min(fewer)
            below = self._probe(self.class_caps(upper, strict=True), nb)
            if not self._probe_passes(below, nb, max_stages):
                ok, caps = self._passes_at(upper, nb, max_stages, self._caps_at)
                if ok:  # it does: it passes there with fewer stages
                    return upper, self._picked(caps, nb, max_stages)
        return None

    def _picked(self, caps: tuple[Any, Any, Any], nb: int, max_stages: int) -> list[int]:
        """The order picked at capacities where the test passes."""
        order = self.order(caps, nb, max_stages)
        assert order is not None
        return order

    def _least_searched(self, nb: int, max_stages: int) -> tuple[float, list[int]] | None:
        """:meth:`least_feasible` by its search."""
        np = self.np
        ok, hi_caps = self._passes_at(math.inf, nb, max_stages, self._caps_at)
        if not ok:
            return None
        zero = np.zeros(len(self.members), dtype=np.int64)
        bracket = _Bracket((zero, zero, zero), math.inf, hi_caps)
        force = False
        while True:
            spans = _Spans(np, bracket, self.sizes)
            if spans.count <= ENUMERATE or force:
                t = self._least_listed(spans, bracket, nb, max_stages)
                break
            pivot = self._weighted_median(spans)
            if pivot >= bracket.hi_t:  # ties at the top: list them all
                force = True
                continue
            ok, caps = self._passes_at(pivot, nb, max_stages, self._caps_at)
            if ok:
                bracket.hi_t, bracket.hi_caps = pivot, caps
            else:
                bracket.lo_caps = caps
        order = self.order(bracket.hi_caps, nb, max_stages)
        assert order is not None
        return t, order

    def _weighted_median(self, spans: _Spans) -> float:
        """A weighted median of the spans' middle values: the capacity test there removes
        at least a quarter of the candidates left."""
        np = self.np
        middle = np.concatenate(
            (
                self.stage[spans.rows0, (spans.a0 + spans.b0) // 2],
                self.tail[spans.rows2, (spans.a2 + spans.b2) // 2],
            )
        )
        weights = np.concatenate((spans.w0, spans.w2))
        # Alike middle values are one pivot whichever of them the weights reach.
        order = np.argsort(middle, kind="stable")
        reached = np.cumsum(weights[order])
        at = int(np.searchsorted(reached, spans.count / 2, side="left"))
        return float(middle[order[min(at, len(order) - 1)]])

    def _least_listed(self, spans: _Spans, bracket: _Bracket, nb: int, max_stages: int) -> float:
        """The least listed candidate of the spans at which the test passes (the bracket's
        passing bound if none), by bisection; the bracket's passing side follows it."""
        np = self.np
        rows0, rows2 = spans.rows0, spans.rows2
        a0, b0, a2, b2 = spans.a0, spans.b0, spans.a2, spans.b2
        cols0 = np.arange(self.stage.shape[1])
        cols2 = np.arange(self.tail.shape[1])
        in0 = (cols0 >= a0[:, None]) & (cols0 < b0[:, None])
        in2 = (cols2 >= a2[:, None]) & (cols2 < b2[:, None])
        listed = _Listed(
            np,
            bracket.lo_caps,
            self.k_first,
            (np.repeat(rows0, b0 - a0), self.stage[rows0][in0]),
            (np.repeat(rows2, b2 - a2), self.tail[rows2][in2]),
        )
        values = np.unique(np.concatenate((listed.values0, listed.values2)))
        cands = values[values < bracket.hi_t].tolist()
        left, right = 0, len(cands)  # the answer is cands[right] (or hi_t at len)
        while left < right:
            m = (left + right) // 2
            ok, caps = self._passes_at(cands[m], nb, max_stages, listed.caps)
            if ok:
                right, bracket.hi_caps = m, caps
            else:
                left = m + 1
        return cands[right] if right < len(cands) else bracket.hi_t

    def relaxation_fails(self, t: float, nb: int, max_stages: int) -> bool:
        """Whether the relaxed capacity test of
        :func:`~stowplan.planner.strategies.throughput.proves_optimal` fails strictly
        below ``t``: the ``max_stages`` largest interior capacities (two at least) and
        the best gains of two different nodes as stage 0 and as the last stage hold
        fewer than ``nb`` blocks."""
        np = self.np
        mid, first, last = (part[self.cls] for part in self.class_caps(t, strict=True))
        n = len(mid)
        positions = np.arange(n)

        def best_two(role: Any) -> list[tuple[int, int]]:
            # The two largest (gain, position) of the nodes able to take the role: one key
            # (gain, then position, which is below n), the least where it cannot.
            gain = role - mid
            key = np.where(role > 0, gain * n + positions, _LEAST)
            top = []
            for _ in range(min(2, n)):
                at = int(key.argmax())
                if key[at] == _LEAST:
                    break
                top.append((int(gain[at]), at))
                key[at] = _LEAST
            return top

        gains = [gf + gl for gf, f in best_two(first) for gl, lst in best_two(last) if f != lst]
        if not gains:
            return True
        top = max(max_stages, 2)
        held = np.sort(mid)[::-1][:top]
        return int(held.sum()) + max(gains) < nb

    def _node_ends(self, role: Any, mid: Any, nb: int) -> list[int]:
        """End candidates by node: the four largest capacities in the role and the four
        least losses against the interior role, ties to the least id; sorted by id."""
        np = self.np
        able = np.flatnonzero(role > 0)
        r, ids = role[able], self.node_ids[able]
        span = self.id_span
        picked: set[int] = set()
        for key in (
            (nb - r) * span + ids,
            ((mid[able] - r + nb) * (nb + 1) + (nb - r)) * span + ids,
        ):
            best = np.argpartition(key, 3)[:4] if key.size > 4 else np.arange(key.size)
            picked.update(able[best].tolist())
        return sorted(picked, key=self.ids.__getitem__)

    def order(self, class_caps: tuple[Any, Any, Any], nb: int, max_stages: int) -> list[int] | None:
        """The order the capacity test picks at these class capacities (node ids): the
        first node, the ``max_stages − 2`` largest interior capacities among the rest by
        capacity then id, the last node; None if the test fails."""
        np = self.np
        mid, first, last = (part[self.cls] for part in class_caps)
        ids = self.node_ids
        able = np.flatnonzero(mid > 0)
        ranked = able[np.lexsort((ids[able], -mid[able]))]
        place = np.full(len(mid), -1, dtype=np.int64)
        place[ranked] = np.arange(len(ranked))
        prefix = [0, *np.cumsum(mid[ranked]).tolist()]
        k_inner = max_stages - 2
        top_first = self._node_ends(first, mid, nb)
        top_last = self._node_ends(last, mid, nb)
        ends = sorted(set(top_first) | set(top_last))
        at = dict(zip(ends, place[ends].tolist(), strict=True))
        held = dict(zip(ends, mid[ends].tolist(), strict=True))
        as_first = dict(zip(top_first, first[top_first].tolist(), strict=True))
        as_last = dict(zip(top_last, last[top_last].tolist(), strict=True))
        size = len(ranked)
        best_total = -1
        best: tuple[int, int, int] | None = None
        for f in top_first:
            for lst in top_last:
                if f == lst:
                    continue
                # The first k_inner of ranked without f and lst.
                end = min(k_inner, size)
                excluded = 0
                for p, e in sorted((at[e], e) for e in (f, lst) if at[e] >= 0):
                    if p < end:
                        excluded += held[e]
                        end = min(end + 1, size)
                total = as_first[f] + as_last[lst] + prefix[end] - excluded
                if total >= nb and total > best_total:
                    best_total, best = total, (f, lst, end)
        if best is None:
            return None
        f, lst, end = best
        inner = [i for i in ranked[:end].tolist() if i not in (f, lst)]
        ids_of = self.ids
        return [ids_of[f], *(ids_of[i] for i in inner), ids_of[lst]]


def fluid_capacity(
    xfer: Sequence[float],
    stage: Sequence[float],
    inverse_rate: Sequence[float],
    limit: Sequence[float],
    top: int,
) -> Any:
    """The fractional capacity test of :func:`~stowplan.planner.exact.pipelines.fluid_bound`
    on arrays: ``capacity(tm)`` is the same count as the pure one's.

    Per node, the fractional blocks within ``tm`` as an interior stage (after its
    transfer) and as the last stage (no transfer), ``min(max(tm − x − s, 0) / rate,
    limit)`` (the limit itself where the rate is 0); the ``top`` largest interior ones,
    each floored, plus the best end gain, floored, plus one.
    """
    np = numpy_module()
    x = np.asarray(xfer, dtype=np.float64)
    s = np.asarray(stage, dtype=np.float64)
    v = np.asarray(inverse_rate, dtype=np.float64)
    c = np.asarray(limit, dtype=np.float64)
    free = v == math.inf
    v = np.where(free, 0.0, v)
    any_free = bool(free.any())
    n = len(c)
    cut = n - min(top, n)
    mid, end = np.empty(n), np.empty(n)

    def blocks(out: Any, tm: float, after: Any | None) -> Any:
        """``min(max(tm − after − s, 0) · v, c)`` into ``out`` (``after`` None: no
        transfer), the limit where the rate is 0; the same operations in the same order."""
        if after is None:
            np.subtract(tm, s, out=out)
        else:
            np.subtract(tm, after, out=out)
            np.subtract(out, s, out=out)
        np.maximum(out, 0.0, out=out)
        np.multiply(out, v, out=out)
        np.minimum(out, c, out=out)
        if any_free:
            np.copyto(out, c, where=free)
        return out

    def capacity(tm: float) -> float:
        blocks(mid, tm, x)
        blocks(end, tm, None)
        gain = float(np.subtract(end, mid, out=end).max())
        held = np.floor(np.add(mid, 1e-9, out=mid), out=mid)
        if cut > 0:
            held = np.partition(held, cut)[cut:]
        return float(held.sum()) + math.floor(gain + 1e-9) + 1

    return capacity
