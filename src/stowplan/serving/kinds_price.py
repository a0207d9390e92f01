"""A lower bound on the $/h of disjoint replicas reaching a target on a fleet too large
to bound composition by composition: the mirror of the kinds programme of
:mod:`~stowplan.serving.kinds_bound`.

The nodes fall into ``T`` types; node ``i`` of type ``t`` rents at ``p[i]``.  With the
kinds of that module (every composition ``c`` of at most ``K`` nodes, serving at most
``v[c]`` users or requests/s; a large replica of first type ``f`` at most ``V[f]``)::

    min  Σ_i p[i]·n[i]
    s.t. Σ_c v[c]·x[c] + Σ_f V[f]·y[f] ≥ target
         Σ_c c[t]·x[c] + Σ_{f ≤ t} z[f][t] ≤ Σ_{i of type t} n[i]      every type t
         z[f][f] ≥ y[f],  Σ_{t ≥ f} z[f][t] ≥ (K + 1)·y[f]            every f
         0 ≤ n ≤ 1,  x, y, z ≥ 0

Any set of disjoint replicas reaching the target is a feasible point: ``n[i]`` = 1 for
the nodes they rent, ``x[c]`` the replicas of kind ``c``, ``y[f]`` the large ones of
first type ``f`` and ``z[f][t]`` the nodes of type ``t`` these hold.  Their users (or
requests/s) are at most the first row's left side, which is therefore at least the
target, and each type's nodes they take are rented.  The objective there is their
$/h, so the optimum (of the relaxation over the reals) bounds the price of every such
set from below.  So does any bound proved on the same programme with every column
whole (the replicas, the large replicas' nodes and the nodes rented are counts), which
HiGHS solves for a moment once the relaxation's kinds are refined: a replica of 97 users
then takes a whole node where the relaxation rented a tenth of one.  What it adds to
the pooled floor of
:mod:`~stowplan.serving.price_floor` is that every replica is charged the nodes it
needs to hold the weights and serves no more than a replica of its kind can.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from stowplan.model import Constraints, ModelLayout, NodeDescriptor
from stowplan.planner.exact.highs import milp
from stowplan.serving.kinds_bound import KIND_LIMIT, FleetKinds, kind_columns, kind_rows
from stowplan.workload import Workload

__all__ = ["REFINE_LIMIT", "fleet_kinds_price_floor", "kinds_price_floor"]

REFINE_LIMIT = 24
"""Most kinds refined."""

MILP_NODES = 200
"""Most branch-and-bound nodes of the programme with whole columns (its best bound so
far is kept): a count, so the floor is the same on every machine."""

MILP_SECONDS = 2.0
"""A safety cap on the time of the programme with whole columns (the node count is
meant to end it first)."""

WHOLE_ROUNDS = 4
"""Most times the programme with whole columns is solved (the kinds its point uses
refined between)."""


def kinds_price_floor(
    prices: Sequence[Sequence[float]],
    bound: Callable[[tuple[int, ...], int], float],
    order: Sequence[int],
    target: float,
    *,
    refine: Callable[[tuple[int, ...]], float | None] | None = None,
    limit: int = KIND_LIMIT,
) -> float | None:
    """The optimum of the module's programme for types whose nodes rent at ``prices[t]``,
    ``bound(c, s)`` per composition (for replicas on at least ``s`` of its nodes, as
    :func:`~stowplan.serving.kinds_bound.kinds_users_bound` takes it), the large kinds'
    types in ``order`` and ``target``; None without scipy or when no set of the kinds
    reaches the target (then nothing is bounded).  ``refine(c)``, when given, is a
    smaller bound of a kind the programme uses (None: none smaller); those are put in
    and the programme solved again, until it uses none it has not refined or
    :data:`REFINE_LIMIT` are: a smaller column only raises the optimum.  Then the same
    with whole columns, the kinds of its best point refined, up to :data:`WHOLE_ROUNDS`
    times.  The floor is the largest bound of all these programmes."""
    try:
        import numpy as np
        from scipy.optimize import linprog
    except ImportError:  # pragma: no cover - scipy ships with the exact extra
        return None
    counts = [len(p) for p in prices]
    combos, most, values, large = kind_columns(counts, bound, order, limit)
    n_types = len(counts)
    refined: set[tuple[int, ...]] = set()
    low, rounds = -math.inf, 0
    while True:
        used = [c for c in combos if values[c] > 0]
        # Columns: the kinds programme's (x, y, z), then n per node rented.
        block, served = kind_rows(np, used, values, large, order, most, n_types)
        rented = block.shape[1]
        if rented == 0:
            return None
        cols = rented + sum(counts)
        obj = np.zeros(cols)
        obj[rented:] = [p for ps in prices for p in ps]
        rows = np.zeros((1 + block.shape[0], cols))
        rhs = np.zeros(rows.shape[0])
        rows[0, :rented] = -served
        rhs[0] = -target
        rows[1:, :rented] = block
        at = rented
        for t in range(n_types):
            rows[1 + t, at : at + counts[t]] = -1.0
            at += counts[t]
        bounds = [(0.0, None)] * rented + [(0.0, 1.0)] * (cols - rented)
        if rounds == 0:
            res = linprog(obj, A_ub=rows, b_ub=rhs, bounds=bounds, method="highs")
            if res.status != 0 or not math.isfinite(res.fun):
                return None
            got, x = float(res.fun), res.x
        else:
            got, x = _integral_floor(obj, rows, rhs, bounds)
        # A column only shrinks: every programme solved bounds the price.
        low = max(low, got)
        fresh = False
        for j, c in enumerate(used):
            if x is None or refine is None or x[j] <= 1e-9 or c in refined:
                continue
            if len(refined) >= REFINE_LIMIT:
                break
            refined.add(c)
            smaller = refine(c)
            if smaller is not None and smaller < values[c]:
                values[c], fresh = max(0.0, smaller), True
        if not fresh:
            if rounds > 0:
                return low
            rounds = 1  # the relaxation is settled: now with whole columns
        elif rounds > 0:
            rounds += 1
            if rounds > WHOLE_ROUNDS:
                return low


def _integral_floor(
    obj: Any, rows: Any, rhs: Any, bounds: Sequence[tuple[float, float | None]]
) -> tuple[float, Any]:
    """The best bound HiGHS proves within :data:`MILP_NODES` nodes on the programme with
    every column whole (replicas, large replicas' nodes and the nodes rented are counts:
    every set of disjoint replicas is still a point of it) and the best point it found;
    (-inf, None) where it proves nothing."""
    from scipy.optimize import Bounds, LinearConstraint

    lo = [b[0] for b in bounds]
    hi = [math.inf if b[1] is None else b[1] for b in bounds]
    res = milp(
        obj,
        constraints=LinearConstraint(rows, -math.inf, rhs),
        bounds=Bounds(lo, hi),
        integrality=[1] * len(obj),
        options={"node_limit": MILP_NODES, "time_limit": MILP_SECONDS},
    )
    dual = getattr(res, "mip_dual_bound", None)
    if res.status not in (0, 1) or dual is None or not math.isfinite(dual):
        return -math.inf, None
    return float(dual), res.x


def fleet_kinds_price_floor(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    w: Workload,
    c: Constraints,
    target: float,
    *,
    by_rate: bool,
    limit: int = KIND_LIMIT,
) -> float | None:
    """A lower bound on the $/h of any disjoint replicas of ``model`` on ``nodes``
    serving ``target`` users (requests/s with ``by_rate``) of ``w``; None without scipy
    or when the kinds reach no such target: :func:`kinds_price_floor` over the columns
    of :class:`~stowplan.serving.kinds_bound.FleetKinds`, refined where the programme
    uses them.  A node without a price rents for nothing."""
    fk = FleetKinds(model, nodes, w, c, by_rate=by_rate)
    prices = [[n.price_per_hour or 0.0 for n in members] for members in fk.types]
    return kinds_price_floor(prices, fk.bound, fk.order, target, refine=fk.refine, limit=limit)
