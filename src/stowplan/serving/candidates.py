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
import re
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
    "ReplicaMemo",
    "compositions",
    "grouped_compositions",
    "node_classes",
    "replica_of",
    "split_bound",
    "split_of",
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
    count and, up to :data:`SMALL_CLASSES` classes, the compositions of two or three
    nodes, the first ``limit`` of them beyond the single-class ones (callers add groups
    of their own, see :func:`grouped_compositions`)."""
    total = math.prod(s + 1 for s in sizes) - 1
    if total <= limit:
        every = [c for c in product(*(range(s + 1) for s in sizes)) if any(c)]
        return sorted(every, key=lambda c: (sum(c), c)), True
    k = len(sizes)
    chosen: dict[Composition, None] = {}
    for i, s in enumerate(sizes):
        for count in range(1, s + 1):
            chosen[tuple(count if j == i else 0 for j in range(k))] = None
    most = 3 if k <= SMALL_CLASSES else 1
    small = [c for c in _small(sizes, most) if c not in chosen]
    for c in sorted(small, key=lambda c: (sum(c), c))[:limit]:
        chosen[c] = None
    return list(chosen), False


SMALL_CLASSES = 24
"""Up to this many classes, every composition of two or three nodes is tried; beyond,
the groups of :func:`grouped_compositions` stand for them."""

GROUP_ROOMS = (1.2, 1.5, 2.0)
"""The memory, in copies of the weights, each of :func:`grouped_compositions`' groups
is filled up to."""


def grouped_compositions(
    rates: FleetRates,
    classes: Sequence[Sequence[NodeDescriptor]],
    index: dict[str, int],
    w: Workload,
) -> list[Composition]:
    """Replicas for a fleet too large to enumerate: the nodes in order of their own
    prefill and decode speed (and, for a target, of price per speed), cut into
    consecutive groups that each hold :data:`GROUP_ROOMS` copies of the weights —
    disjoint groups that packing can take side by side; the remainder joins the last
    group.  Nodes that serve a request alone are left to the single-class
    compositions."""
    flat = [(k, n) for k, cls in enumerate(classes) for n in cls]

    def speed(i: int) -> float:
        return 1.0 / max(rates.ttft0_floor([i]) + rates.cycle_floor([i]), 1e-30)

    small = [(k, n) for k, n in flat if users_bound(rates, [index[n.id]], w) < 1]
    orders = [sorted(small, key=lambda kn: -speed(index[kn[1].id]))]
    if w.has_target and all(n.price_per_hour for _, n in small):
        orders.append(
            sorted(small, key=lambda kn: (kn[1].price_per_hour or 0.0) / speed(index[kn[1].id]))
        )
    out: dict[Composition, None] = {}
    for order in orders:
        for room in GROUP_ROOMS:
            need = room * rates.weight_bytes
            groups: list[list[tuple[int, NodeDescriptor]]] = [[]]
            held = 0.0
            for k, n in order:
                groups[-1].append((k, n))
                held += rates.usable[index[n.id]]
                if held >= need:
                    groups.append([])
                    held = 0.0
            if len(groups) > 1 and held < need:
                rest = groups.pop()
                groups[-1] += rest
            for g in groups:
                if not g:
                    continue
                combo = [0] * len(classes)
                for k, _ in g:
                    combo[k] += 1
                out[tuple(combo)] = None
    return list(out)


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
            inv_flops=cm.inv_prefill_flops,
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
    """The planning nodes of ``plan``, in the same order: the physical nodes, or for a
    split the GPU group ``plan`` is on."""
    split: int = 1
    """Copies of the replica one node holds side by side (data parallel inside the
    node): ``plan`` is on GPUs ``[0, g/split)`` of node ``node_ids[0]``, the other
    copies on its next GPU ranges; ``serving`` is one copy's."""

    @property
    def value_users(self) -> int:
        """Users of every copy the option holds."""
        return self.serving.users * self.split

    @property
    def value_rate(self) -> float:
        """Requests/s of every copy the option holds."""
        return self.serving.requests_per_s * self.split


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

    The plan for the bound's U requests (P + O tokens of KV each) first: when it serves
    some U* ≥ 1, the plan for U* itself (its KV reserve and microbatches then fit U*)
    is tried too and the better kept.  When no plan holds U requests (or it serves
    none), U is bisected downward until one serves; that plan's U* is then refined
    the same way.  The plan serving the most (then the lower TPOT) wins.
    """
    from stowplan.planner import plan_blocks

    by_id = {n.id: n for n in nodes}
    tried: dict[int, Candidate | None] = {}

    def attempt(u: int) -> Candidate | None:
        if u in tried:
            return tried[u]
        try:
            found = plan_blocks(model, nodes, replace(serving_constraints(w, c), batch=u))
        except PlanError:
            tried[u] = None
            return None
        got = _score(model, by_id, found, c, w)
        ids = tuple(dict.fromkeys(a.node_id for a in found.assignments))
        cand = Candidate(plan=found, serving=got, node_ids=ids, nodes=tuple(by_id[i] for i in ids))
        tried[u] = cand
        return cand

    def served(cand: Candidate | None) -> bool:
        return cand is not None and cand.serving.users >= 1

    hi = max(1, min(start_users, MAX_BATCH))
    u = hi
    best = attempt(u)
    while not served(best) and u > 1:
        # No plan for ``u`` requests serves one: halve U until one does.
        hi = u - 1
        u //= 2
        best = attempt(u)
    if best is None or not served(best):
        return None
    # Bisect between what is served and what was asked, a few steps: a plan for fewer
    # requests reserves less KV and may split the blocks so that it serves more.
    lo = best.serving.users
    for _ in range(REFINE_STEPS):
        if lo >= hi:
            break
        mid = (lo + hi + 1) // 2
        got = attempt(mid)
        if got is not None and not _better(got, best) and _shape(got) == _shape(best):
            break  # the plan for fewer requests is the same pipeline: it serves no more
        if got is not None and _better(got, best):
            best = got
        if got is not None and got.serving.users >= mid:
            lo = max(lo, got.serving.users)
        else:
            hi = mid - 1
        lo = max(lo, best.serving.users)
    again = attempt(min(best.serving.users, MAX_BATCH))
    if again is not None and _better(again, best):
        best = again
    return best


REFINE_STEPS = 6
"""Bisection steps :func:`replica_of` takes between the users served and those asked."""


def _shape(c: Candidate) -> tuple[tuple[object, ...], ...]:
    return tuple(
        (a.node_id, a.block_range, a.tensor_parallel, a.gpu_indices) for a in c.plan.assignments
    )


def _better(a: Candidate, b: Candidate) -> bool:
    return (a.serving.users, -a.serving.tpot_s) > (b.serving.users, -b.serving.tpot_s)


def _splits(
    model: ModelLayout, node: NodeDescriptor, w: Workload, c: Constraints, by_rate: bool
) -> list[tuple[NodeDescriptor, int, int, float]]:
    """Per divisor d < g of ``node``'s GPUs: the group of d GPUs, the copies g/d, the
    group's users bound and the bound of all copies (users, or requests/s)."""
    g = node.num_gpus
    out = []
    for d in (d for d in range(1, g) if g % d == 0):
        group = gpu_group_node(node, 0, d)
        rates = FleetRates.of(model, [group], replace(c, batch=1), w)
        ub = users_bound(rates, [0], w)
        copies = g // d
        out.append((group, copies, ub, copies * (rate_bound(rates, [0], w) if by_rate else ub)))
    return out


