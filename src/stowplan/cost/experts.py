"""The cost model's expert term: per-token time of the experts a stage's MoE blocks use.

An expert-parallel plan's stage time is the cost model's time for its backbone
blocks (:func:`~stowplan.moe.routing.backbone_layout`) plus
:func:`expert_stage_times` (the slowest holder's expert reads and the
all-to-all); :func:`expert_prediction` is the whole prediction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from stowplan.cost.cycle import cycle_seconds, microbatches, usd_per_million_tokens
from stowplan.cost.rates import node_rates
from stowplan.errors import InputError
from stowplan.model import Constraints, ModelLayout, NodeDescriptor
from stowplan.moe.numbering import ValueNumbers
from stowplan.moe.routing import (
    Holders,
    backbone_layout,
    holders_of,
    node_reach,
    nodes_in_order,
    stage_of_block,
    token_routing,
)
from stowplan.moe.stats import CoActivation, ExpertLoad
from stowplan.plan import Plan, Prediction

if TYPE_CHECKING:
    from stowplan.calibration.profile import Calibration

__all__ = ["ExpertTime", "expert_prediction", "expert_stage_times"]


def _bandwidths_gbps(nodes: Sequence[NodeDescriptor]) -> list[float]:
    return [node_rates(n, 0.0)[0].bandwidth_bytes_per_s / 1e9 for n in nodes]


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertTime:
    """Per-token expert time of one stage (its MoE blocks), in seconds."""

    stage: int
    compute_s: float
    """Sum over the stage's MoE blocks of the slowest holder's routed-expert reads."""
    transfer_s: float
    """Sum over the stage's MoE blocks of the all-to-all: latency, send and return."""

    @property
    def total_s(self) -> float:
        return self.compute_s + self.transfer_s


def expert_stage_times(
    plan: Plan,
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    *,
    batch: int = 1,
    load: ExpertLoad | None = None,
    coactivation: CoActivation | None = None,
    bandwidth_gbps: Mapping[str, float] | None = None,
    holders_by_block: Sequence[Holders] | None = None,
    reach_by_block: Sequence[Sequence[float]] | None = None,
) -> tuple[ExpertTime, ...]:
    """The expert term of every stage's time per decode step (first-order, like ``cost``).

    For a MoE block run by the stage on node ``h`` with ``batch`` tokens:

    * compute: every node ``j`` reads each of its experts hit by at least one
      token, ``expert_params_bytes * sum_e (1 - (1 - q_je) ** batch)`` bytes at
      its bandwidth; the block waits for the slowest node (``q_je``: the
      token's probability of using ``e``'s copy on ``j``).
    * transfer: ``h`` sends ``batch * reach_j * hidden_dim *
      bytes_per_activation_elem`` to every other node ``j`` over its own link,
      each ``j`` returns as much over its link (the slowest return counts),
      plus, when some token leaves ``h``, the round-trip latency
      ``latency(h) + max latency(j)`` of the nodes reached.

    A stage on a GPU group of a node is a node of its own here (its share of the node's
    bandwidth, :func:`~stowplan.moe.routing.nodes_in_order`); between two groups of one
    node the bits go over the GPUs' own link each way (its rate and latency,
    ``intra_link_gbps`` and ``intra_link_latency_us`` or the interconnect table) and the
    round trip's latency is the largest over the nodes reached of the two legs'.

    These seconds replace the routed-expert reads the block would cost on
    ``h``: add them to the stage time of the backbone (:func:`backbone_layout`).
    ``bandwidth_gbps`` overrides per planning node id (a GPU group's ``node/gpuA-B``);
    otherwise the cost model's bandwidth is used.  An unknown link (``link_mbps`` 0) costs
    no transfer time, as in :mod:`stowplan.cost`.  ``holders_by_block`` is
    :func:`holders_of` of ``plan`` when the caller has it (the planner, from its packing),
    so it is not rebuilt from the plan's expert lists; ``reach_by_block`` is
    :func:`block_reaches` of those holders when the caller has it (the planner shares it
    with the expert summary).
    """
    ex = model.experts
    if ex is None:
        return tuple(
            ExpertTime(stage=a.stage, compute_s=0.0, transfer_s=0.0) for a in plan.assignments
        )
    ordered = nodes_in_order(plan, nodes)
    bws = [
        (bandwidth_gbps or {}).get(x.id, bw)
        for x, bw in zip(ordered, _bandwidths_gbps(ordered), strict=True)
    ]
    for x, bw in zip(ordered, bws, strict=True):
        if not bw > 0:
            raise InputError(f"{x.id}.mem_bandwidth_gbps", bw, "must be > 0 to time its experts")
    routing = token_routing(model, load, coactivation)
    all_holders = holders_of(plan, model) if holders_by_block is None else holders_by_block
    home_stage = stage_of_block(plan)
    parents = [a.node_id for a in plan.assignments]
    n = len(ordered)
    act = model.hidden_dim * model.bytes_per_activation_elem
    compute = [0.0] * plan.num_stages
    transfer = [0.0] * plan.num_stages
    # Blocks alike (same copies and load; same pairs and home stage for the transfer)
    # cost the same.
    number = ValueNumbers()
    read_s: dict[tuple[int, int], float] = {}
    sent_s: dict[tuple[int, int, int, int], float | None] = {}
    for li, holders in enumerate(all_holders):
        w = routing.p[li]
        h = home_stage[ex.moe_blocks[li]]
        pairs = routing.pairs[li] if routing.pairs is not None else None
        alike = (number.holders(holders), number(w))
        reads = read_s.get(alike)
        if reads is None:
            reads = read_s[alike] = _block_reads(holders, w, batch, ex.expert_params_bytes, bws)
        key = (*alike, -1 if pairs is None else number(pairs), h)
        if key not in sent_s:
            reach = (
                node_reach(holders, w, pairs, routing.k, n)
                if reach_by_block is None
                else reach_by_block[li]
            )
            sent_s[key] = _block_transfer(ordered, parents, h, reach, batch, act)
        block_transfer = sent_s[key]
        compute[h] += reads
        if block_transfer is not None:
            transfer[h] += block_transfer
    return tuple(
        ExpertTime(stage=a.stage, compute_s=compute[a.stage], transfer_s=transfer[a.stage])
        for a in plan.assignments
    )


