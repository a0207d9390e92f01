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
   at the S fastest rates, the hops of the S cheapest links, the S largest memories).
2. :func:`search` plans each S whose quick bound is below the best cycle found so
   far (most promising first), with the bottleneck solver (and the time-per-token
   one) at that S's microbatch; every pipeline is scored by its true cycle.
3. :func:`optimum` bounds the cycle by the least over S of ``max(m · B_S, L_S)``,
   ``B_S`` and ``L_S`` exact (subset DP / MILP) or relaxed bounds, computing them only
   for the S whose quick bound is below the plan's cycle; the bound is the optimum
   (``exact``) when a pipeline in hand reaches it.

At U = 1 every S has m = 1 and the cycle is the time per token: the time-per-token
solvers are the exact ones and none of this is needed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from stowplan.cost import CostModel, microbatches
from stowplan.planner.common import Problem
from stowplan.planner.throughput import Pipeline

if TYPE_CHECKING:
    from stowplan.planner.exact import Optimum

__all__ = ["SEARCHED_STAGE_COUNTS", "optimum", "quick_bound", "search", "stage_counts"]

SEARCHED_STAGE_COUNTS = 12
"""Most stage counts :func:`search` plans (those with the lowest quick bounds)."""

Solve = Callable[[Problem, CostModel], "Pipeline | None"]
"""A search over ``problem`` (its ``max_stages`` the stage count) on a cost model at that
count's microbatch."""


def stage_counts(problem: Problem) -> range:
    """Every stage count the problem allows."""
    return range(problem.min_stages, problem.max_stages + 1)


def _rates(inverse: tuple[float, ...]) -> list[float]:
    return sorted((math.inf if x == 0 else 1.0 / x for x in inverse), reverse=True)


def quick_bound(problem: Problem, cm: CostModel, stages: int) -> float:
    """A lower bound on the cycle of every pipeline of exactly ``stages`` stages.

    Its stages are ``stages`` distinct nodes: together they hold every byte (else
    ``inf``), read at most at the sum of the ``stages`` fastest rates (so the slowest
    stage takes at least the bytes over that sum) and one at a time no faster than the
    fastest node; a multi-stage pipeline pays at least the ``stages`` cheapest hops.
    """
    if stages < 1:
        return math.inf
    # Stages on GPU groups of one node share its bytes/s, FLOPs and memory: any S stages
    # have at most those of the min(S, n) best whole nodes.
    k = min(stages, len(cm.nodes))
    view = cm.for_stages(stages)
    m, _ = microbatches(cm.batch, stages)
    nb = cm.num_blocks
    held = cm.mem_prefix[nb] + cm.embed + cm.head
    if sum(sorted(cm.usable, reverse=True)[:k]) < held:
        return math.inf
    weights = view.read_prefix[nb] + view.head
    read = weights + view.kv_prefix[nb]
    bw, fl = _rates(view.inv_bw), _rates(view.flop_s_per_byte)
    slowest = max(read / sum(bw[:k]), weights / sum(fl[:k]))
    one_at_a_time = max(read / bw[0], weights / fl[0])
    if stages > 1:
        hops = sorted(min(a, b) for a, b in zip(view.latency_s, view.intra_latency_s, strict=True))
        one_at_a_time += sum(hops[:k]) + (stages - k) * hops[0]
    return max(m * slowest, one_at_a_time)


def _at(problem: Problem, stages: int) -> Problem:
    return replace(problem, max_stages=stages, min_stages=min(problem.min_stages, stages))


