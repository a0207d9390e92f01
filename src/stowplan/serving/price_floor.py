"""A lower bound on the $/h of any set of replicas reaching a target, for fleets too
large to bound composition by composition.

Replicas ``r`` on disjoint nodes, each of pooled bandwidth ``B_r`` and prefill speed
``S_r`` (prompts per second, :meth:`~stowplan.serving.bounds.FleetRates.prefill_speed`)
serving ``U_r`` requests: a decode cycle reads at least their KV (``U_r · K / B_r``, K
the KV a step reads per request) and TTFT0 ≥ 1 / S_r, so ``TPOT_r ≤ tpot`` needs
``U_r · K / B_r + U_r / (O · S_r) ≤ tpot``, and a replica's requests/s
``U_r / (O · TPOT_r)`` is at most ``1 / (O · K / B_r + 1 / S_r)``.  Both right-hand
sides are concave and 1-homogeneous in ``(B, S)``, so their sums over the replicas are
at most their values at the nodes' summed ``B = Σ x_i B_i`` and ``S = Σ x_i S_i``
(``x_i`` = 1 for a node used).  Reaching ``U`` users needs
``U·K / B + U / (O·S) ≤ tpot``; ``R`` requests/s needs ``O·K·R / B + R / S ≤ 1``;
both are ``a / B + c / S ≤ t``, a convex set of ``(B, S)`` that lies on the far side
of each of its tangents ``(a / B0²) B + (c / S0²) S ≥ t`` (at ``a / B0 = λ t``,
``c / S0 = (1 − λ) t``).  With the memory (one copy of the weights and the users' KV)
that makes a linear programme over ``0 ≤ x_i ≤ 1``: its least ``Σ x_i · price_i``
bounds the price of every set of replicas that reaches the target, by FLOPs and by
bytes alike.

For a users target, every replica also reads its weights once a cycle (``W`` bytes, the
weights one decoded token reads): ``(W + U_r · K) / B_r + U_r / (O · S_r) ≤ tpot``, and
``TTFT`` holds ``(W + U_r · K) / B_r + 1 / S_r ≤ ttft``.  Times ``B_r``, with
``B_r / S_r ≥ ρ`` (the least bandwidth over prefill speed of any GPU group: a ratio of
sums is at least the least ratio of its parts), the sums over ``r`` replicas give the
linear rows ``tpot · B ≥ r · W + U · K + U · ρ / O`` and
``ttft · B ≥ r · (W + ρ) + U · K``: what the pooled form leaves out, a copy of the
weights read at every step.

A replica prefills one prompt at a time through its stages, so its TTFT0 is at least
the floor of its cheapest GPU group (:meth:`~stowplan.serving.bounds.FleetRates.lead_floor`:
every block at that group's least cost, bytes and FLOPs at once), and its cycle at least
the fleet's least read of every weight, ``c``: ``U_r / (O · TTFT0_r) ≤ tpot − c`` caps its
users at ``(tpot − c) · O / lead_g`` and its requests/s at ``1 / lead_g``, ``g`` its
leading group, and a group whose floor is above ``ttft − c`` leads none.  The programme
gains a variable ``y_g`` per GPU group ``g`` (its share as a leader; a node's leaders take
no more GPUs than it has, and only when it is rented) and the replica count
``r = Σ_g y_g ≥ 1``: the target is at most the leaders' caps, and the memory and
weight-read rows charge ``r`` copies of the weights.
"""

from __future__ import annotations

from collections.abc import Sequence

from stowplan.serving.bounds import FleetRates
from stowplan.workload import Workload

__all__ = ["TANGENTS", "price_floor"]

TANGENTS = 19
"""Tangent points ``λ = 1/20 … 19/20`` per prefill path."""

HUGE = 1e30
"""Stands for an unbounded rate (a node of unknown speed) in the programme."""


