"""``throughput``: the least slowest stage (what m microbatches wait on each cycle).

For a fixed node order the min-max contiguous split is solved exactly by
bisection on the bottleneck time T with a greedy feasibility test: each node
in turn takes the most blocks it can within T and its VRAM (a node that can
take none is skipped); the first node that can hold all remaining blocks plus
the head finishes.  Taking the most blocks is never worse because every later
stage's feasibility is monotone in where it starts.

Which nodes, and which go at the two ends, is chosen by a capacity test: at
bottleneck T each node can hold some number of blocks as an interior stage,
as stage 0 (with the embed) or as the last stage (with the head, and no
outbound transfer); T passes when the best first node, the best last node and
the best ``max_stages − 2`` others hold every block.  Capacities only change
at the stage times of k blocks on a node, so the least passing T is found by
bisection over that finite set (listed outright once a few thousand remain;
before that, a weighted median of the remaining ranges halves them).  Each
node's stage times are computed once, not per step.

When blocks are all alike a looser test (no end node chosen, just the best
end gains) is a relaxation of every pipeline; when it fails just below the
plan's bottleneck the plan is proven optimal, and the peer rules need not be
run to show it is not worse than theirs.
"""

from __future__ import annotations

import heapq
import math
import operator
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from functools import cached_property
from itertools import accumulate, compress
from typing import Any, NamedTuple

from stowplan.cost import CostModel
from stowplan.planner.problem import Problem
from stowplan.planner.strategies.capacity_arrays import (
    ARRAY_NODES,
    ENUMERATE,
    CapacityArrays,
    RoleRows,
    first_seen_groups,
    numpy_module,
)
from stowplan.planner.strategies.evaluated import evaluated_here
from stowplan.planner.strategies.interior import Interior
from stowplan.planner.strategies.memo import PerModel
from stowplan.planner.strategies.split_tables import split_tables

__all__ = [
    "Pipeline",
    "fastest_single",
    "greedy_split",
    "kept_bottleneck_split",
    "min_bottleneck_split",
    "proves_optimal",
    "relaxed_bottleneck",
    "role_capacity",
    "search_throughput",
    "slower_than",
    "throughput_pipeline",
    "throughput_search",
]

Pipeline = tuple[list[int], list[int]]
"""Node indices in stage order and block boundaries (len N+1)."""

_ITERATIONS = 48


def greedy_split(
    cm: CostModel,
    order: Sequence[int],
    t_max: float,
    min_stages: int = 1,
    max_stages: int | None = None,
) -> Pipeline | None:
    """A split of the blocks over a subsequence of ``order`` with every stage ≤ ``t_max``
    (and at most ``max_stages`` stages, as :func:`_split_or_next` keeps to them)."""
    return _split_or_next(cm, order, t_max, min_stages, max_stages=max_stages)[0]


def _split_or_next(
    cm: CostModel,
    order: Sequence[int],
    t_max: float,
    min_stages: int,
    suffix: Sequence[float] | None = None,
    max_stages: int | None = None,
) -> tuple[Pipeline | None, float]:
    """:func:`greedy_split`, and when it finds no split the least bottleneck above
    ``t_max`` at which any of its choices could change (infinite when none can).

    Every choice of the split compares one stage time with ``t_max``: a node's reach
    (it changes once ``t_max`` reaches the time of one block more), a node ending the
    model (once it reaches that last stage's time), a node passed over because its least
    last stage is slower.  Below the least of the times that failed, every comparison
    comes out the same, and so does the split: no bottleneck in ``[t_max, next)``
    passes.  ``suffix``: as :func:`_ended` reads it.

    ``max_stages``: once all but one of that many stages are taken, only a node that ends
    the model may follow (the split fails where none does).  That compares no further
    times, so the least bottleneck returned holds as it is."""
    nb = cm.num_blocks
    pos = 0
    used: list[int] = []
    bounds = [0]
    gpu_class, xfer = cm.gpu_class, cm.xfer_s
    tables = split_tables(cm)
    nearest = math.inf
    # Per GPU class, the least transfer of a node that took nothing since the split last
    # grew: a node of the class at the same point of the split whose transfer is no less
    # takes nothing too (each of its stage times is no less, the last the same), and
    # changes no least bottleneck above ``t_max``.
    idle: dict[int, float] = {}
    # The last block a node may take while stages are still owed, and whether the next
    # stage may end the model: both change only when the split grows.
    cap = nb - max(min_stages - 1, 1)
    may_end = min_stages <= 1
    reach_of, end_of = tables.reach, tables.end
    last = len(order) if max_stages is None else max_stages - 1
    for i, d in enumerate(order):
        if pos >= cap or len(used) >= last:
            # No node can take a block now (the stages still owed keep the rest, or the
            # next stage is the last allowed): only a node that ends the model can follow,
            # the first such in the rest of the order.
            ended, later = _ended(cm, order, i, t_max, min_stages, used, bounds, suffix)
            return ended, min(nearest, later)
        c = gpu_class[d]
        if c in idle and xfer[d] >= idle[c]:
            continue
        first = not used
        if may_end:
            end = end_of(cm, d, pos, first)
            if end is not None:
                if end <= t_max:
                    used.append(d)
                    bounds.append(nb)
                    return (used, bounds), nearest
                nearest = min(nearest, end)
        reach, further = reach_of(cm, d, pos, t_max, first)
        if reach < cap:
            nearest = min(nearest, further)
        else:
            reach = cap
        if reach > pos:
            used.append(d)
            bounds.append(reach)
            pos = reach
            idle.clear()
            cap = nb - max(min_stages - len(used) - 1, 1)
            may_end = len(used) + 1 >= min_stages
        else:
            idle[c] = xfer[d]
    return None, nearest


