"""An independent referee for serving capacity, written from issue 23's formulas.

It shares no code with :mod:`stowplan.cost` or :mod:`stowplan.serving`: only the
public inputs (:class:`~stowplan.model.ModelLayout` and
:class:`~stowplan.model.NodeDescriptor` fields, the headroom of
:class:`~stowplan.model.Constraints`).  Nodes must state their bandwidth and FLOPs
(no spec-table look-up here); a node with ``num_gpus > 1`` is one stage on all its
GPUs (``tp = num_gpus``) and must state its intra-node link.

For one pipeline (nodes in stage order, block bounds) and a workload (prompt ``P``,
output ``O``):

* decode, microbatch of ``u`` sequences, stage ``s`` on blocks ``[lo, hi)``::

      read(s, u) = Σ_b read_b(u) + head·[last] + u · Σ_b kv_b · min(C, window_b)
      t(s, u)    = max(read(s, u) / BW, 2 · params_1(s) · u / F) + (hi − lo) · 2 · AR_u(tp)
                   + [s < S−1] · u · hidden · act / link(s)
      read_b(u)  = dense_b + E · (1 − (1 − k/E)^u) · expert  (MoE block; dense_b the block
                   less its routed experts), the block's per-token read otherwise
      C          = P + O/2

  (``BW``, ``F`` are the node's, i.e. ``tp`` GPUs'; ``params_1`` the active
  parameters one token multiplies through: the per-token read bytes times the layout's
  parameters per byte, the head on the last stage);
* ``U`` sequences: ``m = min(U, S)`` microbatches of ``u = ⌈U/m⌉``;
  ``cycle(U) = max(Σ_s t(s, u) + Σ_s latency(s → s+1 mod S), m · max_s t(s, u))``
  (no hop for ``S = 1``);
* prefill of one prompt: ``pre(s) = max(read_P(s) / BW, (2 · params_1(s) · P
  + 2 · Σ_b P · min(P, window_b) · A + 2 · head_params · [last]) / F)
  + (hi − lo) · 2 · AR_P(tp) + [s < S−1] · P · hidden · act / link(s)``, ``read_P``
  the blocks as P tokens read them plus the head on the last stage, ``A`` the
  attention width (``num_attention_heads × head_dim`` when the layout states both,
  else ``hidden_dim``);
  ``TTFT0 = Σ pre(s) + Σ_{s < S−1} latency(s)``;
* ``TPOT(U) = cycle(U) + U · TTFT0 / O``, ``TTFT(U) = TTFT0 + cycle(U)``; memory: each
  stage holds its blocks, embed (first), head (last) and ``U · Σ_b kv_b · min(P + O,
  window_b)``; ``U*`` the largest U meeting both SLOs and memory.

``cycle(U)`` never decreases with ``U`` (up to ``S`` sequences every one adds a
microbatch at ``u = 1``; beyond, ``u`` only grows and ``t`` grows with ``u``), so the
feasible ``U`` are ``1 … U*``: :meth:`Referee.max_users` bisects (and tries every U
with ``exhaustive=True``, to test that claim).

The brute force tries every ordered subset of nodes and every contiguous block split
for a replica, then every set of disjoint replicas (a node may stay unused).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache

from stowplan import ModelLayout, NodeDescriptor

DEFAULT_HEADROOM = 0.2
"""Constraints().headroom: the share of VRAM a plan leaves free."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    """The workload the referee serves (the fields of ``stowplan.Workload`` it uses)."""

    prompt_tokens: int
    output_tokens: int
    ttft_s: float
    tpot_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """A node's numbers in SI units, read from its descriptor."""

    bw: float
    """Bytes/s of all its GPUs."""
    flops: float
    link: float
    """Bytes/s of its network link (``inf`` when ``link_mbps`` is 0)."""
    latency: float
    usable: int
    price: float | None
    tp: int
    intra_bw: float
    intra_latency: float