def split_bound(
    model: ModelLayout, node: NodeDescriptor, w: Workload, c: Constraints, *, by_rate: bool
) -> float:
    """An upper bound on what g/d replicas of d GPUs each serve together on multi-GPU
    ``node``, over every divisor d < g (users, or requests/s with ``by_rate``)."""
    return max((b for *_, b in _splits(model, node, w, c, by_rate)), default=0.0)


def split_of(
    memo: ReplicaMemo,
    model: ModelLayout,
    node: NodeDescriptor,
    w: Workload,
    c: Constraints,
    *,
    by_rate: bool,
    beat: float,
) -> Candidate | None:
    """The best data-parallel split of multi-GPU ``node`` (g/d replicas of d GPUs, d a
    divisor of g below it) serving more than ``beat`` in all (users, or requests/s with
    ``by_rate``); None when none does.  Splits whose bound cannot beat the best so far
    are not planned."""
    best: Candidate | None = None
    for group, copies, ub, bound in sorted(
        _splits(model, node, w, c, by_rate), key=lambda t: -t[3]
    ):
        if ub < 1 or bound <= beat:
            continue
        cand = memo.replica([group], ub)
        if cand is None:
            continue
        cand = replace(cand, node_ids=(node.id,), split=copies)
        got = cand.value_rate if by_rate else float(cand.value_users)
        if got > beat:
            best, beat = cand, got
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
    return replace(cand, plan=found, serving=got)


