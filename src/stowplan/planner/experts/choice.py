"""A MoE model end to end: block-local, the layout engines run, with expert-parallel as the
alternative.

Block-local keeps every expert on the node of its block (a plain pipeline, what vLLM,
SGLang and llama.cpp run); expert-parallel plans the backbone first and spreads the
experts over its nodes (:func:`~stowplan.planner.experts.placement.place_experts`),
which only a custom stage worker runs.  By default (:attr:`ExpertPlacement.AUTO`) the
plan is block-local whenever a block-local plan exists, and its notes give the
expert-parallel alternative's prediction and the gap (latency at batch 1, throughput
above, price for a cost objective); expert-parallel leads only when no block-local plan
fits.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

from stowplan.cost.rates import node_rates
from stowplan.errors import Infeasible, InputError, InsufficientVram, PlanError
from stowplan.model import (
    Constraints,
    ModelLayout,
    NodeDescriptor,
    Objective,
    usable_bytes,
)
from stowplan.moe.routing import backbone_layout
from stowplan.plan import Plan, Topology
from stowplan.planner.certify import backbones, figuring, is_probing, searching_in_full
from stowplan.planner.cheapest import served_rate
from stowplan.planner.experts.inputs import ExpertInputs, ExpertPlacement
from stowplan.planner.experts.placement import expert_ids, place_experts
from stowplan.planner.problem import CostModels

__all__ = ["BlockPlanner", "plan_experts"]


class BlockPlanner(Protocol):
    """The block planner, :func:`stowplan.planner.plan_blocks` (passed in: the planner's
    entry point calls this module, so this module does not import it)."""

    def __call__(
        self,
        model: ModelLayout,
        nodes: Sequence[NodeDescriptor],
        constraints: Constraints | None = None,
        *,
        cost_models: CostModels | None = None,
    ) -> Plan: ...


def plan_experts(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    constraints: Constraints,
    experts: ExpertInputs,
    plan_blocks: BlockPlanner,
) -> Plan:
    """Plan a model end to end: blocks (by ``plan_blocks``), then experts.

    Dense models get exactly ``plan_blocks(model, nodes, constraints)``.  A MoE
    model has two placements; by default (``ExpertPlacement.AUTO``) the plan is the
    block-local one, which engines run, whenever it fits, and its notes compare it
    with the expert-parallel one by the workload's objective (latency at batch 1,
    throughput above; price for a cost objective):

    * block-local: every expert stays on the node of its block (a plain
      pipeline; no expert traffic between nodes; what engines without
      expert parallelism can run);
    * expert-parallel: the backbone (blocks without their routed experts) is
      planned with the fewest stages (at least ``min_stages``) whose nodes
      also hold every expert, then experts are spread over those nodes,
      balanced for load and speed (pays the expert all-to-all per token).

    ``experts.placement`` ``BLOCK_LOCAL`` or ``EXPERT_PARALLEL`` forces one of them.

    Raises:
        InsufficientVram: even the largest ``max_stages`` nodes cannot hold
            backbone plus experts (``needed`` and ``available`` in bytes).
        InputError: load or co-activation statistics for a dense model, or
            statistics that do not match the model.
        Everything ``plan_blocks`` raises.
    """
    load, coactivation = experts.load, experts.coactivation
    ex = model.experts
    if ex is None:
        if load is not None or coactivation is not None:
            option = "--expert-load" if load is not None else "--coactivation"
            raise InputError(option, model.name, "is only for mixture-of-experts models")
        return plan_blocks(model, nodes, constraints)
    nodes = tuple(nodes)
    if experts.placement is ExpertPlacement.BLOCK_LOCAL:
        return _block_local(plan_blocks(model, nodes, constraints), model)

    def expert_parallel() -> Plan:
        spread = _expert_parallel(model, nodes, constraints, experts, plan_blocks)
        if constraints.objective is Objective.COST:
            spread = _meeting_target(
                spread,
                lambda c: _expert_parallel(model, nodes, c, experts, plan_blocks),
                constraints,
                len(nodes),
            )
        return spread

    if experts.placement is ExpertPlacement.EXPERT_PARALLEL:
        return expert_parallel()
    if is_probing():
        # Only whether a plan exists: block-local, else expert-parallel, as below (its
        # backbones searched in full: a backbone whose nodes cannot hold the experts
        # moves it on to more stages, so which backbone is found matters).
        try:
            return _block_local(plan_blocks(model, nodes, constraints), model)
        except PlanError:
            with searching_in_full():
                return expert_parallel()
    # Where the block-local plan fits, the expert-parallel one is only its note's figure
    # (a plan with experts carries no certificate): its backbones are figured (sketched,
    # not certified, the exact joint solve only where affordable at every microbatch),
    # and planned again in full where it becomes the plan.
    spread: Plan | None = None
    with figuring():
        try:
            spread = expert_parallel()
        except PlanError as exc:
            unspread = exc
    try:
        local = _block_local(plan_blocks(model, nodes, constraints), model)
    except PlanError as exc:
        if spread is None:
            raise unspread from None
        spread = expert_parallel()
        note = (
            "experts: expert-parallel, which only a custom stage worker runs: no "
            f"block-local plan (what engines run) fits ({exc})"
        )
        return _noted(spread, note)
    if spread is None:
        note = f"experts: no expert-parallel plan fits ({unspread})"
        return _noted(local, note)
    if constraints.objective is Objective.COST:
        return _cheaper(local, spread)
    return _faster(local, spread, constraints)


def _noted(plan: Plan, note: str) -> Plan:
    """``plan`` with ``note`` after its notes."""
    return replace(plan, rationale=replace(plan.rationale, notes=(*plan.rationale.notes, note)))


def _served(p: Plan) -> float:

    return served_rate(p)


def _meeting_target(
    spread: Plan, spread_with: Callable[[Constraints], Plan], constraints: Constraints, n: int
) -> Plan:
    """The expert-parallel plan of a cost search, when it meets the target.

    Its nodes are the cheapest backbone meeting the target; the experts' traffic may
    then slow it below.  The expert-parallel plan on every node is then taken when it
    meets the target (its price not minimised, as a note says); otherwise Infeasible.
    """
    target = constraints.target_tokens_per_s or 0.0
    rate = _served(spread)
    if rate >= target:
        return spread
    speed = replace(constraints, objective=Objective.SPEED, target_tokens_per_s=None)
    fastest = spread_with(speed)
    if _served(fastest) < target:
        raise Infeasible(
            f"expert-parallel: {_served(fastest):.2f} tokens/s on all {n} nodes, below {target:g}"
        )
    note = (
        f"experts: the cheapest backbone for {target:g} tokens/s gives {rate:.2f} tokens/s "
        "with its experts; this expert-parallel plan on every node meets it (price not "
        "minimised)"
    )
    return _noted(fastest, note)


def _cheaper(local: Plan, spread: Plan) -> Plan:
    """The block-local plan of a cost search, the expert-parallel one's price noted."""
    a, b = local.rationale.prediction, spread.rationale.prediction
    if a is None or b is None or a.cost_per_hour is None or b.cost_per_hour is None:
        return local
    note = (
        f"experts: block-local ${a.cost_per_hour:.2f}/h, the layout engines run; "
        f"expert-parallel (a custom stage worker, --expert-parallel) "
        f"${b.cost_per_hour:.2f}/h"
    )
    return _noted(local, note)


