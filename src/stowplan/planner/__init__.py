"""The pure planning core: ``plan(model, nodes, constraints, *, experts=None) -> Plan``.

:func:`plan` is the one verb, for dense and MoE models alike; :func:`plan_blocks`
is the block planner it (and the expert planner) runs.  Imports no Ray, NVML,
torch or network module.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from stowplan.cost import CostModel
from stowplan.errors import DependencyError, Infeasible, InputError, StowplanError
from stowplan.model import (
    Constraints,
    Metric,
    ModelLayout,
    NodeDescriptor,
    Objective,
    Strategy,
    check_unique_ids,
)
from stowplan.plan import Plan
from stowplan.planner.certify import (
    finish,
    is_backbone,
    is_pricing,
    is_probing,
    is_sketching,
    key_of,
    objective_of,
    pick_best,
    pricing,
)
from stowplan.planner.cheapest import plan_cheapest
from stowplan.planner.exact.pipelines import ENUMERATION_LIMIT, EXACT_NODE_LIMIT, solve_exact
from stowplan.planner.exact.trip import coupled_cycle_bound
from stowplan.planner.problem import CostModels, Problem, prepare
from stowplan.planner.strategies import cycle
from stowplan.planner.strategies.dominance import undominated
from stowplan.planner.strategies.latency import latency_pipeline
from stowplan.planner.strategies.throughput import Pipeline, throughput_search
from stowplan.planner.strategies.upgrade import upgraded
from stowplan.planner.strategies.vram import plan_balance_by_vram
from stowplan.planner.tensor.groups import plan_with_groups, with_fixed_degree

if TYPE_CHECKING:
    from stowplan.planner.experts.inputs import ExpertInputs

__all__ = ["plan", "plan_blocks"]


def _balance_by_vram(problem: Problem) -> Plan:
    problem = with_fixed_degree(problem)
    base = plan_balance_by_vram(problem)
    cm = problem.cost_model()
    order, bounds = cm.plan_order_bounds(base)
    return finish(problem, cm, Strategy.BALANCE_BY_VRAM, (order, bounds), base.rationale.notes)


def _heuristic(problem: Problem, cm: CostModel, objective: Metric) -> Pipeline | None:
    """The search of ``objective`` (``latency``: time per token; ``throughput``: the slowest
    stage) at ``cm``'s microbatch, then the best of it and the peer rules by the cycle
    (a probe's first pipeline as found: :func:`~stowplan.planner.certify.probing`)."""
    if objective == Metric.LATENCY:
        found, proven = latency_pipeline(problem, cm), False
    else:
        found, proven = throughput_search(problem, cm)
    if proven:
        # No pipeline has a faster slowest stage, so no peer rule can: they need not be run.
        return found
    if found is not None and is_probing():
        return found  # a plan exists: nothing to rank it against
    if found is None:
        found = _fallback(problem, cm, objective)
    if not cm.uniform and len(cm.nodes) <= _SMALL_NONUNIFORM:
        # Unlike blocks make the node order matter: small clusters are solved exactly.

        try:
            exact = solve_exact(problem, cm, objective).pipeline
        except DependencyError:
            exact = None
        found = pick_best(problem, cm, objective, exact) if exact is not None else found
    return pick_best(problem, cm, objective, found)


def _fallback(problem: Problem, cm: CostModel, objective: Metric) -> Pipeline | None:
    """A pipeline when the strategy's own search found none: a heuristic must not report
    Infeasible while a pipeline exists.  The other strategy's search, and on small
    clusters the exact subset DP (which finds a pipeline whenever one exists) at one
    stream, or where that search found none either: at several sequences the DP's least
    time per token is no candidate for the cycle beside a search's pipeline (deepseek-v3
    at 64 sequences on 8 × H100 groups, held to 8 stages: four times its cycle, and
    15-50 ms a count)."""

    if objective == Metric.LATENCY:
        candidates = [throughput_search(problem, cm)[0]]
    else:
        candidates = [latency_pipeline(problem, cm)]
    if len(cm.nodes) <= ENUMERATION_LIMIT and (cm.batch == 1 or candidates[0] is None):
        with contextlib.suppress(DependencyError):
            candidates.append(solve_exact(problem, cm, objective).pipeline)
    found = [p for p in candidates if p is not None]
    return min(found, key=lambda p: key_of(cm, objective, p)) if found else None


_SMALL_NONUNIFORM = 6
"""Clusters of blocks that differ are solved by the exact DP up to this many nodes."""


def _solve(objective: Metric) -> Callable[[Problem, CostModel], Pipeline | None]:
    """The strategy search for one stage count (``max_stages``) at its microbatch."""

    def run(problem: Problem, cm: CostModel) -> Pipeline | None:
        return _heuristic(problem, cm, objective)

    return run


def _cycle_search(problem: Problem, cm: CostModel, first: Metric) -> Pipeline | None:
    """The least-cycle pipeline of the ``first`` search and the other (the time per token
    or the slowest stage may decide the cycle), over the stage counts."""
    if cm.batch == 1:
        return cycle.search(problem, cm, (_solve(Metric.LATENCY),), first=is_probing())
    other = Metric.THROUGHPUT if first == Metric.LATENCY else Metric.LATENCY
    # A plan's candidates (sketched) keep to the ladder; a plan of its own also searches
    # the counts between the best and the ladder's next.
    solvers = (_solve(first), _solve(other))
    return cycle.search(problem, cm, solvers, between=not is_sketching(), first=is_probing())


def _one_count(first: Metric) -> cycle.Searched:
    """:func:`_cycle_search` of a problem held to one stage count (``first`` first)."""

    def run(problem: Problem, cm: CostModel) -> Pipeline | None:
        return _cycle_search(problem, cm, first)

    return run


def _searched(problem: Problem, cm: CostModel, first: Metric) -> Pipeline:
    """The plan's pipeline: :func:`_cycle_search`'s, its nodes reordered where that lowers
    the cycle (:func:`~stowplan.planner.strategies.cycle.relocated`), then moved to idle
    nodes of better network (:func:`~stowplan.planner.strategies.upgrade.upgraded`).
    Not for a sketch or a probe, whose pipeline a wider search compares or only needs to
    exist, nor for a MoE backbone: its experts are placed after, on its nodes, and a
    faster backbone is not always the faster plan with them; and no move to better
    networks for a set of the cheapest-set search (:func:`~.certify.pricing`)."""
    found = _need(_cycle_search(problem, cm, first))
    if is_sketching() or is_backbone():
        return found
    found = cycle.relocated(cm, found)
    return found if is_pricing() else upgraded(cm, found)


def _latency(problem: Problem) -> Plan:
    cm = problem.cost_model()
    found = _searched(problem, cm, Metric.LATENCY)
    searched = _one_count(Metric.LATENCY)
    return finish(problem, cm, Strategy.LATENCY, found, adopt_optimum=True, searched=searched)


def _throughput(problem: Problem) -> Plan:
    cm = problem.cost_model()
    found = _searched(problem, cm, Metric.THROUGHPUT)
    searched = _one_count(Metric.THROUGHPUT)
    return finish(problem, cm, Strategy.THROUGHPUT, found, adopt_optimum=True, searched=searched)


def _exact(problem: Problem) -> Plan:

    cm = problem.cost_model()
    objective = objective_of(problem.constraints)
    if cm.batch == 1:
        optimum = replace(solve_exact(problem, cm, Metric.LATENCY), objective=objective)
        found = optimum.pipeline or _cycle_search(problem, cm, objective)
    else:
        found = _cycle_search(problem, cm, objective)
        value = cm.evaluate(*found).cycle_s if found is not None else math.inf
        optimum = cycle.optimum(
            problem, cm, objective, solve_exact, value, exact=True, coupled=coupled_cycle_bound
        )
        if optimum.pipeline is not None and (
            found is None or key_of(cm, objective, optimum.pipeline) < key_of(cm, objective, found)
        ):
            found = optimum.pipeline
    return finish(problem, cm, Strategy.EXACT, _need(found), optimum=optimum)


def _need(p: Pipeline | None) -> Pipeline:
    if p is None:
        raise Infeasible("no pipeline of the given nodes fits the model within the stage limits")
    return p


def _grouped(
    runner: Callable[[Problem], Plan], objective: Metric, strategy: Strategy
) -> Callable[[Problem], Plan]:
    """``runner`` over the best GPU groups of the problem's multi-GPU nodes."""

    def run(problem: Problem) -> Plan:
        return plan_with_groups(problem, runner, objective, strategy)

    return run


_STRATEGIES: dict[Strategy, Callable[[Problem], Plan]] = {
    Strategy.BALANCE_BY_VRAM: _balance_by_vram,
    Strategy.LATENCY: _latency,
    Strategy.THROUGHPUT: _throughput,
    Strategy.EXACT: _exact,
}


def plan(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    constraints: Constraints | None = None,
    *,
    experts: ExpertInputs | None = None,
) -> Plan:
    """Place ``model`` on a pipeline of ``nodes``: its blocks, and a MoE model's experts.

    A dense model gets :func:`plan_blocks`' plan.  A MoE model (or any call
    with ``experts``) is planned as ``stowplan plan`` plans it: every routed
    expert placed block-local or expert-parallel, by ``experts.placement``
    (default: whichever the cost model predicts better), with the load and
    co-activation statistics ``experts`` carries (default: uniform routing);
    see :mod:`stowplan.planner.experts`.  The same input always gives the same
    plan.

    Raises:
        InsufficientVram: the nodes cannot hold the model (with its experts).
        NoNodeFitsHead: no node can hold the embed or the head.
        Infeasible: the constraints cannot be met (the reason says why).
        InputError: malformed arguments, or expert statistics for a dense model
            or of the wrong shape.
    """
    if model.experts is None and experts is None:
        return plan_blocks(model, nodes, constraints)
    # The expert planner is loaded on a MoE model's first plan: ``import stowplan`` stays light.
    from stowplan.planner.experts.choice import plan_experts
    from stowplan.planner.experts.inputs import ExpertInputs

    if experts is None:
        experts = ExpertInputs()
    elif not isinstance(experts, ExpertInputs):
        raise InputError("experts", type(experts).__name__, "must be an ExpertInputs or None")
    constraints = Constraints() if constraints is None else constraints
    return plan_experts(model, nodes, constraints, experts, plan_blocks)


def _needed(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    constraints: Constraints,
    strategy: Strategy,
) -> Sequence[NodeDescriptor]:
    """``nodes`` less those no best plan needs (:func:`~.strategies.dominance.undominated`):
    at least as many others as a pipeline may have stages are alike but for a network no
    slower.  The VRAM balance keeps every node (it spreads the blocks by memory, not by
    time), and so does the cheapest set (a node of better network may cost more; its
    search weighs every offer, and its refusals count them)."""
    if (
        strategy is Strategy.BALANCE_BY_VRAM
        or constraints.objective is Objective.COST
        or not isinstance(model, ModelLayout)
    ):
        return nodes
    nodes = tuple(nodes)
    if not all(isinstance(n, NodeDescriptor) for n in nodes):
        return nodes  # prepare names what is wrong
    check_unique_ids(nodes)  # before a node alike to another is left out
    # In the order of their ids, as prepare puts them: of nodes alike, the same are kept
    # whatever order they come in.
    nodes = tuple(sorted(nodes, key=lambda n: n.id))
    most = min(
        constraints.max_stages or math.inf,
        model.num_blocks,
        sum(n.num_gpus for n in nodes),
    )
    if (constraints.min_stages or 1) > most:
        return nodes  # no plan: prepare's refusal names every node given
    return undominated(nodes, int(most))


def plan_blocks(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    constraints: Constraints | None = None,
    *,
    cost_models: CostModels | None = None,
) -> Plan:
    """Place ``model``'s blocks on a pipeline of ``nodes`` (a MoE block with its experts).

    Chooses the number of stages N, which nodes and their order, and the
    contiguous half-open block range of every stage; stage 0 owns the embed,
    stage N-1 owns the head.  Every stage's ``estimated_vram_bytes`` (weights +
    KV reserve) is at most its node's ``vram_bytes * (1 - headroom)``.  The
    same input always gives the same plan.  The strategy is
    ``constraints.resolved_strategy()``: ``latency`` (least time per token) at
    batch 1, ``throughput`` (most tokens/s for ``batch`` concurrent sequences) above;
    both rank pipelines by the cycle (:func:`stowplan.cost.cycle_seconds`).  With
    ``objective="cost"`` the cheapest node set meeting ``target_tokens_per_s``
    is planned.  Every plan carries a :class:`~stowplan.plan.Prediction` and a
    :class:`~stowplan.plan.Certificate` in its rationale.  ``cost_models`` shares the
    cost model (and what the searches keep per cost model) with other plans of the same
    model, nodes and constraints but for the stage limits; the plan is the same.

    Raises:
        InsufficientVram: the usable VRAM of the largest ``max_stages`` nodes
            is below the model's bytes.
        NoNodeFitsHead: no node can hold the embed or the head.
        Infeasible: the constraints cannot be met (the reason says why).
        InputError: malformed arguments.
    """
    constraints = Constraints() if constraints is None else constraints
    strategy = constraints.resolved_strategy()
    problem = prepare(
        model, _needed(model, nodes, constraints, strategy), constraints, shared=cost_models
    )
    runner = _STRATEGIES[strategy]
    if strategy is Strategy.EXACT and len(nodes) > EXACT_NODE_LIMIT:
        raise InputError(
            "strategy",
            strategy.value,
            f"takes at most {EXACT_NODE_LIMIT} nodes ({len(nodes)} given): its search "
            "grows exponentially with them; use latency or throughput, whose certificate "
            "bounds the gap to the optimum",
        )
    if strategy is not Strategy.BALANCE_BY_VRAM:
        runner = _grouped(runner, objective_of(constraints, strategy), strategy)
    try:
        if constraints.objective is Objective.COST:
            with pricing():
                return plan_cheapest(problem, runner)
        return runner(problem)
    except StowplanError:
        raise
    except (ArithmeticError, ValueError) as exc:  # numbers beyond what a plan can express
        raise InputError("nodes", "<extreme values>", f"cannot be planned ({exc})") from exc