def _ended(
    cm: CostModel,
    order: Sequence[int],
    start: int,
    t_max: float,
    min_stages: int,
    used: list[int],
    bounds: list[int],
    suffix: Sequence[float] | None,
) -> tuple[Pipeline | None, float]:
    """:func:`greedy_split`'s end once no node can take a block: the first node of
    ``order[start:]`` that holds the blocks left and the head within ``t_max``; a node
    whose least last stage is slower is not tried.  (It is reached only where the split
    has just grown or not begun: no node has yet taken nothing at this point of it.)
    With no such node, the least bottleneck at which one could end it (as
    :func:`_split_or_next`).

    ``suffix`` (:func:`_suffix_least` of ``order``, or None) ends the scan where every
    node left has a slower least last stage: each would only be passed over, and the least
    of their times is the suffix's."""
    if len(used) + 1 < min_stages:
        return None, math.inf
    pos, first = bounds[-1], not used
    least = _least_last_times(cm)
    tables = split_tables(cm)
    if suffix is not None and suffix[start] > t_max:
        return None, suffix[start]
    nearest = math.inf
    for j in range(start, len(order)):
        d = order[j]
        if least[d] > t_max:
            nearest = min(nearest, least[d])
            continue
        end = tables.end(cm, d, pos, first)
        if end is not None:
            if end <= t_max:
                return ([*used, d], [*bounds, cm.num_blocks]), nearest
            nearest = min(nearest, end)
        if suffix is not None and suffix[j + 1] > t_max:
            return None, min(nearest, suffix[j + 1])
    return None, nearest


def _suffix_least(cm: CostModel, order: Sequence[int]) -> list[float]:
    """Per position of ``order`` (and one past its end, infinite), the least of
    :func:`_least_last` over the nodes from there on."""
    least = _least_last_times(cm)
    out = list(accumulate(reversed([least[d] for d in order]), min, initial=math.inf))
    out.reverse()
    return out


def _least_last(cm: CostModel) -> list[float]:
    """Per node, the time of the last block and the head as the last stage: no last stage
    on it is faster (it holds at least those)."""
    nb, rp, kp = cm.num_blocks, cm.read_prefix, cm.kv_prefix
    weights = rp[nb] - rp[nb - 1] + cm.head
    read = weights + kp[nb] - kp[nb - 1]
    return [
        max(read * ib, weights * fl) + bs + ss
        for ib, fl, bs, ss in zip(
            cm.inv_bw, cm.flop_s_per_byte, cm.block_s, cm.stage_s, strict=True
        )
    ]


_least_last_times = PerModel(_least_last)


def min_bottleneck_split(
    cm: CostModel,
    order: Sequence[int],
    min_stages: int = 1,
    upper: float | None = None,
    max_stages: int | None = None,
) -> Pipeline | None:
    """The split of ``order`` (nodes may be skipped) minimising the slowest stage.

    A bisection on the bottleneck whose failed steps jump to the next time at which the
    greedy split could change (:func:`_split_or_next`): it ends as soon as no such time
    lies below the best split's bottleneck, and that split is then rebuilt at exactly
    that bottleneck (the tightest greedy split reaching it).

    Under a bound the split within it is often already the least: where the greedy split
    fails just below its bottleneck, it fails at every bottleneck below (the split's
    feasibility is monotone in the bottleneck), the bisection could only end there, and
    it is not run.

    With ``max_stages`` the greedy split keeps to that many stages (:func:`_split_or_next`)
    and the same bisection runs: the split it finds is the least the greedy split reaches
    within them, not always the least of every such split (the greedy split's feasibility
    is no longer monotone in the bottleneck where it fills the stages).  On a long order
    it stops where the stages run out, not at the end of the order."""
    hi = math.inf if upper is None else upper
    best = greedy_split(cm, order, hi, min_stages, max_stages)
    if best is None:
        return None
    hi = evaluated_here(cm, *best).bottleneck_s
    lo = 0.0
    suffix = _suffix_least(cm, order)
    if upper is not None and hi > 0.0:
        below = math.nextafter(hi, 0.0)
        if _split_or_next(cm, order, below, min_stages, suffix, max_stages)[0] is None:
            return greedy_split(cm, order, hi, min_stages, max_stages) or best
    for _ in range(_ITERATIONS):
        if hi - lo <= 1e-12 * hi:
            # Within rounding of the best: the times a choice changes at from ``lo`` up to
            # it, in turn (none below ``lo`` passes); the first that passes is the least.
            while 0.0 < lo < hi:
                found, later = _split_or_next(cm, order, lo, min_stages, suffix, max_stages)
                if found is not None:
                    best, hi = found, evaluated_here(cm, *found).bottleneck_s
                    break
                lo = later
            break
        mid = (lo + hi) / 2
        found, later = _split_or_next(cm, order, mid, min_stages, suffix, max_stages)
        if found is None:
            if later >= hi:
                break
            lo = later
        else:
            best = found
            hi = evaluated_here(cm, *found).bottleneck_s
    return greedy_split(cm, order, hi, min_stages, max_stages) or best


def _no_splits(
    cm: CostModel,
) -> dict[tuple[tuple[int, ...], int, float | None, int | None], Pipeline | None]:
    return {}


_splits = PerModel(_no_splits)
"""Per cost model, :func:`min_bottleneck_split` of each order, stage limits and bound."""


