"""The EPLB rule, re-implemented from its documentation, as a baseline for expert placement.

DeepSeek's expert-parallel load balancer (EPLB) takes a load ``weight[layers,
experts]`` and, per MoE layer, when the expert groups divide evenly over the
hosts (hierarchical policy):

1. packs expert groups onto hosts, heaviest group first, each to the least
   loaded host that still takes groups (equal group count per host);
2. within each host, replicates experts: every spare physical slot gets a copy
   of the expert with the heaviest load per copy;
3. packs the physical copies onto the host's GPUs, heaviest first, each to
   the least loaded GPU that still has a slot (equal slot count per GPU).

Otherwise (global policy) it replicates over all slots and packs onto all GPUs;
the global policy is also used for a layer whose hosts cannot take their
share of groups whole.

Here a GPU is a stage node of the plan and GPUs are grouped into hosts of
``gpus_per_host`` consecutive stages.  EPLB assumes identical GPUs; this
*capacity-weighted* version gives each node (host) a slot count proportional to
its free VRAM, a host a group count proportional to its slots, and "least
loaded" means least ``load / speed``.  Copies of one expert go to distinct
nodes when the slots allow.  Memory use matches :func:`place_experts`: the same
free slots and the same ``redundant_per_block`` cap on replicas.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from stowplan.errors import InputError, InsufficientVram
from stowplan.model import Constraints, ExpertId, ModelLayout, NodeDescriptor, usable_bytes
from stowplan.moe.routing import nodes_in_order, token_routing
from stowplan.moe.stats import ExpertLoad
from stowplan.plan import Plan, Topology
from stowplan.planner.experts.inputs import expert_speeds, free_slots

__all__ = ["eplb_place"]


def _apportion(total: int, weights: Sequence[float], caps: Sequence[int]) -> list[int]:
    """Integers summing to ``min(total, sum(caps))``, proportional to ``weights``, each <= cap."""
    total = min(total, sum(caps))
    out = [0] * len(weights)
    while sum(out) < total:
        room = [j for j in range(len(weights)) if out[j] < caps[j]]
        wsum = sum(weights[j] for j in room) or float(len(room))
        need = total - sum(out)
        raw = {j: need * (weights[j] or 1.0) / wsum for j in room}
        for j in room:
            out[j] = min(caps[j], out[j] + math.floor(raw[j]))
        rest = total - sum(out)
        for j in sorted(room, key=lambda x: (-(raw[x] - math.floor(raw[x])), x)):
            if rest <= 0:
                break
            if out[j] < caps[j]:
                out[j] += 1
                rest -= 1
    return out


def _pack(
    items: Sequence[tuple[int, float]],
    counts: Sequence[int],
    speeds: Sequence[float],
    distinct: bool,
) -> list[list[int]]:
    """Heaviest item first to the pack with the least load/speed that has a slot left."""
    packs: list[list[int]] = [[] for _ in counts]
    loads = [0.0] * len(counts)
    for item, weight in sorted(items, key=lambda x: (-x[1], x[0])):
        open_ = [j for j in range(len(counts)) if len(packs[j]) < counts[j]]
        fresh = [j for j in open_ if not distinct or item not in packs[j]]
        if not fresh:
            continue  # no distinct pack left for this copy
        j = min(fresh, key=lambda x: (loads[x] / speeds[x], x))
        packs[j].append(item)
        loads[j] += weight
    return packs


def eplb_place(
    plan: Plan,
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    constraints: Constraints | None = None,
    load: ExpertLoad | None = None,
    *,
    redundant_per_block: int | None = None,
    num_groups: int = 1,
    gpus_per_host: int | None = None,
) -> Plan:
    """Place the routed experts of ``model`` on ``plan``'s stage nodes by the EPLB rule.

    ``plan`` is a backbone plan as for :func:`~stowplan.planner.experts.place_experts`.
    ``num_groups`` expert groups per layer (DeepSeek-V3: 8), hosts of
    ``gpus_per_host`` stage nodes (default: one host).
    """
    ex = model.experts
    if ex is None:
        return plan
    constraints = Constraints() if constraints is None else constraints
    redundant = ex.num_experts // 8 if redundant_per_block is None else redundant_per_block
    if ex.num_experts % num_groups:
        raise InputError("num_groups", num_groups, f"must divide num_experts={ex.num_experts}")
    ordered = nodes_in_order(plan, nodes)
    n = len(ordered)
    per_host = gpus_per_host or n
    hosts = [list(range(h, min(n, h + per_host))) for h in range(0, n, per_host)]
    slots = free_slots(plan, model, ordered, constraints.headroom)
    num_l = len(ex.moe_blocks)
    if sum(slots) < num_l * ex.num_experts:
        raise InsufficientVram(
            sum(a.estimated_vram_bytes for a in plan.assignments)
            + num_l * ex.routed_bytes_per_block,
            sum(usable_bytes(x, constraints.headroom) for x in ordered),
        )
    speeds, _ = expert_speeds(ordered)
    routing = token_routing(model, load, None)
    owned: list[list[ExpertId]] = [[] for _ in ordered]
    size = ex.num_experts // num_groups
    hierarchical = len(hosts) > 1 and num_groups % len(hosts) == 0
    for li, block in enumerate(ex.moe_blocks):
        w = routing.p[li]
        # Static per-layer quotas: node j gets its proportional part of its free slots.
        quota = [math.floor((li + 1) * s / num_l) - math.floor(li * s / num_l) for s in slots]
        physical = min(ex.num_experts + redundant, sum(quota))
        counts = _apportion(physical, [float(q) for q in quota], quota)
        if sum(counts) < ex.num_experts:  # rounding left the layer short: borrow later slots
            counts = _apportion(ex.num_experts, [float(q) for q in quota], slots)
        if hierarchical:
            # Step 1: pack groups to hosts (group counts proportional to host slots).
            host_slots = [sum(counts[j] for j in h) for h in hosts]
            host_groups = _apportion(
                num_groups, [float(x) for x in host_slots], [x // size for x in host_slots]
            )
            groups = [(g, sum(w[g * size : (g + 1) * size])) for g in range(num_groups)]
            host_speeds = [sum(speeds[j] for j in h) for h in hosts]
            by_host = _pack(groups, host_groups, host_speeds, distinct=False)
            hosts_now = hosts
        if not hierarchical or sum(len(g) for g in by_host) < num_groups:
            # Global policy (also when some host's slots cannot take its groups whole).
            by_host = [list(range(num_groups))]
            hosts_now = [list(range(n))]
        for host, host_group_ids in zip(hosts_now, by_host, strict=True):
            experts = [e for g in host_group_ids for e in range(g * size, (g + 1) * size)]
            # Step 2: replicate within the host.
            room = sum(counts[j] for j in host)
            copies = dict.fromkeys(experts, 1)
            for _ in range(max(0, room - len(experts))):
                e = max(experts, key=lambda x: (w[x] / copies[x], -x))
                copies[e] += 1
            # Step 3: pack the copies onto the host's GPUs.
            items = [(e, w[e] / copies[e]) for e in experts for _ in range(copies[e])]
            packs = _pack(items, [counts[j] for j in host], [speeds[j] for j in host], True)
            for j, pack in zip(host, packs, strict=True):
                owned[j].extend(ExpertId(block=block, expert=e) for e in sorted(pack))
    assignments = tuple(
        replace(
            a,
            owned_experts=tuple(mine),
            estimated_vram_bytes=a.estimated_vram_bytes + len(mine) * ex.expert_params_bytes,
        )
        for a, mine in zip(plan.assignments, owned, strict=True)
    )
    return replace(
        plan,
        topology=Topology.PipelineWithExperts(plan.num_stages, ex.num_experts),
        assignments=assignments,
        rationale=replace(plan.rationale, strategy=f"{plan.rationale.strategy}+eplb"),
    )
