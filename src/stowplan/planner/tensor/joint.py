"""The optimum over every grouping the engine rule allows (step 4 of
:func:`stowplan.planner.tensor.groups.plan_with_groups`): the joint solve where it is exact, bounds
elsewhere, per stage count for concurrent sequences."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

from stowplan.cost import microbatches
from stowplan.errors import DependencyError
from stowplan.model import Metric
from stowplan.planner.problem import Problem
from stowplan.planner.strategies import cycle
from stowplan.planner.tensor.capacity import (
    COARSE,
    STAGES_COUNTED_FAR,
    StageCapacity,
    bisect_bound,
    counted_stages,
    fewest_holding,
)
from stowplan.planner.tensor.exact import (
    GROUPED_NODE_LIMIT,
    GroupedOptimum,
    degrees,
    grouped_bound,
    grouped_work,
    solve_grouped,
    stage_count_trips_by_nodes,
)
from stowplan.planner.tensor.layouts import EngineRule, as_pipeline, cycle_of
from stowplan.planner.tensor.nodes import GroupCosts, numpy_module
from stowplan.planner.tensor.two_stages import two_stage_cycle

__all__ = [
    "INLINE_GROUPED_WORK",
    "adjacency_loses_nothing",
    "exact_allowed",
    "joint_cycle",
    "joint_optimum",
    "joint_runs",
]


INLINE_GROUPED_WORK = 200_000_000
"""Every plan is certified by the exact joint solve while its work (element operations,
:func:`~stowplan.planner.tensor.exact.grouped_work`) stays within this; beyond, a bound."""


def exact_allowed(rule: EngineRule, problem: Problem) -> list[tuple[int, ...] | None]:
    """The degree sets the joint solve runs with: one per degree under a uniform rule."""
    if not rule.uniform:
        return [rule.degrees]
    if rule.degrees is not None:
        return [rule.degrees]
    return [(t,) for t in sorted({t for n in problem.nodes for t in degrees(problem, n, None)})]


_RELAXED = "fractional relaxation, every node at full bandwidth, no all-reduce"
_BOUND_METHODS = {
    Metric.THROUGHPUT: f"bound: {_RELAXED}",
    Metric.LATENCY: f"bound: {_RELAXED}; every block at its least cost on any GPU group, "
    "with the network crossings memory forces and each node's own hop",
}
"""How :func:`~stowplan.planner.tensor.exact.grouped_bound` is named, per objective."""


def joint_optimum(
    problem: Problem,
    rule: EngineRule,
    objective: Metric,
    runs: bool,
    lossless: bool,
    shared: dict[tuple[int, ...] | None, GroupCosts] | None = None,
    like: dict[tuple[int, ...] | None, GroupCosts] | None = None,
) -> tuple[float, bool, str, GroupedOptimum | None]:
    """The optimum over every grouping the rule allows (exact on small fleets), or a bound:
    (seconds, exact?, method, its pipeline).  ``runs``: :func:`joint_runs`; ``lossless``:
    :func:`adjacency_loses_nothing`; ``shared``: the groups of each degree set, kept for
    another objective's solve of the same ``problem``; ``like``: the groups of each degree
    set at any microbatch (their cost models' views serve this one; filled when empty)."""
    sets = exact_allowed(rule, problem)
    shared = {} if shared is None else shared

    def of(a: tuple[int, ...] | None) -> GroupCosts:
        if a not in shared:
            shared[a] = GroupCosts(problem, a, None if like is None else like.get(a))
            if like is not None:
                like.setdefault(a, shared[a])
        return shared[a]

    if runs:
        try:
            found = [
                solve_grouped(problem, objective, a, wrap=not rule.consecutive, groups=of(a))
                for a in sets
            ]
        except DependencyError:
            found = []
        else:
            got = [f for f in found if f is not None]
            best = min(got, key=lambda f: f.value) if got else None
            value = best.value if best is not None else math.inf
            if lossless:
                method = (
                    "joint dynamic programme over GPU groups and pipelines of "
                    f"{len(problem.nodes)} nodes"
                )
                return value, True, method, best
            # Blocks differ or a GPU link is dearer than the network: a pipeline that
            # interleaves nodes may be better, so the solve's value is no bound.
            bound = min(grouped_bound(problem, objective, a, of(a)) for a in sets)
            method = _BOUND_METHODS[objective]
            return min(bound, value), False, method, best
    # The throughput bound needs no GPU groups (:func:`grouped_bound`).
    bound = min(
        grouped_bound(problem, objective, a, of(a) if objective == Metric.LATENCY else None)
        for a in sets
    )
    return bound, False, _BOUND_METHODS[objective], None


def joint_cycle(
    problem: Problem,
    rule: EngineRule,
    runs: bool,
    lossless: bool,
    plan_cycle: float,
    counts: dict[int, float] | None = None,
    coupled_counts: dict[int, float] | None = None,
    couple: bool = True,
) -> tuple[float, bool, str, GroupedOptimum | None]:
    """:func:`joint_optimum` for U > 1 concurrent sequences: a lower bound on the cycle,
    per stage count S the largest of its quick bound, m × the least slowest stage and the
    least time per token, both at S's microbatch over every grouping (any stage count:
    a bound for S), and the time per token of exactly S stages
    (:func:`~stowplan.planner.tensor.exact.stage_count_trips`); and the better by cycle
    of the two solves' pipelines.

    Every stage time grows with the microbatch, so a solve at a smaller microbatch
    bounds every stage count whose microbatch is larger.  Without the exact solve (no
    pipeline comes of a solve, only bounds) the smallest microbatch is solved first, the
    counts then go in the order of what it bounds them by, and a count is solved only
    while that bound is below the least so far and the plan's cycle (the plan is a
    pipeline of some count: the least bound is no more than its cycle).

    ``counts``, when given, receives the bound of each stage count bounded in full
    (the counts that may hold a pipeline better than the plan in hand are among them),
    and ``coupled_counts`` the bound of each count the coupled bound (:class:`_Coupled`)
    raised above that; without ``couple`` the coupled bound is not sought."""
    cm = problem.cost_model()
    total = sum(n.num_gpus for n in problem.nodes)
    top = min(problem.constraints.max_stages or total, total, problem.model.num_blocks)
    solved: dict[int, _Solved] = {}
    like: dict[tuple[int, ...] | None, GroupCosts] = {}
    # The problem's nodes stand for every grouping of their GPUs.
    quick = {
        s: cycle.quick_bound(problem, cm, s, layouts=True)
        for s in range(problem.min_stages, top + 1)
    }

    def solve(u: int) -> _Solved:
        if u not in solved:
            pu = problem.at_microbatch(u)
            shared: dict[tuple[int, ...] | None, GroupCosts] = {}
            b = joint_optimum(pu, rule, Metric.THROUGHPUT, runs, lossless, shared, like)
            t = joint_optimum(pu, rule, Metric.LATENCY, runs, lossless, shared, like)
            found = [g for g in (b[3], t[3]) if g is not None and g.stages]
            counted = [stage_count_trips_by_nodes(pu, g, top) for g in shared.values()]
            # Per stage count and node count, the least over the degree sets.
            by_nodes = reduce(numpy_module().minimum, counted) if counted else None
            trips = [] if by_nodes is None else by_nodes.min(axis=1).tolist()
            groups = list(shared.values())
            solved[u] = _Solved(b[0], t[0], found, {b[2], t[2]}, trips, pu, groups, by_nodes)
        return solved[u]

    fewest: list[int] = []
    """The fewest GPU groups whose memory holds the model (:func:`fewest_holding`, over
    every grouping; computed once a solve has built the groups)."""

    def known(s: int, held: float = 0.0, sharp: float = math.inf) -> float:
        """Stage count ``s``'s bound from the solves so far (its own microbatch's, or
        smaller ones'); with ``held``, also by the blocks its groups could hold (sought
        up to ``held``).  Infinite below the fewest groups that hold the model."""
        if solved and not fewest:
            groups = next(iter(solved.values())).groups
            fewest.append(min((fewest_holding(problem, g, top) for g in groups), default=1))
        if fewest and s < fewest[0]:
            return math.inf
        m, u = microbatches(cm.batch, s)
        # The largest microbatch first (its bound is the closest): each bound after is
        # sought only above the largest so far.
        found = quick[s]
        for w in sorted((w for w in solved if w <= u), reverse=True):
            found = max(found, solved[w].bound(s, m, held, sharp, floor=found))
        return found

    def solvable(s: int) -> bool:
        return quick[s] < plan_cycle and math.isfinite(quick[s])

    cycles: dict[int, float] = {}
    """Per microbatch solved, the least cycle of its pipelines."""

    def in_hand() -> float:
        """The least cycle of a pipeline in hand (the search's, or a solve's)."""
        for w, v in solved.items():
            if w not in cycles:
                cycles[w] = min(
                    (cycle_of(*as_pipeline(problem, g.stages), Metric.THROUGHPUT) for g in v.found),
                    default=math.inf,
                )
        return min([plan_cycle, *cycles.values()])

    def incumbent() -> float:
        """:func:`in_hand`, with the tolerance a bound must exceed it by."""
        return in_hand() * (1 + 1e-12)

    lower = math.inf
    within = False
    """Whether the coupled bound raised a count's."""
    solved_two = False
    """Whether two stages solved (:func:`two_stage_cycle`) raised their count's bound."""
    held_counts = False
    """Whether what a count's groups could hold raised its bound."""
    first = quick
    smallest = min((microbatches(cm.batch, s)[1] for s in quick if solvable(s)), default=None)
    if smallest is not None:
        solve(smallest)
        first = {s: known(s) for s in quick}
    per_count = dict(first)
    """Per stage count, its bound so far."""
    full: dict[int, float] = {}
    """The counts bounded in full (their microbatch solved, what their groups hold), each
    with the cycle its bound was sought up to."""

    def bound_in_full(s: int, held: float) -> float:
        """Count ``s`` bounded in full, sought up to ``held``."""
        full[s] = max(full.get(s, 0.0), held)
        if solvable(s):
            solve(microbatches(cm.batch, s)[1])
        here = known(s)
        if here < held and solvable(s):
            fuller = known(s, held=held, sharp=in_hand())
            if fuller > here:
                nonlocal held_counts
                held_counts = True
            here = fuller
        per_count[s] = max(per_count[s], here)
        if counts is not None:
            counts[s] = here
        return here

    for s in sorted(quick, key=lambda s: (first[s], s)):
        if runs:
            # A count bounded above a pipeline in hand holds no better pipeline, and its
            # bound is no less than that pipeline's cycle, which bounds the optimum.
            if first[s] > incumbent():
                lower = min(lower, first[s])
                break  # the counts go by this bound: none after holds a better one
            per_count[s] = known(s)
            if per_count[s] > incumbent():
                lower = min(lower, per_count[s])
                continue
        else:
            # The plan in hand is a pipeline of some count: the least bound is no more
            # than its cycle, and a count bounded at or above it cannot lower the least.
            cut = min(lower, plan_cycle)
            if first[s] >= cut:
                lower = min(lower, first[s])
                break  # the counts go by this bound: none after can lower the least
            per_count[s] = known(s)
            if per_count[s] >= cut:
                lower = min(lower, per_count[s])
                continue
        lower = min(lower, bound_in_full(s, min(lower, plan_cycle)))
    held_to = in_hand()
    if couple and lower < held_to * (1 - COUPLED_GAP):
        # The least count is bounded again, cheapest first: at its own microbatch, with
        # its slowest stage and time per token together, then by what its groups hold.
        coupled = _Coupled(cm.batch, solved, held_to)
        own = set(full)
        """The counts bounded at their own microbatch."""
        tried: set[tuple[int, int]] = set()
        """The counts and least stages the coupled bound was sought at."""
        two_tried = False
        """Whether two stages were solved (:func:`two_stage_cycle`)."""
        while True:
            s = min(per_count, key=lambda k: (per_count[k], k))
            if per_count[s] >= held_to * (1 - COUPLED_GAP):
                break
            if s not in own:
                own.add(s)
                if solvable(s):
                    solve(microbatches(cm.batch, s)[1])
                per_count[s] = max(per_count[s], known(s))
                continue
            # The coupled bound as any pipeline of two stages or more, then as one of the
            # count's own (each stage counted costs more to bound), counted up to
            # capacity.STAGES_COUNTED, then (a count past it) up to STAGES_COUNTED_FAR.
            rungs = (
                coupled.counted(s, 2),
                coupled.counted(s, s),
                coupled.counted(s, s, STAGES_COUNTED_FAR),
            )
            least = next((k for k in rungs if (s, k) not in tried), None)
            if least is not None:
                tried.add((s, least))
                raised = coupled.bound(s, per_count[s], least)
                if raised > per_count[s]:
                    within, per_count[s] = True, raised
                    if coupled_counts is not None:
                        coupled_counts[s] = raised
                continue
            if full.get(s, 0.0) < held_to:
                # Not bounded in full, or sought only up to the least bound of the counts
                # before it (where its bound may have stopped): sought up to the plan.
                bound_in_full(s, held_to)
                continue
            if s == 2 and not two_tried:
                # Two stages are few enough to solve: every pair of groups, every split.
                two_tried = True
                at = solve(microbatches(cm.batch, 2)[1])
                exact = min((two_stage_cycle(at.problem, g) for g in at.groups), default=0.0)
                if exact > per_count[2]:
                    solved_two, per_count[2] = True, exact
                    if coupled_counts is not None:
                        coupled_counts[2] = exact
                continue
            break
        lower = min(per_count.values())
    candidates = [g for v in solved.values() for g in v.found]
    best = min(
        candidates,
        key=lambda g: cycle_of(*as_pipeline(problem, g.stages), Metric.THROUGHPUT),
        default=None,
    )
    texts = {k for v in solved.values() for k in v.texts}
    if held_counts:
        texts.add(f"bound: {HELD}")
    if within:
        texts.add(f"bound: {WITHIN}")
    if solved_two:
        texts.add(f"bound: {TWO_STAGES}")
    # A text another one extends says nothing more.
    kinds = "; ".join(sorted(t for t in texts if not any(u.startswith(t) for u in texts - {t})))
    kinds = kinds or "closed form"
    method = f"per stage count, max(m × slowest-stage bound, time-per-token bound): {kinds}"
    return lower, False, method, best


COUPLED_GAP = 0.01
"""Below this gap a certificate is left as the bounds above give it; above, the stage
counts of least bound are bounded again with their slowest stage and time per token
together (:meth:`~stowplan.planner.tensor.capacity.StageCapacity.trip_within`)."""

COUPLED_STEPS = 10
"""Most bisection steps of one stage count's coupled bound (to 2⁻¹⁰ of its interval)."""

COUPLED_PRECISION = 1e-9
"""Where the coupled bound's interval is this narrow (relative), its bisection stops."""

COUPLED_DOUBLINGS = 64
"""Most doublings of the bound in search of a cycle the coupled test reaches, with no
pipeline in hand."""

WITHIN = "the least time per token of GPU groups with every stage within the slowest"
"""How the coupled bound is named in a certificate."""

TWO_STAGES = "two stages solved over every pair of GPU groups and split"
"""How :func:`~stowplan.planner.tensor.two_stages.two_stage_cycle` is named in a
certificate."""


class _Coupled:
    """The coupled bound of each stage count, within a cycle ``in_hand`` (the least
    cycle of a pipeline in hand, or inf).

    A pipeline of ``s`` ≥ 2 stages and ``m`` microbatches (``s`` ≥ ``m``) whose cycle is
    ``C`` has every stage within ``C / m`` and its time per token within ``C``, so
    ``trip_within(C / m, k) ≤ C`` for every ``k`` from 2 to ``m`` on the groups of some
    grouping at its microbatch or a smaller one (stage times grow with the microbatch);
    where that fails, ``C`` is below its cycle.  The test holds at every cycle above one
    where it holds (the bound falls as the stages' limit rises): the largest cycle where
    it fails is sought by bisection, and where it holds at ``C`` the least time per token
    ``T`` found there fails every cycle below ``T`` (none has a smaller one), so the
    bisection's lower end rises to ``T``.  Counting stages (a larger ``k``) bounds more
    tightly and costs more: ``k`` = 2 is sought first."""

    def __init__(self, batch: int, solved: dict[int, _Solved], in_hand: float) -> None:
        self.batch, self.solved, self.in_hand = batch, solved, in_hand
        self.done: dict[tuple[int, int, int], float] = {}
        """Per count of microbatches, microbatch solved and least stages, the bound found."""

    def counted(self, s: int, least: int, most: int | None = None) -> int:
        """The stages the bound of count ``s`` counts when asked for ``least`` (at most
        ``s``) up to ``most`` (:data:`STAGES_COUNTED` unless given): a count's pipelines
        have ``s`` stages, at least ``m``, so the counts of the same microbatches (all of
        ``batch`` or more stages) share the bound, as do those past the stages the bound
        counts (:func:`counted_stages`)."""
        return counted_stages(min(least, microbatches(self.batch, s)[0]), most)

    def bound(self, s: int, lo: float, least: int) -> float:
        """Stage count ``s``'s bound as a pipeline of at least ``least`` stages (as
        :meth:`counted` gives them), given ``lo`` (its bound in hand, the least of every
        count's: a count of the same microbatches asked later has a bound no lower)."""
        m, u = microbatches(self.batch, s)
        w = max((w for w in self.solved if w <= u), default=None)
        if s < 2 or w is None:
            return lo
        if (m, w, least) not in self.done:
            caps = self.solved[w].held()

            def trip(c: float) -> float:
                """The least time per token within a cycle of ``c`` (inf above ``c``)."""
                return min(
                    (h.trip_within(c / m, least, c, most=least) for h in caps),
                    default=math.inf,
                )

            hi = self.in_hand
            if math.isinf(hi):  # nothing in hand: doubled from the bound until reached
                hi = max(lo, 1e-12) * 2
                for _ in range(COUPLED_DOUBLINGS):
                    if trip(hi) <= hi:
                        break
                    hi *= 2
            if not caps or trip(lo) <= lo:
                self.done[(m, w, least)] = lo
            elif (reach := trip(hi)) > hi:
                self.done[(m, w, least)] = hi
            else:
                # Where the test holds at C, the time per token T found there is no more
                # than at any cycle below: every cycle under T fails it, so T bounds too.
                lo = max(lo, reach)
                for _ in range(COUPLED_STEPS):
                    if hi - lo <= COUPLED_PRECISION * hi:
                        break
                    mid = (lo + hi) / 2
                    reach = trip(mid)
                    lo, hi = (max(lo, reach), mid) if reach <= mid else (mid, hi)
                self.done[(m, w, least)] = lo
        return max(lo, self.done[(m, w, least)])


@dataclass(frozen=True, slots=True)
class _Solved:
    """The solves of one microbatch: the least slowest stage and time per token over
    every grouping and stage count, their pipelines and methods, and the time per token
    of each stage count."""

    slowest: float
    trip: float
    found: list[GroupedOptimum]
    texts: set[str]
    trips: list[float]
    problem: Problem
    """The problem at this microbatch."""
    groups: list[GroupCosts]
    """Its groups, per grouping."""
    by_nodes: Any = None
    """Per stage count and count of nodes used, the time per token of exactly those
    (a numpy array; None without groups)."""
    kept: list[StageCapacity] = field(default_factory=list)
    """Per grouping, the blocks its groups could hold within a slowest stage (built
    when first asked)."""

    def held(self) -> list[StageCapacity]:
        if not self.kept and self.groups:
            self.kept.extend(StageCapacity(self.problem, g) for g in self.groups)
        return self.kept

    def bound(
        self, s: int, m: int, held: float = 0.0, sharp: float = math.inf, floor: float = 0.0
    ) -> float:
        """Stage count ``s`` of ``m`` microbatches, at this microbatch or a larger one;
        with ``held`` > 0, its slowest stage also bounded by what ``s`` stages could hold
        (at the next count of :data:`HELD_COUNTS` or above: no more stages, no faster
        slowest stage) and both per count of nodes used, sought no further than a cycle
        of ``held``, and finely only near ``sharp`` (the cycle of the plan in hand).

        ``floor``: a bound in hand; the answer is then exact only where it is above
        ``floor`` (the larger of the two is the same: where the blocks are held within a
        cycle of ``floor``, the bisection's bound is below it and is not sought)."""
        slowest = self.slowest
        if not (held > 0 and self.groups):
            return max(m * slowest, self.trip, self.trips[s] if self.trips else 0.0)
        at = next((c for c in HELD_COUNTS if c >= s), s)
        slowest = max(slowest, min(h.slowest(at, held / m, sharp=sharp / m) for h in self.held()))
        found = max(m * slowest, self.trip, self.trips[s] if self.trips else 0.0)
        if found >= held or self.by_nodes is None:
            return found
        # A pipeline on n nodes of cycle C has its slowest stage within C / m on at most
        # n nodes and the time per token of exactly n nodes within C; on n ≥ 2 nodes each
        # of them pays its own hop, so none whose hop would take that time past C serves.
        # Both grow with C and the blocks held grow with n and the nodes allowed, so C is
        # out of reach when, for every n whose time per token is within C, the groups on
        # at most n of the nodes allowed hold too few blocks: the largest such C is
        # sought by bisection (up to ``held``).
        trips = self.by_nodes[s].tolist()
        # The k-th least network latency: what the time per token of k nodes counts for
        # the k-th node's hop (every node of a pipeline on several sends once at least).
        hops = sorted(self.problem.cost_model().latency_s)
        distinct = sorted(set(hops))

        def reached(cycle: float) -> bool:
            """Whether some pipeline on k nodes may have a cycle of ``cycle``: its time per
            token of k nodes within it, and the groups on at most k nodes, of those whose
            hop keeps that time within it, holding every block."""
            checked: list[float] = []
            for k in range(len(trips) - 1, 0, -1):  # the most nodes first
                if trips[k] > cycle:
                    continue
                # A node of a k-node pipeline (k ≥ 2) pays its own hop in place of the
                # k-th least the time per token counts.
                latest = math.inf if k == 1 else cycle - trips[k] + hops[k - 1]
                # The nodes within: those of latency up to the largest present within it.
                limit = max((x for x in distinct if x <= latest), default=-math.inf)
                if limit == -math.inf or any(x >= limit for x in checked):
                    continue  # no node may serve, or no more than a count checked
                checked.append(limit)
                nodes = None if k >= at else k
                if any(h.held(cycle / m, at, nodes, limit) >= h.nb for h in self.held()):
                    return True
            return False

        if floor > found and (floor >= held or reached(floor)):
            return found  # this bound is at most ``floor``, or ``held``
        if not reached(held):
            return held
        lo, hi = found, held
        if math.isinf(hi):  # unbounded: doubled from the bound in hand until reached
            hi = max(found, 1e-12) * 2
            while not reached(hi):
                lo, hi = hi, hi * 2
        least, _ = bisect_bound(reached, lo, hi, COARSE, sharp)
        return max(found, least)


HELD = (
    "the blocks each stage count's GPU groups could hold within its slowest stage, "
    "on nodes whose hops keep the time per token within the cycle"
)
"""How :mod:`~stowplan.planner.tensor.capacity`'s bound is named in a certificate."""

HELD_COUNTS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 16, 20, 24, 32, 48, 64, 96, 128, 192, 256)
"""The stage counts whose slowest stage the groups' capacities bound (a count between
two takes the larger's: at most as many stages can only be slower)."""