def search(problem: Problem, cm: CostModel, solvers: tuple[Solve, ...]) -> Pipeline | None:
    """The pipeline of least cycle any of ``solvers`` finds over the stage counts."""
    if cm.batch == 1:
        found = [p for solve in solvers if (p := solve(problem, cm)) is not None]
        return min(found, key=lambda p: _key(cm, p)) if found else None
    bounds = {s: quick_bound(problem, cm, s) for s in stage_counts(problem)}
    best: Pipeline | None = None
    best_key: tuple[float, float, int, tuple[int, ...]] = (math.inf, math.inf, 0, ())
    tried = 0
    for s in sorted(bounds, key=lambda s: (bounds[s], s)):
        if bounds[s] >= best_key[0] or tried >= SEARCHED_STAGE_COUNTS:
            break
        tried += 1
        sub, view = _at(problem, s), cm.for_stages(s)
        for solve in solvers:
            p = solve(sub, view)
            if p is None:
                continue
            k = _key(cm, p)
            if k < best_key:
                best, best_key = p, k
    if best is None and tried >= SEARCHED_STAGE_COUNTS:
        # Every promising count failed: the rest may still hold a pipeline.
        for s in sorted(bounds, key=lambda s: (bounds[s], s))[tried:]:
            if math.isfinite(bounds[s]):
                got = [p for solve in solvers if (p := solve(_at(problem, s), cm.for_stages(s)))]
                if got:
                    return min(got, key=lambda p: _key(cm, p))
    return best


def _key(cm: CostModel, p: Pipeline) -> tuple[float, float, int, tuple[int, ...]]:
    """Least cycle first, then the slowest stage, fewer stages, node order (as
    :func:`stowplan.planner.certify.key_of`)."""
    ev = cm.evaluate(*p)
    return (ev.cycle_s, ev.bottleneck_s, len(p[0]), tuple(p[0]))


Bound = Callable[[Problem, CostModel, str], "Optimum"]
"""The optimum (or a bound) of a solver objective (``latency`` or ``throughput``:
bottleneck seconds) of ``problem`` on a cost model."""


def optimum(
    problem: Problem,
    cm: CostModel,
    objective: str,
    bound: Bound,
    value: float = math.inf,
    *,
    exact: bool = False,
) -> Optimum:
    """A lower bound on the cycle of every pipeline (the optimum when one in hand meets it).

    ``bound`` gives per stage count the least bottleneck and least time per token
    (exact solvers or relaxations); ``value`` is the cycle of the plan being certified:
    a stage count whose quick bound is already at or above it needs no solve.  With
    ``exact``, each stage count's least cycle is solved outright where the cluster is
    small enough (:func:`~stowplan.planner.exact.least_cycle`).
    """
    from stowplan.errors import DependencyError
    from stowplan.planner.exact import Optimum, least_cycle

    counts = list(stage_counts(problem))
    per_count: list[float] = []
    pipelines: list[Pipeline] = []
    exact_parts = True
    split = False
    """Whether some stage count was bounded by its two parts rather than solved whole."""
    methods: set[str] = set()
    for s in counts:
        quick = quick_bound(problem, cm, s)
        if quick >= value or not math.isfinite(quick):
            per_count.append(quick)
            continue
        m, _ = microbatches(cm.batch, s)
        sub, view = _at(problem, s), cm.for_stages(s)
        if exact:
            try:
                solved = least_cycle(problem, view, s)
            except DependencyError:
                pass
            else:
                methods.add(solved.method)
                if solved.pipeline is not None:
                    pipelines.append(solved.pipeline)
                per_count.append(solved.value)
                continue
        split = True
        slowest = bound(sub, view, "throughput")
        methods.add(slowest.method)
        exact_parts &= slowest.exact
        if slowest.pipeline is not None:
            pipelines.append(slowest.pipeline)
        lb = max(quick, m * slowest.value)
        if lb < value:
            trip = bound(sub, view, "latency")
            methods.add(trip.method)
            exact_parts &= trip.exact
            if trip.pipeline is not None:
                pipelines.append(trip.pipeline)
            lb = max(lb, trip.value)
        per_count.append(lb)
    lower = min(per_count, default=math.inf)
    best = min(pipelines, key=lambda p: cm.evaluate(*p).cycle_s, default=None)
    best_cycle = cm.evaluate(*best).cycle_s if best is not None else math.inf
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
    )
