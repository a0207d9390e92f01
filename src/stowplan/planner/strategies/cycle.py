"""Concurrent sequences: the best pipeline and the bound on its cycle, stage count by stage count.

U sequences decoded together on S stages form ``m = min(U, S)`` microbatches of
``b = ⌈U / m⌉``; every sequence gets a token per cycle, ``cycle = max(Σ t + hops,
m · max t)`` with the stage times ``t`` at microbatch ``b`` (:mod:`stowplan.cost`).
Both objectives rank pipelines by the cycle: per-sequence time per token is the
cycle, tokens/s is U / cycle.

The cycle is not one of the two sums the solvers minimise, but for a fixed stage
count S it is bounded by both: ``cycle ≥ m · (least bottleneck of ≤ S stages at b)``
and ``cycle ≥ least Σ t + hops of ≤ S stages at b``.  So:

1. :func:`quick_bound` gives every S a closed-form lower bound (the stages' bytes
   at the S fastest rates, the S largest memories, the hops and sends of the S
   cheapest links, the fixed seconds every stage and block pays).
2. :func:`search` plans the stage counts of a geometric :func:`ladder` (1, 2, 3, 4,
   6, 8, …, U, the most) whose looser bound (reads and cheaper hops alone) is below the
   best cycle found so far (most promising first), with the bottleneck and the
   time-per-token searches at that count's microbatch; every pipeline is scored by its
   true cycle.  A plan of its own (not a candidate of a larger search) then also plans
   the counts between the best one and the ladder's next (:func:`_between`) and, up
   to U stages, the counts whose slowest stage by whole blocks may beat it
   (:func:`_whole_blocks`).  On nodes all alike (one kind, each its own host) every
   count up to :data:`~.cycle_split.CYCLE_SPLIT_STAGES` is solved outright first
   (:func:`_on_alike_nodes`), and only the counts past those are searched.
3. :func:`optimum` bounds the cycle by the least over ranges ``[a, b]`` of the ladder
   of ``max(m_a · B(≤ b stages, u_b), L(≤ b stages, u_b))`` (any S in the range has
   at least ``m_a`` microbatches of at least ``u_b``), ``B`` and ``L`` exact (subset DP
   / MILP) or relaxed bounds, computed only where the quick bound is below the plan's
   cycle; on small fleets every S is its own range and is solved outright
   (:func:`~stowplan.planner.exact.pipelines.least_cycle`; two stages on any fleet).
   The bound is the optimum (``exact``) when a pipeline in hand reaches it; a count
   holding the least bound that cannot be solved outright is searched on its own, and
   its pipeline is a candidate.
4. :func:`swapped` moves the stages of the pipeline found to unused nodes while that
   lowers its cycle, and :func:`resplit` splits its nodes again where the other side
   of the cycle's split is faster.

At U = 1 every S has m = 1 and the cycle is the time per token: the time-per-token
solvers are the exact ones and none of this is needed.
"""

from __future__ import annotations

import heapq
import itertools
import math
import operator
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import lru_cache, partial
from typing import Any

from stowplan.cost import CostModel, microbatches
from stowplan.errors import DependencyError
from stowplan.model import Metric, node_kinds
from stowplan.planner.exact.pipelines import CYCLE_EXACT_LIMIT, Optimum, least_cycle
from stowplan.planner.problem import Problem
from stowplan.planner.strategies.capacity_arrays import numpy_module
from stowplan.planner.strategies.cycle_split import CYCLE_SPLIT_STAGES, TIED, least_cycle_split
from stowplan.planner.strategies.evaluated import evaluated
from stowplan.planner.strategies.latency import alike_by_hop, ends_split, kept_split
from stowplan.planner.strategies.memo import PerModel
from stowplan.planner.strategies.throughput import (
    Pipeline,
    kept_bottleneck_split,
    relaxed_bottleneck,
    slower_than,
)

__all__ = [
    "BETWEEN_ROUNDS",
    "COUNT_SEARCH_NODES",
    "RELOCATED_ROUNDS",
    "SEARCHED_COUNTS",
    "SEARCHED_FURTHER",
    "Searched",
    "count_ranges",
    "ladder",
    "optimum",
    "quick_bound",
    "rank_key",
    "relocated",
    "search",
    "stage_counts",
    "swapped",
]

SEARCHED_COUNTS = 6
"""Once a pipeline is in hand, :func:`search` plans at most this many stage counts (those
of least quick bound); the certificate states how far the plan may be from the best."""

Solve = Callable[[Problem, CostModel], "Pipeline | None"]
"""A search over ``problem`` (its ``max_stages`` the stage count) on a cost model at that
count's microbatch."""


def stage_counts(problem: Problem) -> range:
    """Every stage count the problem allows."""
    return range(problem.min_stages, problem.max_stages + 1)


@lru_cache(maxsize=1024)
def _rates(inverse: tuple[float, ...]) -> list[float]:
    return sorted((math.inf if x == 0 else 1.0 / x for x in inverse), reverse=True)


@lru_cache(maxsize=256)
def _largest_held(usable: tuple[int, ...]) -> list[int]:
    """Per k, the usable bytes of the k largest memories together (k = 0 .. n)."""
    return [0, *itertools.accumulate(sorted(usable, reverse=True))]


def _cheapest(
    cm: CostModel, layouts: bool
) -> tuple[Sequence[float], Sequence[float], float, float]:
    """Per stage a GPU group may hold, cheapest first: the least the stage pays besides
    its reads, FLOPs and blocks (its hop and its fixed seconds), and the least it pays
    to send (the last stage sends nothing), at the network link, or the cheaper of it and
    the link inside the node where another group shares the node; the least fixed
    seconds a block pays, and a stage (of one block at least, besides its reads and
    FLOPs).  With ``layouts``, a node of several GPUs stands for every grouping of them:
    it holds a stage per GPU, each at the cheaper link, with no fixed seconds (a
    grouping's own figures may be less)."""
    gpus = tuple(node.num_gpus for node in cm.nodes) if layouts else None
    kinds = _stand_ins(cm.parent, gpus)
    times = None if kinds is None else kinds[1]
    hops: Sequence[float]
    sends: Sequence[float]
    if kinds is None:  # every group alone on its node, none standing in
        hops, sends = sorted(map(operator.add, cm.latency_s, cm.stage_s)), cm.xfer_s
    else:
        hops = _hops(cm.latency_s, cm.intra_latency_s, cm.stage_s, kinds)
        pairs = zip(cm.xfer_s, cm.intra_xfer_s, kinds[0], strict=True)
        sends = [min(s, i) if f else s for s, i, f in pairs]
    if times is None:
        block = min(cm.block_s, default=0.0)
        stage = min(map(operator.add, cm.block_s, cm.stage_s), default=0.0)
        return hops, sorted(sends), block, stage
    # A stand-in sends at the cheaper link once per GPU and pays no fixed seconds.
    sends = [x for x, t in zip(sends, times, strict=True) for _ in range(t)]
    fixed = [
        (0.0, 0.0) if t > 1 else (b, b + f)
        for b, f, t in zip(cm.block_s, cm.stage_s, times, strict=True)
    ]
    return hops, sorted(sends), min(f[0] for f in fixed), min(f[1] for f in fixed)


_Kinds = tuple[tuple[bool, ...], tuple[int, ...] | None]
"""Per GPU group, whether its hop and send may take the link inside its node, and (None
where each counts one) how many stages it counts for."""


@lru_cache(maxsize=256)
def _stand_ins(parent: tuple[str, ...], gpus: tuple[int, ...] | None) -> _Kinds | None:
    """Per GPU group: whether its hop and send may take the link inside its node (another
    group shares the node, or it stands in for its GPUs' groupings), and how many stages
    it counts for (its GPUs where it stands in, else one; None where every group counts
    one); None where no group may take that link."""
    shared = Counter(parent)
    counts = gpus or (1,) * len(parent)
    inside = tuple(g > 1 or shared[p] > 1 for p, g in zip(parent, counts, strict=True))
    if not any(inside):
        return None
    return inside, (counts if any(g > 1 for g in counts) else None)