def node_of(d: NodeDescriptor, headroom: float = DEFAULT_HEADROOM) -> Node:
    """The referee's reading of descriptor ``d`` (its bandwidth and FLOPs must be given)."""
    if d.mem_bandwidth_gbps is None or d.flops_estimate <= 0:
        raise ValueError(f"{d.id}: the referee needs mem_bandwidth_gbps and flops_estimate")
    tp = d.num_gpus
    if tp > 1 and (d.intra_link_gbps is None or d.intra_link_latency_us is None):
        raise ValueError(f"{d.id}: a multi-GPU node needs its intra-node link")
    return Node(
        bw=d.mem_bandwidth_gbps * 1e9,
        flops=d.flops_estimate * 1e12,
        link=d.link_mbps * 1e6 / 8 if d.link_mbps > 0 else math.inf,
        latency=d.link_latency_ms / 1e3,
        usable=math.floor(d.vram_bytes * (1 - headroom)),
        price=d.price_per_hour,
        tp=tp,
        intra_bw=(d.intra_link_gbps or 0.0) * 1e9,
        intra_latency=(d.intra_link_latency_us or 0.0) / 1e6,
    )


def experts_touched(num_experts: int, k: int, tokens: int) -> float:
    """Expected distinct experts ``tokens`` tokens read under uniform top-``k`` routing."""
    return num_experts * (1 - (1 - k / num_experts) ** tokens)


