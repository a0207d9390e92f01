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
from stowplan.cost.touch import expert_touch_bytes
from stowplan.model import Constraints, ModelLayout, NodeDescriptor
from stowplan.quantities.limits import MAX_BATCH
from stowplan.workload import Workload

__all__ = ["FleetRates", "rate_bound", "users_bound"]


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
