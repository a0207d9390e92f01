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
    rows: list[list[float]] = []
    rhs: list[float] = []
    need = rates.weight_bytes + users * rates.kv_per_request
    rows.append([-float(u) for u in rates.usable])
    rhs.append(-float(need))
    for path in (1, 2):
        speed = [min(rates.prefill_speed(i, path), HUGE) for i in range(n)]
        if a <= 0:  # no KV read: the prefill speed alone, S ≥ c / t
            rows.append([-v for v in speed])
            rhs.append(-c / t)
            continue
        bandwidth = [min(b, HUGE) for b in rates.bandwidth]
        for k in range(1, TANGENTS + 1):
            lam = k / (TANGENTS + 1)
            b0, s0 = a / (lam * t), c / ((1 - lam) * t)
            rows.append([-(a / b0**2 * bandwidth[i] + c / s0**2 * speed[i]) for i in range(n)])
            rhs.append(-t)
    res = linprog(c=list(prices), A_ub=rows, b_ub=rhs, bounds=[(0.0, 1.0)] * n, method="highs")
    if res.status != 0:
        return None
    return float(res.fun)
