"""Experts onto a backbone plan: :func:`place_experts` and the notes of the expert plan."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache

from stowplan.cost.experts import expert_prediction
from stowplan.errors import InputError, InsufficientVram
from stowplan.model import Constraints, ExpertId, ModelLayout, NodeDescriptor
from stowplan.moe.routing import (
    Holders,
    block_reaches,
    experts_per_node,
    nodes_in_order,
    remote_transfers,
    stage_of_block,
    token_routing,
)
from stowplan.moe.stats import CoActivation, ExpertLoad
from stowplan.plan import Plan, Prediction, Topology
from stowplan.planner.certify import kv_capacity_note, prediction_note
from stowplan.planner.experts.inputs import LOCALITY_TOLERANCE, expert_speeds, free_slots
from stowplan.planner.experts.packing import pack_shared
from stowplan.planner.experts.summary import ExpertSummary, expert_summary

__all__ = ["expert_ids", "place_experts"]


@lru_cache(maxsize=4096)
def expert_ids(block: int, count: int) -> tuple[ExpertId, ...]:
    """Every routed expert of ``block``, built once (frozen: plans share them)."""
    return tuple(ExpertId(block=block, expert=e) for e in range(count))


def place_experts(
    plan: Plan,
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    constraints: Constraints | None = None,
    load: ExpertLoad | None = None,
    coactivation: CoActivation | None = None,
    *,
    redundant_per_block: int | None = None,
    locality_tolerance: float = LOCALITY_TOLERANCE,
) -> Plan:
    """Place every routed expert of ``model`` on the stage nodes of ``plan``.

    ``plan`` is a block plan of :func:`backbone_layout` (``model`` without its
    routed experts) on ``nodes``; ``constraints`` must be those it was made
    with (headroom).  Returns the plan with ``Topology.PipelineWithExperts``,
    every stage's ``owned_experts`` and ``estimated_vram_bytes`` including
    them, and notes on balance and traffic.  ``redundant_per_block`` caps the
    replicas added per MoE block (default ``num_experts // 8``; 0: none);
    ``locality_tolerance`` is how much slower (fraction) a block's slowest node
    may get to keep co-activated experts together (default 0.05).
    Deterministic.  A dense ``model`` returns ``plan`` unchanged.

    Raises:
        InsufficientVram: the stage nodes' free VRAM cannot hold every expert.
        InputError: the statistics do not match the model, or ``plan`` names
            nodes not in ``nodes``.
    """
    ex = model.experts
    if ex is None:
        return plan
    constraints = Constraints() if constraints is None else constraints
    if redundant_per_block is None:
        redundant_per_block = ex.num_experts // 8
    if redundant_per_block < 0:
        raise InputError("redundant_per_block", redundant_per_block, "must be an integer >= 0")
    ordered = nodes_in_order(plan, nodes)
    slots = free_slots(plan, model, ordered, constraints.headroom)
    needed = len(ex.moe_blocks) * ex.num_experts
    if sum(slots) < needed:
        backbone = sum(a.estimated_vram_bytes for a in plan.assignments)
        room = backbone + sum(slots) * ex.expert_params_bytes  # whole experts only
        raise InsufficientVram(backbone + needed * ex.expert_params_bytes, room)
    speeds, source = expert_speeds(ordered)
    routing = token_routing(model, load, coactivation)
    if not 0 <= locality_tolerance < math.inf:
        raise InputError("locality_tolerance", locality_tolerance, "must be a number >= 0")
    # The layers' lists of holders are shared (blocks packed alike) and only read here.
    packing = pack_shared(
        routing.p,
        speeds,
        slots,
        redundant_per_layer=redundant_per_block,
        experts_per_token=routing.k,
        pairs=routing.pairs,
        locality_tolerance=locality_tolerance,
    )
    transfers_before = None
    if packing.load_only is not None and routing.pairs is not None:
        # The load-only layout's traffic, for the note on what co-activation saved.
        home_stage = stage_of_block(plan)
        transfers_before = 0.0
        for li, holders in enumerate(packing.load_only):
            home = home_stage[ex.moe_blocks[li]]
            w, pairs = routing.p[li], routing.pairs[li]
            transfers_before += remote_transfers(holders, w, pairs, routing.k, len(speeds), home)
    # The stages holding each expert, as holders_of reads them off the plan (ascending);
    # blocks packed alike share one list, which the figures below work out once.
    stage_holders = _sorted_holders(packing.holders)
    # Every stage's experts, block by block, each block's ascending (blocks sharing a
    # list of holders share their experts per node).
    owned: list[list[ExpertId]] = []
    for per in experts_per_node(ex.moe_blocks, stage_holders, len(ordered)):
        mine: list[ExpertId] = []
        for block, es in per:
            mine.extend(map(expert_ids(block, ex.num_experts).__getitem__, es))
        owned.append(mine)
    assignments = tuple(
        replace(
            a,
            owned_experts=tuple(mine),
            estimated_vram_bytes=a.estimated_vram_bytes + len(mine) * ex.expert_params_bytes,
        )
        for a, mine in zip(plan.assignments, owned, strict=True)
    )
    result = replace(
        plan,
        topology=Topology.PipelineWithExperts(plan.num_stages, ex.num_experts),
        assignments=assignments,
        model_name=model.name,
    )
    # Both read each block's node reach: computed once.
    reaches = block_reaches(stage_holders, routing, len(ordered))
    summary = expert_summary(
        result,
        model,
        nodes,
        load,
        coactivation,
        holders_by_block=stage_holders,
        reach_by_block=reaches,
    )
    prediction = expert_prediction(
        model,
        nodes,
        constraints,
        result,
        load,
        coactivation,
        holders_by_block=stage_holders,
        reach_by_block=reaches,
    )
    # One source of truth: every figure below comes from the final plan and its prediction;
    # the backbone's own notes (stage VRAM, KV capacity, certificate) described the blocks
    # without their experts and are not carried over.
    notes = [
        *_stage_notes(result, prediction, constraints),
        *_notes(summary, transfers_before, source, load, coactivation),
        f"predicted with experts: {prediction.time_per_token_s * 1e3:.1f} ms per token "
        f"for each of {prediction.batch} sequence(s), {prediction.tokens_per_s:.2f} tokens/s "
        "in all; no certificate: the planner's bound covers the blocks' "
        f"placement ({plan.rationale.strategy}) without the experts",
    ]
    return replace(
        result,
        rationale=replace(
            plan.rationale,
            strategy=f"{plan.rationale.strategy}+experts",
            notes=tuple(notes),
            prediction=prediction,
            certificate=None,
        ),
    )


def _sorted_holders(blocks: Sequence[Holders]) -> tuple[Holders, ...]:
    """Every block's copies with each expert's holders ascending; equal blocks share the
    list of the first (the recent distinct blocks are compared, most recent first)."""
    distinct: list[tuple[Holders, Holders]] = []
    out = []
    for block in blocks:
        for raw, done in reversed(distinct[-_RECENT:]):
            if raw is block or raw == block:
                out.append(done)
                break
        else:
            done = list(map(sorted, block))
            distinct.append((block, done))
            out.append(done)
    return tuple(out)


_RECENT = 8
"""Distinct blocks :func:`_sorted_holders` compares a block with."""


def _stage_notes(plan: Plan, prediction: Prediction, constraints: Constraints) -> list[str]:
    """Per stage time and VRAM, and the KV capacity, all of the final expert plan."""
    out = []
    for a in plan.assignments:
        t = prediction.stage_time_s[a.stage] * 1e3
        usable = a.usable_vram_bytes
        vram = (
            f"VRAM {a.estimated_vram_bytes / usable:.1%} of usable"
            if usable
            else "no usable VRAM figure"
        )
        out.append(
            f"stage {a.stage} on {a.node_id}: {t:.2f} ms/step, {vram} "
            f"({a.num_blocks} blocks, {len(a.owned_experts)} experts)"
        )
    out.append(prediction_note(prediction, plan.num_stages))
    out.append(kv_capacity_note(prediction, constraints.context_tokens, ", experts included"))
    if prediction.assumed:
        out.append(
            f"{len(prediction.assumed)} input(s) assumed from the spec table (see prediction)"
        )
    return out


def _notes(
    summary: ExpertSummary,
    transfers_before: float | None,
    source: str,
    load: ExpertLoad | None,
    coactivation: CoActivation | None,
) -> list[str]:
    out = [
        f"experts: {summary.num_placed} placed ({summary.num_replicas} redundant replicas) "
        f"after the blocks, balanced by {source}; "
        f"load {'from statistics' if load is not None else 'assumed uniform'}",
        f"expert load imbalance (max/mean relative to speed): mean {summary.imbalance_mean:.3f}, "
        f"worst block {summary.imbalance_max:.3f}",
    ]
    if transfers_before is not None and coactivation is not None:
        out.append(
            f"cross-node expert transfers per token: {summary.transfers_per_token:.2f} "
            f"(load-only placement: {transfers_before:.2f}; co-activation kept together)"
        )
    else:
        out.append(f"cross-node expert transfers per token: {summary.transfers_per_token:.2f}")
    return out