class Referee:
    """The serving formulas of issue 23 for one model on one fleet."""

    def __init__(
        self,
        model: ModelLayout,
        nodes: Sequence[NodeDescriptor],
        load: Load,
        headroom: float = DEFAULT_HEADROOM,
    ) -> None:
        self.model = model
        self.load = load
        self.nodes = [node_of(d, headroom) for d in nodes]
        nb = model.num_blocks
        self.sizes = (
            list(model.block_bytes) if model.block_bytes else [model.block_params_bytes] * nb
        )
        self.reads = list(model.block_read_bytes) if model.block_read_bytes else list(self.sizes)
        self.kv = list(model.kv_bytes_per_token or [0] * nb)
        self.window = list(model.kv_window_tokens or [None] * nb)
        read_all = sum(self.reads) + model.head_params_bytes + model.embed_params_bytes
        if model.active_params and read_all:
            self.params_per_byte = model.active_params / read_all
        elif model.total_params:
            self.params_per_byte = model.total_params / model.weight_bytes
        else:
            self.params_per_byte = 0.5  # two bytes a parameter (bf16)
        self.act = model.hidden_dim * model.bytes_per_activation_elem
        self.mean_context = load.prompt_tokens + load.output_tokens / 2

    # -- one block ------------------------------------------------------------------
    def block_read(self, b: int, tokens: int) -> float:
        """Bytes block ``b`` reads for ``tokens`` tokens at once (the expert-touch rule)."""
        ex = self.model.experts
        if ex is None or b not in ex.moe_blocks:
            return float(self.reads[b])
        dense = self.sizes[b] - ex.num_experts * ex.expert_params_bytes
        touched = experts_touched(ex.num_experts, ex.experts_per_token, tokens)
        return dense + touched * ex.expert_params_bytes

    def kv_tokens(self, b: int, context: float) -> float:
        w = self.window[b]
        return context if w is None else min(context, w)

    def all_reduce(self, n: Node, tokens: int) -> float:
        if n.tp == 1:
            return 0.0
        return n.intra_latency + 2 * (n.tp - 1) / n.tp * tokens * self.act / n.intra_bw

    # -- one stage ------------------------------------------------------------------
    def decode_stage(self, d: int, lo: int, hi: int, last: bool, u: int) -> float:
        """t(s) of a microbatch of ``u`` sequences, its outbound transfer included."""
        n, head = self.nodes[d], self.model.head_params_bytes
        weights = sum(self.block_read(b, u) for b in range(lo, hi)) + (head if last else 0)
        kv = u * sum(self.kv[b] * self.kv_tokens(b, self.mean_context) for b in range(lo, hi))
        active = sum(self.reads[lo:hi]) + (head if last else 0)
        compute = 2 * active * self.params_per_byte * u / n.flops
        t = max((weights + kv) / n.bw, compute) + (hi - lo) * 2 * self.all_reduce(n, u)
        return t if last else t + u * self.act / n.link

    def prefill_stage(self, d: int, lo: int, hi: int, last: bool) -> float:
        """pre(s): one prompt of P tokens, its outbound transfer included."""
        n, p, head = self.nodes[d], self.load.prompt_tokens, self.model.head_params_bytes
        read = sum(self.block_read(b, p) for b in range(lo, hi)) + (head if last else 0)
        params = sum(self.reads[lo:hi]) * self.params_per_byte
        m = self.model
        width = (
            m.num_attention_heads * m.head_dim
            if m.num_attention_heads and m.head_dim
            else m.hidden_dim
        )
        attention = sum(2 * p * self.kv_tokens(b, p) * width for b in range(lo, hi))
        head_flops = 2 * head * self.params_per_byte if last else 0.0
        t = max(read / n.bw, (2 * params * p + attention + head_flops) / n.flops)
        t += (hi - lo) * 2 * self.all_reduce(n, p)
        return t if last else t + p * self.act / n.link

    def stage_memory(self, lo: int, hi: int, first: bool, last: bool, users: int) -> float:
        ctx = self.load.prompt_tokens + self.load.output_tokens
        held = sum(self.sizes[lo:hi]) + (self.model.embed_params_bytes if first else 0)
        held += self.model.head_params_bytes if last else 0
        return held + users * sum(self.kv[b] * self.kv_tokens(b, ctx) for b in range(lo, hi))

    # -- one pipeline ---------------------------------------------------------------
    def cycle(self, order: Sequence[int], bounds: Sequence[int], users: int) -> float:
        s = len(order)
        m = min(users, s)
        u = -(-users // m)
        times = [
            self.decode_stage(d, bounds[i], bounds[i + 1], i == s - 1, u)
            for i, d in enumerate(order)
        ]
        hops = sum(self.nodes[d].latency for d in order) if s > 1 else 0.0
        return max(sum(times) + hops, m * max(times))

    def ttft0(self, order: Sequence[int], bounds: Sequence[int]) -> float:
        s = len(order)
        pre = sum(
            self.prefill_stage(d, bounds[i], bounds[i + 1], i == s - 1) for i, d in enumerate(order)
        )
        return pre + sum(self.nodes[d].latency for d in order[:-1])

    def tpot(self, order: Sequence[int], bounds: Sequence[int], users: int) -> float:
        return self.cycle(order, bounds, users) + users * self.ttft0(order, bounds) / (
            self.load.output_tokens
        )

    def ttft(self, order: Sequence[int], bounds: Sequence[int], users: int) -> float:
        return self.ttft0(order, bounds) + self.cycle(order, bounds, users)

    def fits(self, order: Sequence[int], bounds: Sequence[int], users: int) -> bool:
        s = len(order)
        return all(
            self.stage_memory(bounds[i], bounds[i + 1], i == 0, i == s - 1, users)
            <= self.nodes[d].usable
            for i, d in enumerate(order)
        )

    def meets(self, order: Sequence[int], bounds: Sequence[int], users: int) -> bool:
        """Whether ``users`` requests meet both SLOs and the memory on this pipeline."""
        if not self.fits(order, bounds, users):
            return False
        t0 = self.ttft0(order, bounds)
        c = self.cycle(order, bounds, users)
        return (
            t0 + c <= self.load.ttft_s
            and c + users * t0 / self.load.output_tokens <= self.load.tpot_s
        )

    def max_users(
        self, order: Sequence[int], bounds: Sequence[int], *, exhaustive: bool = False
    ) -> int:
        """U* of the pipeline (0 when not even one request fits).

        TPOT(U) ≥ U · TTFT0 / O bounds U; the feasible U being ``1 … U*`` (see the
        module), U* is found by bisection; ``exhaustive`` tries every U up to the bound
        one by one instead (for the tests of this very claim)."""
        t0 = self.ttft0(order, bounds)
        limit = math.floor(self.load.tpot_s * self.load.output_tokens / t0) if t0 > 0 else 10**6
        limit = min(limit, 10**6)
        if exhaustive:
            return max((u for u in range(1, limit + 1) if self.meets(order, bounds, u)), default=0)
        if limit < 1 or not self.meets(order, bounds, 1):
            return 0
        lo, hi = 1, limit + 1  # meets(lo), not meets(hi) (or hi past the bound)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.meets(order, bounds, mid) else (lo, mid)
        return lo

    def rate(self, order: Sequence[int], bounds: Sequence[int], users: int) -> float:
        """Requests/s of ``users`` requests: U / (O · TPOT(U))."""
        if users == 0:
            return 0.0
        return users / (self.load.output_tokens * self.tpot(order, bounds, users))

    # -- brute force ----------------------------------------------------------------
    def pipelines(self, members: Sequence[int]) -> Iterator[tuple[tuple[int, ...], list[int]]]:
        """Every pipeline on exactly the nodes ``members``: each order, each split."""
        nb, s = self.model.num_blocks, len(members)
        if s > nb:
            return
        for order in itertools.permutations(members):
            for cuts in itertools.combinations(range(1, nb), s - 1):
                yield order, [0, *cuts, nb]

    def best_replica(self, members: Sequence[int]) -> tuple[int, float]:
        """The most users, and (on its own) the most requests/s, one replica on exactly
        the nodes ``members`` serves."""
        return self._best_replica(tuple(sorted(members)))

    @cache  # noqa: B019 - one referee per example; the cache dies with it
    def _best_replica(self, members: tuple[int, ...]) -> tuple[int, float]:
        users, rate = 0, 0.0
        for order, bounds in self.pipelines(members):
            u = self.max_users(order, bounds)
            users, rate = max(users, u), max(rate, self.rate(order, bounds, u))
        return users, rate

    def fleet_users(self, mask: int | None = None) -> int:
        """The most users disjoint replicas of the nodes in bit set ``mask`` (None: all)
        serve."""
        return self._partition(self._full if mask is None else mask)[0]

    def fleet_rate(self, mask: int | None = None) -> float:
        """The most requests/s disjoint replicas serve, each at its own U*."""
        return self._partition(self._full if mask is None else mask)[1]

    @property
    def _full(self) -> int:
        return (1 << len(self.nodes)) - 1

    @cache  # noqa: B019
    def _partition(self, mask: int) -> tuple[int, float]:
        """(most users, most requests/s) over disjoint replicas inside ``mask``, each
        objective maximised on its own: the lowest node either stays unused or joins a
        replica with any subset of the others."""
        if mask == 0:
            return (0, 0.0)
        low = mask & -mask
        rest = mask ^ low
        best_users, best_rate = self._partition(rest)
        sub = rest
        while True:
            group = sub | low
            u, r = self.best_replica([i for i in range(len(self.nodes)) if group >> i & 1])
            if u > 0:
                left = self._partition(mask ^ group)
                best_users = max(best_users, u + left[0])
                best_rate = max(best_rate, r + left[1])
            if sub == 0:
                break
            sub = (sub - 1) & rest
        return (best_users, best_rate)

    def cheapest(self, users: int) -> float:
        """The least $/h of a node set whose disjoint replicas serve ``users`` (inf: none)."""
        best = math.inf
        for mask in range(1, 1 << len(self.nodes)):
            prices = [self.nodes[i].price for i in range(len(self.nodes)) if mask >> i & 1]
            if any(p is None for p in prices):
                continue
            price = sum(p for p in prices if p is not None)
            if price < best and self._partition(mask)[0] >= users:
                best = price
        return best


def share_target(
    ref: Referee, nodes: Sequence[NodeDescriptor], share: float, by_rate: bool
) -> tuple[float, float]:
    """A target of ``share`` of the most the fleet serves (requests/s with ``by_rate``,
    else whole users) and the least $/h of nodes reaching it (a node without a price
    rents for nothing); the example is rejected where the target is empty."""
    from hypothesis import assume

    if by_rate:
        target = ref.fleet_rate() * share
        assume(target > 0)
        cheapest = min(
            sum(nodes[i].price_per_hour or 0.0 for i in range(len(nodes)) if mask >> i & 1)
            for mask in range(1, 1 << len(nodes))
            if ref.fleet_rate(mask) >= target
        )
        return target, cheapest
    users = math.floor(ref.fleet_users() * share)
    assume(users >= 1)
    return float(users), ref.cheapest(users)
