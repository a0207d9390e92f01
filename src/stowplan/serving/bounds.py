"""The relaxation bounds of serving: what any pipeline on a node set serves at most.

:class:`FleetRates` holds, per physical node, the figures the bounds read;
:func:`users_bound` bounds the U* of any pipeline on a node set (pooled memory,
prefill and decode at the fastest node's rates, the hops a pipeline across nodes
pays); :func:`rate_bound` the requests/s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from stowplan.cost import CostModel
from stowplan.cost.model import kv_read_bytes
from stowplan.cost.serving import group_all_reduce_s as all_reduce_s
from stowplan.cost.touch import expert_touch_bytes
from stowplan.model import Constraints, ModelLayout, NodeDescriptor, gpu_group_node
from stowplan.quantities.limits import MAX_BATCH
from stowplan.quantities.search import last_true
from stowplan.workload import Workload

__all__ = ["FleetRates", "GroupPrefill", "fleet_users_bound", "rate_bound", "users_bound"]


@dataclass(frozen=True, slots=True)
class GroupPrefill:
    """A GPU group of ``size`` GPUs of one node, as a stage: the figures bounds read."""

    size: int
    compute_s: tuple[float, ...]
    """Per block kind, seconds of one prompt's prefill FLOPs plus the block's two
    all-reduces (none for one GPU)."""
    stream_s: tuple[float, ...]
    """Per block kind, the same for the bytes P tokens read in the block."""
    head_compute_s: float
    head_stream_s: float
    decode_s: float
    """Seconds to read every weight once."""
    bandwidth: float
    """Bytes/s of the node's GPUs when all of them form groups of this size."""