def _plan_key(n: NodeDescriptor, alone: bool) -> tuple[object, ...]:
    """What a replica's plan reads of a node: every figure but its id and price (and,
    for a replica on this node ``alone``, its network link, which no stage crosses)."""
    key = _class_key(replace(n, price_per_hour=None))
    if alone:
        key = _class_key(replace(n, price_per_hour=None, link_mbps=1.0, link_latency_ms=0.0))
    return key


class ReplicaMemo:
    """:func:`replica_of` once per kind of node list: nodes that differ only in their
    ids, prices (and, alone, their network link) get the same plan, renamed.  A plan
    reused on nodes of other prices carries the first nodes' $/h in its prediction
    until :func:`repriced`."""

    def __init__(self, model: ModelLayout, w: Workload, c: Constraints) -> None:
        self._model, self._w, self._c = model, w, c
        self._seen: dict[tuple[object, ...], tuple[Candidate | None, tuple[str, ...]]] = {}

    def replica(self, nodes: Sequence[NodeDescriptor], start_users: int) -> Candidate | None:
        alone = len(nodes) == 1
        key = (start_users, *(_plan_key(n, alone) for n in nodes))
        ids = tuple(n.id for n in nodes)
        hit = self._seen.get(key)
        if hit is None:
            got = replica_of(self._model, nodes, self._w, self._c, start_users)
            self._seen[key] = (got, ids)
            return got
        cand, first = hit
        if cand is None or first == ids:
            return cand
        return _renamed_candidate(cand, dict(zip(first, ids, strict=True)), nodes)


def renamed_text(text: str, mapping: dict[str, str]) -> str:
    """``text`` with every node id of ``mapping`` (a whole id, not part of a longer one)
    replaced at once by its new id."""
    changed = {k: v for k, v in mapping.items() if k != v}
    if not changed:
        return text
    alternatives = "|".join(re.escape(k) for k in sorted(changed, key=len, reverse=True))
    pattern = rf"(?<![\w./-])(?:{alternatives})(?![\w./-])"
    return re.sub(pattern, lambda m: changed[m.group(0)], text)


def _renamed_candidate(
    cand: Candidate, mapping: dict[str, str], nodes: Sequence[NodeDescriptor]
) -> Candidate:
    """``cand`` on ``nodes``, node ``k`` of it now ``mapping[k]``."""
    stages = tuple(replace(a, node_id=mapping[a.node_id]) for a in cand.plan.assignments)
    notes = [renamed_text(text, mapping) for text in cand.plan.rationale.notes]
    plan = replace(
        cand.plan,
        assignments=stages,
        rationale=replace(cand.plan.rationale, notes=tuple(notes)),
    )
    by_id = {n.id: n for n in nodes}
    ids = tuple(mapping[i] for i in cand.node_ids)
    return replace(cand, plan=plan, node_ids=ids, nodes=tuple(by_id[i] for i in ids))


def repriced(
    model: ModelLayout,
    plan: Plan,
    nodes: Sequence[NodeDescriptor],
    rent: float | None,
    w: Workload,
    c: Constraints,
) -> Plan:
    """``plan`` with its prediction's rent ($/h, $ per million tokens) ``rent``: the
    replica's share of its nodes (a plan :class:`ReplicaMemo` reused was predicted on
    nodes of other prices; replicas side by side on one node share its rent)."""
    from stowplan.cost.predict import predict
    from stowplan.planner.certify import prediction_note

    pred = plan.rationale.prediction
    if pred is None or rent == pred.cost_per_hour:
        return plan
    fresh = predict(model, nodes, replace(serving_constraints(w, c), batch=pred.batch), plan)
    usd = fresh.usd_per_million_tokens
    if rent is not None and fresh.cost_per_hour and usd is not None:
        usd = usd * rent / fresh.cost_per_hour
    fresh = replace(
        fresh, cost_per_hour=rent, usd_per_million_tokens=usd, calibration=pred.calibration
    )
    old_note = prediction_note(pred, len(plan.assignments))
    new_note = prediction_note(fresh, len(plan.assignments))
    notes = tuple(new_note if n == old_note else n for n in plan.rationale.notes)
    return replace(plan, rationale=replace(plan.rationale, prediction=fresh, notes=notes))
