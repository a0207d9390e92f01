"""Replicas that mix node types, for fleets too large to enumerate composition by
composition: each replica *kind* planned once and placed on many groups of real nodes.

The nodes fall into types alike but for their id, price and network link
(:func:`~stowplan.serving.compositions.node_types`); a kind is how many nodes of each
type a replica takes.  Within a type the nodes are ranked by their link, the fastest
(an unknown link, which costs no transfer, first) then the least hop latency.

Which kinds: a linear programme over the kinds of at most :data:`MOST` nodes::

    max Σ_k value(k)·x[k]   s.t. Σ_k k[t]·x[k] ≤ N[t] every type t,  x ≥ 0

``value(k)`` is what the replica planned for ``k`` on the best-ranked nodes of its
types serves once planned; before, the relaxation bound of a pipeline across all of
them (:func:`~stowplan.serving.bounds.users_bound`); for one node, the most a replica
planned on one node of the type serves (given).  The kinds of several nodes its
optimum uses are planned and it is solved again, until it uses only planned kinds or
:data:`PLAN_LIMIT` are planned.  The kinds then worth placing serve at least
:data:`NEAR` of what their nodes are worth at the prices (duals) of the programme
over the planned kinds and the nodes alone.

Placing a kind: its plan's nodes in stage order all send a prompt's activations and
the tokens over their network link but the last, whose link carries only the way back
to the first.  Group ``j`` of the kind takes, of each type, the ``j``-th block of the
nodes ranked best for the sending places and the ``j``-th worst for the last place,
or (a second series, leaving the best-linked nodes to other kinds) the sending places'
blocks just above those of the last place.  The plan moves onto each group
(:func:`~stowplan.serving.reuse.moved`) and is scored again on the group's own links:
a group's TTFT/TPOT are its own nodes'.  The packing program chooses among the groups
(they overlap from kind to kind).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from stowplan.model import Constraints, ModelLayout, NodeDescriptor
from stowplan.serving.bounds import FleetRates, rate_bound, users_bound
from stowplan.serving.candidates import Candidate
from stowplan.serving.compositions import node_types
from stowplan.serving.kinds_bound import kinds
from stowplan.serving.reuse import moved
from stowplan.workload import Workload

__all__ = ["KIND_LIMIT", "MOST", "NEAR", "PLAN_LIMIT", "kind_candidates", "link_rank"]

MOST = 3
"""Nodes a kind takes at most."""

KIND_LIMIT = 3000
"""Kinds the programme weighs at most (fewer nodes per kind when there would be more)."""

PLAN_LIMIT = 12
"""Kinds planned at most."""

NEAR = 0.9
"""A planned kind is placed when it serves at least this share of what the
programme's prices of its nodes add up to (1: only kinds as good as the optimum's)."""


def link_rank(n: NodeDescriptor) -> tuple[bool, float, float]:
    """Sort key of a type's nodes, the best-linked first: an unknown link (no transfer
    counted), then the fastest, then the least hop latency."""
    return (n.link_mbps != 0.0, -n.link_mbps, n.link_latency_ms)


def kind_candidates(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    rates: FleetRates,
    w: Workload,
    c: Constraints,
    plan_replica: Callable[[Sequence[NodeDescriptor], int], Candidate | None],
    alone: dict[str, float],
    *,
    by_rate: bool,
) -> list[Candidate]:
    """Replicas of the kinds the module's programme picks, on groups of ``nodes`` (see
    the module), each scored on its own nodes.

    ``rates`` are ``nodes``' (in their order); ``plan_replica(nodes, users)`` plans a
    replica (:func:`~stowplan.serving.candidates.replica_of` or a memo of it);
    ``alone[id]`` is what the best replica planned on node ``id`` alone serves (users,
    or requests/s with ``by_rate``; absent: none).
    """
    types = [sorted(t, key=link_rank) for t in node_types(nodes)]
    counts = [len(t) for t in types]
    index = {n.id: i for i, n in enumerate(nodes)}
    type_of = {n.id: t for t, members in enumerate(types) for n in members}
    combos, _ = kinds(counts, KIND_LIMIT)
    combos = [k for k in combos if sum(k) <= MOST]
    if not any(sum(k) > 1 for k in combos):
        return []

    def value_of(cand: Candidate) -> float:
        return cand.value_rate if by_rate else float(cand.value_users)

    def best(k: tuple[int, ...]) -> list[NodeDescriptor]:
        return [n for t, m in enumerate(k) for n in types[t][:m]]

    values: dict[tuple[int, ...], float] = {}
    start: dict[tuple[int, ...], int] = {}
    for k in combos:
        if sum(k) == 1:
            t = k.index(1)
            values[k] = max((alone.get(n.id, 0.0) for n in types[t]), default=0.0)
            continue
        members = [index[n.id] for n in best(k)]
        # Nodes that cannot hold the weights and a request's KV serve none (a quick test).
        ub = users_bound(rates, members, w, span=len(members)) if rates.memory_users(members) else 0
        start[k] = ub
        values[k] = 0.0 if ub < 1 else rate_bound(rates, members, w) if by_rate else float(ub)
    planned: dict[tuple[int, ...], Candidate | None] = {}
    while len(planned) < PLAN_LIMIT:
        cols = [k for k in combos if values[k] > 0]
        got = _solve(cols, counts, [values[k] for k in cols])
        if got is None:
            break
        todo = [
            k
            for k, v in zip(cols, got[0], strict=True)
            if v > 1e-9 and sum(k) > 1 and k not in planned
        ]
        if not todo:
            break
        for k in sorted(todo, key=lambda k: -values[k])[: PLAN_LIMIT - len(planned)]:
            cand = plan_replica(best(k), start[k])
            planned[k] = cand
            whole = cand is not None and len(cand.node_ids) == sum(k)
            values[k] = value_of(cand) if whole and cand is not None else 0.0
    # The types' prices in the programme over what was planned (and the nodes alone).
    cols = [k for k in combos if values[k] > 0 and (sum(k) == 1 or k in planned)]
    got = _solve(cols, counts, [values[k] for k in cols])
    prices = got[1] if got is not None else [0.0] * len(counts)
    out: list[Candidate] = []
    for k, cand in planned.items():
        if cand is None:
            continue
        out.append(cand)
        worth = sum(p * m for p, m in zip(prices, k, strict=True))
        if values[k] <= 0 or values[k] < NEAR * worth:
            continue
        for group in _groups(k, cand, types, type_of):
            got_cand = moved(model, cand, group, w, c)
            if got_cand.serving.users >= 1 and got_cand is not cand:
                out.append(got_cand)
    return out


def _groups(
    k: tuple[int, ...],
    cand: Candidate,
    types: Sequence[Sequence[NodeDescriptor]],
    type_of: dict[str, int],
) -> list[list[NodeDescriptor]]:
    """The groups of real nodes kind ``k``'s plan ``cand`` is placed on, each in the
    plan's stage order (see the module)."""
    roles = [type_of[i] for i in cand.node_ids]
    sending = [0] * len(types)
    for t in roles[:-1]:
        sending[t] += 1
    copies = min(len(types[t]) // m for t, m in enumerate(k) if m)
    out: list[list[NodeDescriptor]] = []
    seen: set[tuple[str, ...]] = set()
    for top in (True, False):
        for j in range(copies):
            taken = [0] * len(types)
            group: list[NodeDescriptor] = []
            for pos, t in enumerate(roles):
                members = types[t]
                if pos == len(roles) - 1:
                    group.append(members[len(members) - 1 - j])
                    continue
                offset = 0 if top else len(members) - copies * k[t]
                group.append(members[offset + j * sending[t] + taken[t]])
                taken[t] += 1
            ids = tuple(n.id for n in group)
            if ids not in seen:
                seen.add(ids)
                out.append(group)
    return out


def _solve(
    cols: Sequence[tuple[int, ...]], counts: Sequence[int], values: Sequence[float]
) -> tuple[list[float], list[float]] | None:
    """The programme's optimum x and each type's price (its dual); None without scipy
    or when it fails."""
    if not cols:
        return None
    try:
        import numpy as np
        from scipy.optimize import linprog
    except ImportError:  # pragma: no cover - scipy ships with the exact extra
        return None
    rows = np.array(cols, dtype=float).T.reshape(len(counts), len(cols))
    res = linprog(
        -np.asarray(values, dtype=float),
        A_ub=rows,
        b_ub=np.asarray(counts, dtype=float),
        bounds=[(0.0, None)] * len(cols),
        method="highs",
    )
    if res.status != 0:
        return None
    prices = [max(0.0, -float(v)) for v in res.ineqlin.marginals]
    return [float(v) for v in res.x], prices