def _block_local(plan: Plan, model: ModelLayout) -> Plan:
    """``plan`` (blocks with their experts) with each stage owning its blocks' experts."""
    ex = model.experts
    assert ex is not None
    moe = set(ex.moe_blocks)
    stages = tuple(
        replace(
            a,
            owned_experts=tuple(
                itertools.chain.from_iterable(
                    expert_ids(b, ex.num_experts) for b in range(*a.block_range) if b in moe
                )
            ),
        )
        for a in plan.assignments
    )
    note = "experts: block-local (every expert on the node of its block; no expert traffic)"
    placed = replace(
        plan,
        topology=Topology.PipelineWithExperts(plan.num_stages, ex.num_experts),
        assignments=stages,
    )
    return _noted(placed, note)


def _faster(local: Plan, spread: Plan, constraints: Constraints) -> Plan:
    """The block-local plan, with the expert-parallel alternative's figure and the gap
    by the workload's objective noted."""
    a, b = local.rationale.prediction, spread.rationale.prediction
    if a is None or b is None:
        return local
    if constraints.batch == 1:
        unit, va, vb = "ms/token", a.time_per_token_s * 1e3, b.time_per_token_s * 1e3
        gain = a.time_per_token_s / b.time_per_token_s - 1 if b.time_per_token_s > 0 else 0.0
    else:
        unit, va, vb = "tokens/s", a.tokens_per_s, b.tokens_per_s
        gain = b.tokens_per_s / a.tokens_per_s - 1 if a.tokens_per_s > 0 else 0.0
    if gain >= _SHOWN_GAIN:
        than = f"{gain:.0%} faster"
    else:
        than = "as fast" if gain > -_SHOWN_GAIN else "no faster"
    note = (
        f"experts: block-local {_figure(va)} {unit}, the layout engines run; expert-parallel "
        f"(a custom stage worker, --expert-parallel) {_figure(vb)} {unit}, {than}"
    )
    return _noted(local, note)


