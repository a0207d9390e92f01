"""Expert parallelism (seed 000 §11): where every routed expert of a MoE model lives.

How blocks and experts share memory
-----------------------------------
A MoE :class:`~stowplan.model.ModelLayout` counts a block's routed experts in
its ``block_bytes``.  In an expert-parallel plan those experts need not live
on the node of the stage that runs the block:

1. **Blocks first, without their routed experts.**  The block planner places
   the *backbone* (:func:`backbone_layout`): every block counted with only its
   non-expert bytes (attention, norms, router, shared experts), plus embed,
   head and KV reserve, exactly as for a dense model.
2. **Experts fill what is left, anywhere.**  A stage node's expert capacity is
   ``usable_vram - backbone blocks - embed/head - KV reserve`` divided by
   ``expert_params_bytes``.  Every routed expert of every MoE block is placed
   on at least one stage node; spare slots may hold redundant replicas of hot
   experts.
3. Every stage's ``estimated_vram_bytes`` is its backbone bytes plus the bytes
   of the experts it owns (``owned_experts``), and never exceeds its usable
   VRAM.  When the stage nodes cannot hold every expert even with all offered
   nodes as stages, :class:`~stowplan.errors.InsufficientVram` gives the bytes.

Dense models (``experts is None``) get exactly the block planner's plan.

Load and locality
-----------------
Decode is memory-bound, so a node's expert *speed* is its memory bandwidth
(the cost model's figure: given, else the GPU spec table).  Per MoE block, spare slots first
get replicas by EPLB's rule (each extra copy goes to the expert with the
heaviest load per copy, at most ``redundant_per_block``, and only while that
copy carries more than half a node's mean load; a replicated
expert's tokens are split evenly over its copies).  All copies are then
packed heaviest first onto the node whose finish time ``load / speed`` after
the addition is least (capacity-weighted LPT; copies of one expert on
distinct nodes), and single-copy experts are moved or swapped off the slowest
node while that lowers it.  The **imbalance** of a block is
``max_j(load_j / speed_j) / (sum(load) / sum(speed))`` (1.0 is perfect).

With co-activation counts, experts selected together at least twice as often
as chance are grouped (up to ``experts_per_token`` per group) and a group is
placed (and moved) as one item; the grouped layout is kept for a block when
its slowest node is within ``locality_tolerance`` (default 5 %) of the
load-only layout's.

**Cross-node transfers per token** of a block: the expected number of distinct
nodes other than the stage's node that hold the experts a token selects (each
costs one send of the hidden state and one return), estimated per node as
``sum(p_e) - sum(p_ef)`` clipped to ``[max(p_e), 1]`` (second-order
inclusion-exclusion; exact when no more than two selected experts share a
node), with ``p_ef`` from the co-activation counts (pairs a file does not
list are taken at chance level) or, without them, independent routing
(``p_ef = p_e * p_f * (k - 1) / k``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from stowplan.errors import Infeasible, InputError, InsufficientVram, PlanError
from stowplan.expert_stats import CoActivation, ExpertLoad
from stowplan.model import (
    Constraints,
    ExpertId,
    ModelLayout,
    NodeDescriptor,
    Objective,
    usable_bytes,
)
from stowplan.plan import Plan, Prediction, Topology

if TYPE_CHECKING:
    from stowplan.calibration.profile import Calibration

__all__ = [
    "ExpertSummary",
    "ExpertTime",
    "NodeExperts",
    "backbone_layout",
    "expert_prediction",
    "expert_speeds",
    "expert_stage_times",
    "expert_summary",
    "place_experts",
    "plan_with_experts",
]

LOCALITY_TOLERANCE = 0.05
"""A co-activation-grouped block layout may be this much slower than the load-only one."""
_REFINE_STEPS = 32
_REFINE_TARGETS = 4
_EPS = 1e-12

Holders = list[list[int]]
"""Per expert of one MoE block, the indices (stage order) of the nodes holding a copy."""


# -- layouts and inputs -------------------------------------------------------------------


def backbone_layout(model: ModelLayout) -> ModelLayout:
    """``model`` with every MoE block's routed experts removed from its bytes and reads.

    The result is a dense layout (``experts=None``) the block planner places;
    a dense ``model`` is returned unchanged.
    """
    ex = model.experts
    if ex is None:
        return model
    sizes = list(model.block_sizes())
    reads = list(model.block_read_sizes())
    for b in ex.moe_blocks:
        sizes[b] -= ex.routed_bytes_per_block
        reads[b] -= ex.experts_per_token * ex.expert_params_bytes
        if sizes[b] < 0:
            raise InputError(
                f"block_bytes[{b}]",
                sizes[b] + ex.routed_bytes_per_block,
                f"must include the block's routed experts ({ex.routed_bytes_per_block} bytes)",
            )
        reads[b] = max(reads[b], 0)
    return replace(
        model,
        block_bytes=tuple(sizes),
        block_read_bytes=tuple(reads),
        block_params_bytes=round(sum(sizes) / model.num_blocks),
        experts=None,
    )


def expert_speeds(nodes: Sequence[NodeDescriptor]) -> tuple[tuple[float, ...], str]:
    """Relative expert speed of every node (memory bandwidth / the fastest's) and its source.

    The cost model's bandwidth: the descriptor's, else the GPU spec table, else
    its default (see :func:`stowplan.cost.node_rates`).
    """
    from stowplan.cost import node_rates

    speeds = []
    assumed = 0
    for n in nodes:
        rates, notes = node_rates(n, 0.0)
        speeds.append(rates.bandwidth_bytes_per_s)
        assumed += any("mem_bandwidth_gbps" in x for x in notes)
    source = "memory bandwidth"
    if assumed:
        source += f" ({assumed} of {len(speeds)} nodes from the spec table or default)"
    top = max(speeds)
    return tuple(x / top for x in speeds), source


def _bandwidths_gbps(nodes: Sequence[NodeDescriptor]) -> list[float]:
    from stowplan.cost import node_rates

    return [node_rates(n, 0.0)[0].bandwidth_bytes_per_s / 1e9 for n in nodes]


@dataclass(frozen=True, slots=True)
class _Routing:
    """Per MoE block: selection probability per token of every expert (sums to k), pairs."""

    p: tuple[tuple[float, ...], ...]
    pairs: tuple[tuple[tuple[int, int, float], ...], ...] | None
    k: int


def _routing(model: ModelLayout, load: ExpertLoad | None, co: CoActivation | None) -> _Routing:
    ex = model.experts
    assert ex is not None
    k, n = ex.experts_per_token, ex.num_experts
    rows = load.per_block(ex) if load is not None else ((1.0,) * n,) * len(ex.moe_blocks)
    p = tuple(tuple(min(1.0, k * w / sum(r)) for w in r) for r in rows)
    pairs = None
    if co is not None:
        co_rows = co.per_block(ex)
        norm = []
        for r, prow in zip(co_rows, rows, strict=True):
            total_pairs = sum(c for _, _, c in r)
            if load is not None:
                tokens = sum(prow) / k
            else:
                tokens = total_pairs / (k * (k - 1) / 2) if k > 1 else 0.0
            scale = 1.0 / tokens if tokens > 0 else 0.0
            norm.append(tuple((e, f, min(1.0, c * scale)) for e, f, c in r))
        pairs = tuple(norm)
    return _Routing(p=p, pairs=pairs, k=k)


# -- one MoE block ------------------------------------------------------------------------


def _shares(holders: list[int]) -> list[float]:
    """A replicated expert's tokens are split evenly over its copies (EPLB's convention)."""
    return [1.0 / len(holders)] * len(holders)


def _loads(holders: Holders, w: Sequence[float], n: int) -> list[float]:
    loads = [0.0] * n
    for e, hs in enumerate(holders):
        for j, share in zip(hs, _shares(hs), strict=True):
            loads[j] += w[e] * share
    return loads


def _worst(loads: Sequence[float], speeds: Sequence[float]) -> float:
    return max(load / s for load, s in zip(loads, speeds, strict=True))


def _groups(
    w: Sequence[float], pairs: Sequence[tuple[int, int, float]] | None, k: int
) -> list[list[int]]:
    """Experts grouped by strong co-activation (union of pairs >= twice chance, size <= k)."""
    n = len(w)
    parent = list(range(n))
    size = [1] * n

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    if pairs:
        total = sum(w)
        p = [k * x / total for x in w]
        chance = (k - 1) / k
        for e, f, c in sorted(pairs, key=lambda t: (-t[2], t[0], t[1])):
            if c < 2.0 * p[e] * p[f] * chance:
                break
            a, b = root(e), root(f)
            if a != b and size[a] + size[b] <= k:
                a, b = min(a, b), max(a, b)
                parent[b] = a
                size[a] += size[b]
    out: dict[int, list[int]] = {}
    for e in range(n):
        out.setdefault(root(e), []).append(e)
    return list(out.values())


def _replica_counts(w: Sequence[float], redundant: int, num_nodes: int) -> list[int]:
    """EPLB's rule: give each extra copy to the expert with the heaviest load per copy.

    Stops early once no copy carries more than half of a node's mean load.
    """
    counts = [1] * len(w)
    heap = [(-x, e) for e, x in enumerate(w) if x > 0]
    heapq.heapify(heap)
    light = sum(w) / num_nodes / 2
    for _ in range(redundant):
        if not heap or -heap[0][0] <= light:
            break
        _, e = heapq.heappop(heap)
        counts[e] += 1
        heapq.heappush(heap, (-w[e] / counts[e], e))
    return counts


class _Bins:
    """Nodes grouped by speed, each group a heap of ``(load, node)``: the least loaded first."""

    def __init__(self, speeds: Sequence[float], limits: Sequence[int]) -> None:
        self.speeds = speeds
        self.limits = limits
        self.used = [0] * len(speeds)
        self.loads = [0.0] * len(speeds)
        self.heaps: dict[float, list[tuple[float, int]]] = {}
        for j, s in enumerate(speeds):
            if limits[j] > 0:
                self.heaps.setdefault(s, []).append((0.0, j))

    def best(self, size: int, weight: float, exclude: Sequence[int]) -> int:
        """The node with room for ``size`` and least finish time after ``weight`` (-1: none)."""
        best, best_t = -1, math.inf
        for heap in self.heaps.values():
            skipped = []
            while heap:
                load, j = heap[0]
                if load != self.loads[j] or self.used[j] >= self.limits[j]:
                    heapq.heappop(heap)  # a stale entry or a full node
                    continue
                if self.limits[j] - self.used[j] < size or j in exclude:
                    skipped.append(heapq.heappop(heap))
                    continue
                t = (load + weight) / self.speeds[j]
                if t < best_t - _EPS or (abs(t - best_t) <= _EPS and j < best):
                    best, best_t = j, t
                break
            for item in skipped:
                heapq.heappush(heap, item)
        return best

    def add(self, j: int, size: int, weight: float) -> None:
        self.used[j] += size
        self.loads[j] += weight
        if self.used[j] < self.limits[j]:
            heapq.heappush(self.heaps[self.speeds[j]], (self.loads[j], j))


def _place_block(
    w: Sequence[float],
    speeds: Sequence[float],
    limits: Sequence[int],
    groups: list[list[int]],
    redundant: int,
) -> Holders:
    """Pack one MoE block: every expert once within ``limits``, plus ``redundant`` copies."""
    holders: Holders = [[] for _ in w]
    counts = _replica_counts(w, min(redundant, max(0, sum(limits) - len(w))), len(speeds))
    queue: list[tuple[list[int], float]] = []
    for g in groups:
        if len(g) > 1 and all(counts[e] == 1 for e in g):
            queue.append((g, sum(w[e] for e in g)))
        else:
            queue.extend(([e], w[e] / counts[e]) for e in g for _ in range(counts[e]))
    queue.sort(key=lambda item: (-item[1], item[0][0]))
    bins = _Bins(speeds, limits)
    i = 0
    while i < len(queue):
        group, weight = queue[i]
        i += 1
        exclude = holders[group[0]] if len(group) == 1 else []
        best = bins.best(len(group), weight, exclude)
        if best < 0:
            if len(group) == 1:
                continue  # a copy with no distinct node left: the expert keeps fewer copies
            queue[i:] = sorted(
                queue[i:] + [([e], w[e]) for e in group], key=lambda item: (-item[1], item[0][0])
            )
            continue
        for e in group:
            holders[e].append(best)
        bins.add(best, len(group), weight)
    used, loads = bins.used, bins.loads
    _refine(holders, w, speeds, limits, used, loads, groups)
    return holders


def _refine(
    holders: Holders,
    w: Sequence[float],
    speeds: Sequence[float],
    limits: Sequence[int],
    used: list[int],
    loads: list[float],
    groups: list[list[int]],
) -> None:
    """Move or swap single-copy items (groups or experts) off the slowest node while it gains."""
    n = len(speeds)
    items: list[list[int]] = []
    for g in groups:
        single = [e for e in g if len(holders[e]) == 1]
        if len(single) == len(g) and len({holders[e][0] for e in g}) == 1:
            items.append(g)
        else:  # replicated members, or a group split for lack of room: its singles move alone
            items.extend([e] for e in single)
    item_w = [sum(w[e] for e in g) for g in items]
    where = [holders[g[0]][0] for g in items]
    for _ in range(_REFINE_STEPS):
        b = max(range(n), key=lambda j: (loads[j] / speeds[j], -j))
        cur = loads[b] / speeds[b]
        targets = sorted((j for j in range(n) if j != b), key=lambda j: (loads[j] / speeds[j], j))
        targets = targets[:_REFINE_TARGETS]
        on: dict[int, list[int]] = {j: [] for j in (b, *targets)}
        for i, j in enumerate(where):
            if j in on:
                on[j].append(i)
        best: tuple[float, int, int, int] | None = None  # (new max, item, node, other item or -1)
        for a in on[b]:
            size_a = len(items[a])
            for j in targets:
                if limits[j] - used[j] >= size_a:
                    t = max((loads[b] - item_w[a]) / speeds[b], (loads[j] + item_w[a]) / speeds[j])
                    if t < cur - _EPS and (best is None or t < best[0] - _EPS):
                        best = (t, a, j, -1)
                for c in on[j]:
                    d = item_w[a] - item_w[c]
                    grow = len(items[c]) - size_a
                    if d <= 0 or limits[b] - used[b] < grow or limits[j] - used[j] < -grow:
                        continue
                    t = max((loads[b] - d) / speeds[b], (loads[j] + d) / speeds[j])
                    if t < cur - _EPS and (best is None or t < best[0] - _EPS):
                        best = (t, a, j, c)
        if best is None:
            return
        _, a, j, c = best
        moves = [(a, b, j)] + ([(c, j, b)] if c >= 0 else [])
        for item, src, dst in moves:
            for e in items[item]:
                holders[e] = [dst]
            where[item] = dst
            loads[src] -= item_w[item]
            loads[dst] += item_w[item]
            used[src] -= len(items[item])
            used[dst] += len(items[item])


# -- metrics ------------------------------------------------------------------------------


def _imbalance(holders: Holders, w: Sequence[float], speeds: Sequence[float]) -> float:
    loads = _loads(holders, w, len(speeds))
    mean = sum(loads) / sum(speeds)
    return _worst(loads, speeds) / mean if mean > 0 else 1.0


def _node_reach(
    holders: Holders,
    p: Sequence[float],
    pairs: Sequence[tuple[int, int, float]] | None,
    k: int,
    n: int,
) -> list[float]:
    """Per node: the estimated probability that a token selects at least one expert there."""
    q_sum = [0.0] * n
    q_sq = [0.0] * n
    q_max = [0.0] * n
    share: dict[tuple[int, int], float] = {}
    for e, hs in enumerate(holders):
        for j, s in zip(hs, _shares(hs), strict=True):
            q = p[e] * s
            q_sum[j] += q
            q_sq[j] += q * q
            q_max[j] = max(q_max[j], q)
            share[(e, j)] = s
    chance = (k - 1) / k
    pair_sum = [(q_sum[j] ** 2 - q_sq[j]) / 2 * chance for j in range(n)]
    for e, f, c in pairs or ():
        excess = c - p[e] * p[f] * chance  # a listed pair's departure from chance
        for j in holders[e]:
            s_f = share.get((f, j))
            if s_f is not None:
                pair_sum[j] += excess * share[(e, j)] * s_f
    return [min(1.0, max(q_max[j], q_sum[j] - pair_sum[j])) for j in range(n)]


def _transfers(
    holders: Holders,
    p: Sequence[float],
    pairs: Sequence[tuple[int, int, float]] | None,
    k: int,
    n: int,
    home: int,
) -> float:
    reach = _node_reach(holders, p, pairs, k, n)
    return sum(r for j, r in enumerate(reach) if j != home)


# -- the placement ------------------------------------------------------------------------


def _stage_of_block(plan: Plan) -> dict[int, int]:
    out = {}
    for a in plan.assignments:
        for b in range(*a.block_range):
            out[b] = a.stage
    return out


def _nodes_in_order(plan: Plan, nodes: Sequence[NodeDescriptor]) -> list[NodeDescriptor]:
    by_id = {n.id: n for n in nodes}
    missing = [a.node_id for a in plan.assignments if a.node_id not in by_id]
    if missing:
        raise InputError("plan.assignments[].node_id", missing[0], "is not among the given nodes")
    return [by_id[a.node_id] for a in plan.assignments]


def _free_slots(
    plan: Plan, model: ModelLayout, nodes: Sequence[NodeDescriptor], headroom: float
) -> list[int]:
    ex = model.experts
    assert ex is not None
    out = []
    for a, node in zip(plan.assignments, nodes, strict=True):
        free = usable_bytes(node, headroom) - a.estimated_vram_bytes
        out.append(max(0, free) // ex.expert_params_bytes if ex.expert_params_bytes else 10**9)
    return out


@dataclass(frozen=True, slots=True)
class _Layout:
    holders: tuple[Holders, ...]
    """Per MoE block (in ``moe_blocks`` order)."""
    transfers_before: float | None
    """With co-activation: the load-only layout's transfers per token."""
    imbalance_before: float | None