def kept_bottleneck_split(
    cm: CostModel,
    order: Sequence[int],
    min_stages: int = 1,
    upper: float | None = None,
    max_stages: int | None = None,
) -> Pipeline | None:
    """:func:`min_bottleneck_split`, kept per cost model, order, stage limits and
    ``upper`` (the stage counts that step at one microbatch search one model, and often
    split the same orders under the same bound): a copy each time."""
    kept = _splits(cm)
    key = (tuple(order), min_stages, upper, max_stages)
    if key not in kept:
        kept[key] = min_bottleneck_split(cm, order, min_stages, upper, max_stages)
    found = kept[key]
    return None if found is None else (list(found[0]), list(found[1]))


def role_capacity(cm: CostModel, d: int, t_max: float, first: bool, last: bool) -> int:
    """Blocks node ``d`` can hold in the given role within ``t_max`` and its VRAM.

    The role's blocks are counted from the start of the model (from its end
    for the last stage); for blocks that differ this is a heuristic.
    """
    times = _RoleTimes(cm, [d])
    caps = times.caps(t_max, strict=False)
    return caps[1 if first else 2 if last else 0][0]


class _RoleTimes:
    """Per node, the stage time of its first k blocks (k = 1 .. what fits in VRAM).

    ``base[d][k-1] + xfer[d]`` is the time of blocks ``[0, k)`` on node ``d`` as
    stage 0 or an interior stage (they differ only in the VRAM the embed takes);
    ``tail[d][k-1]`` the time of the last k blocks plus the head, as the last
    stage.  Both are non-decreasing in k, so a node's capacity at a bottleneck T
    is a bisection, and every T at which some capacity changes is one of these
    values: the search for the least feasible T runs over them.  The values
    are computed exactly as :meth:`CostModel.stage_time` computes them.
    """

    def __init__(self, cm: CostModel, nodes: Sequence[int]) -> None:
        self.nodes = list(nodes)
        self.arrays: CapacityArrays | None = None
        """The same figures on arrays, on a fleet of :data:`ARRAY_NODES` classes of
        nodes or more (few classes of many alike nodes stay on the pure path)."""
        self._source: _Classes | _ClassArrays
        if len(self.nodes) >= ARRAY_NODES and numpy_module() is not None:
            self._source = found = _classes_on_arrays(cm, self.nodes)
            if len(found.firsts) >= ARRAY_NODES:
                self.arrays = CapacityArrays(
                    RoleRows(found.base, found.base_of, found.tail, found.tail_of),
                    found.xfer,
                    found.held[:, 1],
                    None if found.singletons else self.members,
                    self.nodes,
                    found.cls,
                )
        else:
            self._source = _classes(cm, self.nodes)
        self._stage: list[list[float]] | None = None

    @cached_property
    def _lists(self) -> _Classes:
        """The classes as lists (built on first use when they came on arrays)."""
        source = self._source
        return source if isinstance(source, _Classes) else _as_lists(source, self.nodes)

    @property
    def cls(self) -> list[int]:
        """Per node position, its class: nodes alike in every figure the times use."""
        return self._lists.cls

    @property
    def members(self) -> list[list[int]]:
        """Per class, its node positions in order (of node id)."""
        return self._lists.members

    @property
    def _held(self) -> list[tuple[int, int, int]]:
        """Per class, the blocks it holds as an interior stage, as stage 0, as the last."""
        return self._lists.held

    @cached_property
    def xfer(self) -> list[float]:
        """Per node position, its transfer."""
        return self._lists.xfer

    @cached_property
    def rep(self) -> list[int]:
        """Per class, its first node position (whose figures every member shares)."""
        return [m[0] for m in self.members]

    @cached_property
    def first_ids(self) -> list[int]:
        """Per class, its first member's node id (the least)."""
        return [self.nodes[i] for i in self.rep]

    @cached_property
    def sizes(self) -> list[int]:
        """Per class, how many nodes it has."""
        return [len(m) for m in self.members]

    @cached_property
    def _rep_tail(self) -> list[list[float]]:
        found = self._lists
        return [found.tail[g] for g in found.tail_of]

    @cached_property
    def _rep_k_first(self) -> list[int]:
        return [h[1] for h in self._held]

    @property
    def k_mid(self) -> list[int]:
        """Per node position, the blocks it holds as an interior stage."""
        return [self._held[c][0] for c in self.cls]

    @property
    def k_first(self) -> list[int]:
        """Per node position, the blocks it holds as stage 0 (beside the embed)."""
        return [self._held[c][1] for c in self.cls]

    @property
    def k_last(self) -> list[int]:
        """Per node position, the blocks it holds as the last stage (with the head)."""
        return [self._held[c][2] for c in self.cls]

    @property
    def base(self) -> list[list[float]]:
        """Per node position, its base times (blocks ``[0, k)`` without its transfer)."""
        found = self._lists
        return [found.base[found.base_of[c]] for c in self.cls]

    @property
    def tail(self) -> list[list[float]]:
        """Per node position, its tail times (the last k blocks with the head)."""
        return [self._rep_tail[c] for c in self.cls]

    @property
    def stage(self) -> list[list[float]]:
        """Per class, the stage times as the test compares them (``v + xfer``, the same
        floats): a capacity at T is then one bisection of a sorted list."""
        if self._stage is None:
            found = self._lists
            self._stage = [
                [v + self.xfer[i] for v in found.base[g]]
                for i, g in zip(self.rep, found.base_of, strict=True)
            ]
        return self._stage

    def class_caps(self, t: float, strict: bool) -> tuple[list[int], list[int], list[int]]:
        """:meth:`caps` per class (every member of a class holds as many blocks)."""
        if self.arrays is not None:
            return self.arrays.caps(t, strict)
        # ``v + x`` is non-decreasing in v, so a count is a bisection of the shifted times.
        count = bisect_left if strict else bisect_right
        mids = [count(times, t) for times in self.stage]
        lasts = [count(times, t) for times in self._rep_tail]
        firsts = list(map(min, mids, self._rep_k_first))
        return mids, firsts, lasts

    def caps(self, t: float, strict: bool) -> tuple[list[int], list[int], list[int]]:
        """Blocks each node holds within ``t`` (``< t`` when strict): interior, first, last."""
        mid, first, last = self.class_caps(t, strict)
        cls = self.cls
        return [mid[c] for c in cls], [first[c] for c in cls], [last[c] for c in cls]

    def values(self, i: int, role: int, lo: int, hi: int) -> list[float]:
        """Stage times of k = lo+1 .. hi blocks of node ``i`` in ``role`` (0/1: base, 2: tail)."""
        if role == 2:
            return self._rep_tail[self.cls[i]][lo:hi]
        return self.stage[self.cls[i]][lo:hi]