def price_floor(
    rates: FleetRates, prices: Sequence[float], w: Workload, target: float, *, by_rate: bool
) -> float | None:
    """The least $/h of the linear programme of the module for ``target`` users (or
    requests/s with ``by_rate``) on every node of ``rates`` (``prices`` per node);
    None without scipy or when the programme finds nothing (then nothing is bounded)."""
    try:
        from scipy.optimize import linprog
    except ImportError:  # pragma: no cover - scipy ships with the exact extra
        return None
    n = len(prices)
    o, kv = w.output_tokens, rates.kv_read_per_request
    if by_rate:
        a, c, t = o * kv * target, target, 1.0
        users = 1.0
    else:
        a, c, t = kv * target, target / o, w.tpot_s
        users = target
    # Columns: x_i per node, y_g per GPU group as a replica's leader, then r.
    groups = [(i, lead) for i in range(n) for lead in rates.lead_floor(i)]
    g = len(groups)

    def row(
        nodes: Sequence[float], leaders: dict[int, float] | None = None, r: float = 0.0
    ) -> list[float]:
        full = [*nodes, *([0.0] * g), r]
        for col, v in (leaders or {}).items():
            full[col] = v
        return full

    rows: list[list[float]] = []
    rhs: list[float] = []
    rows.append(row([-float(u) for u in rates.usable], r=float(rates.weight_bytes)))
    rhs.append(-float(users * rates.kv_per_request))
    bounds = [(0.0, 1.0)] * n
    # Every replica's cycle is at least the fleet's least read of every weight.
    cycle = min(rates.decode_s, default=0.0)
    caps = []
    for _, (_, floor) in groups:
        each = (1.0 if by_rate else max(0.0, t - cycle) * o) / max(floor, 1.0 / HUGE)
        caps.append(min(HUGE, each))
        bounds.append((0.0, 0.0 if floor + cycle > w.ttft_s else HUGE))
    # The target is at most the leaders' caps.
    rows.append(row([0.0] * n, {n + k: -caps[k] for k in range(g)}))
    rhs.append(-target)
    # A node's leaders fit its GPUs, on a rented node.
    for i in range(n):
        nodes = [0.0] * n
        nodes[i] = -float(rates.gpus[i])
        rows.append(
            row(nodes, {n + k: float(lead[0]) for k, (j, lead) in enumerate(groups) if j == i})
        )
        rhs.append(0.0)
    # One leader per replica.
    eq_rows = [row([0.0] * n, {n + k: 1.0 for k in range(g)}, r=-1.0)]
    for path in (1, 2):
        speed = [min(rates.prefill_speed(i, path), HUGE) for i in range(n)]
        if not by_rate:
            rho = min(rates.bandwidth_per_speed(i, path) for i in range(n))
            for slo, each, prefill in (
                (w.tpot_s, rates.decode_read, target * rho / o),
                (w.ttft_s, rates.decode_read + rho, 0.0),
            ):
                rows.append(row([-slo * min(b, HUGE) for b in rates.bandwidth], r=each))
                rhs.append(-(kv * target + prefill))
        if a <= 0:  # no KV read: the prefill speed alone, S ≥ c / t
            rows.append(row([-v for v in speed]))
            rhs.append(-c / t)
            continue
        bandwidth = [min(b, HUGE) for b in rates.bandwidth]
        for k in range(1, TANGENTS + 1):
            lam = k / (TANGENTS + 1)
            b0, s0 = a / (lam * t), c / ((1 - lam) * t)
            rows.append(row([-(a / b0**2 * bandwidth[i] + c / s0**2 * speed[i]) for i in range(n)]))
            rhs.append(-t)
    bounds.append((1.0, HUGE))
    res = linprog(
        c=[*prices, *([0.0] * (g + 1))],
        A_ub=rows,
        b_ub=rhs,
        A_eq=eq_rows,
        b_eq=[0.0],
        bounds=bounds,
        method="highs",
    )
    if res.status != 0:
        return None
    return float(res.fun)