@lru_cache(maxsize=256)
def _hops(
    latency: tuple[float, ...], intra: tuple[float, ...], fixed: tuple[float, ...], kinds: _Kinds
) -> tuple[float, ...]:
    """:func:`_cheapest`'s hops with their stages' fixed seconds, cheapest first (a stand-in
    pays none)."""
    inside, times = kinds
    if times is None:
        hops = [
            (min(hop, inner) if f else hop) + t
            for hop, inner, t, f in zip(latency, intra, fixed, inside, strict=True)
        ]
    else:
        hops = [
            min(hop, inner) if g > 1 else (min(hop, inner) if f else hop) + t
            for hop, inner, t, f, g in zip(latency, intra, fixed, inside, times, strict=True)
            for _ in range(g)
        ]
    return tuple(sorted(hops))


def quick_bound(
    problem: Problem, cm: CostModel, stages: int, most: int | None = None, *, layouts: bool = False
) -> float:
    """A lower bound on the cycle of every pipeline of ``stages`` to ``most`` (default:
    ``stages``) stages (with ``layouts``, on any grouping of the GPUs of ``cm``'s nodes
    of several).

    Such a pipeline has at least ``m = min(U, stages)`` microbatches of at least the
    microbatch of ``most`` stages, on at most ``k = min(most, n)`` nodes (stages on GPU
    groups of one node share its bytes/s, FLOPs and memory): together they hold every
    byte (else ``inf``) and read at most at the sum of the ``k`` fastest rates, so the
    slowest stage takes at least the bytes over that sum; one trip reads every byte
    no faster than filling the fastest nodes up to their memory.  Besides, every block
    pays the least fixed seconds of a block and every stage those of a stage (the
    slowest stage too, a stage holding one block at least), and a multi-stage pipeline
    the ``stages`` cheapest hops and the ``stages - 1`` cheapest sends (:func:`_cheapest`).
    """
    most = stages if most is None else most
    if stages < 1 or most < stages:
        return math.inf
    k = min(most, len(cm.nodes))
    m, _ = microbatches(cm.batch, stages)
    if not _holds(cm, k):
        return math.inf
    view = (_quick_layouts if layouts else _quick_figures)(cm.for_stages(most))
    return max(m * view.slowest(k), view.trip + view.fixed(stages))


def _holds(cm: CostModel, k: int) -> bool:
    """Whether ``k`` nodes' memories together hold every byte."""
    nb = cm.num_blocks
    return _quick_figures(cm).largest_held[k] >= cm.mem_prefix[nb] + cm.embed + cm.head


def _loose_bound(cm: CostModel, stages: int) -> float:
    """:func:`quick_bound` of ``stages`` stages by their reads and FLOPs and each node's
    cheaper hop (network or in-host) alone: no sends or fixed seconds, and for a node of
    one GPU a link inside the node that it never uses."""
    k = min(stages, len(cm.nodes))
    if not _holds(cm, k):
        return math.inf
    view = _quick_figures(cm.for_stages(stages))
    trip = view.reads
    if stages > 1:
        trip += _least_sum(view.cheaper_hops, stages)
    return max(microbatches(cm.batch, stages)[0] * view.slowest_reads(k), trip)


@lru_cache(maxsize=256)
def _cheaper_hops(latency: tuple[float, ...], intra: tuple[float, ...]) -> list[float]:
    """Each node's cheaper hop (network or in-host), cheapest first."""
    return sorted(min(a, b) for a, b in zip(latency, intra, strict=True))


class _QuickFigures:
    """What :func:`quick_bound` reads off one cost model, each figure computed once (the
    bounds of every stage count and range read the few models of their microbatches)."""

    def __init__(self, view: CostModel, layouts: bool = False) -> None:
        nb = view.num_blocks
        self.largest_held = _largest_held(view.usable)
        """Per k, the usable bytes of the k largest memories together."""
        self.weights = view.read_prefix[nb] + view.head
        self.read = self.weights + view.kv_prefix[nb]
        self.bw, self.fl = _rates(view.inv_bw), _rates(view.flop_s_per_byte)
        self._hops, self._sends, block, self._stage = _cheapest(view, layouts)
        self.reads = max(_fill(view, self.read), self.weights / self.fl[0])
        """One trip's reads at the least: the fastest nodes filled first."""
        self.trip = self.reads + nb * block
        """And its blocks' fixed seconds at the least."""
        self._alone = 0.0 if layouts else min(view.stage_s, default=0.0)
        self.cheaper_hops = _cheaper_hops(view.latency_s, view.intra_latency_s)
        """Each node's cheaper hop, network or in-host (:func:`_loose_bound`'s)."""
        self._slowest: dict[int, float] = {}
        self._fixed: dict[int, float] = {}

    def slowest(self, k: int) -> float:
        """The least slowest stage of ``k`` nodes: every byte at the ``k`` fastest rates,
        and the least fixed seconds of a stage besides (a stage within ``T`` reads at
        most ``T`` less its fixed seconds times its rate)."""
        return self.slowest_reads(k) + self._stage

    def slowest_reads(self, k: int) -> float:
        """The least slowest stage of ``k`` nodes by its reads and FLOPs alone."""
        found = self._slowest.get(k)
        if found is None:
            bw, fl = self.bw, self.fl
            found = self._slowest[k] = max(self.read / sum(bw[:k]), self.weights / sum(fl[:k]))
        return found

    def fixed(self, stages: int) -> float:
        """The least a trip of ``stages`` stages pays besides its reads and its blocks:
        one stage's fixed seconds alone, else the ``stages`` cheapest hops with their
        fixed seconds and the ``stages - 1`` cheapest sends (the cheapest again past the
        last group)."""
        found = self._fixed.get(stages)
        if found is None:
            if stages == 1:
                found = self._alone
            else:
                found = _least_sum(self._hops, stages) + _least_sum(self._sends, stages - 1)
            self._fixed[stages] = found
        return found


def _least_sum(cheapest: Sequence[float], k: int) -> float:
    """The sum of ``k`` of ``cheapest`` (sorted), the first again past the last."""
    if k <= 0 or not cheapest:
        return 0.0
    return sum(cheapest[:k]) + max(0, k - len(cheapest)) * cheapest[0]


_quick_figures = PerModel(_QuickFigures)
_quick_layouts = PerModel(partial(_QuickFigures, layouts=True))
"""The figures of a model whose nodes of several GPUs stand for every grouping of them."""


def _most_read_per_held(cm: CostModel) -> float:
    """The most bytes a step reads per byte held, over the blocks and the head."""
    rp, kp, mp = cm.read_prefix, cm.kv_prefix, cm.mem_prefix
    ratios = [
        (rp[i + 1] - rp[i] + kp[i + 1] - kp[i]) / (mp[i + 1] - mp[i])
        for i in range(cm.num_blocks)
        if mp[i + 1] > mp[i]
    ]
    return max([1.0] * (cm.head > 0) + ratios, default=1.0)


@lru_cache(maxsize=1024)
def _by_speed(inv_bw: tuple[float, ...], usable: tuple[int, ...]) -> list[tuple[float, int]]:
    return sorted(zip(inv_bw, usable, strict=True))


def _fill(cm: CostModel, read: float) -> float:
    """Seconds to read ``read`` bytes on the fastest nodes first, each reading at most
    :func:`_most_read_per_held` times its usable memory (a relaxation of every placement,
    blocks being split fractionally)."""
    per_held = _most_read_per_held(cm)
    left, total = read, 0.0
    for inv, room in _by_speed(cm.inv_bw, cm.usable):
        take = min(left, room * per_held)
        total += take * inv
        left -= take
        if left <= 0:
            return total
    return math.inf


def _at(problem: Problem, stages: int) -> Problem:
    return replace(problem, max_stages=stages, min_stages=min(problem.min_stages, stages))