def _block_reads(
    holders: Holders, w: Sequence[float], batch: int, expert_bytes: int, bws: Sequence[float]
) -> float:
    """Seconds the slowest node of one MoE block reads the experts ``batch`` tokens hit."""
    n = len(bws)
    hit = [0.0] * n
    for e, hs in enumerate(holders):
        if hs:
            # every copy's share of the tokens (copy_shares), and its chance to be read
            x = 1.0 - (1.0 - w[e] * (1.0 / len(hs))) ** batch
            for j in hs:
                hit[j] += x
    return max(hit[j] * expert_bytes / (bws[j] * 1e9) for j in range(n))


def _block_transfer(
    ordered: Sequence[NodeDescriptor],
    parents: Sequence[str],
    h: int,
    reach: Sequence[float],
    batch: int,
    act: int,
) -> float | None:
    """Seconds of one MoE block's all-to-all from the stage ``h`` (None: no token leaves
    it); ``act`` bytes per token and stage reached; ``parents`` the physical node of each
    stage (``ordered``: its planning node).  Between GPU groups of one node the bits go
    over the GPUs' own link, else over the sender's network link."""
    remote = [j for j in range(len(ordered)) if j != h and reach[j] > 0]
    if not remote:
        return None
    inside = {j for j in remote if parents[j] == parents[h]}
    rates = {j: node_rates(ordered[j], 0.0)[0] for j in (h, *inside)} if inside else {}

    def bits(j: int) -> float:
        return batch * reach[j] * act * 8

    def link_s(j: int, sent: float) -> float:
        """Seconds of ``sent`` bits over node ``j``'s network link (none where unknown)."""
        return sent / (ordered[j].link_mbps * 1e6) if ordered[j].link_mbps else 0.0

    def intra_s(j: int, sent: float) -> float:
        return sent / (rates[j].intra_bytes_per_s * 8)

    # Out of h: the network's bits together, each group's of its own node apart; back: the
    # slowest leg; the round trip: the largest over the stages reached (ms).
    send = link_s(h, sum(bits(j) for j in remote if j not in inside))
    send += sum(intra_s(h, bits(j)) for j in remote if j in inside)
    back = max(intra_s(j, bits(j)) if j in inside else link_s(j, bits(j)) for j in remote)
    trip_ms = max(
        (rates[h].intra_latency_s + rates[j].intra_latency_s) * 1e3
        if j in inside
        else ordered[h].link_latency_ms + ordered[j].link_latency_ms
        for j in remote
    )
    p_any = 1.0 - math.prod((1.0 - reach[j]) ** batch for j in remote)
    return send + back + p_any * trip_ms / 1e3