def _role_counts(cm: CostModel, u: int) -> tuple[int, int, int]:
    """Blocks a node of ``u`` usable bytes holds as an interior stage, as stage 0 (beside
    the embed) and as the last stage (blocks ``[nb − k, nb)`` beside the head)."""
    nb, mp = cm.num_blocks, cm.mem_prefix
    k_mid = max(min(nb, bisect_right(mp, u) - 1), 0)
    k_first = max(min(nb, bisect_right(mp, u - cm.embed) - 1), 0)
    room = u - cm.head
    k_last = max(min(0 if room < 0 else nb - bisect_left(mp, mp[nb] - room), nb), 0)
    return k_mid, k_first, k_last


def _base_times(
    cm: CostModel, ib: float, fl: float, bs: float, ss: float, k_mid: int
) -> list[float]:
    """Stage times of blocks ``[0, k)``, k = 1 .. ``k_mid``, at these rates, without the
    transfer (as :meth:`CostModel.stage_time` computes them)."""
    rp, kp = cm.read_prefix, cm.kv_prefix
    return [max((rp[k] + kp[k]) * ib, rp[k] * fl) + (k * bs + ss) for k in range(1, k_mid + 1)]


def _tail_times(
    cm: CostModel, ib: float, fl: float, bs: float, ss: float, k_last: int
) -> list[float]:
    """Stage times of the last k blocks with the head, k = 1 .. ``k_last``, at these rates
    (as :meth:`CostModel.stage_time` computes them)."""
    nb, rp, kp, head = cm.num_blocks, cm.read_prefix, cm.kv_prefix, cm.head
    return [
        max(
            (rp[nb] - rp[nb - k] + head + kp[nb] - kp[nb - k]) * ib,
            (rp[nb] - rp[nb - k] + head) * fl,
        )
        + (k * bs + ss)
        for k in range(1, k_last + 1)
    ]


class _Classes(NamedTuple):
    """Node classes and their stage times: per node position its class; per class its
    positions (by node id), the blocks it holds in each role (interior, first, last), and
    which of the distinct base and tail time lists are its own."""

    cls: list[int]
    members: list[list[int]]
    held: list[tuple[int, int, int]]
    base: list[list[float]]
    base_of: list[int]
    tail: list[list[float]]
    tail_of: list[int]
    xfer: list[float]
    """Per node position, its transfer."""


def _classes(cm: CostModel, nodes: list[int]) -> _Classes:
    """The nodes' classes: alike in every figure the stage times use (rates, block and
    stage costs, blocks held per role, transfer), numbered as they first come.  Classes
    alike in rates and a role's block count share that role's list of times."""
    usable = cm.usable
    counts = {u: _role_counts(cm, u) for u in {usable[d] for d in nodes}}
    classes: dict[tuple[float | int, ...], int] = {}
    cls: list[int] = []
    held: list[tuple[int, int, int]] = []
    base_of: list[int] = []
    tail_of: list[int] = []
    base_index: dict[tuple[float | int, ...], int] = {}
    tail_index: dict[tuple[float | int, ...], int] = {}
    base: list[list[float]] = []
    tail: list[list[float]] = []
    for d in nodes:
        rates = (cm.inv_bw[d], cm.flop_s_per_byte[d], cm.block_s[d], cm.stage_s[d])
        h = counts[usable[d]]
        key = (*rates, *h, cm.xfer_s[d])
        c = classes.get(key)
        if c is None:
            c = classes[key] = len(held)
            held.append(h)
            for index, rows, of, k, times in (
                (base_index, base, base_of, h[0], _base_times),
                (tail_index, tail, tail_of, h[2], _tail_times),
            ):
                g = index.get((*rates, k))
                if g is None:
                    g = index[(*rates, k)] = len(rows)
                    rows.append(times(cm, *rates, k))
                of.append(g)
        cls.append(c)
    members = _members(cls, len(held), nodes)
    xfer = [cm.xfer_s[d] for d in nodes]
    return _Classes(cls, members, held, base, base_of, tail, tail_of, xfer)


class _ClassArrays(NamedTuple):
    """:class:`_Classes` on arrays: per node position its class (``cls``); per class its
    first position (``firsts``), blocks held per role (``held``, one row each), transfer
    (``xfer``) and time lists (``base[base_of[c]]``, ``tail[tail_of[c]]``); per position
    its transfer (``node_xfer``)."""

    cls: Any
    firsts: Any
    held: Any
    xfer: Any
    base: list[list[float]]
    base_of: Any
    tail: list[list[float]]
    tail_of: Any
    node_xfer: Any

    @property
    def singletons(self) -> bool:
        """Whether every class is one node."""
        return len(self.firsts) == len(self.cls)