def count_ranges(points: Sequence[int]) -> list[tuple[int, int]]:
    """The ranges of stage counts ``[a, b]`` that ``points`` (sorted counts, the last the
    most allowed: a :func:`ladder`) start: each up to the count before the next, the last
    that count alone.  Together they hold every count from the first point to the last."""
    if not points:
        return []
    return [(a, b - 1) for a, b in itertools.pairwise(points)] + [(points[-1], points[-1])]


def ladder(problem: Problem, sequences: int, *, fine: bool = True) -> list[int]:
    """The stage counts searched (``fine``) or the starts of the ranges bounded together:
    the fewest and most allowed, U, and 1 to 8, 12, 16, 24, 32, 48, … between (without
    ``fine``: 1, 2, 4, 8, …), a geometric ladder, so a fleet of n nodes costs O(log n)
    solves, not n."""
    lo, hi = problem.min_stages, problem.max_stages
    points = {lo, hi, min(max(sequences, lo), hi)}
    if fine:
        points.update(range(1, 9))
    x = 1
    while x <= hi:
        points.update((x, x + x // 2) if fine else (x,))
        x *= 2
    return sorted(p for p in points if lo <= p <= hi)


def search(
    problem: Problem,
    cm: CostModel,
    solvers: tuple[Solve, ...],
    *,
    between: bool = False,
    first: bool = False,
) -> Pipeline | None:
    """The pipeline of least cycle any of ``solvers`` finds at the :func:`ladder`'s stage
    counts (each solve may use fewer stages than its count); with ``between``, on up to
    :data:`COUNT_SEARCH_NODES` nodes, also at the counts :func:`_between` the best one's
    and the ladder's next.  With ``first``, the first pipeline found, as found (in the
    same order of counts and solvers: one is found exactly when the full search finds
    one)."""
    if cm.batch == 1:
        found = []
        for solve in solvers:
            if (p := solve(problem, cm)) is not None:
                if first:
                    return p
                found.append(p)
        return swapped(cm, min(found, key=lambda p: rank_key(cm, p))) if found else None
    alike, upto = (None, 0) if first else _on_alike_nodes(problem, cm)
    if upto >= problem.max_stages:
        return alike
    # The counts go in the order of a looser bound than the quick bound, and a count is
    # solved while that is below the best in hand: a search held to at most S stages
    # often finds a better pipeline of fewer stages than the searches held to those (it
    # chooses among more nodes), so the bound of exactly S stages (its sends and fixed
    # seconds besides) does not set it aside.
    # Nodes alike have their counts up to ``upto`` solved: the search plans the counts
    # past them, from the best of those.
    bounds = {s: _loose_bound(cm, s) for s in ladder(problem, cm.batch) if s > upto}
    best: Pipeline | None = alike
    best_key: tuple[float, float, int, tuple[int, ...]] = (
        (math.inf, math.inf, 0, ()) if alike is None else rank_key(cm, alike)
    )
    solved = 0
    for s in sorted(bounds, key=lambda s: (bounds[s], s)):
        if best is not None and (bounds[s] >= best_key[0] or solved >= SEARCHED_COUNTS):
            break
        if not math.isfinite(bounds[s]) and best is None:
            s = problem.max_stages  # no count on the ladder holds every byte: the most may
        found = _at_count(problem, cm, solvers, s, first=first)
        if first and found:
            return found[0]
        for p in found:
            if (k := rank_key(cm, p)) < best_key:
                best, best_key = p, k
        solved += best is not None
        if not math.isfinite(bounds[s]):
            break
    if between and best is not None:
        points = set(bounds) | set(range(problem.min_stages, upto + 1))
        if len(problem.nodes) <= COUNT_SEARCH_NODES:
            best = _between(problem, cm, solvers, points, best, best_key)
        return _whole_blocks(problem, cm, solvers, points, best)
    return None if best is None else _handed_on(problem, cm, best)


def _on_alike_nodes(problem: Problem, cm: CostModel) -> tuple[Pipeline | None, int]:
    """Where the nodes are all alike (one kind, each its own host), the pipeline of least
    cycle over the stage counts up to :data:`~.cycle_split.CYCLE_SPLIT_STAGES` (None
    where none fits), and the most stages it is the least of: the problem's most where
    no count past those may beat it; elsewhere ``(None, 0)``.

    On nodes alike every order of ``S`` of them is the same, so a count's least cycle is
    that of its first ``S`` nodes split for their least cycle
    (:func:`~.cycle_split.least_cycle_split`, exact per order): the counts go in the
    order of their quick bound, and the search stops at the first whose bound is above
    the best cycle found beyond a tie (no pipeline of it or any count after is faster,
    nor as fast)."""
    if len(cm.nodes) < 2 or not cm.own_hosts or len(node_kinds(problem.nodes)[1]) != 1:
        return None, 0
    lo, hi = problem.min_stages, min(problem.max_stages, cm.num_blocks)
    split = min(hi, CYCLE_SPLIT_STAGES)
    bounds = {s: quick_bound(problem, cm, s) for s in range(lo, split + 1)}
    best: Pipeline | None = None
    key: tuple[float, float, float, int] = (math.inf, 0.0, math.inf, 0)
    for s in sorted(bounds, key=lambda s: (bounds[s], s)):
        if bounds[s] > key[0] * (1 + TIED):
            break
        p: Pipeline | None
        if s == 1:
            p = ([0], [0, cm.num_blocks])
        else:
            beat = key[0] * (1 + TIED)
            p = least_cycle_split(cm.for_stages(s), list(range(s)), beat, settle=True)
        if p is None or not cm.fits_pipeline(*p):
            continue
        ev = evaluated(cm, *p)
        room = cm.kv_capacity_tokens(*p)
        # Cycles within TIED tie: then the most KV room (tiebreak's first rule), the
        # slowest stage and fewer stages (rank_key's).
        here = (ev.cycle_s, -(-1 if room is None else room), ev.bottleneck_s, s)
        if ev.cycle_s < key[0] * (1 - TIED) or (
            ev.cycle_s <= key[0] * (1 + TIED) and here[1:] < key[1:]
        ):
            best, key = p, here
    beyond = hi > split and quick_bound(problem, cm, split + 1, hi) <= key[0] * (1 + TIED)
    return best, split if beyond else problem.max_stages


def _at_count(
    problem: Problem, cm: CostModel, solvers: tuple[Solve, ...], stages: int, first: bool = False
) -> list[Pipeline]:
    """The pipelines ``solvers`` find for ``problem`` held to at most ``stages`` stages, at
    that count's microbatch (each solver's, in their order; none where it finds none;
    with ``first``, only the first found)."""
    sub, view = _at(problem, stages), cm.for_stages(stages)
    found = []
    for solve in solvers:
        if (p := solve(sub, view)) is not None:
            found.append(p)
            if first:
                break
    return found


def _handed_on(problem: Problem, cm: CostModel, p: Pipeline) -> Pipeline:
    """``p`` as :func:`search` hands it on: its stages :func:`swapped`, then
    :func:`resplit`."""
    return resplit(problem, cm, swapped(cm, p))


def resplit(problem: Problem, cm: CostModel, p: Pipeline) -> Pipeline:
    """``p``, or its nodes split again (in their order, or a subsequence of them) where
    that lowers the cycle: by the least slowest stage, by the least time per token, and
    (several sequences, up to :data:`~.cycle_split.CYCLE_SPLIT_STAGES` stages) by the
    least cycle (:func:`~.cycle_split.least_cycle_split`) where the order has GPU groups
    of one node next to each other or neither other split gives it (:func:`_pull_apart`).

    The searches choose nodes and split them by one side of the cycle at a time, and
    :func:`swapped` moves stages without moving blocks: on the nodes chosen the other
    side's split may be the faster one (the cycle is ``max(m · slowest, Σ t + hops)``)."""
    order = p[0]
    if len(order) < 2:
        return p
    view = cm.for_stages(len(order))
    best, least = p, rank_key(cm, p)[0]

    def consider(q: Pipeline | None) -> None:
        nonlocal best, least
        if (
            q is not None
            and problem.min_stages <= len(q[0]) <= problem.max_stages
            and cm.fits_pipeline(*q)
            and (k := rank_key(cm, q)[0]) < least * (1 - 1e-9)
        ):
            best, least = q, k

    by_slowest = kept_bottleneck_split(view, order, problem.min_stages)
    by_trip = kept_split(view, order)
    consider(by_slowest)
    consider(by_trip)
    if view.batch > 1 and (
        any(map(cm.same_node, order, order[1:])) or _pull_apart(cm, len(order), by_slowest, by_trip)
    ):
        # Neither side's split: the least cycle of the order, where it may beat both
        # (their programmes charge a stage the network even before a stage on its own
        # node's other GPUs; and each minimises one side of the cycle).
        consider(least_cycle_split(view, order, least))
    return best


RELOCATED_ROUNDS = 2
"""Most rounds of :func:`relocated`."""


def relocated(cm: CostModel, p: Pipeline, most: int = CYCLE_SPLIT_STAGES) -> Pipeline:
    """``p``, or its nodes in another order, split for its least cycle
    (:func:`~.cycle_split.least_cycle_split`), where that lowers the cycle: each stage's
    node moved to the front of the order or to its end (the roles that differ: the first
    stage holds the embedding and the first blocks, the last the head), the best move
    a round, at most :data:`RELOCATED_ROUNDS` rounds; on up to
    :data:`COUNT_SEARCH_NODES` nodes and ``most`` stages (unless given,
    :data:`~.cycle_split.CYCLE_SPLIT_STAGES`), where blocks differ (alike, a node's role
    moves nothing but the embedding and head, which the searches' roles already weigh).
    For the plan's pipeline, once: each reorder costs a split of the blocks squared per
    stage.

    The searches place a node by its speed and room for the blocks it is given, and
    :func:`swapped` and :func:`resplit` keep the order: where blocks differ (dense blocks
    before the MoE ones), a small node holding the first block ahead of every other can
    lower the trip of the whole (deepseek-v3 at 16 sequences on 16 nodes: an A100 moved
    from the seventh stage to the first, 1.7 % more tokens/s)."""
    order = p[0]
    stages = len(order)
    if cm.uniform or not 3 <= stages <= most or len(cm.nodes) > COUNT_SEARCH_NODES:
        return p
    view = cm.for_stages(stages)
    best, least = p, rank_key(cm, p)[0]
    kept: dict[tuple[Any, ...], Any] = {}
    """The positions' tables, shared by the moves (each changes two or three)."""
    for _ in range(RELOCATED_ROUNDS):
        order = best[0]
        moves = [[order[i], *order[:i], *order[i + 1 :]] for i in range(1, stages)]
        moves += [[*order[:i], *order[i + 1 :], order[i]] for i in range(stages - 1)]
        found = best
        for o in moves:
            q = least_cycle_split(view, o, least * (1 - 1e-9), most=most, kept=kept)
            if (
                q is not None
                and cm.fits_pipeline(*q)
                and (k := rank_key(cm, q)[0]) < least * (1 - 1e-9)
            ):
                found, least = q, k
        if found is best:
            break
        best = found
    return best


def _pull_apart(
    cm: CostModel, stages: int, by_slowest: Pipeline | None, by_trip: Pipeline | None
) -> bool:
    """Whether a split of an order of ``stages`` nodes may have a lower cycle than its
    split of least slowest stage and its split of least time per token.  Not where the
    first keeps every node and its cycle is m times its slowest stage (no split's can be
    less), nor where the second keeps every node and its cycle is its time per token
    (likewise); a split that drops a node runs another count of microbatches and says
    nothing of the order's splits."""

    def decided_by_trip(p: Pipeline) -> bool:
        e = evaluated(cm, *p)
        return sum(e.stage_time_s) + e.hops_s > e.num_microbatches * max(e.stage_time_s)

    if by_slowest is not None and len(by_slowest[0]) == stages and not decided_by_trip(by_slowest):
        return False
    return not (by_trip is not None and len(by_trip[0]) == stages and decided_by_trip(by_trip))


BETWEEN_ROUNDS = 2
"""Most rounds of :func:`_between`."""

COUNT_SEARCH_NODES = 64
"""Fleets up to this many nodes search the counts :func:`_between` and the count of least
bound (:func:`optimum`'s ``searched``); beyond, a count's search costs tens of
milliseconds, and the certificate states the gap."""


def _between(
    problem: Problem,
    cm: CostModel,
    solvers: tuple[Solve, ...],
    points: set[int],
    best: Pipeline,
    best_key: tuple[float, float, int, tuple[int, ...]],
) -> Pipeline:
    """``best``, or a pipeline of lesser cycle at a count between its stage count and the
    next counts searched below and above it (their midpoints, a round at a time while
    one gains, at most :data:`BETWEEN_ROUNDS` rounds; a count whose quick bound is no
    less than the best cycle is not solved).

    The ladder leaves gaps above 8 stages, and the cycle of the searches' pipelines is
    far from smooth in the stage count: a count in a gap may beat both its ends."""
    for _ in range(BETWEEN_ROUNDS):
        here = len(best[0])
        below = max((t for t in points if t < here), default=None)
        above = min((t for t in points if t > here), default=None)
        mids = {(here + t) // 2 for t in (below, above) if t is not None}
        gained = False
        for c in sorted(mids - points):
            points.add(c)
            if quick_bound(problem, cm, c) >= best_key[0]:
                continue
            for p in _at_count(problem, cm, solvers, c):
                if (k := rank_key(cm, p))[0] < best_key[0] * (1 - 1e-9):
                    best, best_key, gained = p, k, True
        if not gained:
            break
    return best


WHOLE_BLOCK_COUNTS = 2
"""Most stage counts :func:`_whole_blocks` plans."""


def _whole_blocks(
    problem: Problem,
    cm: CostModel,
    solvers: tuple[Solve, ...],
    points: set[int],
    best: Pipeline,
) -> Pipeline:
    """``best``, or a pipeline of lesser cycle at a stage count of at most U left out so far
    whose slowest stage, by whole blocks, may be fast enough to beat it (the counts of
    least such bound first, at most :data:`WHOLE_BLOCK_COUNTS`; blocks alike only).

    Up to U stages the microbatches are as many as the stages, so the cycle is at least
    ``S`` times the slowest stage, and whole blocks make that product far from smooth in
    ``S``: 80 blocks fill 9 stages of 9 blocks (81 block-times a cycle) where 8 stages
    take 11 blocks on one (88) and 10 stages 9 (90).  The quick bound splits blocks
    fractionally and cannot see it; one capacity test per count (is every pipeline of
    ``S`` stages slower than ``best``'s cycle over ``S``?) can, and the counts it leaves
    are ranked by :func:`~stowplan.planner.strategies.throughput.relaxed_bottleneck`.
    Pipelines compare as the search hands them on (:func:`_handed_on`), ``best`` too, and
    the one returned is handed on (a count's pipeline that wins once more: its stages may
    be swapped further)."""
    if cm.batch < 2 or not cm.uniform or not cm.own_hosts:
        return _handed_on(problem, cm, best)
    cycle = rank_key(cm, best)[0]
    ranked: list[tuple[float, int]] = []
    # Stage times grow with the microbatch: a count that is slower at a microbatch of
    # one sequence is slower at its own (one test on one cost model, then the count's).
    single = cm.for_stages(cm.batch)
    for s in range(max(problem.min_stages, 2), min(problem.max_stages, cm.batch) + 1):
        if s in points or quick_bound(problem, cm, s) >= cycle:
            continue
        m, _ = microbatches(cm.batch, s)
        view = cm.for_stages(s)
        if slower_than(single, s, cycle / m) or (
            view is not single and slower_than(view, s, cycle / m)
        ):
            continue  # every pipeline of s stages or fewer has a slower cycle
        floor = _quick_figures(view).slowest(min(s, len(cm.nodes)))
        slowest = relaxed_bottleneck(_at(problem, s), view, floor)
        ranked.append((m * (floor if slowest is None else slowest), s))
    handed: Pipeline | None = None
    if ranked:
        # Pipelines compare as the search hands them on.
        handed = _handed_on(problem, cm, best)
        cycle = rank_key(cm, handed)[0]
    for estimate, s in sorted(ranked)[:WHOLE_BLOCK_COUNTS]:
        points.add(s)
        if estimate >= cycle:
            break
        for p in _at_count(problem, cm, solvers, s):
            if (k := rank_key(cm, p := _handed_on(problem, cm, p))[0]) < cycle * (1 - 1e-9):
                best, cycle, handed = p, k, None
    return _handed_on(problem, cm, best) if handed is None else handed


SWAP_PASSES = 4
"""Most rounds of :func:`swapped`."""

SWAP_SCORED = 8
"""Moves :func:`swapped` scores by the true cycle per round where nodes share hosts."""

SWAP_ARRAY_NODES = 64
"""Fleets from which :func:`swapped` times a stage on every node at once (numpy)."""


class _MoveTimes:
    """A stage's time and hop on every node at once, with :meth:`CostModel.stage_time`'s
    arithmetic (no two nodes share a host: every transfer and hop is the network's)."""

    def __init__(self, np: Any, cm: CostModel) -> None:
        self.np, self.cm = np, cm
        self.inv_bw = np.array(cm.inv_bw)
        self.flop = np.array(cm.flop_s_per_byte)
        self.block = np.array(cm.block_s)
        self.stage = np.array(cm.stage_s)
        self.xfer = np.array(cm.xfer_s)
        self.hop = np.array(cm.latency_s)
        self.usable = np.array(cm.usable, dtype=float)

    def moves(
        self,
        s: int,
        lo: int,
        hi: int,
        first: bool,
        last: bool,
        base: float,
        others: float,
        m: int,
        cycle_s: float,
        used: set[int],
    ) -> list[tuple[float, int, int]]:
        """The least (estimated cycle, ``s``, node) over the unused nodes that hold stage
        ``s`` with an estimate below ``cycle_s`` (none: empty): :func:`swapped` takes only
        the least move where it times stages on arrays, so the rest are not listed."""
        np, cm = self.np, self.cm
        weights = cm.read_prefix[hi] - cm.read_prefix[lo] + (cm.head if last else 0)
        read = weights + cm.kv_prefix[hi] - cm.kv_prefix[lo]
        t = np.maximum(read * self.inv_bw, weights * self.flop)
        t = t + ((hi - lo) * self.block + self.stage)
        if not last:
            t = t + self.xfer
        guess = np.maximum(base + t + self.hop, m * np.maximum(t, others))
        ok = (guess < cycle_s * (1 - 1e-9)) & (cm.stage_bytes(lo, hi, first, last) <= self.usable)
        if used:
            ok[list(used)] = False
        found = np.flatnonzero(ok)
        if not found.size:
            return []
        least = int(np.argmin(guess[found]))  # the first of equal estimates: the least node
        return [(float(guess[found[least]]), s, int(found[least]))]


def swapped(cm: CostModel, p: Pipeline) -> Pipeline:
    """``p`` with one stage at a time moved to an unused node, its blocks kept, while that
    lowers the cycle (the move that lowers it most each round, at most
    :data:`SWAP_PASSES` rounds).

    The searches choose nodes by one side of the cycle at a time: the slowest stage or
    the time per token.  Among nodes alike but for their links (or nearly so), a stage
    may hold its blocks as fast on a node whose hop and transfer are cheaper, which the
    cycle's other side gains.  A move's cycle is estimated by the stage's time and hop on
    the new node in place of the old, the other stages as they were: the cycle itself
    unless the move makes or parts GPU groups of one host.  Where no two nodes share a
    host the least estimate is the move; else the :data:`SWAP_SCORED` least are scored
    by the true cycle."""
    order, bounds = list(p[0]), list(p[1])
    stages, n = len(order), len(cm.nodes)
    view = cm.for_stages(stages)
    m, _ = microbatches(cm.batch, stages)
    ev = evaluated(cm, order, bounds)
    cycle_s = ev.cycle_s
    exact = cm.own_hosts
    np = numpy_module() if exact and n >= SWAP_ARRAY_NODES else None
    arrays = None if np is None else _MoveTimes(np, view)
    for _ in range(SWAP_PASSES):
        used = set(order)
        moves: list[tuple[float, int, int]] = []
        times, trip = ev.stage_time_s, sum(ev.stage_time_s) + ev.hops_s
        for s, d in enumerate(order):
            lo, hi, first, last = bounds[s], bounds[s + 1], s == 0, s == stages - 1
            after = order[(s + 1) % stages]
            others = max((t for i, t in enumerate(times) if i != s), default=0.0)
            base = trip - times[s] - view.hop_s(d, after)
            if arrays is not None:
                moves += arrays.moves(s, lo, hi, first, last, base, others, m, cycle_s, used)
                continue
            for e in range(n):
                if e in used or not view.fits(e, lo, hi, first, last):
                    continue
                t = view.stage_time(e, lo, hi, first, last, None if last else after)
                guess = max(base + t + view.hop_s(e, after), m * max(t, others))
                if guess < cycle_s * (1 - 1e-9):
                    moves.append((guess, s, e))
        best: tuple[float, int, int] | None = None
        for _, s, e in heapq.nsmallest(1 if exact else SWAP_SCORED, moves):
            got = evaluated(cm, [*order[:s], e, *order[s + 1 :]], bounds).cycle_s
            if got < cycle_s * (1 - 1e-9) and (best is None or got < best[0]):
                best = (got, s, e)
        if best is None:
            break
        cycle_s, s, e = best
        order[s] = e
        ev = evaluated(cm, order, bounds)
    return order, bounds


def rank_key(cm: CostModel, p: Pipeline) -> tuple[float, float, int, tuple[int, ...]]:
    """How pipelines rank, for every objective: least cycle first (per-sequence time per
    token; U / tokens/s), then the slowest stage, fewer stages, node ids."""
    ev = evaluated(cm, *p)
    return (ev.cycle_s, ev.bottleneck_s, len(p[0]), tuple(p[0]))


Tighten = Callable[[Problem, CostModel], "Optimum | None"]
"""A costlier bound on the least time per token of ``problem`` at a cost model's
microbatch (None where it is not computed)."""

Searched = Callable[[Problem, CostModel], "Pipeline | None"]
"""A search for a pipeline of ``problem``'s stage limits (one count) on a cost model at
that count's microbatch: a candidate, no bound."""

Coupled = Callable[
    [Problem, CostModel, int, float, float, float], "tuple[float, Pipeline | None] | None"
]
"""A lower bound on the cycle of ``problem``'s pipelines coupling their slowest stage and
their trip (given ``m``, a bound in hand, a cycle in hand and a bound it need not pin
below: it may stop once sure to stay under it), with a candidate pipeline where it has
one; None where not computed."""

Bound = Callable[[Problem, CostModel, Metric], "Optimum"]
"""The optimum (or a bound) of a solver objective (``latency`` or ``throughput``:
bottleneck seconds) of ``problem`` on a cost model."""


COUPLED = "bound: the least trip with every stage within the slowest (a knapsack, bisected)"
"""How the bound ``coupled`` gives is named in a certificate's method."""

REFINE_RANGES = 64
"""Most refinements of the range holding the least bound (a solve, a costlier bound, a
split), per certificate: on fleets of a few dozen nodes whose best pipelines run a dozen
stages or more, the ranges of counts near the optimum's each take several."""

SEARCHED_FURTHER = 4
"""On up to :data:`COUNT_SEARCH_NODES` nodes, once the refinements end with the plan
above the bound, the stage counts and ranges of them of least bound below it (besides
the counts solved whole) searched held to their counts, at most this many: the count of
least bound is not always the optimum's, and the plan's search tries the few counts of
least quick bound."""

REFINED_GAP = 0.01
"""Beyond :data:`COUNT_SEARCH_NODES` nodes, the range holding the least bound is refined
only while the plan in hand is more than this far above it (a cycle at most 1 % above
the bound: the gap a certificate states within 1 %): on such fleets each refinement
costs milliseconds, and closing the last fraction of a percent took a third of a plan.
On every fleet, the coupled bound of a range of several counts runs only while the plan
is more than this far above the least bound (on 64 nodes, 30 ms of knapsacks to close
0.49 % to 0.21 %, with no better pipeline found)."""

PROVEN_NODES = 16
"""Fleets up to this many nodes refine a certificate's least bound until the plan meets
it (or the refinements run out): a proof of its optimum where one is found."""

NEAR_GAP = 1e-4
"""Beyond :data:`PROVEN_NODES` nodes, up to :data:`COUNT_SEARCH_NODES`, the least bound
is refined only while the plan is more than this far above it (0.01 %): the last steps to
a proof split the range holding it count by count and bound each again, a third of a
plan's time where the plan already is within a thousandth of a percent (llama3.1:405b-q4_0
at 16 sequences on 64 single-GPU nodes: 11 of 41 ms, against 27 ms on 128 nodes)."""


def refined_gap(nodes: int) -> float:
    """How far above the least bound a plan on ``nodes`` nodes may be left unrefined."""
    if nodes <= PROVEN_NODES:
        return 1e-12
    return NEAR_GAP if nodes <= COUNT_SEARCH_NODES else REFINED_GAP


COUPLED_CUT = 0.05
"""On a range of several stage counts, :func:`optimum`'s coupled bound stops its bisection
once it shows the range's bound stays more than this share below the plan in hand (its
upper end falls below): the range is split next and each part bounded again, so the
bisection's last steps would only set their floor (deepseek-v3 at 256 sequences on 64
single-GPU nodes: 3.6 → 2.2 s, the same plan; its bound 0.005 % lower)."""


ENDS_FOUND_BY = "the exact split with each kind of node at either end"
"""How a plan note names a pipeline of :func:`~.latency.ends_split`."""


def _reshaped(
    problem: Problem,
    cm: CostModel,
    pipelines: list[Pipeline],
    got: dict[tuple[int, int], float],
    target: float,
) -> list[tuple[Pipeline, str]]:
    """Where the best cycle in hand (``target``, or a pipeline's of ``pipelines``) is
    still more than :data:`REFINED_GAP` above the least of the ranges' bounds ``got``, on
    up to :data:`COUNT_SEARCH_NODES` nodes: the pipelines the splits with each kind of
    node at either end find (:func:`_ends_splits`, where blocks differ), the best
    pipeline's own order split for its least cycle where it has more stages than the
    searches split so (:func:`_order_split`), then those the best pipeline's neighbours
    find (:func:`_neighbour_splits`), each of a lower cycle than the one before: in that
    order, each with how a plan note names what found it."""
    lower = min(got.values(), default=math.inf)
    best = min(pipelines, key=lambda p: evaluated(cm, *p).cycle_s, default=None)
    cycle_s = target if best is None else min(target, evaluated(cm, *best).cycle_s)
    if not cycle_s > lower * (1 + REFINED_GAP) or len(cm.nodes) > COUNT_SEARCH_NODES:
        return []
    (_, last), _ = min(got.items(), key=lambda kv: kv[1])
    ends = [] if cm.uniform else _ends_splits(problem, cm, best, last, cycle_s, lower)
    if ends:
        best, cycle_s = ends[-1], evaluated(cm, *ends[-1]).cycle_s
    split = [] if best is None else _order_split(cm, best, cycle_s)
    if split:
        best, cycle_s = split[-1], evaluated(cm, *split[-1]).cycle_s
    moves = [] if best is None else _neighbour_splits(problem, cm, best, cycle_s, lower)
    return [
        *((p, ENDS_FOUND_BY) for p in ends),
        *((p, ORDER_FOUND_BY) for p in split),
        *((p, NEIGHBOURS_FOUND_BY) for p in moves),
    ]


ORDER_SPLIT_STAGES = 64
"""Most stages of an order :func:`_order_split` splits for its least cycle."""

ORDER_FOUND_BY = (
    "the order in hand, and its nodes moved to its front or end, split again for the least cycle"
)
"""How a plan note names a pipeline of :func:`_order_split`."""


def _order_split(cm: CostModel, best: Pipeline, cycle_s: float) -> list[Pipeline]:
    """Where ``best`` has more than :data:`~.cycle_split.CYCLE_SPLIT_STAGES` stages (up to
    :data:`ORDER_SPLIT_STAGES`): its own order split for its least cycle
    (:func:`~.cycle_split.least_cycle_split`), then that order's nodes moved to its front
    or end and split so (:func:`relocated`), each where its cycle is below the one before
    (``cycle_s`` first).  The searches split such orders by one side of the cycle at a
    time, and the plan's search and the neighbours' moves split orders of up to
    :data:`~.cycle_split.CYCLE_SPLIT_STAGES` stages only (one split of 32 stages of 61
    blocks takes about 17 ms; most moves stop early, past the cycle in hand).  Where the
    trip decides, the exact split moves blocks to the nodes fast at them: deepseek-v3 at
    256 sequences on 48 LAN nodes, 32 stages, 38.25 → 37.60 ms a cycle, then two H100s
    moved to the front for the dense blocks, 37.13 ms."""
    stages = len(best[0])
    if not CYCLE_SPLIT_STAGES < stages <= ORDER_SPLIT_STAGES:
        return []
    found: list[Pipeline] = []
    view = cm.for_stages(stages)
    q = least_cycle_split(view, best[0], cycle_s * (1 - 1e-9), most=ORDER_SPLIT_STAGES)
    if q is not None and cm.fits_pipeline(*q) and evaluated(cm, *q).cycle_s < cycle_s * (1 - 1e-9):
        found.append(q)
        best, cycle_s = q, evaluated(cm, *q).cycle_s
    moved = relocated(cm, best, ORDER_SPLIT_STAGES)
    if moved is not best and evaluated(cm, *moved).cycle_s < cycle_s * (1 - 1e-9):
        found.append(moved)
    return found


def _ends_splits(
    problem: Problem, cm: CostModel, best: Pipeline | None, last: int, cycle_s: float, lower: float
) -> list[Pipeline]:
    """The least time per token with each kind of node at either end
    (:func:`~.latency.ends_split`) at the microbatches of ``best``'s count, one and two
    more, one fewer and ``last`` (the last count of the range of least bound; a split of
    the least trip at one microbatch runs at that of its own count), until one is within
    :data:`REFINED_GAP` of ``lower``: those below ``cycle_s`` and each before them.

    The searches choose nodes by average blocks: where the dense blocks come first, a node
    holding a MoE block or two may cost a hop the trip need not pay (kimi-k2 at 4
    sequences on 64 nodes: 9 stages, 4.9 % above an 8-stage pipeline of other ends)."""
    s = last if best is None else len(best[0])
    views: dict[int, CostModel] = {}
    for stages in (s, s + 1, s + 2, s - 1, last):
        if problem.min_stages <= stages <= problem.max_stages:
            view = cm.for_stages(stages)
            views.setdefault(view.microbatch, view)
    found = []
    for view in views.values():
        q = ends_split(view, problem.min_stages, problem.max_stages)
        if q is not None and (c := evaluated(cm, *q).cycle_s) < cycle_s * (1 - 1e-9):
            found.append(q)
            cycle_s = c
            if cycle_s <= lower * (1 + REFINED_GAP):
                break  # within the gap a certificate states
    return found


NEIGHBOUR_SPLITS = 160
"""Most orders :func:`_neighbour_splits` splits for their least cycle per certificate."""

NEIGHBOURS_FOUND_BY = "a node dropped, replaced, put in or swapped, each order split again"
"""How a plan note names a pipeline of :func:`_neighbour_splits`."""


def _neighbour_splits(
    problem: Problem, cm: CostModel, best: Pipeline, cycle_s: float, lower: float
) -> list[Pipeline]:
    """``best``'s order (of cycle ``cycle_s``) with a stage dropped, its node replaced or
    a node put in before it (of each kind of node unused, the one of least hop and
    transfer), or two stages' nodes swapped, each order split for its least cycle
    (:func:`~.cycle_split.least_cycle_split`); the best move while one lowers the cycle,
    at most :data:`NEIGHBOUR_SPLITS` splits in all, until within :data:`REFINED_GAP` of
    ``lower``: the pipelines of those moves.

    The searches fill the fastest nodes first and split by one side of the cycle at a
    time: where the slowest stage and the trip balance, another node in one place, split
    again, can lower both (deepseek-v3 at 16 sequences on 16 LAN nodes: an H200 of four
    blocks for an H100 and two stages moved, 1.7 %)."""
    kinds = alike_by_hop(cm)
    found: list[Pipeline] = []
    order, splits = list(best[0]), 0
    kept: dict[CostModel, dict[tuple[Any, ...], Any]] = {}
    """Per view (of a stage count's microbatch), the positions' tables its moves share."""
    while splits < NEIGHBOUR_SPLITS and cycle_s > lower * (1 + REFINED_GAP):
        used = set(order)
        unused = (next((d for d in ds if d not in used), None) for ds in kinds)
        others = [d for d in unused if d is not None]
        moves = [order[:i] + order[i + 1 :] for i in range(len(order))]
        moves += [[*order[:i], e, *order[i + 1 :]] for i in range(len(order)) for e in others]
        moves += [[*order[:i], e, *order[i:]] for i in range(len(order) + 1) for e in others]
        for i, j in itertools.combinations(range(len(order)), 2):
            swap = list(order)
            swap[i], swap[j] = swap[j], swap[i]
            moves.append(swap)
        step: Pipeline | None = None
        for pairs in (False, True):
            if splits >= NEIGHBOUR_SPLITS:
                break
            # The pairs are built only where no move of one node lowered the cycle.
            for o in _pair_moves(order, kinds) if pairs else moves:
                if not problem.min_stages <= len(o) <= problem.max_stages or len(o) < 2:
                    continue
                if splits >= NEIGHBOUR_SPLITS:
                    break
                splits += 1
                view = cm.for_stages(len(o))
                q = least_cycle_split(view, o, cycle_s * (1 - 1e-9), kept=kept.setdefault(view, {}))
                if (
                    q is not None
                    and cm.fits_pipeline(*q)
                    and (c := evaluated(cm, *q).cycle_s) < cycle_s * (1 - 1e-9)
                ):
                    step, cycle_s = q, c
            if step is not None:
                break  # a move of one node lowers the cycle: no pairs this round
        if step is None:
            break
        found.append(step)
        order = list(step[0])
    return found


def _pair_moves(order: list[int], kinds: list[list[int]]) -> list[list[int]]:
    """``order`` with two of its stages' nodes replaced by the first two unused nodes of
    one kind, then with one stage's node replaced by two unused nodes (the first unused
    of one kind, then the first unused of another or the second of the same; kinds of
    :func:`~.latency.alike_by_hop`).  Tried only where no move of one node lowers the
    cycle: where two stages of a slower kind beat one of a faster, the move of the first
    of them alone may lower neither side of the cycle (deepseek-r1 at 16 sequences on 64
    WAN nodes: an A100 and five B200s, where four B200s and two H100s run 1.5 % faster,
    and neither H100 alone, in place of the A100 or of a B200, does)."""
    used = set(order)
    free = [[d for d in ds if d not in used][:2] for ds in kinds]
    two = [ds for ds in free if len(ds) == 2]
    moves = []
    for i, j in itertools.combinations(range(len(order)), 2):
        for e, f in two:
            o = list(order)
            o[i], o[j] = e, f
            moves.append(o)
    firsts = [ds[0] for ds in free if ds]
    pairs = [(e, f) for e in firsts for f in firsts if e != f]
    pairs += [(ds[0], ds[1]) for ds in two]
    moves += [[*order[:i], e, f, *order[i + 1 :]] for i in range(len(order)) for e, f in pairs]
    return moves


def optimum(
    problem: Problem,
    cm: CostModel,
    objective: Metric,
    bound: Bound,
    value: float = math.inf,
    *,
    exact: bool = False,
    tighten: Tighten | None = None,
    whole: bool = False,
    outright: Tighten | None = None,
    searched: Searched | None = None,
    coupled: Coupled | None = None,
    reshaped: bool = True,
) -> Optimum:
    """A lower bound on the cycle of every pipeline (the optimum when one in hand meets it).

    ``bound`` gives per stage count the least bottleneck and least time per token
    (exact solvers or relaxations); ``value`` is the cycle of the plan being certified:
    a stage count whose quick bound is already at or above it needs no solve.  With
    ``exact``, each stage count's least cycle is solved outright where the cluster is
    small enough (:func:`~stowplan.planner.exact.pipelines.least_cycle`).  ``tighten``
    gives a costlier bound on the least time per token, tried only on the range of stage
    counts that holds the least bound, where that range's time per token decides it.
    With ``whole``, a single stage count that holds the least bound while it is below
    ``value`` is solved outright where :func:`~stowplan.planner.exact.pipelines.least_cycle`
    can (small clusters; two stages on any): its optimum, and its pipeline, which beats
    the plan's.  Where it cannot, ``outright`` (given the problem held to that count)
    may give the least time per token of that count and its pipeline, when it proves
    it: the cycle is at least that, and the pipeline is a candidate.  Where neither
    proves it, ``searched`` (given the problem held to that count) may give a pipeline
    of that count, on up to :data:`COUNT_SEARCH_NODES` nodes: a candidate only.  The
    plan's search tries the few stage counts of least quick bound; the count holding the
    least bound may be another.  ``coupled`` bounds the range holding the least bound
    once more, on clusters beyond :data:`CYCLE_EXACT_LIMIT` nodes, where its two parts
    were bounded apart: the slowest stage and the trip of one pipeline together.  On a
    range of several counts it runs only while the plan is more than
    :data:`REFINED_GAP` above the least bound: within that gap the cheaper bounds of the
    range's parts narrow it to the count it is refined at, where ``coupled`` runs again
    (its pipeline there is the one that may beat the plan); and it stops once sure the
    range stays more than :data:`COUPLED_CUT` below the plan (it is split then).  With
    ``reshaped`` (not for a MoE backbone: its experts are placed after, and a faster
    backbone is not always the faster plan with them), where ``searched`` runs and the
    plan is still more than :data:`REFINED_GAP` above the bound, the splits with each
    kind of node at either end, the best pipeline's own order split whole (past the
    stages the searches split so) and its neighbours (:func:`_reshaped`) are candidates
    too.
    """

    points = list(stage_counts(problem)) if exact else ladder(problem, cm.batch, fine=False)
    # Stage counts [a, b] bounded together: m ≥ m_a and stage times at u_b or more, so
    # the cycle of any of them is at least max(m_a · B(≥ a, ≤ b, u_b), L(≥ a, ≤ b, u_b)).
    ranges = count_ranges(points)
    got: dict[tuple[int, int], float] = {}
    """Each range's bound."""
    pipelines: list[Pipeline] = []
    exact_parts = True
    split = False
    """Whether some stage count was bounded by its two parts rather than solved whole."""
    methods: set[str] = set()

    quick_only: set[tuple[int, int]] = set()
    """Ranges whose bound is their quick bound alone (it could not lower the least)."""
    loose: dict[tuple[int, int], tuple[Problem, CostModel]] = {}
    """Ranges whose time-per-token bound is not exact: what ``tighten`` would be given."""
    whole_counts: set[int] = set()
    """Stage counts solved outright."""
    coupled_ranges: set[tuple[int, int]] = set()
    """Ranges ``coupled`` has bounded."""
    found_by: dict[int, str] = {}
    """Per pipeline that ``searched``, ``coupled`` or :func:`_reshaped` found (by ``id``),
    how a plan note names what found it."""

    def solve_whole(stages: int, floor: float) -> float:
        """The least cycle of ``stages`` stages (``floor`` where it cannot be solved)."""
        whole_counts.add(stages)
        try:
            solved = least_cycle(problem, cm.for_stages(stages), stages)
        except DependencyError:
            held = replace(problem, min_stages=stages, max_stages=stages)
            view = cm.for_stages(stages)
            trip = None if outright is None else outright(held, view)
            if trip is None or not trip.exact:
                # A solve cut short says nothing the same on every machine.
                if (
                    searched is not None
                    and len(cm.nodes) <= COUNT_SEARCH_NODES
                    and (found := searched(held, view)) is not None
                ):
                    pipelines.append(found)
                    found_by[id(found)] = _held_to(stages)
                return floor
            methods.add(trip.method)
            if trip.pipeline is not None:
                pipelines.append(trip.pipeline)
            return max(floor, trip.value)
        methods.add(solved.method)
        if solved.pipeline is not None:
            pipelines.append(solved.pipeline)
        return max(floor, solved.value)

    def bounded(first: int, last: int, floor: float = 0.0, *, force: bool = False) -> float:
        nonlocal exact_parts, split
        quick = max(floor, quick_bound(problem, cm, first, last))
        if not math.isfinite(quick) or (quick >= min([value, *got.values()]) and not force):
            quick_only.add((first, last))
            return quick  # cannot lower the least bound: no solve needed
        quick_only.discard((first, last))
        m, _ = microbatches(cm.batch, first)
        sub, view = _at(problem, last), cm.for_stages(last)
        if exact and first == last:
            try:
                solved = least_cycle(problem, view, last)
            except DependencyError:
                pass
            else:
                methods.add(solved.method)
                if solved.pipeline is not None:
                    pipelines.append(solved.pipeline)
                return solved.value
        split = True
        # The range holds pipelines of at least ``first`` stages: their hops are paid.
        sub = replace(sub, min_stages=max(sub.min_stages, first))
        slowest = bound(sub, view, Metric.THROUGHPUT)
        methods.add(slowest.method)
        exact_parts &= slowest.exact and first == last
        if slowest.pipeline is not None:
            pipelines.append(slowest.pipeline)
        lb = max(quick, m * slowest.value)
        if lb < value:
            trip = bound(sub, view, Metric.LATENCY)
            methods.add(trip.method)
            exact_parts &= trip.exact
            if trip.pipeline is not None:
                pipelines.append(trip.pipeline)
            if not trip.exact:
                loose[(first, last)] = (sub, view)
            lb = max(lb, trip.value)
        return lb

    for r in sorted(ranges, key=lambda r: quick_bound(problem, cm, *r)):
        got[r] = bounded(*r)
    # The range holding the least bound, split (finer ladder, then halves) and bounded
    # again while it is below the plan: m and the microbatch then fit its counts.
    fine = ladder(problem, cm.batch)
    close = 1 - refined_gap(len(cm.nodes))
    """The least bound at or above ``target`` times this needs no refining."""
    target, counted = value, 0
    """The least cycle in hand (the plan's, or a pipeline's found on the way), and how
    many of ``pipelines`` it has counted."""
    for _ in range(REFINE_RANGES):
        for p in pipelines[counted:]:
            target = min(target, evaluated(cm, *p).cycle_s)
        counted = len(pipelines)
        (first, last), least = min(got.items(), key=lambda kv: kv[1])
        if least >= target * close or not math.isfinite(least):
            break
        if (first, last) in quick_only:  # the least is a quick bound: solve it now
            got[(first, last)] = bounded(first, last, least, force=True)
            continue
        if tighten is not None and (first, last) in loose:
            better = tighten(*loose.pop((first, last)))
            if better is not None and better.value > least:
                methods.add(better.method)
                got[(first, last)] = better.value
            continue
        if (
            coupled is not None
            and (first, last) not in coupled_ranges
            and len(cm.nodes) > CYCLE_EXACT_LIMIT
            and (first == last or least < target * (1 - REFINED_GAP))
        ):
            coupled_ranges.add((first, last))
            m, _ = microbatches(cm.batch, first)
            sub = replace(_at(problem, last), min_stages=max(problem.min_stages, first))
            # A range of several counts whose bound stays well below the plan is split
            # next: its bisection may stop there (COUPLED_CUT).
            short = target * close * (1 - COUPLED_CUT) if first < last else 0.0
            at_last = cm.for_stages(last)
            joint, candidate = coupled(sub, at_last, m, least, target, short) or (0.0, None)
            if (
                candidate is not None
                and sub.min_stages <= len(candidate[0]) <= sub.max_stages
                and cm.fits_pipeline(*candidate)
                and evaluated(cm, *candidate).cycle_s < target * (1 - 1e-9)
            ):
                pipelines.append(candidate)
                found_by[id(candidate)] = "the coupled bound's knapsack"
            if joint > least:
                methods.add(COUPLED)
                got[(first, last)] = joint
                continue
            if len(pipelines) > counted:
                continue  # a better cycle in hand: the loop reads it first
        if first == last:
            if whole and first not in whole_counts:
                got[(first, last)] = solve_whole(first, least)
                continue
            break
        cuts = [p for p in fine if first < p <= last] or [(first + last + 1) // 2]
        starts = [first, *cuts]
        del got[(first, last)]
        for a, b in zip(starts, [*(c - 1 for c in cuts), last], strict=True):
            got[(a, b)] = bounded(a, b, least)
    if whole and searched is not None and len(cm.nodes) <= COUNT_SEARCH_NODES:
        # The loop ends at a count solved whole (or out of refinements) with the plan
        # still above the bound: the next counts (or ranges of them) of least bound may
        # hold a better pipeline than the plan's search found; a few are searched, each
        # held to its counts.
        for p in pipelines[counted:]:
            target = min(target, evaluated(cm, *p).cycle_s)
        further = sorted(
            (bound_of, first, last)
            for (first, last), bound_of in got.items()
            if not (first == last and first in whole_counts) and bound_of < target * close
        )
        for _, first, last in further[:SEARCHED_FURTHER]:
            held = replace(problem, min_stages=first, max_stages=last)
            if (found := searched(held, cm.for_stages(last))) is not None:
                pipelines.append(found)
                found_by[id(found)] = _held_to(len(found[0]))
        if reshaped:
            for p, by in _reshaped(problem, cm, pipelines, got, target):
                pipelines.append(p)
                found_by[id(p)] = by
    per_count = list(got.values())
    lower = min(per_count, default=math.inf)
    best = min(pipelines, key=lambda p: evaluated(cm, *p).cycle_s, default=None)
    best_cycle = evaluated(cm, *best).cycle_s if best is not None else math.inf
    reached = min(best_cycle, value)
    exact = reached <= lower * (1 + 1e-12)
    kind = "; ".join(sorted(methods)) or "closed form"
    if not split:
        method = f"least cycle per stage count: {kind}"
    elif exact_parts:
        method = f"per stage count, max(m × least slowest stage, least time per token): {kind}"
    else:
        method = f"per stage count, max(m × slowest-stage bound, time-per-token bound): {kind}"
    return Optimum(
        objective=objective,
        value=min(reached, lower) if exact else lower,
        exact=exact,
        method=method,
        pipeline=best,
        found_by="" if best is None else found_by.get(id(best), ""),
    )


def _held_to(stages: int) -> str:
    """How a plan note names a pipeline ``optimum``'s ``searched`` found held to a count."""
    return f"a search held to {stages} stages (the count of least bound)"