def joint_runs(
    problem: Problem, rule: EngineRule, exact_strategy: bool, every_microbatch: bool = False
) -> bool:
    """Whether step 4 solves exactly (small fleet, free stage count, affordable work).
    With ``every_microbatch`` the work counts a solve per microbatch of the stage counts
    (as many as :func:`joint_cycle` may solve), not one."""
    c = problem.constraints
    if len(problem.nodes) > GROUPED_NODE_LIMIT or (c.min_stages or 1) > 1:
        return False
    if c.max_stages is not None:
        return False
    work = sum(grouped_work(problem, a) for a in exact_allowed(rule, problem))
    if every_microbatch and c.batch > 1:
        total = sum(n.num_gpus for n in problem.nodes)
        top = min(total, problem.model.num_blocks)
        work *= len({microbatches(c.batch, s)[1] for s in range(1, top + 1)})
    return exact_strategy or work <= INLINE_GROUPED_WORK


def adjacency_loses_nothing(problem: Problem) -> bool:
    """Whether some optimal pipeline keeps each node's stages together around the cycle.

    With blocks alike a stage's time and memory depend on its block count and role only,
    so the stages between the first and the last can be reordered node by node; each
    node then sends over the network once, which costs no more than before whenever its
    GPU link is no dearer than its network link (transfer and hop).
    """
    cm = problem.cost_model()
    if not cm.uniform:
        return False
    return all(
        ix <= x and il <= lat
        for ix, x, il, lat in zip(
            cm.intra_xfer_s, cm.xfer_s, cm.intra_latency_s, cm.latency_s, strict=True
        )
    )