def _assign(
    plan: Plan,
    model: ModelLayout,
    speeds: Sequence[float],
    slots: Sequence[int],
    routing: _Routing,
    redundant: int,
    tolerance: float,
) -> _Layout:
    ex = model.experts
    assert ex is not None
    num_e = ex.num_experts
    rem = list(slots)
    home_stage = _stage_of_block(plan)
    layers = len(ex.moe_blocks)
    out: list[Holders] = []
    before_t = 0.0
    before_i = 0.0
    for li, block in enumerate(ex.moe_blocks):
        left = layers - li
        limits = [
            min(r, max(-(-r // left), r - math.floor(c * (left - 1) / layers)))
            for r, c in zip(rem, slots, strict=True)
        ]
        w = routing.p[li]
        spare = sum(rem) - num_e * left
        budget = min(redundant, max(0, spare) // left)
        pairs = routing.pairs[li] if routing.pairs is not None else None
        singles = [[e] for e in range(num_e)]
        holders = _place_block(w, speeds, limits, singles, budget)
        if pairs is not None:
            home = home_stage[block]
            before_t += _transfers(holders, w, pairs, routing.k, len(speeds), home)
            before_i += _imbalance(holders, w, speeds)
            groups = _groups(w, pairs, routing.k)
            if any(len(g) > 1 for g in groups):
                grouped = _place_block(w, speeds, limits, groups, budget)
                worst_g = _worst(_loads(grouped, w, len(speeds)), speeds)
                worst_s = _worst(_loads(holders, w, len(speeds)), speeds)
                if worst_g <= worst_s * (1 + tolerance) + _EPS:
                    holders = grouped
        for hs in holders:
            for j in hs:
                rem[j] -= 1
        out.append(holders)
    with_co = routing.pairs is not None
    return _Layout(
        holders=tuple(out),
        transfers_before=before_t if with_co else None,
        imbalance_before=before_i / layers if with_co else None,
    )


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
    ordered = _nodes_in_order(plan, nodes)
    slots = _free_slots(plan, model, ordered, constraints.headroom)
    needed = len(ex.moe_blocks) * ex.num_experts
    if sum(slots) < needed:
        backbone = sum(a.estimated_vram_bytes for a in plan.assignments)
        room = backbone + sum(slots) * ex.expert_params_bytes  # whole experts only
        raise InsufficientVram(backbone + needed * ex.expert_params_bytes, room)
    speeds, source = expert_speeds(ordered)
    routing = _routing(model, load, coactivation)
    if not 0 <= locality_tolerance < math.inf:
        raise InputError("locality_tolerance", locality_tolerance, "must be a number >= 0")
    layout = _assign(plan, model, speeds, slots, routing, redundant_per_block, locality_tolerance)
    owned: list[list[ExpertId]] = [[] for _ in ordered]
    for block, holders in zip(ex.moe_blocks, layout.holders, strict=True):
        for e, hs in enumerate(holders):
            for j in hs:
                owned[j].append(ExpertId(block=block, expert=e))
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
    summary = expert_summary(result, model, nodes, load, coactivation)
    prediction = expert_prediction(model, nodes, constraints, result, load, coactivation)
    # One source of truth: every figure below comes from the final plan and its prediction;
    # the backbone's own notes (stage VRAM, KV capacity, certificate) described the blocks
    # without their experts and are not carried over.
    notes = [
        *_stage_notes(result, prediction, constraints),
        *_notes(summary, layout, source, load, coactivation),
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


def _stage_notes(plan: Plan, prediction: Prediction, constraints: Constraints) -> list[str]:
    """Per stage time and VRAM, and the KV capacity, all of the final expert plan."""
    from stowplan.planner.certify import _prediction_note, kv_capacity_note

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
    out.append(_prediction_note(prediction, plan.num_stages))
    if prediction.kv_capacity_tokens is None:
        out.append("KV capacity unknown: the layout has no KV-cache figure")
    else:
        out.append(kv_capacity_note(prediction, constraints.context_tokens, ", experts included"))
    if prediction.assumed:
        out.append(
            f"{len(prediction.assumed)} input(s) assumed from the spec table (see prediction)"
        )
    return out


def _notes(
    summary: ExpertSummary,
    layout: _Layout,
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
    if layout.transfers_before is not None and coactivation is not None:
        out.append(
            f"cross-node expert transfers per token: {summary.transfers_per_token:.2f} "
            f"(load-only placement: {layout.transfers_before:.2f}; co-activation kept together)"
        )
    else:
        out.append(f"cross-node expert transfers per token: {summary.transfers_per_token:.2f}")
    return out


def plan_with_experts(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    constraints: Constraints | None = None,
    load: ExpertLoad | None = None,
    coactivation: CoActivation | None = None,
    *,
    redundant_per_block: int | None = None,
    locality_tolerance: float = LOCALITY_TOLERANCE,
    expert_parallel: bool | None = None,
) -> Plan:
    """Plan a model end to end: blocks (by the block planner), then experts.

    Dense models get exactly ``stowplan.planner.plan(model, nodes,
    constraints)``.  A MoE model has two placements, and by default
    (``expert_parallel=None``) the one the cost model predicts faster for the
    workload's objective (latency at batch 1, throughput above) wins:

    * block-local: every expert stays on the node of its block (a plain
      pipeline; no expert traffic between nodes; what engines without
      expert parallelism can run);
    * expert-parallel: the backbone (blocks without their routed experts) is
      planned with the fewest stages (at least ``min_stages``) whose nodes
      also hold every expert, then experts are spread over those nodes,
      balanced for load and speed (pays the expert all-to-all per token).

    ``expert_parallel=True`` or ``False`` forces one of them.

    Raises:
        InsufficientVram: even the largest ``max_stages`` nodes cannot hold
            backbone plus experts (``needed`` and ``available`` in bytes).
        Everything :func:`stowplan.planner.plan` raises.
    """
    from stowplan.planner import plan as plan_blocks

    constraints = Constraints() if constraints is None else constraints
    ex = model.experts
    if ex is None:
        if load is not None or coactivation is not None:
            option = "--expert-load" if load is not None else "--coactivation"
            raise InputError(option, model.name, "is only for mixture-of-experts models")
        return plan_blocks(model, nodes, constraints)
    nodes = tuple(nodes)
    if expert_parallel is False:
        return _block_local(plan_blocks(model, nodes, constraints), model)
    spread = _expert_parallel(
        model, nodes, constraints, load, coactivation, redundant_per_block, locality_tolerance
    )
    if constraints.objective is Objective.COST:
        spread = _meeting_target(
            spread,
            lambda c: _expert_parallel(
                model, nodes, c, load, coactivation, redundant_per_block, locality_tolerance
            ),
            constraints,
            len(nodes),
        )
    if expert_parallel is True:
        return spread
    try:
        local = _block_local(plan_blocks(model, nodes, constraints), model)
    except PlanError:
        return spread
    if constraints.objective is Objective.COST:
        return _cheaper(local, spread)
    return _faster(local, spread, constraints)


def _served(p: Plan) -> float:
    from stowplan.planner.selection import served_rate

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
    return replace(
        fastest, rationale=replace(fastest.rationale, notes=(*fastest.rationale.notes, note))
    )


def _cheaper(local: Plan, spread: Plan) -> Plan:
    """The cheaper of two plans that both meet the target (the faster on a tie), noted."""
    a, b = local.rationale.prediction, spread.rationale.prediction
    if a is None or b is None or a.cost_per_hour is None or b.cost_per_hour is None:
        return local
    local_wins = (a.cost_per_hour, -_served(local)) <= (b.cost_per_hour, -_served(spread))
    chosen, other = (
        ("block-local", "expert-parallel") if local_wins else ("expert-parallel", "block-local")
    )
    note = (
        f"experts: {chosen} chosen over {other} by price "
        f"(block-local ${a.cost_per_hour:.2f}/h, expert-parallel ${b.cost_per_hour:.2f}/h)"
    )
    winner = local if local_wins else spread
    return replace(
        winner, rationale=replace(winner.rationale, notes=(*winner.rationale.notes, note))
    )


def _block_local(plan: Plan, model: ModelLayout) -> Plan:
    """``plan`` (blocks with their experts) with each stage owning its blocks' experts."""
    ex = model.experts
    assert ex is not None
    moe = set(ex.moe_blocks)
    stages = tuple(
        replace(
            a,
            owned_experts=tuple(
                ExpertId(block=b, expert=e)
                for b in range(*a.block_range)
                if b in moe
                for e in range(ex.num_experts)
            ),
        )
        for a in plan.assignments
    )
    note = "experts: block-local (every expert on the node of its block; no expert traffic)"
    return replace(
        plan,
        topology=Topology.PipelineWithExperts(plan.num_stages, ex.num_experts),
        assignments=stages,
        rationale=replace(plan.rationale, notes=(*plan.rationale.notes, note)),
    )


def _faster(local: Plan, spread: Plan, constraints: Constraints) -> Plan:
    """The better of the two placements by the workload's objective, with both figures noted."""
    a, b = local.rationale.prediction, spread.rationale.prediction
    if a is None or b is None:
        return local
    if constraints.batch == 1:
        unit, va, vb = "ms/token", a.time_per_token_s * 1e3, b.time_per_token_s * 1e3
        local_wins = a.time_per_token_s <= b.time_per_token_s
    else:
        unit, va, vb = "tokens/s", a.tokens_per_s, b.tokens_per_s
        local_wins = a.tokens_per_s >= b.tokens_per_s
    chosen, other = "block-local", "expert-parallel"
    if not local_wins:
        chosen, other = other, chosen
    note = (
        f"experts: {chosen} chosen over {other} by the cost model "
        f"(block-local {va:.4g} {unit}, expert-parallel {vb:.4g} {unit})"
    )
    winner = local if local_wins else spread
    return replace(
        winner, rationale=replace(winner.rationale, notes=(*winner.rationale.notes, note))
    )


def _expert_parallel(
    model: ModelLayout,
    nodes: tuple[NodeDescriptor, ...],
    constraints: Constraints,
    load: ExpertLoad | None,
    coactivation: CoActivation | None,
    redundant_per_block: int | None,
    locality_tolerance: float,
) -> Plan:
    """Backbone first, then every expert packed onto the stage nodes."""
    from stowplan.planner import plan as plan_blocks

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
    max_n = min(constraints.max_stages or len(nodes), len(nodes), model.num_blocks)
    ranked = sorted((usable_bytes(n, headroom) for n in nodes), reverse=True)
    available = sum(ranked[:max_n])
    if available < needed:
        raise InsufficientVram(needed, available)
    first = constraints.min_stages or 1
    if first > max_n:
        raise Infeasible(
            f"min_stages={first} but at most {max_n} stages are possible "
            f"({len(nodes)} nodes, {model.num_blocks} blocks, max_stages={constraints.max_stages})"
        )
    while first < max_n and sum(ranked[:first]) < needed:
        first += 1
    last_error: InsufficientVram | None = None
    for n in range(first, max_n + 1):
        base = plan_blocks(backbone, nodes, replace(constraints, min_stages=n))
        try:
            return place_experts(
                base,
                model,
                nodes,
                constraints,
                load,
                coactivation,
                redundant_per_block=redundant_per_block,
                locality_tolerance=locality_tolerance,
            )
        except InsufficientVram as exc:
            last_error = exc
    assert last_error is not None
    raise last_error


# -- reading a plan back ------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeExperts:
    """The experts one stage node owns and the share of expert work it carries."""

    stage: int
    node_id: str
    per_block: tuple[tuple[int, tuple[int, ...]], ...]
    """``(block, expert indices)`` for every MoE block the node holds experts of."""
    num_experts: int
    """Expert copies held (replicas included)."""
    load_share: float
    """Fraction of all expected expert work (tokens × experts) served here."""
    speed_share: float
    """This node's fraction of the stage nodes' total expert speed (the ideal load share)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertSummary:
    """Balance and traffic of an expert placement (see the module docstring)."""

    nodes: tuple[NodeExperts, ...]
    num_placed: int
    num_replicas: int
    imbalance_mean: float
    """Mean over MoE blocks of ``max_j(load_j/speed_j) / (sum load / sum speed)``."""
    imbalance_max: float
    transfers_per_token: float
    """Expected distinct remote nodes a token's experts live on, summed over MoE blocks."""
    speed_source: str
    block_local: bool = False
    """Every expert lives only on the node of its block: no expert parallelism, so the
    imbalance figures (which compare nodes) do not apply; the stage split balances work."""


def _holders_of(plan: Plan, model: ModelLayout) -> tuple[Holders, ...]:
    ex = model.experts
    assert ex is not None
    row = {b: i for i, b in enumerate(ex.moe_blocks)}
    out: list[Holders] = [[[] for _ in range(ex.num_experts)] for _ in ex.moe_blocks]
    for j, a in enumerate(plan.assignments):
        for x in a.owned_experts:
            if x.block not in row or x.expert >= ex.num_experts:
                raise InputError(
                    f"assignments[{a.stage}].owned_experts",
                    (x.block, x.expert),
                    "is not a routed expert of the model",
                )
            out[row[x.block]][x.expert].append(j)
    for li, holders in enumerate(out):
        for e, hs in enumerate(holders):
            if not hs:
                raise InputError(
                    "assignments[].owned_experts",
                    (ex.moe_blocks[li], e),
                    "every routed expert must be owned by some stage",
                )
    return tuple(out)


def expert_summary(
    plan: Plan,
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    load: ExpertLoad | None = None,
    coactivation: CoActivation | None = None,
) -> ExpertSummary:
    """Balance and traffic of the experts ``plan`` places, under ``load``/``coactivation``."""
    ex = model.experts
    if ex is None:
        raise InputError("model", model.name, "has no routed experts")
    ordered = _nodes_in_order(plan, nodes)
    speeds, source = expert_speeds(ordered)
    routing = _routing(model, load, coactivation)
    all_holders = _holders_of(plan, model)
    home_stage = _stage_of_block(plan)
    n = len(ordered)
    work = [0.0] * n
    imbalances = []
    transfers = 0.0
    for li, holders in enumerate(all_holders):
        w = routing.p[li]
        for j, node_load in enumerate(_loads(holders, w, n)):
            work[j] += node_load
        imbalances.append(_imbalance(holders, w, speeds))
        pairs = routing.pairs[li] if routing.pairs is not None else None
        transfers += _transfers(holders, w, pairs, routing.k, n, home_stage[ex.moe_blocks[li]])
    total_work = sum(work) or 1.0
    rows = []
    for j, a in enumerate(plan.assignments):
        per: dict[int, list[int]] = {}
        for x in a.owned_experts:
            per.setdefault(x.block, []).append(x.expert)
        rows.append(
            NodeExperts(
                stage=a.stage,
                node_id=a.node_id,
                per_block=tuple((b, tuple(sorted(es))) for b, es in sorted(per.items())),
                num_experts=len(a.owned_experts),
                load_share=work[j] / total_work,
                speed_share=speeds[j] / sum(speeds),
            )
        )
    placed = sum(r.num_experts for r in rows)
    return ExpertSummary(
        nodes=tuple(rows),
        num_placed=placed,
        num_replicas=placed - len(ex.moe_blocks) * ex.num_experts,
        imbalance_mean=sum(imbalances) / len(imbalances),
        imbalance_max=max(imbalances),
        transfers_per_token=transfers,
        speed_source=source,
        block_local=all(
            hs == [home_stage[b]]
            for b, holders in zip(ex.moe_blocks, all_holders, strict=True)
            for hs in holders
        ),
    )


# -- the cost model's expert term ---------------------------------------------------------


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

    These seconds replace the routed-expert reads the block would cost on
    ``h``: add them to the stage time of the backbone (:func:`backbone_layout`).
    ``bandwidth_gbps`` overrides per node id; otherwise the cost model's
    bandwidth is used.  An unknown link (``link_mbps`` 0) costs no transfer
    time, as in :mod:`stowplan.cost`.
    """
    ex = model.experts
    if ex is None:
        return tuple(
            ExpertTime(stage=a.stage, compute_s=0.0, transfer_s=0.0) for a in plan.assignments
        )
    ordered = _nodes_in_order(plan, nodes)
    bws = [
        (bandwidth_gbps or {}).get(x.id, bw)
        for x, bw in zip(ordered, _bandwidths_gbps(ordered), strict=True)
    ]
    for x, bw in zip(ordered, bws, strict=True):
        if not bw > 0:
            raise InputError(f"{x.id}.mem_bandwidth_gbps", bw, "must be > 0 to time its experts")
    routing = _routing(model, load, coactivation)
    all_holders = _holders_of(plan, model)
    home_stage = _stage_of_block(plan)
    n = len(ordered)
    act = model.hidden_dim * model.bytes_per_activation_elem
    compute = [0.0] * plan.num_stages
    transfer = [0.0] * plan.num_stages
    for li, holders in enumerate(all_holders):
        w = routing.p[li]
        h = home_stage[ex.moe_blocks[li]]
        hit = [0.0] * n
        for e, hs in enumerate(holders):
            for j, s in zip(hs, _shares(hs), strict=True):
                hit[j] += 1.0 - (1.0 - w[e] * s) ** batch
        compute[h] += max(hit[j] * ex.expert_params_bytes / (bws[j] * 1e9) for j in range(n))
        pairs = routing.pairs[li] if routing.pairs is not None else None
        reach = _node_reach(holders, w, pairs, routing.k, n)
        remote = [j for j in range(n) if j != h and reach[j] > 0]
        if not remote:
            continue
        sent_bits = sum(batch * reach[j] * act * 8 for j in remote)
        send = sent_bits / (ordered[h].link_mbps * 1e6) if ordered[h].link_mbps else 0.0
        back = max(
            batch * reach[j] * act * 8 / (ordered[j].link_mbps * 1e6)
            if ordered[j].link_mbps
            else 0.0
            for j in remote
        )
        p_any = 1.0 - math.prod((1.0 - reach[j]) ** batch for j in remote)
        latency = p_any * (
            ordered[h].link_latency_ms + max(ordered[j].link_latency_ms for j in remote)
        )
        transfer[h] += send + back + latency / 1e3
    return tuple(
        ExpertTime(stage=a.stage, compute_s=compute[a.stage], transfer_s=transfer[a.stage])
        for a in plan.assignments
    )


def expert_prediction(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    constraints: Constraints,
    plan: Plan,
    load: ExpertLoad | None = None,
    coactivation: CoActivation | None = None,
    calibration: Calibration | None = None,
) -> Prediction:
    """The cost model's prediction for an expert-parallel ``plan``.

    Every stage's time is the cost model's time for its backbone blocks
    (:func:`backbone_layout`) plus its :func:`expert_stage_times`; the KV
    capacity counts the experts each stage holds.  ``calibration`` applies to
    the backbone's stage times (as in :func:`stowplan.cost.predict`) and its
    bandwidth fraction to the experts' reads.
    """
    from stowplan.cost import CostModel, cycle_seconds, microbatches, usd_per_million_tokens

    cm = CostModel(backbone_layout(model), nodes, constraints, calibration)
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