def _classes_on_arrays(cm: CostModel, nodes: list[int]) -> _ClassArrays:
    """:func:`_classes` on arrays: the same classes, numbers and lists (the figures
    compared as the same floats)."""
    np = numpy_module()
    at = np.asarray(nodes, dtype=np.int64)
    # Nodes of one usable VRAM hold as many blocks in every role (bytes may pass int64).
    rooms: dict[int, int] = {}
    room_of = [rooms.setdefault(cm.usable[d], len(rooms)) for d in nodes]
    counts = np.array([_role_counts(cm, u) for u in rooms], dtype=np.int64)
    held_at = counts[np.asarray(room_of, dtype=np.int64)]
    table = np.empty((8, len(nodes)))
    for row, figure in enumerate(
        (cm.inv_bw, cm.flop_s_per_byte, cm.block_s, cm.stage_s, cm.xfer_s)
    ):
        table[row if row < 4 else 7] = np.asarray(figure, dtype=np.float64)[at]
    table[4:7] = held_at.T
    group, firsts = first_seen_groups(table)
    reps = table[:, firsts]
    shared = []
    for count_row, times in ((4, _base_times), (6, _tail_times)):
        of, first_of = first_seen_groups(reps[[0, 1, 2, 3, count_row]])
        rows = [
            times(cm, ib, fl, bs, ss, int(k))
            for ib, fl, bs, ss, k in reps[[0, 1, 2, 3, count_row]][:, first_of].T.tolist()
        ]
        shared.append((rows, of))
    (base, base_of), (tail, tail_of) = shared
    return _ClassArrays(
        group, firsts, held_at[firsts], reps[7], base, base_of, tail, tail_of, table[7]
    )


def _as_lists(found: _ClassArrays, nodes: list[int]) -> _Classes:
    """The classes found on arrays as :func:`_classes` lists them."""
    cls = found.cls.tolist()
    if found.singletons:
        members = [[i] for i in found.firsts.tolist()]
    else:
        members = _members(cls, len(found.firsts), nodes)
    return _Classes(
        cls,
        members,
        list(map(tuple, found.held.tolist())),
        found.base,
        found.base_of.tolist(),
        found.tail,
        found.tail_of.tolist(),
        found.node_xfer.tolist(),
    )


def _members(cls: list[int], k: int, nodes: list[int]) -> list[list[int]]:
    """Per class, its node positions ordered by node id."""
    members: list[list[int]] = [[] for _ in range(k)]
    for i, c in enumerate(cls):
        members[c].append(i)
    for m in members:
        if len(m) > 1:
            m.sort(key=nodes.__getitem__)
    return members


_Caps = tuple[list[int], list[int], list[int]]


def _capacity_order(
    nodes: Sequence[int], caps: _Caps, nb: int, max_stages: int
) -> list[int] | None:
    """The order the capacity test picks at these capacities (node ids), None if it fails.

    The first node, the last node and the ``max_stages − 2`` largest interior
    capacities among the rest must hold every block.  The ends are tried among
    the largest capacities in their role and the smallest losses against the
    interior role.
    """
    mid, first, last = caps
    n = len(nodes)
    ranked = sorted((i for i in range(n) if mid[i] > 0), key=lambda i: (-mid[i], nodes[i]))
    pos = {i: p for p, i in enumerate(ranked)}
    prefix = [0]
    for i in ranked:
        prefix.append(prefix[-1] + mid[i])
    k_inner = max_stages - 2
    top_first = _top_ends(nodes, first, mid)
    top_last = _top_ends(nodes, last, mid)
    best_total = -1
    best: tuple[int, int, int] | None = None
    for f in top_first:
        for lst in top_last:
            if f == lst:
                continue
            # The first k_inner of ranked without f and lst.
            end = min(k_inner, len(ranked))
            excluded = 0
            for p in sorted(pos[e] for e in (f, lst) if e in pos):
                if p < end:
                    excluded += mid[ranked[p]]
                    end = min(end + 1, len(ranked))
            total = first[f] + last[lst] + prefix[end] - excluded
            if total >= nb and total > best_total:
                best_total, best = total, (f, lst, end)
    if best is None:
        return None
    f, lst, end = best
    inner = [nodes[i] for i in ranked[:end] if i not in (f, lst)]
    return [nodes[f], *inner, nodes[lst]]


def _top_ends(nodes: Sequence[int], role: list[int], mid: list[int]) -> list[int]:
    """End candidates: the largest capacities in the role and the smallest losses vs interior."""
    able = [i for i in range(len(nodes)) if role[i] > 0]
    by_cap = sorted(able, key=lambda i: (-role[i], nodes[i]))[:4]
    by_gain = sorted(able, key=lambda i: (mid[i] - role[i], -role[i], nodes[i]))[:4]
    return sorted(set(by_cap) | set(by_gain), key=lambda i: nodes[i])


def _class_ends(times: _RoleTimes, role: list[int], mid: list[int]) -> list[tuple[int, int]]:
    """:func:`_top_ends` from class capacities: (node position, its class), the same nodes
    (a class offers only its first four members: no more can be among the four best)."""
    ids = times.nodes
    members = times.members
    # A class's members share its key but for their ids, sorted: the four best nodes are
    # among the members of the four classes whose first member is best (classes able to
    # take the role: ``compress`` keeps those whose capacity in it is not 0).
    classes = range(len(members))
    neg = list(map(operator.neg, role))
    cap_classes = heapq.nsmallest(
        4, compress(zip(neg, times.first_ids, classes, strict=True), role)
    )
    by_cap = heapq.nsmallest(
        4, [(-role[c], ids[i], i, c) for *_, c in cap_classes for i in members[c][:4]]
    )
    gain_classes = heapq.nsmallest(
        4,
        compress(
            zip(map(operator.sub, mid, role), neg, times.first_ids, classes, strict=True), role
        ),
    )
    by_gain = heapq.nsmallest(
        4,
        [
            (mid[c] - role[c], -role[c], ids[i], i, c)
            for *_, c in gain_classes
            for i in members[c][:4]
        ],
    )
    ends = {(e[-2], e[-1]) for e in by_cap} | {(e[-2], e[-1]) for e in by_gain}
    return sorted(ends, key=lambda ic: ids[ic[0]])


