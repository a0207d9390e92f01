"""An upper bound on the users of disjoint replicas on a fleet too large to bound
composition by composition: a linear programme over replica *kinds*.

The nodes fall into ``T`` types, type ``t`` holding ``N[t]`` nodes.  A replica's
*composition* ``c`` is how many nodes of each type it takes (``|c|`` nodes in all);
``bound(c)`` is at least what any replica (or, for one multi-GPU node, any replicas
side by side on its GPUs) on ``c``'s nodes serves.  Every composition of at most
``K`` nodes is a kind of its own.  A replica of more than ``K`` nodes is of a *large*
kind: with the types in a fixed order, the first of its types (in that order) is some
``f``, every node it holds is of type ``f`` or later, and it serves at most
``bound(L[f])``, ``L[f]`` every node of the types from ``f`` on (a bound holds on any
subset of its nodes).  The programme::

    max  Σ_c bound(c)·x[c] + Σ_f bound(L[f])·y[f]
    s.t. Σ_c c[t]·x[c] + Σ_{f ≤ t} z[f][t] ≤ N[t]      every type t
         z[f][f] ≥ y[f],  Σ_{t ≥ f} z[f][t] ≥ (K + 1)·y[f]    every f
         x, y, z ≥ 0

takes any set of disjoint replicas as a feasible point: ``x[c]`` the replicas of
``c``, ``y[f]`` the large ones whose first type is ``f`` and ``z[f][t]`` the nodes of
type ``t`` these hold (at least one of ``f``, ``K + 1`` in all).  Its objective there
is at least their users, so its optimum (that of the relaxation over the reals) bounds
the users of every set of disjoint replicas.  A per-replica bound pooled over the
whole fleet lets any node join any replica; here each replica is charged the nodes it
needs to hold the weights, which is what limits a fleet of nodes each too small to
hold them alone.  ``K`` is the most nodes whose compositions number at most
:data:`KIND_LIMIT`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from stowplan.model import Constraints, ModelLayout, NodeDescriptor
from stowplan.quantities.limits import MAX_BATCH
from stowplan.serving.bounds import FleetRates, rate_bound, users_bound
from stowplan.serving.candidates import splits
from stowplan.serving.compositions import best_links, node_types
from stowplan.serving.exhaustive import best_replica_value
from stowplan.serving.node_groups import best_node_replicas
from stowplan.serving.pipeline_bound import pipeline_rate_bound, pipeline_users_bound
from stowplan.workload import Workload

__all__ = [
    "KIND_LIMIT",
    "FleetKinds",
    "fleet_kinds_bound",
    "kind_columns",
    "kind_rows",
    "kinds",
    "kinds_users_bound",
]

KIND_LIMIT = 3000
"""At most this many compositions are kinds of their own."""

REFINE_LIMIT = 64
"""Most kinds refined."""


def kind_columns(
    counts: Sequence[int],
    bound: Callable[[tuple[int, ...], int], float],
    order: Sequence[int],
    limit: int = KIND_LIMIT,
) -> tuple[list[tuple[int, ...]], int, dict[tuple[int, ...], float], list[tuple[int, float]]]:
    """The columns of the kinds programmes: every kind of :func:`kinds`, their most
    nodes ``K``, each kind's bound
    ``bound(c, size)`` (none below 0), and, where larger replicas exist, per first type
    ``f`` in ``order`` the bound of a replica of more than ``K`` nodes of ``f`` and the
    types after it (those with a positive bound)."""
    combos, most = kinds(counts, limit)
    values = {c: max(0.0, bound(c, sum(c))) for c in combos}
    large: list[tuple[int, float]] = []
    if most < sum(counts):
        for pos, f in enumerate(order):
            rest = {order[j] for j in range(pos, len(order))}
            whole = tuple(counts[t] if t in rest else 0 for t in range(len(counts)))
            got = max(0.0, bound(whole, most + 1))
            if got > 0:
                large.append((f, got))
    return combos, most, values, large


def kind_rows(
    np: Any,
    used: Sequence[tuple[int, ...]],
    values: dict[tuple[int, ...], float],
    large: Sequence[tuple[int, float]],
    order: Sequence[int],
    most: int,
    n_types: int,
) -> tuple[Any, Any]:
    """The part the kinds programmes share: columns ``x`` per kind of ``used``, then per
    large kind of first type ``f`` its replicas ``y[f]`` and the nodes ``z[f][t]`` they
    take of each type from ``f`` on (in ``order``).  Rows: per type the nodes the columns
    take of it, then per large kind ``z[f][f] ≥ y[f]`` and ``Σ_t z[f][t] ≥ (K + 1)·y[f]``
    (as ``≤ 0`` rows; ``K = most``; ``n_types`` types).  Also what each column serves
    (``values`` per kind, the large kinds' bounds per ``y``; 0 for ``z``)."""
    rank = {t: j for j, t in enumerate(order)}
    cols = len(used)
    layout: list[tuple[int, int, list[tuple[int, int]]]] = []
    for f, _v in large:
        y = cols
        zs = [(t, y + 1 + j) for j, t in enumerate(t for t in order if rank[t] >= rank[f])]
        layout.append((f, y, zs))
        cols = y + 1 + len(zs)
    rows = np.zeros((n_types + 2 * len(layout), cols))
    served = np.zeros(cols)
    for j, c in enumerate(used):
        rows[:n_types, j] = c
        served[j] = values[c]
    for k, ((f, y, zs), (_f, v)) in enumerate(zip(layout, large, strict=True)):
        served[y] = v
        first, size = n_types + 2 * k, n_types + 2 * k + 1
        for t, z in zs:
            rows[t, z] = 1.0
            rows[size, z] = -1.0
            if t == f:
                rows[first, z] = -1.0
        rows[first, y] = 1.0
        rows[size, y] = float(most + 1)
    return rows, served


def kinds(counts: Sequence[int], limit: int = KIND_LIMIT) -> tuple[list[tuple[int, ...]], int]:
    """Every composition of at most ``K`` nodes (``counts[t]`` of type ``t`` at most) and
    ``K``: the most for which they number at most ``limit`` (at least 1)."""
    total = sum(counts)
    most = 1
    for k in range(2, total + 1):
        if _number(counts, k) > limit:
            break
        most = k
    return list(_compositions(counts, most)), most


def _number(counts: Sequence[int], most: int) -> int:
    """How many compositions of 1..``most`` nodes there are (a count over types)."""
    ways = [1] + [0] * most
    for c in counts:
        nxt = [0] * (most + 1)
        for s, v in enumerate(ways):
            if v:
                for j in range(min(c, most - s) + 1):
                    nxt[s + j] += v
        ways = nxt
    return sum(ways) - 1


def _compositions(counts: Sequence[int], most: int) -> Iterator[tuple[int, ...]]:
    acc: list[int] = []

    def walk(i: int, left: int) -> Iterator[tuple[int, ...]]:
        if i == len(counts):
            if any(acc):
                yield tuple(acc)
            return
        for c in range(min(counts[i], left) + 1):
            acc.append(c)
            yield from walk(i + 1, left - c)
            acc.pop()

    yield from walk(0, most)


def kinds_users_bound(
    counts: Sequence[int],
    bound: Callable[[tuple[int, ...], int], float],
    order: Sequence[int],
    *,
    refine: Callable[[tuple[int, ...]], float | None] | None = None,
    limit: int = KIND_LIMIT,
) -> float | None:
    """The optimum of the module's programme for types of ``counts`` nodes, ``bound(c,
    s)`` per composition (for replicas on at least ``s`` of its nodes: a kind's are on
    all of them, a large one's on more than ``K``) and the large kinds' types in
    ``order`` (any order is valid; the
    fastest first is the tightest); None without scipy.  ``refine(c)``, when given, is
    a smaller bound of a composition the programme uses (None: none smaller); those
    are put in and the programme solved again, until it uses none it has not refined
    or :data:`REFINE_LIMIT` are."""
    try:
        import numpy as np
        from scipy.optimize import linprog
    except ImportError:  # pragma: no cover - scipy ships with the exact extra
        return None
    combos, most, values, large = kind_columns(counts, bound, order, limit)
    n_types = len(counts)
    refined: set[tuple[int, ...]] = set()
    while True:
        used = [c for c in combos if values[c] > 0]
        rows, served = kind_rows(np, used, values, large, order, most, n_types)
        cols = rows.shape[1]
        if cols == 0:
            return 0.0
        obj = -served
        rhs = np.zeros(rows.shape[0])
        rhs[:n_types] = counts
        res = linprog(obj, A_ub=rows, b_ub=rhs, bounds=[(0.0, None)] * cols, method="highs")
        if res.status != 0:
            return None
        top = -float(res.fun)
        if refine is None:
            return top
        fresh = False
        for j, c in enumerate(used):
            if res.x[j] <= 1e-9 or c in refined or len(refined) >= REFINE_LIMIT:
                continue
            refined.add(c)
            smaller = refine(c)
            if smaller is not None and smaller < values[c]:
                values[c], fresh = max(0.0, smaller), True
        if not fresh:
            return top if math.isfinite(top) else None


class FleetKinds:
    """The types of a fleet's nodes and what a replica of each kind serves at most, in
    users or (``by_rate``) requests/s: the columns of the kinds programmes, for users
    here and for $/h in :mod:`~stowplan.serving.kinds_price`.

    The nodes' types (:func:`~stowplan.serving.compositions.best_links`: each node
    swapped for its type's best-linked, whose replicas serve no fewer).  A kind of one
    node is bounded by :func:`~stowplan.serving.bounds.users_bound` (or
    :func:`~stowplan.serving.bounds.rate_bound`) and its splits side by side
    (:func:`~stowplan.serving.candidates.splits`); a kind of several nodes, whose
    replicas span all of them, by ``users_bound`` with that span (the network hops it
    must cross; ``rate_bound`` with that span), and a large kind by ``users_bound``
    (``rate_bound``) spanning ``K + 1`` nodes.  :meth:`refine` bounds a kind holding a
    multi-GPU node again by every grouping of its GPUs and pipeline of the groups
    (:func:`~stowplan.serving.node_groups.best_node_replicas`, exact), and a kind of a
    few single-GPU nodes by every pipeline tried
    (:func:`~stowplan.serving.exhaustive.best_replica_value`) or the subset programme's
    bound (:func:`~stowplan.serving.pipeline_bound.pipeline_users_bound`,
    :func:`~stowplan.serving.pipeline_bound.pipeline_rate_bound`), both over subsets
    too.  :attr:`order` puts the types fastest first (one prompt's prefill and a decode
    step on one node), the tightest order of the large kinds."""

    def __init__(
        self,
        model: ModelLayout,
        nodes: Sequence[NodeDescriptor],
        w: Workload,
        c: Constraints,
        *,
        by_rate: bool = False,
    ) -> None:
        self.model, self.w, self.c, self.by_rate = model, w, c, by_rate
        self.types = node_types(nodes)
        """Every type's nodes (the fleet's own, with their prices)."""
        best = best_links(nodes)
        self.counts = [n for _, n in best]
        self.fleet = [replace(node, id=f"{node.id}-{j}") for node, k in best for j in range(k)]
        self.first = [sum(self.counts[:t]) for t in range(len(self.counts))]
        self.rates = FleetRates.of(model, self.fleet, replace(c, batch=1), w)

        def speed(t: int) -> float:
            i = self.first[t]
            return self.rates.ttft0_floor([i]) + self.rates.cycle_floor([i])

        self.order = sorted(range(len(self.counts)), key=speed)

    def members(self, combo: tuple[int, ...]) -> list[int]:
        """The indices in :attr:`fleet` of a composition's nodes."""
        return [self.first[t] + j for t, m in enumerate(combo) for j in range(m)]

    def bound(self, combo: tuple[int, ...], span: int) -> float:
        """At most what a replica on ``combo``'s nodes spanning at least ``span`` of them
        serves (for one node: all its replicas side by side)."""
        rates, w = self.rates, self.w
        chosen = self.members(combo)
        if len(chosen) == 1:
            one = self.fleet[chosen[0]]
            ub = users_bound(rates, chosen, w)
            whole = (rate_bound(rates, chosen, w) if self.by_rate else ub) if ub >= 1 else 0
            sides = [sp.bound for sp in splits(self.model, one, w, self.c, by_rate=self.by_rate)]
            return float(max([whole, *sides]))
        if self.by_rate:
            return rate_bound(rates, chosen, w, span=span)
        return float(users_bound(rates, chosen, w, span=span))

    def refine(self, combo: tuple[int, ...]) -> float | None:
        """A smaller bound of a kind of a few single-GPU nodes; None where none is found."""
        on = [self.fleet[i] for i in self.members(combo)]
        if any(n.num_gpus > 1 for n in on):
            grouped = best_node_replicas(self.model, on, self.w, self.c, by_rate=self.by_rate)
            return None if grouped is None else grouped.value
        got = best_replica_value(self.model, on, self.w, self.c, by_rate=self.by_rate)
        if got is not None:
            return got
        top = self.bound(combo, len(on))
        if self.by_rate:
            return pipeline_rate_bound(self.model, on, self.w, self.c, top)
        most = math.floor(top) if math.isfinite(top) else MAX_BATCH
        ub = pipeline_users_bound(self.model, on, self.w, self.c, most)
        return None if ub is None else float(ub)


def fleet_kinds_bound(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    w: Workload,
    c: Constraints,
    *,
    limit: int = KIND_LIMIT,
) -> float | None:
    """An upper bound on the users of any disjoint replicas of ``model`` on ``nodes``
    serving ``w``; None without scipy: :func:`kinds_users_bound` over the columns of
    :class:`FleetKinds`, refined where the programme uses them.  ``limit`` is the
    programme's (:data:`KIND_LIMIT`)."""
    fk = FleetKinds(model, nodes, w, c)
    return kinds_users_bound(fk.counts, fk.bound, fk.order, refine=fk.refine, limit=limit)
