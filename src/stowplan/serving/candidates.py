"""Candidate replicas of a serving fleet: node classes, compositions, the replica of each.

Nodes alike in every figure but their id form one class; a *composition* is how many
nodes of each class a replica takes.  The replica of a composition is the pipeline
the block planner (:func:`~stowplan.planner.plan_blocks`, per-stage tensor parallel
and engine rules included) plans on those nodes for a batch of U requests with P + O
tokens of KV each, scored by :func:`~stowplan.cost.serving.pipeline_serving`; U is
set from the relaxation bound, then to the U* the plan serves, and the better plan
is kept.  :func:`users_bound` is that relaxation: an upper bound on the U* of any
pipeline on a node set.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import product

from stowplan.cost import CostModel
from stowplan.cost.serving import ReplicaServing, pipeline_serving, serving_constraints
from stowplan.cost.touch import expert_touch_bytes
from stowplan.errors import PlanError
from stowplan.model import Constraints, ModelLayout, NodeDescriptor, gpu_group_node
from stowplan.plan import Plan
from stowplan.quantities.limits import MAX_BATCH
from stowplan.workload import Workload

__all__ = [
    "Candidate",
    "FleetRates",
    "compositions",
    "node_classes",
    "replica_of",
    "users_bound",
]

Composition = tuple[int, ...]


def _class_key(n: NodeDescriptor) -> tuple[object, ...]:
    return (
        n.gpu_name,
        n.vram_bytes,
        n.flops_estimate,
        n.link_mbps,
        n.mem_bandwidth_gbps,
        n.link_latency_ms,
        n.price_per_hour,
        n.num_gpus,
        n.intra_link_gbps,
        n.intra_link_latency_us,
    )


def node_classes(nodes: Sequence[NodeDescriptor]) -> list[list[NodeDescriptor]]:
    """The nodes grouped into classes of nodes alike but for their id, in first-seen order."""
    out: dict[tuple[object, ...], list[NodeDescriptor]] = {}
    for n in nodes:
        out.setdefault(_class_key(n), []).append(n)
    return list(out.values())


def compositions(sizes: Sequence[int], limit: int) -> tuple[list[Composition], bool]:
    """Compositions (nodes taken per class) to try, fewest nodes first, and whether they
    are all of them.  All when there are at most ``limit``; otherwise every single-class
    count, every composition of up to three nodes, and the whole fleet, within ``limit``
    beyond the single-class ones."""
    total = math.prod(s + 1 for s in sizes) - 1
    if total <= limit:
        every = [c for c in product(*(range(s + 1) for s in sizes)) if any(c)]
        return sorted(every, key=lambda c: (sum(c), c)), True
    k = len(sizes)
    chosen: dict[Composition, None] = {}
    for i, s in enumerate(sizes):
        for count in range(1, s + 1):
            chosen[tuple(count if j == i else 0 for j in range(k))] = None
    small = [c for c in _small(sizes, 3) if c not in chosen]
    for c in sorted(small, key=lambda c: (sum(c), c))[:limit]:
        chosen[c] = None
    chosen[tuple(sizes)] = None
    return list(chosen), False


def _small(sizes: Sequence[int], most: int) -> list[Composition]:
    """Every composition of 1..``most`` nodes."""
    out: list[Composition] = []

    def walk(i: int, left: int, acc: list[int]) -> None:
        if i == len(sizes):
            if any(acc):
                out.append(tuple(acc))
            return
        for c in range(min(sizes[i], left) + 1):
            acc.append(c)
            walk(i + 1, left - c, acc)
            acc.pop()

    walk(0, most, [])
    return out


@dataclass(frozen=True, slots=True)
class FleetRates:
    """Per physical node of the fleet, the figures the relaxation bound reads."""

    usable: tuple[int, ...]
    inv_bw: tuple[float, ...]
    inv_flops: tuple[float, ...]
    weight_bytes: int
    kv_per_request: int
    """KV bytes one request holds at P + O tokens, all blocks."""
    prefill_read: float
    prefill_flops: float
    decode_read: float
    """Weight bytes one decoded token reads (every block's per-token read and the head)."""
    latency_s: tuple[float, ...]
    """Each node's network hop latency."""
    token_send_s: tuple[float, ...]
    """Seconds each node's network link takes to send one token's activations."""

    @classmethod
    def of(
        cls, model: ModelLayout, nodes: Sequence[NodeDescriptor], c: Constraints, w: Workload
    ) -> FleetRates:
        cm = CostModel(model, nodes, c)
        p = w.prompt_tokens
        reads = model.block_read_sizes()
        windows = model.kv_window_tokens or (None,) * model.num_blocks
        weights = sum(reads)
        attention = sum(p * (p if x is None else min(p, x)) for x in windows)
        return cls(
            usable=cm.usable,
            inv_bw=cm.inv_bw,
            inv_flops=cm.inv_flops,
            weight_bytes=model.weight_bytes,
            kv_per_request=sum(
                model.kv_bytes(b, w.context_tokens, 1) for b in range(model.num_blocks)
            ),
            prefill_read=weights + sum(expert_touch_bytes(model, p)) + cm.head,
            prefill_flops=2.0 * weights * cm.params_per_byte * p
            + 2.0 * attention * model.hidden_dim
            + 2.0 * cm.head * cm.params_per_byte,
            decode_read=weights + cm.head,
            latency_s=cm.latency_s,
            token_send_s=tuple(
                model.hidden_dim * model.bytes_per_activation_elem / r.link_bytes_per_s
                for r in cm.rates
            ),
        )

    def ttft0_floor(self, members: Sequence[int]) -> float:
        """A lower bound on TTFT0 of any pipeline on nodes ``members``: every stage reads
        and computes its part at no better than the fastest node's rates."""
        bw = min(self.inv_bw[i] for i in members)
        fl = min(self.inv_flops[i] for i in members)
        return max(self.prefill_read * bw, self.prefill_flops * fl)

    def cycle_floor(self, members: Sequence[int]) -> float:
        """A lower bound on cycle(U) for U ≥ 1: the trip reads every weight once."""
        return self.decode_read * min(self.inv_bw[i] for i in members)

    def memory_users(self, members: Sequence[int]) -> int:
        """Requests the pooled memory of ``members`` holds beside one copy of the weights."""
        room = sum(self.usable[i] for i in members) - self.weight_bytes
        if room < 0:
            return 0
        return (
            MAX_BATCH if self.kv_per_request == 0 else min(MAX_BATCH, room // self.kv_per_request)
        )


def users_bound(rates: FleetRates, members: Sequence[int], w: Workload) -> int:
    """An upper bound on U* of any pipeline on (a subset of) nodes ``members``.

    The larger of two cases.  One node ``i`` alone: U ≤ its own memory; TTFT0 ≥
    its :meth:`FleetRates.ttft0_floor`, cycle ≥ its :meth:`FleetRates.cycle_floor`.
    Several nodes: U ≤ their pooled memory; the floors at the best rates among them,
    plus what a pipeline crossing the network pays at least — one forward hop's
    latency and a prompt's send for TTFT0, the way out and back (two latencies) and
    one token's send for the cycle.  Then TTFT(U) ≤ ttft needs TTFT0 + cycle ≤ ttft and
    TPOT(U) ≤ tpot needs U ≤ (tpot − cycle floor) · O / TTFT0 floor.
    """
    if not members:
        return 0
    best = max(_bound_with(rates, [i], w, 0.0, 0.0) for i in members)
    if len(members) > 1:
        lat = min(rates.latency_s[i] for i in members)
        send = min(rates.token_send_s[i] for i in members)
        prompt = lat + w.prompt_tokens * send
        best = max(best, _bound_with(rates, members, w, prompt, 2 * lat + send))
    return best


def _bound_with(
    rates: FleetRates, members: Sequence[int], w: Workload, ttft0_extra: float, cycle_extra: float
) -> int:
    u = rates.memory_users(members)
    t0 = rates.ttft0_floor(members) + ttft0_extra
    cyc = rates.cycle_floor(members) + cycle_extra
    if t0 + cyc > w.ttft_s or cyc >= w.tpot_s:
        return 0
    if t0 > 0:
        u = min(u, math.floor((w.tpot_s - cyc) * w.output_tokens / t0))
    return max(0, u)


def rate_bound(rates: FleetRates, members: Sequence[int], w: Workload) -> float:
    """An upper bound on the requests/s of any pipeline on ``members``: U/(O·TPOT(U)) ≤
    U/(O·cycle floor + U·TTFT0 floor), which grows with U, at the users bound (the
    floors of the whole set, the lowest of the cases :func:`users_bound` weighs)."""
    u = users_bound(rates, members, w)
    if u == 0:
        return 0.0
    den = w.output_tokens * rates.cycle_floor(members) + u * rates.ttft0_floor(members)
    return math.inf if den <= 0 else u / den


@dataclass(frozen=True, slots=True)
class Candidate:
    """A replica on some nodes and what it serves."""

    plan: Plan
    serving: ReplicaServing
    node_ids: tuple[str, ...]
    """The physical nodes it uses, in stage order."""
    nodes: tuple[NodeDescriptor, ...] = ()
    """Their descriptors, in the same order."""


def _score(
    model: ModelLayout, by_id: dict[str, NodeDescriptor], plan: Plan, c: Constraints, w: Workload
) -> ReplicaServing:
    units = []
    for a in plan.assignments:
        node = by_id[a.node_id]
        part = bool(a.gpu_indices) and a.tensor_parallel < node.num_gpus
        units.append(gpu_group_node(node, a.gpu_indices[0], a.tensor_parallel) if part else node)
    parents = [a.node_id for a in plan.assignments]
    cm = CostModel(model, units, serving_constraints(w, c), parents=parents)
    bounds = [a.block_range[0] for a in plan.assignments] + [plan.assignments[-1].block_range[1]]
    return pipeline_serving(cm, list(range(len(units))), bounds, w)


def replica_of(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    w: Workload,
    c: Constraints,
    start_users: int,
) -> Candidate | None:
    """The best replica the block planner finds on ``nodes`` (None: none serves a user).

    Bisection on U in ``[0, start_users]``: the plan for U requests (P + O tokens of KV
    each) either serves U — then every U below is served too — or not; every plan's
    own U* is kept as a lower end.  The plan serving the most (then the lower TPOT) wins.
    """
    from stowplan.planner import plan_blocks

    by_id = {n.id: n for n in nodes}
    best: Candidate | None = None

    def attempt(u: int) -> Candidate | None:
        try:
            found = plan_blocks(model, nodes, replace(serving_constraints(w, c), batch=u))
        except PlanError:
            return None
        got = _score(model, by_id, found, c, w)
        ids = tuple(dict.fromkeys(a.node_id for a in found.assignments))
        return Candidate(plan=found, serving=got, node_ids=ids, nodes=tuple(by_id[i] for i in ids))

    lo, hi = 0, max(1, min(start_users, MAX_BATCH))
    first = True
    while lo < hi:
        mid = hi if first else (lo + hi + 1) // 2  # the bound itself first: often served
        first = False
        cand = attempt(mid)
        if cand is not None:
            got = cand.serving
            if best is None or (got.users, -got.tpot_s) > (
                best.serving.users,
                -best.serving.tpot_s,
            ):
                best = cand
            lo = max(lo, got.users)
        if cand is None or cand.serving.users < mid:
            hi = mid - 1
        if best is None and hi < 1:
            break
    if best is None or best.serving.users < 1:
        return None
    return best


def settle(model: ModelLayout, cand: Candidate, w: Workload, c: Constraints) -> Candidate:
    """``cand`` planned again for its own U* requests on its own nodes (so the plan's KV
    reserve and prediction are those of U*), when that plan serves as many; else
    ``cand``."""
    from stowplan.planner import plan_blocks

    u = cand.serving.users
    pred = cand.plan.rationale.prediction
    if pred is not None and pred.batch == u:
        return cand
    nodes = list(cand.nodes)
    if not nodes:
        return cand
    try:
        found = plan_blocks(model, nodes, replace(serving_constraints(w, c), batch=u))
    except PlanError:
        return cand
    got = _score(model, {n.id: n for n in nodes}, found, c, w)
    if (got.users, -got.tpot_s) < (u, -cand.serving.tpot_s):
        return cand
    return Candidate(plan=found, serving=got, node_ids=cand.node_ids, nodes=cand.nodes)