_NODE_LEVEL = 16
"""Up to this many nodes the capacity test runs node by node (cheaper than counting)."""


def _passes(times: _RoleTimes, caps: _Caps, nb: int, max_stages: int) -> bool:
    """Whether :func:`_capacity_order` finds an order at these class capacities.

    The same test, by counts: the ``max_stages − 2`` largest interior capacities among the
    nodes other than the two ends sum the same whichever nodes alike hold them.
    """
    mid, first, last = caps
    if len(times.nodes) <= _NODE_LEVEL:
        cls = times.cls
        node_caps = ([mid[c] for c in cls], [first[c] for c in cls], [last[c] for c in cls])
        return _capacity_order(times.nodes, node_caps, nb, max_stages) is not None
    # Interior capacities, largest first: distinct values, how many nodes reach each.
    counts: dict[int, int] = {}
    for v, size_c in zip(mid, times.sizes, strict=True):
        if v > 0:
            counts[v] = counts.get(v, 0) + size_c
    values = sorted(counts, reverse=True)
    reach = list(accumulate(counts[v] for v in values))
    sums = list(accumulate(counts[v] * v for v in values))
    interior = Interior(values, reach, sums)
    k_inner = max_stages - 2
    ends_first = _class_ends(times, first, mid)
    ends_last = _class_ends(times, last, mid)
    for f, cf in ends_first:
        for lst, cl in ends_last:
            if f != lst and interior.pair_passes(
                first[cf], last[cl], mid[cf], mid[cl], k_inner, nb
            ):
                return True
    return False


