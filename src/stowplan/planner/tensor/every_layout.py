"""Small fleets of multi-GPU nodes solved over every split of their GPUs.

A node of ``G`` GPUs runs as GPU groups of the degrees the rule allows; a pipeline
skips the groups it does not use, so the splits worth trying are those that leave no
GPU idle that a group of an allowed degree could use (8 GPUs of degrees 1, 2, 4, 8:
ten splits, from one group of 8 to eight of 1).  A layout is one split per node; its
groups are the planning nodes of a problem whose least cycle of each stage count
:func:`~stowplan.planner.exact.pipelines.least_cycle` finds exactly on up to
:data:`~stowplan.planner.exact.pipelines.CYCLE_EXACT_LIMIT` groups (every order of
them, stages of one node apart or together).  The least over every layout and count
is the optimum.

A layout whose least cycle bound (:func:`least_cycle_bound`)
is no less than the cycle to beat is not solved, nor a count whose quick bound is; a
layout of more groups than the exact solve takes counts by that bound alone: where
such a bound lies below the least cycle found, the answer is a bound, not the optimum.

Pure: numbers in, numbers out (numpy through the exact solve).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product

from stowplan.cost import microbatches
from stowplan.errors import DependencyError, PlanError
from stowplan.model import NodeDescriptor
from stowplan.planner.exact.pipelines import CYCLE_EXACT_LIMIT, least_cycle
from stowplan.planner.problem import Problem
from stowplan.planner.strategies import cycle
from stowplan.planner.strategies.throughput import Pipeline
from stowplan.planner.tensor.layouts import EngineRule, Layout, expand
from stowplan.planner.tensor.nodes import degrees

__all__ = [
    "EVERY_LAYOUT",
    "EVERY_LAYOUT_LIMIT",
    "EveryLayout",
    "every_layout",
    "full_splits",
    "least_cycle_bound",
]

EVERY_LAYOUT_LIMIT = 100
"""Most layouts (one split per multi-GPU node, all together) solved one by one: two
nodes of 8 GPUs, or three of 8, 4 and 2."""

EVERY_LAYOUT = (
    "every split of the nodes' GPUs, the least cycle of each stage count "
    "(subset dynamic programme over the groups)"
)
"""How the bound :func:`every_layout` gives is named in a certificate's method."""


@dataclass(frozen=True, slots=True)
class EveryLayout:
    """What :func:`every_layout` found."""

    value: float
    """Seconds: a lower bound on the cycle of every pipeline over every layout (the
    optimum where ``exact``)."""
    exact: bool
    problem: Problem | None
    """The problem of the groups of the least cycle's layout (None: none found below
    the cycle to beat)."""
    pipeline: Pipeline | None
    """That pipeline, on ``problem``'s planning nodes."""


def least_cycle_bound(problem: Problem) -> float:
    """A lower bound on the cycle (seconds; the time per token at one sequence) of every
    pipeline of ``problem``'s planning nodes: the least of
    :func:`~stowplan.planner.strategies.cycle.quick_bound` over ranges of stage counts
    that cover every count the problem allows."""
    cm = problem.cost_model()
    lo, hi = problem.min_stages, problem.max_stages
    if cm.batch == 1:
        return cycle.quick_bound(problem, cm, lo, hi)
    ranges = cycle.count_ranges(cycle.ladder(problem, cm.batch, fine=False))
    return min((cycle.quick_bound(problem, cm, a, b) for a, b in ranges), default=math.inf)


def full_splits(
    problem: Problem, rule: EngineRule, node: NodeDescriptor, most: int = EVERY_LAYOUT_LIMIT
) -> list[tuple[int, ...]] | None:
    """The splits of ``node``'s GPUs into groups of the degrees ``rule`` and the model
    allow (largest first) that leave fewer GPUs idle than the least degree; None where
    there are more than ``most`` (or a split has more groups than that)."""
    legal = sorted(degrees(problem, node, rule.degrees), reverse=True)
    if not legal or node.num_gpus // legal[-1] > most:
        return None
    out: list[tuple[int, ...]] = []
    # Depth first, the larger degrees first: (split so far, GPUs left, least index of a
    # degree it may still take).
    stack: list[tuple[tuple[int, ...], int, int]] = [((), node.num_gpus, 0)]
    while stack:
        prefix, left, start = stack.pop()
        grown = [j for j in range(start, len(legal)) if legal[j] <= left]
        if not grown:
            if prefix:
                out.append(prefix)
                if len(out) > most:
                    return None
            continue
        stack += [((*prefix, legal[j]), left - legal[j], j) for j in reversed(grown)]
    return out


def every_layout(problem: Problem, rule: EngineRule, beat: float) -> EveryLayout | None:
    """The least cycle over every layout of ``problem``'s nodes (:func:`full_splits`)
    and every pipeline of its groups, sought below ``beat`` (seconds: the cycle in hand);
    None where the rule fixes one degree for every stage, a node has no split, or the
    layouts number more than :data:`EVERY_LAYOUT_LIMIT`."""
    if rule.uniform:
        return None
    multi = [n for n in problem.nodes if n.num_gpus > 1]
    found_splits = [full_splits(problem, rule, n) for n in multi]
    splits = [s for s in found_splits if s]
    if not multi or len(splits) < len(multi) or math.prod(map(len, splits)) > EVERY_LAYOUT_LIMIT:
        return None
    found = beat
    """The least cycle so far (a count bounded no lower is not solved)."""
    unsolved = math.inf
    """The least bound of the layouts too large to solve."""
    best: tuple[Problem, Pipeline] | None = None
    batch = problem.constraints.batch
    for combo in product(*splits):
        layout: Layout = {n.id: split for n, split in zip(multi, combo, strict=True)}
        try:
            groups = expand(problem, layout)
        except PlanError:
            continue
        bound = least_cycle_bound(groups)
        if bound >= found * (1 - 1e-12):
            continue
        if len(groups.nodes) > CYCLE_EXACT_LIMIT:
            unsolved = min(unsolved, bound)
            continue
        top = min(len(groups.nodes), groups.max_stages)
        for stages in range(max(groups.min_stages, 1), top + 1):
            at = groups.at_microbatch(microbatches(batch, stages)[1])
            cm = at.cost_model()
            if cycle.quick_bound(at, cm, stages) >= found * (1 - 1e-12):
                continue
            try:
                solved = least_cycle(at, cm, stages)
            except DependencyError:
                return None
            if solved.pipeline is not None and solved.value < found * (1 - 1e-12):
                found, best = solved.value, (groups, solved.pipeline)
    least = min(found, unsolved)
    return EveryLayout(
        value=least,
        exact=unsolved >= found * (1 - 1e-12),
        problem=None if best is None else best[0],
        pipeline=None if best is None else best[1],
    )