_SHOWN_GAIN = 0.005
"""The least gain the note gives as a percentage (it rounds to 1 %); within it either way
the two placements are as fast."""


def _figure(value: float) -> str:
    """Four significant digits, thousands grouped past 10,000 (no exponent)."""
    return f"{value:,.0f}" if value >= 10_000 else f"{value:.4g}"


def _fewest_holding(rooms: Sequence[int], needed: int, most: int) -> int:
    """The fewest of ``rooms`` (bytes, taken in their order) that reach ``needed``
    (``most`` where none up to that many do)."""
    held = 0
    for k, room in enumerate(rooms[:most], 1):
        held += room
        if held >= needed:
            return k
    return most


def _fastest_first(nodes: Sequence[NodeDescriptor], headroom: float) -> list[int]:
    """The nodes' usable bytes, fastest first (memory bandwidth, then room)."""
    rates = sorted(
        (node_rates(n, headroom)[0] for n in nodes),
        key=lambda r: (-r.bandwidth_bytes_per_s, -r.usable_bytes),
    )
    return [r.usable_bytes for r in rates]


def _expert_parallel(
    model: ModelLayout,
    nodes: tuple[NodeDescriptor, ...],
    constraints: Constraints,
    experts: ExpertInputs,
    plan_blocks: BlockPlanner,
) -> Plan:
    """Backbone first, then every expert packed onto the stage nodes."""
    ex = model.experts
    assert ex is not None
    backbone = backbone_layout(model)
    headroom = constraints.headroom
    routed = len(ex.moe_blocks) * ex.routed_bytes_per_block
    needed = (
        backbone.weight_bytes
        + routed
        + sum(
            model.kv_bytes(b, constraints.context_tokens or 0, constraints.batch)
            for b in range(model.num_blocks)
        )
    )
    # A node of several GPUs holds as many stages as its GPUs split into (its GPU groups
    # are planned with the backbone), each stage on one GPU at least.
    gpus = sum(n.num_gpus for n in nodes)
    max_n = min(constraints.max_stages or gpus, gpus, model.num_blocks)
    ranked = sorted((usable_bytes(n, headroom) for n in nodes), reverse=True)
    available = sum(ranked[:max_n])
    if available < needed:
        raise InsufficientVram(needed, available)
    first = constraints.min_stages or 1
    if first > max_n:
        on_gpus = "" if gpus == len(nodes) else f", {gpus} GPUs"
        raise Infeasible(
            f"min_stages={first} but at most {max_n} stages are possible "
            f"({len(nodes)} nodes{on_gpus}, {model.num_blocks} blocks, "
            f"max_stages={constraints.max_stages})"
        )
    first = max(first, _fewest_holding(ranked, needed, max_n))
    # Where every node is one GPU the counts start from the fewest of the fastest nodes
    # that hold it all: the backbone's search takes fast nodes, and the largest (whose
    # count ``first`` is) are often not among them.  Below that start the counts are tried
    # down to one that falls short, as above: where more stages hold more, the same count.
    start = (
        first
        if gpus != len(nodes)
        else max(first, _fewest_holding(_fastest_first(nodes, headroom), needed, max_n))
    )
    tried: dict[int, Plan | InsufficientVram] = {}
    # The backbone plans differ only in their stage limits: they share one cost model.
    shared = CostModels()

    def attempt(n: int) -> Plan | InsufficientVram:
        """The backbone on at least ``n`` stages with every expert placed, or why not."""
        if n not in tried:
            with backbones():
                base = plan_blocks(
                    backbone, nodes, replace(constraints, min_stages=n), cost_models=shared
                )
            try:
                tried[n] = place_experts(
                    base,
                    model,
                    nodes,
                    constraints,
                    experts.load,
                    experts.coactivation,
                    redundant_per_block=experts.redundant_per_block,
                    locality_tolerance=experts.locality_tolerance,
                )
            except InsufficientVram as exc:
                tried[n] = exc
        return tried[n]

    # The fewest stages whose nodes hold every expert.  A count that falls short jumps
    # by the stages its shortfall takes at the largest node's room; from the first that
    # holds them, the counts below are tried down to one that falls short (more stages
    # hold more: the counts it jumped over fall short as well).
    n, below = start, first - 1
    while True:
        got = attempt(n)
        if isinstance(got, InsufficientVram):
            below = n
            if n >= max_n:
                raise got
            more = math.ceil((got.needed - got.available) / max(1, ranked[0]))
            n = min(max_n, n + max(1, more))
            continue
        while n - 1 > below and not isinstance(attempt(n - 1), InsufficientVram):
            n -= 1
        found = tried[n]
        assert not isinstance(found, InsufficientVram)
        return found