def _least_feasible(times: _RoleTimes, nb: int, max_stages: int) -> tuple[float, list[int]] | None:
    """The least candidate bottleneck T at which the capacity test passes, and its order."""
    if times.arrays is not None:
        return times.arrays.least_feasible(nb, max_stages)
    hi_t = math.inf
    hi_caps = times.class_caps(hi_t, strict=False)
    if not _passes(times, hi_caps, nb, max_stages):
        return None
    k = len(times.members)
    lo_caps: _Caps = ([0] * k, [0] * k, [0] * k)
    weight = [len(m) for m in times.members]

    def spans(lo: _Caps, hi: _Caps) -> list[tuple[int, int, int, int]]:
        out = []
        for c in range(k):
            # Stage 0 and interior capacities change only where the base times do.
            a, b = lo[0][c], hi[0][c]
            if b > a:
                out.append((c, 0, a, b))
            if hi[2][c] > lo[2][c]:
                out.append((c, 2, lo[2][c], hi[2][c]))
        return out

    rep = times.rep
    force = False
    while True:
        todo = spans(lo_caps, hi_caps)
        count = sum((b - a) * weight[c] for c, _, a, b in todo)
        if count <= ENUMERATE or force:
            cands = sorted({v for c, r, a, b in todo for v in times.values(rep[c], r, a, b)})
            cands = [v for v in cands if v < hi_t]
            left, right = 0, len(cands)  # the answer is cands[right] (or hi_t at len)
            while left < right:
                m = (left + right) // 2
                caps = times.class_caps(cands[m], strict=False)
                if _passes(times, caps, nb, max_stages):
                    right, hi_caps = m, caps
                else:
                    left = m + 1
            t = cands[right] if right < len(cands) else hi_t
            break
        # A weighted median of the spans' middle values removes at least a quarter.
        pivots = sorted(
            (times.values(rep[c], r, (a + b) // 2, (a + b) // 2 + 1)[0], (b - a) * weight[c])
            for c, r, a, b in todo
        )
        half, acc, pivot = count / 2, 0, pivots[-1][0]
        for v, w in pivots:
            acc += w
            if acc >= half:
                pivot = v
                break
        if pivot >= hi_t:  # ties at the top: list them all
            force = True
            continue
        caps = times.class_caps(pivot, strict=False)
        if _passes(times, caps, nb, max_stages):
            hi_t, hi_caps = pivot, caps
        else:
            lo_caps = caps
    return t, _order_at(times, hi_caps, nb, max_stages)


def _order_at(times: _RoleTimes, class_caps: _Caps, nb: int, max_stages: int) -> list[int]:
    """The order :func:`_capacity_order` picks at these class capacities (the test passes)."""
    cls = times.cls
    mid, first, last = class_caps
    node_caps = ([mid[c] for c in cls], [first[c] for c in cls], [last[c] for c in cls])
    order = _capacity_order(times.nodes, node_caps, nb, max_stages)
    assert order is not None
    return order


def proves_optimal(cm: CostModel, times: _RoleTimes, bottleneck_s: float, max_stages: int) -> bool:
    """True when no pipeline of two or more stages has every stage faster than ``bottleneck_s``.

    A relaxation of the capacity test, valid when every block is alike (a
    stage's time and bytes then depend only on its block count and role):
    any such pipeline's blocks are at most the ``max_stages`` largest interior
    capacities plus the best gains of two different nodes as stage 0 and as
    the last stage (each able to hold a block in that role).
    """
    if not cm.uniform:
        return False
    if times.arrays is not None:
        return times.arrays.relaxation_fails(bottleneck_s, cm.num_blocks, max_stages)
    mid, first, last = times.caps(bottleneck_s, strict=True)
    # A stage holds at least one block: only nodes able to take the role can end the chain.
    firsts = sorted(
        ((f - m, i) for i, (f, m) in enumerate(zip(first, mid, strict=True)) if f), reverse=True
    )[:2]
    lasts = sorted(
        ((x - m, i) for i, (x, m) in enumerate(zip(last, mid, strict=True)) if x), reverse=True
    )[:2]
    gains = [gf + gl for gf, f in firsts for gl, lst in lasts if f != lst]
    if not gains:
        return True
    top = sorted(mid, reverse=True)[: max(max_stages, 2)]
    return sum(top) + max(gains) < cm.num_blocks


def slower_than(cm: CostModel, stages: int, bottleneck_s: float) -> bool:
    """Whether every pipeline of two to ``stages`` stages on ``cm``'s nodes has a stage of
    at least ``bottleneck_s`` by whole blocks (the relaxed capacity test of
    :func:`proves_optimal`, one test); False where blocks differ or two nodes are GPU
    groups of one host (not known)."""
    if not cm.uniform or not cm.own_hosts or stages < 2:
        return False
    return proves_optimal(cm, _tables(cm).times, bottleneck_s, stages)


RELAXED_STEPS = 12
"""Most steps of :func:`relaxed_bottleneck`'s search up and of its bisection."""
RELAXED_PRECISION = 1e-4
""":func:`relaxed_bottleneck`'s bisection stops within this share of the bound."""


def relaxed_bottleneck(problem: Problem, cm: CostModel, floor: float = 0.0) -> float | None:
    """A lower bound on the slowest stage of every pipeline ``problem`` allows on ``cm``'s
    nodes at its microbatch, at least ``floor`` (itself such a bound); None where blocks
    differ or two nodes are GPU groups of one host.

    A pipeline of two to ``max_stages`` stages has every stage below ``t`` only where the
    relaxed capacity test of :func:`proves_optimal` passes strictly below ``t``: where it
    fails, ``t`` bounds the slowest stage.  The test passes at the least bottleneck the
    capacity test admits (it is a relaxation of it) where the search has found that, else
    at the first of ``floor · (1 + 2^i / 256)`` where it passes; the bound is the largest
    ``t`` between ``floor`` and there at which it fails, found by bisection (``floor``
    where none is found).  One stage: the fastest node holding the whole model.  The
    capacities count each stage's blocks, its transfer out (over the network: no next
    stage shares its host), the embed's memory and the head, so the bound holds whole
    blocks where the fractional relaxation splits them.
    """
    nb, n = cm.num_blocks, len(cm.nodes)
    if not cm.uniform or not cm.own_hosts:
        return None
    single = math.inf
    if problem.min_stages <= 1:
        # The least time of a node holding the whole model: the fastest such node's.
        for d in _fastest_single(cm):
            single = cm.stage_time(d, 0, nb, True, True)
    if problem.max_stages < 2 or n < 2:
        return max(floor, single)
    max_stages = problem.max_stages
    tables = _tables(cm)
    times = tables.times
    lo = floor
    if max_stages in tables.least:  # the search's: the capacity test passes there
        found = tables.least[max_stages]
        hi = math.inf if found is None else found[0]
        if proves_optimal(cm, times, hi, max_stages):
            lo = max(lo, hi)  # the test fails up to there: no pipeline is faster
    else:
        hi = math.inf
        for i in range(RELAXED_STEPS if floor > 0 else 0):
            t = floor * (1 + 2**i / 256)
            if not proves_optimal(cm, times, t, max_stages):
                hi = t
                break
            lo = t
    if lo < hi < math.inf:
        for _ in range(RELAXED_STEPS):
            mid = (lo + hi) / 2
            if proves_optimal(cm, times, mid, max_stages):
                lo = mid
            else:
                hi = mid
            if hi - lo <= RELAXED_PRECISION * hi:
                break
    return max(floor, min(single, lo))


class _Tables:
    """A cost model's stage-time tables and the capacity test's answers per stage limit:
    the stage counts that step at one microbatch plan on one model and share them."""

    def __init__(self, cm: CostModel) -> None:
        self.times = _RoleTimes(cm, range(len(cm.nodes)))
        self.least: dict[int, tuple[float, list[int]] | None] = {}
        self.reaching: dict[tuple[int, int], tuple[float, list[int]] | None] = {}

    def least_feasible(self, nb: int, max_stages: int) -> tuple[float, list[int]] | None:
        if max_stages not in self.least:
            self.least[max_stages] = _least_feasible(self.times, nb, max_stages)
        return self.least[max_stages]

    def least_reaching(
        self, nb: int, min_stages: int, max_stages: int
    ) -> tuple[float, list[int]] | None:
        """:meth:`least_feasible`, its order of at least ``min_stages`` nodes: where the
        least bottleneck's order has fewer (no other node holds a block within it), the
        bottleneck rises through the nodes' times of one block until the order the test
        picks has as many (None where none does)."""
        found = self.least_feasible(nb, max_stages)
        if found is None or len(found[1]) >= min_stages:
            return found
        key = (min_stages, max_stages)
        if key not in self.reaching:
            self.reaching[key] = _reaching(self.times, nb, min_stages, max_stages, found[0])
        return self.reaching[key]


def _reaching(
    times: _RoleTimes, nb: int, min_stages: int, max_stages: int, least: float
) -> tuple[float, list[int]] | None:
    """:meth:`_Tables.least_reaching` past ``least`` (the least feasible bottleneck)."""
    stage = times.stage
    for t in sorted({stage[c][0] for c in set(times.cls) if stage[c] and stage[c][0] > least}):
        caps = times.class_caps(t, strict=False)
        if _passes(times, caps, nb, max_stages):
            order = _order_at(times, caps, nb, max_stages)
            if len(order) >= min_stages:
                return t, order
    return None


_tables = PerModel(_Tables)


def _no_searches(cm: CostModel) -> dict[tuple[int, int], tuple[Pipeline | None, bool]]:
    return {}


_searches = PerModel(_no_searches)
"""Per cost model, :func:`throughput_search`'s answer per stage limits."""


def throughput_search(problem: Problem, cm: CostModel) -> tuple[Pipeline | None, bool]:
    """The best pipeline this strategy finds, and whether it is proven optimal: kept per
    cost model and stage limits (all the search reads of the problem), a copy each time."""
    kept = _searches(cm)
    key = (problem.min_stages, problem.max_stages)
    if key not in kept:
        kept[key] = search_throughput(cm, *key)
    found, proven = kept[key]
    return (None if found is None else (list(found[0]), list(found[1]))), proven


def search_throughput(cm: CostModel, min_n: int, max_n: int) -> tuple[Pipeline | None, bool]:
    """:func:`throughput_search` itself, for stage limits ``[min_n, max_n]``."""
    nodes = list(range(len(cm.nodes)))
    candidates: list[Pipeline] = []
    # One stage: the fastest single node that holds everything.
    if min_n <= 1:
        candidates += [([d], [0, cm.num_blocks]) for d in _fastest_single(cm)]
    times: _RoleTimes | None = None
    if max_n >= 2 and len(nodes) >= 2:
        # The least bottleneck the capacity test admits chooses the nodes and the ends.
        tables = _tables(cm)
        times = tables.times
        found = tables.least_reaching(cm.num_blocks, min_n, max_n)
        if found is not None:
            t, order = found
            split = greedy_split(cm, order, t * (1 + 1e-9), min_n)
            if split is None or not cm.uniform:
                split = kept_bottleneck_split(cm, order, min_n) or split
            if split is not None:
                candidates.append(split)
            if not cm.uniform:
                # Blocks differ: where a node sits matters.  Try the chosen nodes in the
                # orders of their VRAM, and every node (skipping allowed) likewise.
                # An order whose least bottleneck is above the best in hand cannot win
                # (the bottleneck is compared first): it is bisected below that only.
                # An order alike to one split already (node for node, :func:`_alike`)
                # splits alike and scores the same: it could not replace that split.
                seen: list[Sequence[int]] = [order]
                for pool in (order, nodes):
                    by_room = sorted(pool, key=lambda d: (cm.usable[d], d))
                    for o in (by_room, by_room[::-1]):
                        if any(_alike(cm, o, other) for other in seen):
                            continue
                        seen.append(o)
                        upper = min(
                            (
                                evaluated_here(cm, *c).bottleneck_s
                                for c in candidates
                                if min_n <= len(c[0]) <= max_n
                            ),
                            default=None,
                        )
                        split = kept_bottleneck_split(cm, o, min_n, upper, max_n)
                        if split is not None:
                            candidates.append(split)
    candidates = [c for c in candidates if min_n <= len(c[0]) <= max_n]
    if not candidates:
        return None, False
    best = min(candidates, key=lambda c: _throughput_key(cm, c))
    proven = (
        times is not None
        and max_n >= 2
        and proves_optimal(cm, times, evaluated_here(cm, *best).bottleneck_s, max_n)
    )
    if max_n < 2:
        proven = True  # the fastest single node is the only kind of pipeline
    return best, proven


def fastest_single(cm: CostModel, per_class: bool = True) -> list[int]:
    """The fastest node that holds the whole model as one stage (least index among equal
    times; empty: none holds it).  ``per_class``: each stage class's time computed once, on
    its first node that holds it (the time depends on the class's figures only)."""
    nb = cm.num_blocks
    need = cm.stage_bytes(0, nb, True, True)  # what :meth:`CostModel.fits` compares
    singles = [d for d, room in enumerate(cm.usable) if need <= room]
    if per_class:
        firsts: dict[int, int] = {}
        node_class = cm.stage_class
        for d in singles:
            firsts.setdefault(node_class[d], d)
        singles = list(firsts.values())
    if not singles:
        return []
    return [min(singles, key=lambda d: (cm.stage_time(d, 0, nb, True, True), d))]


_fastest_single = PerModel(fastest_single)
"""Per cost model, :func:`fastest_single` (a list: empty is kept too)."""


def _alike(cm: CostModel, a: Sequence[int], b: Sequence[int]) -> bool:
    """Whether orders ``a`` and ``b`` are the same up to the nodes' names in what a split
    and its score read, position by position: each node's stage class, hops and in-host
    transfer, and which positions are GPU groups of one host (read until they differ)."""
    if len(a) != len(b):
        return False
    cls, lat, intra, intra_x, parent = (
        cm.stage_class,
        cm.latency_s,
        cm.intra_latency_s,
        cm.intra_xfer_s,
        cm.parent,
    )
    hosts_a: dict[str, int] = {}
    hosts_b: dict[str, int] = {}
    for d, e in zip(a, b, strict=True):
        if d == e:
            same = True
        else:
            same = cls[d] == cls[e] and lat[d] == lat[e] and intra[d] == intra[e]
            same = same and intra_x[d] == intra_x[e]
        if not same:
            return False
        if hosts_a.setdefault(parent[d], len(hosts_a)) != hosts_b.setdefault(
            parent[e], len(hosts_b)
        ):
            return False
    return True


def throughput_pipeline(problem: Problem, cm: CostModel) -> Pipeline | None:
    """The best pipeline this strategy finds (node indices, bounds); None if none fits."""
    return throughput_search(problem, cm)[0]


def _throughput_key(cm: CostModel, c: Pipeline) -> tuple[float, float, int]:
    ev = evaluated_here(cm, *c)
    return (ev.bottleneck_s, ev.time_per_token_s, len(c[0]))