@dataclass(frozen=True, slots=True)
class FleetRates:
    """Per physical node of the fleet, the figures the relaxation bound reads.

    A node's GPUs may form stages of any group size ``t`` dividing its GPU count (a
    group of ``t`` reads and computes at ``t`` GPUs' rates and pays two all-reduces per
    block when ``t > 1``), so the per-node floors are the least over its groupings.
    """

    usable: tuple[int, ...]
    inv_bw: tuple[float, ...]
    """Seconds per byte of each node with all its GPUs on one stage."""
    inv_flops: tuple[float, ...]
    """Seconds per prefill FLOP of each node with all its GPUs on one stage."""
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
    gpus: tuple[int, ...]
    """Each node's GPU count."""
    block_counts: tuple[int, ...]
    """How many blocks there are of each kind (blocks alike in prefill work)."""
    groups: tuple[tuple[GroupPrefill, ...], ...]
    """Per node, the prefill figures of every GPU group a stage may take on it."""
    head_s: tuple[float, float]
    """The least seconds the head's prefill FLOPs, and its bytes, take on any group."""
    decode_s: tuple[float, ...]
    """Per node, the least seconds a GPU group of it takes to read every weight once."""
    bandwidth: tuple[float, ...]
    """Per node, the most bytes/s its GPUs read together (every group at once)."""
    kv_read_per_request: float
    """KV bytes a decode step reads per request, all blocks, at the mean context."""
    block_room: tuple[float, ...]
    """Per node, the most blocks its memory holds (at the smallest block's size)."""
    smallest_block: int
    """Bytes of the smallest block."""
    block_kv: int
    """KV bytes one request holds in the block holding the least (P + O tokens)."""

    @classmethod
    def of(
        cls, model: ModelLayout, nodes: Sequence[NodeDescriptor], c: Constraints, w: Workload
    ) -> FleetRates:
        cm = CostModel(model, nodes, c)
        p = w.prompt_tokens
        reads = model.block_read_sizes()
        windows = model.kv_window_tokens or (None,) * model.num_blocks
        touch = expert_touch_bytes(model, p)
        weights = sum(reads)
        smallest = min(model.block_sizes())
        attention = [p * (p if x is None else min(p, x)) for x in windows]
        # Per block, the prefill work of one prompt (the formula of cost.serving).
        work = [
            (2.0 * r * cm.params_per_byte * p + 2.0 * a * model.attention_width, r + t)
            for r, a, t in zip(reads, attention, touch, strict=True)
        ]
        kinds = sorted(set(work))
        # Every GPU group a stage may take on each node: t GPUs, t dividing its count.
        sizes = [[t for t in range(1, n.num_gpus + 1) if n.num_gpus % t == 0] for n in nodes]
        gm = CostModel(
            model,
            [gpu_group_node(n, 0, t) for n, ts in zip(nodes, sizes, strict=True) for t in ts],
            c,
        )
        act = p * model.hidden_dim * model.bytes_per_activation_elem
        head_flops = 2.0 * cm.head * cm.params_per_byte
        groups: list[tuple[GroupPrefill, ...]] = []
        decode, bandwidth = [], []
        j = 0
        for n, ts in zip(nodes, sizes, strict=True):
            own = []
            for t in ts:
                ar = 2 * all_reduce_s(gm, j, act)
                y, x = gm.inv_prefill_flops[j], gm.inv_bw[j]
                own.append(
                    GroupPrefill(
                        size=t,
                        compute_s=tuple(f * y + ar for f, _ in kinds),
                        stream_s=tuple(r * x + ar for _, r in kinds),
                        head_compute_s=head_flops * y,
                        head_stream_s=cm.head * x,
                        decode_s=(weights + cm.head) * x,
                        bandwidth=math.inf if x <= 0 else n.num_gpus // t / x,
                    )
                )
                j += 1
            groups.append(tuple(own))
            decode.append(min(g.decode_s for g in own))
            bandwidth.append(max(g.bandwidth for g in own))
        every = [g for own in groups for g in own]
        return cls(
            usable=cm.usable,
            inv_bw=cm.inv_bw,
            inv_flops=cm.inv_prefill_flops,
            weight_bytes=model.weight_bytes,
            kv_per_request=sum(
                model.kv_bytes(b, w.context_tokens, 1) for b in range(model.num_blocks)
            ),
            prefill_read=weights + sum(touch) + cm.head,
            prefill_flops=2.0 * weights * cm.params_per_byte * p
            + 2.0 * sum(attention) * model.attention_width
            + head_flops,
            decode_read=weights + cm.head,
            latency_s=cm.latency_s,
            token_send_s=tuple(
                model.hidden_dim * model.bytes_per_activation_elem / r.link_bytes_per_s
                for r in cm.rates
            ),
            gpus=tuple(n.num_gpus for n in nodes),
            block_counts=tuple(work.count(k) for k in kinds),
            groups=tuple(groups),
            head_s=(min(g.head_compute_s for g in every), min(g.head_stream_s for g in every)),
            decode_s=tuple(decode),
            block_room=tuple(math.inf if smallest == 0 else u / smallest for u in cm.usable),
            smallest_block=smallest,
            block_kv=min(model.kv_bytes(b, w.context_tokens, 1) for b in range(model.num_blocks)),
            bandwidth=tuple(bandwidth),
            kv_read_per_request=sum(
                kv_read_bytes(model, b, w.mean_context_tokens, 1) for b in range(model.num_blocks)
            ),
        )

    def ttft0_floor(self, members: Sequence[int], users: int = 0) -> float:
        """A lower bound on TTFT0 of any pipeline on nodes ``members`` serving ``users``
        requests: each block's prefill at its cheapest on any GPU group of them (FLOPs,
        or bytes, plus the group's all-reduces), and the head's; on several nodes, also
        each node holding no more blocks than its memory holds beside the requests' KV
        (:meth:`_filled`)."""
        found = []
        for path, head in ((0, self.head_s[0]), (1, self.head_s[1])):
            total = head
            for k, count in enumerate(self.block_counts):
                total += count * min(
                    (g.stream_s if path else g.compute_s)[k]
                    for i in members
                    for g in self.groups[i]
                )
            found.append(total)
            if len(members) > 1:
                found.append(head + self._filled(members, path, users))
        return max(found)

    def _filled(self, members: Sequence[int], path: int, users: int = 0) -> float:
        """The blocks' prefill when each node holds no more blocks than its memory does
        beside ``users`` requests' KV (a block takes at least the smallest block's bytes
        and the least KV of a block per request): the nodes cheapest per block (any
        kind, any group) filled first, fractionally."""
        left = float(sum(self.block_counts))
        total = 0.0
        per_block = self.smallest_block + users * self.block_kv
        for cost, room in sorted(
            (
                min(min(g.stream_s if path else g.compute_s) for g in self.groups[i]),
                self.block_room[i]
                if users == 0
                else (math.inf if per_block == 0 else self.usable[i] / per_block),
            )
            for i in members
        ):
            take = min(left, room)
            total += take * cost
            left -= take
            if left <= 0:
                return total
        return math.inf

    def lead_ttft0(self, i: int) -> list[tuple[int, float, float]]:
        """Per GPU group size ``t`` of node ``i``: (``t``, and by FLOPs and by bytes, a
        TTFT0 floor of any pipeline whose cheapest group is one of that size there).
        A pipeline's TTFT0 is at least every block at its cheapest group's cheapest
        block kind (and the head at its cheapest anywhere)."""
        blocks = sum(self.block_counts)
        return [
            (
                g.size,
                blocks * min(g.compute_s) + self.head_s[0],
                blocks * min(g.stream_s) + self.head_s[1],
            )
            for g in self.groups[i]
        ]

    def lead_floor(self, i: int) -> list[tuple[int, float]]:
        """Per GPU group size ``t`` of node ``i``: (``t``, a TTFT0 floor of any pipeline
        whose cheapest group is one of that size there, by FLOPs and bytes at once).

        A stage's prefill is the larger of its bytes and its FLOPs over its blocks, so
        it is at least its block count times the larger of its group's least per-block
        cost on each (all-reduces included); the head, on the last stage, adds at least
        the less of its two least costs anywhere."""
        blocks = sum(self.block_counts)
        head = min(self.head_s)
        return [
            (g.size, blocks * max(min(g.compute_s), min(g.stream_s)) + head) for g in self.groups[i]
        ]

    def prefill_speed(self, i: int, path: int) -> float:
        """Prompts per second node ``i`` prefills at most, its GPUs in groups of the best
        size each taking its own prompt: by FLOPs (``path`` 1) or by bytes (2), from
        :meth:`lead_ttft0`."""
        return max(
            math.inf if lead[path] <= 0 else self.gpus[i] // lead[0] / lead[path]
            for lead in self.lead_ttft0(i)
        )

    def bandwidth_per_speed(self, i: int, path: int) -> float:
        """The least bytes/s over prompts/s of any GPU group of node ``i`` (one group's
        bandwidth over :meth:`lead_ttft0`'s prefill speed; by FLOPs with ``path`` 1, by
        bytes with 2): a replica's pooled bandwidth over its summed group speeds is at
        least the least of these over its groups."""
        return min(
            0.0 if lead[path] <= 0 else g.bandwidth * lead[path] / (self.gpus[i] // g.size)
            for g, lead in zip(self.groups[i], self.lead_ttft0(i), strict=True)
        )

    def cycle_floor(self, members: Sequence[int]) -> float:
        """A lower bound on cycle(U) for U ≥ 1: the trip reads every weight once."""
        return min(self.decode_s[i] for i in members)

    def inv_pooled_bw(self, members: Sequence[int]) -> float:
        """Seconds per byte of all ``members``' GPUs reading at once: cycle(U) ≥ m × the
        slowest stage, which reads its weights and U/m requests' KV, so cycle(U) is at
        least (weights + U × KV read) at this rate."""
        total = sum(self.bandwidth[i] for i in members)
        return 0.0 if total == math.inf else 1.0 / total

    def memory_users(self, members: Sequence[int]) -> int:
        """Requests the pooled memory of ``members`` holds beside one copy of the weights."""
        room = sum(self.usable[i] for i in members) - self.weight_bytes
        if room < 0:
            return 0
        return (
            MAX_BATCH if self.kv_per_request == 0 else min(MAX_BATCH, room // self.kv_per_request)
        )


def users_bound(rates: FleetRates, members: Sequence[int], w: Workload, *, span: int = 1) -> int:
    """An upper bound on U* of any pipeline on (a subset of) nodes ``members``; with
    ``span`` > 1, of any pipeline on at least ``span`` of them.

    The larger of two cases.  One node ``i`` alone: U ≤ its own memory; TTFT0 ≥
    its :meth:`FleetRates.ttft0_floor`, cycle ≥ its :meth:`FleetRates.cycle_floor`.
    Several nodes: U ≤ their pooled memory; the floors at the best rates among them,
    plus what a pipeline crossing the network pays at least — one forward hop's
    latency and a prompt's send for TTFT0, the way out and back (two latencies) and
    one token's send for the cycle.  Then TTFT(U) ≤ ttft needs TTFT0 + cycle ≤ ttft and
    TPOT(U) ≤ tpot needs U ≤ (tpot − cycle floor) · O / TTFT0 floor.

    A pipeline across ``S`` nodes enters each but the first from another node (``S −
    1`` forward hops over the network, each sending the prompt's activations and a
    token's) and its decode trip, a closed tour of them, crosses the network ``S``
    times: with ``span`` = S > 1 the hops charged are these (one node alone is then
    not a case).
    """
    if not members or len(members) < span:
        return 0
    best = 0 if span > 1 else max(_bound_with(rates, [i], w, 0.0, 0.0) for i in members)
    if len(members) > 1:
        best = max(best, _bound_with(rates, members, w, *_network(rates, members, w, span)))
    return best


def _network(
    rates: FleetRates, members: Sequence[int], w: Workload, span: int
) -> tuple[float, float]:
    """What a pipeline across at least ``max(2, span)`` of ``members`` pays at least on
    the network: (to its TTFT0, to its cycle), as :func:`users_bound` says."""
    hops = max(1, span - 1)
    lat = min(rates.latency_s[i] for i in members)
    send = min(rates.token_send_s[i] for i in members)
    return hops * (lat + w.prompt_tokens * send), (hops + 1) * lat + hops * send


def _bound_with(
    rates: FleetRates, members: Sequence[int], w: Workload, ttft0_extra: float, cycle_extra: float
) -> int:
    u = rates.memory_users(members)
    t0 = rates.ttft0_floor(members) + ttft0_extra
    cyc = rates.cycle_floor(members) + cycle_extra
    if t0 + cyc > w.ttft_s or cyc >= w.tpot_s:
        return 0
    o = w.output_tokens
    if t0 > 0:
        u = min(u, math.floor((w.tpot_s - cyc) * o / t0))
    # cycle(U) ≥ (weights + U·KV) at the pooled bandwidth: TPOT and TTFT cap U again.
    pooled = rates.inv_pooled_bw(members)
    kv = rates.kv_read_per_request * pooled
    fixed = rates.decode_read * pooled  # the m × slowest-stage branch: no hops
    if kv + t0 / o > 0:
        u = min(u, math.floor((w.tpot_s - fixed) / (kv + t0 / o)))
    if kv > 0:
        u = min(u, math.floor((w.ttft_s - t0 - fixed) / kv))
    if len(members) > 1 and rates.block_kv > 0 and u > 1:
        # The TTFT0 floor of U requests grows with U (their KV leaves each node room for
        # fewer blocks): the largest U every limit allows at its own floor, by bisection
        # (each limit only tightens as U grows).
        def fits(users: int) -> bool:
            t = rates.ttft0_floor(members, users) + ttft0_extra
            return (
                t + cyc <= w.ttft_s
                and users * t <= (w.tpot_s - cyc) * o
                and users * (kv + t / o) <= w.tpot_s - fixed
                and users * kv <= w.ttft_s - t - fixed
            )

        u = last_true(fits, 0, u)
    return max(0, u)


def rate_bound(rates: FleetRates, members: Sequence[int], w: Workload, *, span: int = 1) -> float:
    """An upper bound on the requests/s of any pipeline on ``members``: U/(O·TPOT(U)) ≤
    U/(O·cycle floor(U) + U·TTFT0 floor), which grows with U, at the users bound (the
    floors of the whole set, the lowest of the cases :func:`users_bound` weighs; the
    cycle floor the larger of the trip's and the pooled read of U requests).  With
    ``span`` > 1, of any pipeline on at least ``span`` of them: the users bound of that
    span, and both floors raised by the network hops :func:`users_bound` charges it
    (the pooled read crosses none)."""
    u = users_bound(rates, members, w, span=span)
    if u == 0:
        return 0.0
    ttft0_extra, cycle_extra = (0.0, 0.0) if span <= 1 else _network(rates, members, w, span)
    pooled = (rates.decode_read + u * rates.kv_read_per_request) * rates.inv_pooled_bw(members)
    cycle = max(rates.cycle_floor(members) + cycle_extra, pooled)
    den = w.output_tokens * cycle + u * (rates.ttft0_floor(members) + ttft0_extra)
    return math.inf if den <= 0 else u / den


def fleet_users_bound(rates: FleetRates, members: list[int], w: Workload, gpus: int) -> int:
    """Users any r disjoint replicas on nodes ``members`` serve at most, r up to ``gpus``
    (replicas may sit side by side on a node's GPUs) and to the copies of the weights
    the memory holds; the least of these, per r:

    * memory: r copies of the weights and the requests' KV share the nodes' memory;
    * leaders: a replica's TTFT0 is at least every block at its cheapest group's
      cheapest block kind (:meth:`FleetRates.lead_ttft0`), so its U ≤ C / that, with
      C = (tpot − cycle floor)·O; distinct replicas have distinct cheapest groups, so r
      replicas serve at most the r largest of these caps (a node of g GPUs counted as
      g/t groups of every size t);
    * shares: a replica holding a share φ_j of the blocks on node j has TTFT0 ≥
      Σ_j φ_j·τ_j (τ_j the whole model's prefill there), so Σ_j U·φ_j·τ_j ≤ C; summed
      over replicas, the users Z_j node j's shares carry satisfy Σ_j τ_j·Z_j ≤ r·C,
      and Z_j ≤ (one replica's users bound) × (copies of the weights node j holds);
    * decode and prefill together: U·(KV read / bandwidth + TTFT0/O) ≤ tpot for each
      replica, whose sum over replicas on disjoint GPUs is at most its value at the
      pooled bandwidth and summed group speeds (the function is concave and
      1-homogeneous in the two).

    Each of the prefill terms holds by FLOPs and by bytes; the smaller is kept."""
    room = sum(rates.usable[i] for i in members)
    most = min(gpus, room // max(1, rates.weight_bytes))
    if most < 1:
        return 0
    o = w.output_tokens
    cyc = min(rates.cycle_floor([i]) for i in members)
    budget = max(0.0, (w.tpot_s - cyc) * o)
    each = users_bound(rates, members, w)
    bw = sum(rates.bandwidth[i] for i in members)
    kv = rates.kv_read_per_request / bw if bw > 0 else 0.0
    found = []
    for path in (1, 2):  # TTFT0 floors by FLOPs, then by bytes
        caps: list[float] = []
        speed = 0.0
        shares: list[tuple[float, float]] = []
        for i in members:
            leads = rates.lead_ttft0(i)
            for lead in leads:
                cap = math.inf if lead[path] <= 0 else budget / lead[path]
                caps += [min(float(each), cap)] * (rates.gpus[i] // lead[0])
            speed += rates.prefill_speed(i, path)
            held = rates.usable[i] / max(1, rates.weight_bytes)
            shares.append((min(lead[path] for lead in leads), each * held))
        caps.sort(reverse=True)
        shares.sort()
        best = 0.0
        top = 0.0
        for r in range(1, most + 1):
            top += caps[r - 1] if r <= len(caps) else 0.0
            left = room - r * rates.weight_bytes
            mem = math.inf if rates.kv_per_request == 0 else left // rates.kv_per_request
            best = max(best, min(mem, top, _fill(shares, r * budget)))
        den = kv + (1.0 / (o * speed) if speed > 0 else math.inf)
        if den > 0:
            best = min(best, w.tpot_s / den)
        found.append(math.floor(best + 1e-9))
    return min(found)


def _fill(items: Sequence[tuple[float, float]], budget: float) -> float:
    """The most units a budget buys of items (cost per unit, units) in cost order."""
    got = 0.0
    for cost, units in items:
        if cost <= 0:
            return math.inf
        take = min(units, budget / cost)
        got += take
        budget -= take * cost
        if budget <= 0:
            break
    return got