def _stage_nodes(plan: Plan, nodes: Sequence[NodeDescriptor]) -> Sequence[NodeDescriptor]:
    """The nodes ``plan``'s stages run on, each once in stage order: every figure of a
    prediction is a figure of these nodes (a cost model's figures of a node are its own).
    ``nodes`` itself when ids repeat or a stage's node is not among them by its id."""
    by_id = {x.id: x for x in nodes}
    if len(by_id) != len(nodes):
        return nodes
    out: dict[str, NodeDescriptor] = {}
    for a in plan.assignments:
        x = by_id.get(a.node_id)
        if x is None:
            return nodes
        out.setdefault(a.node_id, x)
    return list(out.values())


def expert_prediction(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    constraints: Constraints,
    plan: Plan,
    load: ExpertLoad | None = None,
    coactivation: CoActivation | None = None,
    calibration: Calibration | None = None,
    *,
    holders_by_block: Sequence[Holders] | None = None,
    reach_by_block: Sequence[Sequence[float]] | None = None,
) -> Prediction:
    """The cost model's prediction for an expert-parallel ``plan``.

    Every stage's time is the cost model's time for its backbone blocks
    (:func:`backbone_layout`) plus its :func:`expert_stage_times`; the KV
    capacity counts the experts each stage holds.  ``calibration`` applies to
    the backbone's stage times (as in :func:`stowplan.cost.predict`) and its
    bandwidth fraction to the experts' reads.  ``holders_by_block``, ``reach_by_block``:
    as in :func:`expert_stage_times`.
    """
    from stowplan.cost.model import plan_cost_model

    whole = _stage_nodes(plan, nodes)
    cm = plan_cost_model(backbone_layout(model), plan, nodes, constraints, calibration, whole=whole)
    order, bounds = cm.plan_order_bounds(plan)
    base = cm.prediction(order, bounds)
    m, b = microbatches(constraints.batch, len(order))
    # The rate the backbone streams at: the datasheet's, or the calibrated one (bandwidth
    # fraction, a layer-split host's single GPU) when a profile applies.
    bw = {
        x.id: (
            cm.rates[cm.index[x.id]].bandwidth_bytes_per_s
            if cm.calibration is None
            else 1.0 / cm.inv_bw[cm.index[x.id]]
        )
        / 1e9
        for x in cm.nodes
    }
    extra = expert_stage_times(
        plan,
        model,
        nodes,
        batch=b,
        load=load,
        coactivation=coactivation,
        bandwidth_gbps=bw,
        holders_by_block=holders_by_block,
        reach_by_block=reach_by_block,
    )
    stage = tuple(t + e.total_s for t, e in zip(base.stage_time_s, extra, strict=True))
    hops = cm.evaluate(order, bounds).hops_s
    per_token = cycle_seconds(stage, hops, m)
    tokens_per_s = constraints.batch / per_token if per_token > 0 else math.inf
    served = tokens_per_s
    kv = None
    if model.kv_bytes_per_token is not None:
        for a, d in zip(plan.assignments, order, strict=True):
            per = sum(model.kv_bytes_per_token[a.block_range[0] : a.block_range[1]])
            if per:
                weights = a.estimated_vram_bytes - a.kv_reserve_bytes
                cap = max(cm.usable[d] - weights, 0) // per
                kv = cap if kv is None else min(kv, cap)
    return replace(
        base,
        tokens_per_s=tokens_per_s,
        time_per_token_s=per_token,
        stage_time_s=stage,
        bottleneck_stage=max(range(len(stage)), key=lambda i: stage[i]),
        kv_capacity_tokens=kv,
        usd_per_million_tokens=usd_per_million_tokens(base.cost_per_hour, served),
    )
