"""Disjoint replicas out of candidate compositions: the most users, or the least $/h.

Candidate ``r`` takes ``n[r][k]`` nodes of class ``k`` (which has ``N[k]``) and
serves ``value[r]`` (users, or requests/s); it costs ``price[r]``/h.  Copies
``x[r]`` are chosen by an integer program (scipy's HiGHS)::

    users: max Σ value·x   s.t. Σ_r n[r][k]·x[r] ≤ N[k]
    price: min Σ price·x   s.t. the same, Σ value·x ≥ target

or, without scipy, greedily (most value per node; least price per value).  The same
program over *bounds* of every composition's value bounds the optimum
(:func:`bound_users`, :func:`bound_price`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from stowplan.errors import DependencyError
from stowplan.planner.exact.highs import milp

__all__ = ["bound_price", "bound_users", "pack_price", "pack_users"]


def _milp(
    counts: Sequence[Sequence[int]],
    sizes: Sequence[int],
    objective: Sequence[float],
    cover: tuple[Sequence[float], float] | None,
    integral: bool = True,
    *,
    proven: bool = False,
) -> list[int] | None:
    """``x`` minimising ``objective·x`` within the class sizes (and ``cover``: values·x ≥
    target); None when infeasible (or, with ``proven``, not proven optimal within the
    time limit).  Raises :class:`DependencyError` without scipy."""
    try:
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint
    except ImportError:
        raise DependencyError("scipy", "exact") from None
    r = len(objective)
    a = np.array(counts, dtype=float).T.reshape(len(sizes), r)
    cons = [LinearConstraint(a, -np.inf, np.asarray(sizes, dtype=float))]
    if cover is not None:
        values, target = cover
        cons.append(LinearConstraint(np.asarray(values, dtype=float)[None, :], target, np.inf))
    upper = [
        min((s // c for s, c in zip(sizes, col, strict=True) if c > 0), default=0) for col in counts
    ]
    res = milp(
        np.asarray(objective, dtype=float),
        constraints=cons,
        integrality=np.ones(r) if integral else np.zeros(r),
        bounds=Bounds(np.zeros(r), np.asarray(upper, dtype=float)),
        options={"disp": False, "time_limit": 20.0},
    )
    if res.x is None or res.status not in ((0,) if proven else (0, 1)):
        return None
    if not integral:
        return [float(v) for v in res.x]  # type: ignore[misc]
    return [round(v) for v in res.x]


def _milp_bound(
    counts: Sequence[Sequence[int]],
    sizes: Sequence[int],
    objective: Sequence[float],
    cover: tuple[Sequence[float], float] | None,
) -> tuple[float, Sequence[float]] | None:
    """The least ``objective·x`` the program can reach, proven, and its ``x``: the optimum
    when HiGHS proves it, else the LP relaxation's (a time limit never passes off a mere
    feasible point as a bound).  None when infeasible; raises :class:`DependencyError`."""
    x: Sequence[float] | None = _milp(counts, sizes, objective, cover, proven=True)
    if x is None:
        x = _milp(counts, sizes, objective, cover, integral=False)
        if x is None:
            return None
    return float(sum(c * v for c, v in zip(objective, x, strict=True))), x


def _greedy(
    counts: Sequence[Sequence[int]],
    sizes: Sequence[int],
    order: Sequence[int],
    enough: float | None,
    values: Sequence[float],
) -> list[int]:
    left = list(sizes)
    x = [0] * len(counts)
    got = 0.0
    for r in order:
        while all(c <= s for c, s in zip(counts[r], left, strict=True)) and (
            enough is None or got < enough
        ):
            x[r] += 1
            got += values[r]
            left = [s - c for s, c in zip(left, counts[r], strict=True)]
            if not any(counts[r]):
                break
    return x


def pack_users(
    counts: Sequence[Sequence[int]], sizes: Sequence[int], users: Sequence[float]
) -> tuple[list[int], str]:
    """Copies of each candidate serving the most users, and the method's name."""
    if not counts:
        return [], "none"
    try:
        x = _milp(counts, sizes, [-u for u in users], None)
        if x is not None:
            return x, "integer program (HiGHS)"
    except DependencyError:
        pass
    order = sorted(range(len(counts)), key=lambda r: -users[r] / max(1, sum(counts[r])))
    return _greedy(counts, sizes, order, None, users), "greedy (most users per node)"


def pack_price(
    counts: Sequence[Sequence[int]],
    sizes: Sequence[int],
    values: Sequence[float],
    prices: Sequence[float],
    target: float,
) -> tuple[list[int] | None, str]:
    """Copies of each candidate reaching ``target`` at the least $/h (None: no mix does)."""
    if not counts:
        return None, "none"
    try:
        return _milp(counts, sizes, prices, (values, target)), "integer program (HiGHS)"
    except DependencyError:
        pass
    order = sorted(
        range(len(counts)), key=lambda r: prices[r] / values[r] if values[r] > 0 else math.inf
    )
    x = _greedy(counts, sizes, order, target, values)
    if sum(v * c for v, c in zip(values, x, strict=True)) < target:
        return None, "greedy (least $/h per user)"
    return x, "greedy (least $/h per user)"


def bound_users(
    counts: Sequence[Sequence[int]], sizes: Sequence[int], bounds: Sequence[float]
) -> tuple[float, Sequence[float]] | None:
    """The most Σ bound·x over the class sizes and its ``x`` (None without scipy): with
    every composition's users bound, an upper bound on the users of any disjoint
    replicas."""
    if not counts:
        return 0.0, []
    try:
        got = _milp_bound(counts, sizes, [-b for b in bounds], None)
    except DependencyError:
        return None
    return None if got is None else (-got[0], got[1])


def bound_price(
    counts: Sequence[Sequence[int]],
    sizes: Sequence[int],
    bounds: Sequence[float],
    prices: Sequence[float],
    target: float,
) -> tuple[float, Sequence[float]] | None:
    """The least Σ price·x with Σ bound·x ≥ target and its ``x`` (None without scipy;
    ``inf`` and no ``x`` when even the bounds cannot reach it): a lower bound on the $/h
    of any node set serving it."""
    try:
        got = _milp_bound(counts, sizes, prices, (bounds, target))
    except DependencyError:
        return None
    return (math.inf, []) if got is None else got
