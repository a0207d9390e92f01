"""The optimum over GPU groups and pipelines together, and a bound beyond small fleets.

Exact solve (:func:`solve_grouped`), for fleets of up to :data:`GROUPED_NODE_LIMIT`
nodes.  A pipeline keeps the stages of one node next to each other (a hop inside a
node is never dearer than one across the network, so this loses nothing whenever
that holds); then a node's share of the pipeline is a sub-pipeline of GPU groups over
blocks ``[i, j)``, and:

1. per node and role (first node, interior, last, alone), a knapsack over its GPUs
   gives the best sub-pipeline of every block range: ``P[u]`` is the best chain of
   groups on ``u`` GPUs whose stages pass on inside the node, extended one group of
   any allowed degree at a time; the node's last group passes on over the network
   (or, for the last node, sends the token back) — :mod:`stowplan.planner.tensor.nodes`;
2. a dynamic programme over (set of nodes used, blocks placed) chains the nodes, as
   the single-stage subset DP does (on nodes alike, one row per count of nodes:
   every set of as many carries the same row);
3. backtracking gives each node's groups and block bounds.

Stages combine with ``+`` for the time per token and ``max`` for the slowest stage,
so one code serves both objectives.  numpy is imported lazily (extra ``exact``).

Bound (:func:`grouped_bound`): the fractional relaxation of
:func:`~stowplan.planner.exact.pipelines.fluid_bound` on the whole nodes with every node at its
full bandwidth and FLOPs, no all-reduce, and the cheaper of its network and
intra-node hop: no grouping of any node is faster.  For the time per token also: every
block at its least cost on any group of a node (all-reduces included) and the head read
on the last stage's node; a pipeline on one node, which pays no hop, on that node's own
groups; one over several nodes by a knapsack choosing nodes, whole blocks and the first
and last stages' roles (the embed's and the head's room taken), each node paying its
network hop and, but for the last stage's node, its transfer out over its own link.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from stowplan.model import Metric
from stowplan.planner.exact.pipelines import fluid_bound
from stowplan.planner.problem import Problem
from stowplan.planner.tensor.nodes import (
    GroupCosts,
    NodeSolver,
    block_byte_arrays,
    degrees,
    node_signature,
    numpy_module,
    row_then,
)

__all__ = [
    "GROUPED_NODE_LIMIT",
    "GroupedOptimum",
    "degrees",
    "grouped_bound",
    "grouped_work",
    "node_signature",
    "solve_grouped",
    "stage_count_trips",
    "stage_count_trips_by_nodes",
]

GROUPED_NODE_LIMIT = 8
"""Largest fleet (in nodes) the exact grouped solve takes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupedOptimum:
    """The best pipeline over every grouping: its value and its stages."""

    value: float
    """Seconds: time per token, or the slowest stage's time."""
    stages: tuple[tuple[str, int, int, int], ...]
    """In pipeline order: (node id, tensor-parallel degree, first block, end block)."""


def grouped_work(problem: Problem, allowed: Sequence[int] | None) -> int:
    """Element operations the exact solve needs (to decide whether to run it inline)."""
    n = problem.model.num_blocks + 1
    kinds = {
        (node_signature(node), len(degrees(problem, node, allowed)), node.num_gpus)
        for node in problem.nodes
    }
    nodes = len(problem.nodes)
    runs = 1 + sum(node.num_gpus - 1 for node in problem.nodes)
    passes = runs * (1 << nodes) * nodes  # rows carried through interior nodes
    cube = _interior(problem) and runs * (1 << (nodes - 1)) > problem.model.num_blocks
    per_node = sum(2 * g * k * (n**3 if cube else 4 * n * n) for _, k, g in kinds)
    per_pass = 1 if cube else 2 * max((g * k for _, k, g in kinds), default=1)
    return per_node + passes * per_pass * n * n


def _interior(problem: Problem) -> bool:
    """Whether a pipeline of these nodes can have a node strictly inside it."""
    n = len(problem.nodes)
    return n >= 3 or (n == 2 and any(node.num_gpus > 1 for node in problem.nodes))


def solve_grouped(
    problem: Problem,
    objective: Metric,
    allowed: Sequence[int] | None = None,
    *,
    wrap: bool = True,
    groups: GroupCosts | None = None,
) -> GroupedOptimum | None:
    """The best pipeline over every grouping of ``problem``'s nodes into GPU groups of the
    ``allowed`` degrees (None: every legal one); None when nothing fits.

    ``problem`` holds whole nodes; the stage count is free (1 to the number of groups).
    Without ``wrap`` a node's stages are consecutive in pipeline order (no node holds
    both ends unless it is the only one), as engines that rank a node's GPUs together
    need.  ``groups``: ``GroupCosts(problem, allowed)`` when the caller has it (the solves
    of both objectives share its stage times).
    """
    np = numpy_module()
    add = objective == Metric.LATENCY
    groups = GroupCosts(problem, allowed) if groups is None else groups
    nb = problem.model.num_blocks
    n = len(problem.nodes)
    solvers = [
        NodeSolver(groups, d, node.num_gpus, add) if groups.kinds[d] else None
        for d, node in enumerate(problem.nodes)
    ]
    comb = np.add if add else np.maximum
    runs = 1 + sum(node.num_gpus - 1 for node in problem.nodes)
    interior = _interior(problem)
    whole_matrices = interior and runs * (1 << (n - 1)) > nb
    cache: dict[tuple[object, ...], tuple[Any, Any, Any, float]] = {}
    first: list[Any] = []
    mid: list[_Interior] = []
    last: list[Any] = []
    best_val = math.inf
    best_alone: int | None = None
    best_chain: tuple[int, int] | None = None
    keys: list[tuple[object, ...] | None] = []
    for d, node in enumerate(problem.nodes):
        solver = solvers[d]
        keys.append(None if solver is None else (node_signature(node), tuple(solver.kinds)))
        if solver is None:
            first.append(np.full(nb + 1, np.inf))
            mid.append(_Interior(None, None, nb, comb))
            last.append(np.full(nb + 1, np.inf))
            continue
        key = keys[d]
        assert key is not None
        if key not in cache:
            f = solver.node_matrix(True, False, False)[0][0]
            # Only interior nodes need whole matrices, and only when many rows pass through
            # them (otherwise each row is carried through the node vector by vector).
            m = solver.node_matrix(False, False, False)[0] if whole_matrices else None
            la = solver.last_vector(nb)
            alone = float(solver.node_matrix(True, True, True)[0][0, nb])
            cache[key] = (f, m, la, alone)
        f, m, la, alone = cache[key]
        first.append(f)
        mid.append(_Interior(solver if interior else None, m if interior else None, nb, comb))
        last.append(la)
        if alone < best_val:
            best_val, best_alone = alone, d
    g, chain_val, best_chain = _chain_dp(first, mid, last, comb, nb, None)
    if chain_val < best_val:
        best_val = chain_val
    else:
        best_chain = None
    # A node may hold both ends of the pipeline: its groups are then next to each other
    # around the cycle (the last sends the token back inside the node).  One run per
    # node and split of its GPUs between the two ends.
    best_wrap: tuple[int, int, Any, int, int, Any, Any] | None = None
    wrapped: set[tuple[object, ...]] = set()
    for w, solver in enumerate(solvers):
        if not wrap or solver is None or solver.gpus < 2 or n < 2:
            continue
        # A node alike to one wrapped already (the same figures and groups) gives the same
        # values with the two swapped: none below the best so far.
        key = keys[w]
        assert key is not None
        if key in wrapped:
            continue
        wrapped.add(key)
        prefix = solver.prefixes()
        ends = solver.suffixes(nb, wrap=True)
        for u1 in range(1, solver.gpus):
            head = prefix[u1]
            tails = [x for x in ends[1 : solver.gpus - u1 + 1] if x is not None]
            if head is None or not tails:
                continue
            tail = np.minimum.reduce(tails)
            firsts = [np.full(nb + 1, np.inf) for _ in range(n)]
            firsts[w] = head
            mids = [_Interior(None, None, nb, comb) if d == w else mid[d] for d in range(n)]
            gw, val, end = _chain_dp(firsts, mids, None, comb, nb, (w, tail))
            if val < best_val:
                best_val, best_chain = val, None
                assert end is not None
                lasts = [tail if d == w else last[d] for d in range(n)]
                best_wrap = (w, u1, gw, end[0], end[1], firsts, (mids, lasts))
    # Step 3: the nodes' ranges, then each node's groups.
    stages: list[tuple[str, int, int, int]] = []
    if best_wrap is not None:
        w, u1, gw, mask, _, firsts, (mids, lasts) = best_wrap
        parts = _backtrack_nodes(gw, mask, w, firsts, mids, lasts, comb, nb, best_val)
        solver = solvers[w]
        assert solver is not None
        for d, is_first, is_last, _alone, i, j, val in parts:
            sd = solvers[d]
            assert sd is not None
            if d == w and is_first:
                groups_ = sd.backtrack(True, False, False, i, j, val, budget=u1)
            elif d == w:
                groups_ = sd.backtrack_last(i, nb, val, budget=sd.gpus - u1, wrap=True)
            else:
                groups_ = sd.backtrack(is_first, is_last, False, i, j, val)
            stages += [(problem.nodes[d].id, t, lo, hi) for t, lo, hi in groups_]
        return GroupedOptimum(value=best_val, stages=tuple(stages))
    if best_chain is not None:
        mask, e = best_chain
        parts = _backtrack_nodes(g, mask, e, first, mid, last, comb, nb, best_val)
    elif best_alone is not None:
        parts = [(best_alone, True, True, True, 0, nb, best_val)]
    else:
        return None
    for d, is_first, is_last, alone_, i, j, val in parts:
        solver = solvers[d]
        assert solver is not None
        for t, lo, hi in solver.backtrack(is_first, is_last, alone_, i, j, val):
            stages.append((problem.nodes[d].id, t, lo, hi))
    return GroupedOptimum(value=best_val, stages=tuple(stages))


def _chain_dp(
    first: Sequence[Any],
    mid: Sequence[Any],
    last: Sequence[Any] | None,
    comb: Any,
    nb: int,
    wrap: tuple[int, Any] | None,
) -> tuple[Any, float, tuple[int, int] | None]:
    """Step 2: chain whole-node sub-pipelines over (set of nodes used, blocks placed).

    Closes with another node's ``last`` vector, or with ``wrap = (w, tail)``: node w,
    already first, takes the last blocks too (then at least one other node between).
    Returns the table, the best value and where it closes (mask, closing node)."""
    np = numpy_module()
    n = len(first)
    alike = _alike_chain(first, mid, last, wrap)
    if alike is not None:
        start = first[0] if wrap is None else first[wrap[0]]
        close = wrap[1] if wrap is not None else None if last is None else last[0]
        return _chain_of_alike(start, close, alike, comb, n, None if wrap is None else wrap[0])
    size = 1 << n
    g = np.full((size, nb + 1), np.inf)
    # Interior nodes alike meet the same rows (nodes alike leave the same rows): each row
    # is carried through each of them once, the same values for every set of nodes.
    carried: dict[tuple[object, bytes], Any] = {}
    for d in range(n):
        g[1 << d] = first[d]
    best, at = math.inf, None
    for mask in range(1, size):
        row = g[mask]
        if not np.isfinite(row).any():
            continue
        if wrap is not None:
            w, tail = wrap
            if mask != 1 << w:
                v = float(comb(row, tail).min())
                if v < best:
                    best, at = v, (mask, w)
        for e in range(n):
            if mask >> e & 1:
                continue
            if last is not None:
                v = float(comb(row, last[e]).min())
                if v < best:
                    best, at = v, (mask, e)
            if mid[e].empty:
                continue
            key = (mid[e].key, row.tobytes())
            through = carried.get(key)
            if through is None:
                through = carried[key] = mid[e].apply(row)
            np.minimum(g[mask | 1 << e], through, out=g[mask | 1 << e])
    return g, best, at


def _alike_chain(
    first: Sequence[Any],
    mid: Sequence[Any],
    last: Sequence[Any] | None,
    wrap: tuple[int, Any] | None,
) -> _Interior | None:
    """The interior every node of :func:`_chain_dp` shares where its nodes are alike (each
    the same first and last vector and an interior of one key), or, with ``wrap = (w, _)``,
    where every node but ``w`` is (``w`` only starts the pipeline); else None."""
    np = numpy_module()
    n = len(first)
    others = [d for d in range(n) if wrap is None or d != wrap[0]]
    if len(others) < 2 or (wrap is not None and (last is not None or not mid[wrap[0]].empty)):
        return None
    one = others[0]
    kind: _Interior = mid[one]
    if kind.empty or any(mid[d].empty or mid[d].key != kind.key for d in others):
        return None
    if wrap is None:
        if any(not np.array_equal(first[d], first[one]) for d in others):
            return None
        if last is not None and any(not np.array_equal(last[d], last[one]) for d in others):
            return None
    elif any(np.isfinite(first[d]).any() for d in others):
        return None
    return kind


def _chain_of_alike(
    start: Any, close: Any, kind: _Interior, comb: Any, n: int, w: int | None
) -> tuple[Any, float, tuple[int, int] | None]:
    """:func:`_chain_dp` of ``n`` nodes alike (:func:`_alike_chain`): the same table, value
    and closing, each row computed once per count of nodes.  ``start``: a node's first
    vector (with ``w``, the index of the node holding both ends, its own); ``close``:
    the vector that closes a chain (the last node's, or the wrapped node's tail; None:
    none closes); ``kind``: the interior every node shares.

    A set's row depends only on how many of the alike nodes it holds (each reached
    through the same interior from rows alike), so the rows are carried count by count
    and the sets are then walked in :func:`_chain_dp`'s order only to find where it
    closes first: every node outside a set closes it alike, so the first of them does."""
    np = numpy_module()
    size = 1 << n
    rows = np.full((n + 1, len(start)), np.inf)
    """Per count of alike nodes in a set (with ``w`` besides, where it wraps), its row."""
    lowest = 0 if w is not None else 1
    rows[lowest] = start
    for k in range(lowest, n - 1 + lowest):
        if np.isfinite(rows[k]).any():
            rows[k + 1] = kind.apply(rows[k])
    counts = np.array([m.bit_count() for m in range(size)])
    if w is None:
        g = rows[counts]
    else:
        holds = (np.arange(size) >> w) & 1 == 1
        g = np.where(holds[:, None], rows[np.maximum(counts - 1, 0)], np.inf)
    finite = np.isfinite(rows).any(axis=1)
    closing = np.full(n + 1, np.inf)
    for k in range(n + 1):
        if not finite[k]:
            continue
        if close is not None and (w is not None or k < n):
            closing[k] = float(comb(rows[k], close).min())
    best: float = math.inf
    at: tuple[int, int] | None = None
    for mask in range(1, size):
        if w is None:
            k = counts[mask]
            if k >= n or closing[k] >= best:
                continue
            best, at = float(closing[k]), (mask, (~mask & (mask + 1)).bit_length() - 1)
        else:
            if not mask >> w & 1 or mask == 1 << w:
                continue
            k = counts[mask] - 1
            if closing[k] < best:
                best, at = float(closing[k]), (mask, w)
    return g, best, at


class _Interior:
    """A node as an interior part of the pipeline: ``row ⊗ N_mid`` and ``N_mid[:, j]``,
    from its whole matrix when many rows will pass through it, else vector by vector."""

    def __init__(self, solver: NodeSolver | None, matrix: Any, nb: int, comb: Any) -> None:
        self.solver = solver
        self.matrix = matrix
        self.nb = nb
        self.comb = comb
        self.empty = solver is None and matrix is None
        self.key: object = (
            id(matrix) if matrix is not None else None if solver is None else solver.alike
        )
        """Interior nodes of equal keys carry every row to the same values: the same
        matrix (kept alive by its node while the solve runs), or solvers of nodes alike
        (:attr:`NodeSolver.alike`: the same matrices)."""

    def apply(self, row: Any) -> Any:
        if self.matrix is not None:
            return row_then(numpy_module(), row, self.matrix, self.comb is numpy_module().add)
        assert self.solver is not None
        return self.solver.apply_mid(row)

    def column(self, j: int) -> Any:
        if self.matrix is not None:
            return self.matrix[:, j]
        if self.solver is None:
            return numpy_module().full(self.nb + 1, numpy_module().inf)
        return self.solver.column_mid(j)


def _backtrack_nodes(
    g: Any, mask: int, e: int, first: Any, mid: Any, last: Any, comb: Any, nb: int, value: float
) -> list[tuple[int, bool, bool, bool, int, int, float]]:
    """(node, first?, last?, alone?, lo, hi, its value) in pipeline order."""
    np = numpy_module()
    row = g[mask]
    tot = comb(row, last[e])
    i = int(np.argmin(tot))
    out = [(e, False, True, False, i, nb, float(last[e][i]))]
    j = i
    target = float(row[j])
    while mask.bit_count() > 1:
        found = False
        for d in range(len(first)):
            if not mask >> d & 1:
                continue
            if mid[d].empty:
                continue
            prev = g[mask ^ (1 << d)]
            col = mid[d].column(j)
            vals = comb(prev, col)
            k = int(np.argmin(vals))
            if np.isfinite(vals[k]) and vals[k] <= target * (1 + 1e-12):
                out.append((d, False, False, False, k, j, float(col[k])))
                mask ^= 1 << d
                j = k
                target = float(prev[k])
                found = True
                break
        assert found
    d = mask.bit_length() - 1
    out.append((d, True, False, False, 0, j, float(first[d][j])))
    return out[::-1]


def grouped_bound(
    problem: Problem,
    objective: Metric,
    allowed: Sequence[int] | None = None,
    groups: GroupCosts | None = None,
) -> float:
    """A valid lower bound (seconds) on ``objective`` over every grouping: see the module.

    For the time per token each block is also charged the least it can cost on any
    group of its node (its degree's share of the bandwidth plus its all-reduces), which
    a block on a tensor-parallel group always pays.
    """

    cm = problem.cost_model().relax_groups()
    relaxed = fluid_bound(problem, cm, objective)
    if objective != Metric.LATENCY:
        return relaxed
    groups = GroupCosts(problem, allowed) if groups is None else groups
    gcm = groups.cm
    nb = cm.num_blocks
    rd, kvr, mem = cm.smallest_block()
    # Per node, its groups' least block cost; nodes whose groups are of the same classes
    # (a fleet of identical nodes) share one.
    cls = gcm.stage_class
    least: dict[tuple[int, ...], float] = {}
    rate = []
    classes = []
    """Per node, its groups' classes."""
    for kinds in groups.kinds:
        key = tuple(cls[v] for v in kinds.values())
        r = least.get(key)
        if r is None:
            blocks = (gcm.block_seconds(v, rd + kvr, rd) for v in kinds.values())
            r = least[key] = min(blocks, default=math.inf)
        rate.append(r)
        classes.append(key)
    window = cm.max_window()
    room = [min(window[d], nb if mem <= 0 else cm.usable[d] / mem) for d in range(len(rate))]
    left, total = float(nb), 0.0
    for d in sorted(range(len(rate)), key=lambda d: rate[d]):
        take = min(left, room[d])
        total += take * rate[d]
        left -= take
        if left <= 0:
            break
    if left > 0:
        return max(relaxed, _per_block(problem, groups))
    # The blocks' least cost, the head's least read, and no hop at all (a one-stage plan
    # has none) when that is all the fluid bound's hops could add.  The last stage's
    # ``k`` blocks and head take at least max((k · read + head) · a, (k · weights + head)
    # · f) on a group of ``a`` s/byte read and ``f`` s/byte computed, with ``read`` and
    # ``weights`` the smallest block's: at least ``k`` blocks' cost plus ``head · a``
    # (where its blocks are compute-bound, f ≥ a), whatever the group's balance.
    reads = [cm.head * cm.inv_bw[d] for d in range(len(rate))]
    head = min(reads)
    # Each role's whole blocks: the first stage's node holds the embed besides its
    # blocks, the last's the head (one node of several GPU groups may hold both); nodes
    # of the same room and memory counted once.
    extras = (0, cm.embed, cm.head, cm.embed + cm.head)

    def whole(c: float) -> int:
        return min(nb, max(0, math.floor(c + 1e-9))) if math.isfinite(c) else nb

    by_room: dict[tuple[float, float], tuple[int, ...]] = {}
    caps = []
    for here, usable in zip(room, cm.usable, strict=True):
        if (here, usable) not in by_room:
            fits = (min(here, nb if mem <= 0 else (usable - e) / mem) for e in extras)
            by_room[(here, usable)] = tuple(map(whole, fits))
        caps.append(by_room[(here, usable)])
    several = _filled_with_hops(problem, rate, caps, reads)
    every = _per_block(problem, groups)
    apart = max(several, every)
    """Pipelines over several nodes (or any, where no node holds the model alone)."""
    # A pipeline on one node reads every block and the head on that node's own groups
    # (nodes whose groups are of the same classes bounded once; a node with groups of
    # every class the fleet has, by every group's least, which no crossing adds to where
    # a node holds the model).
    fleet = set(cls[v] for _, v in groups.distinct())
    own: dict[tuple[int, ...], float] = {}
    single = (d for d, n in enumerate(problem.nodes) if problem.usable[n.id] >= problem.total_bytes)
    for d in single:
        if classes[d] not in own:
            held = (
                every
                if fleet <= set(classes[d])
                else _per_block(problem, groups, groups.kinds[d].values())
            )
            own[classes[d]] = max(nb * rate[d] + reads[d], held)
    return max(relaxed, total + head, min(min(own.values(), default=math.inf), apart))


_ROLES = ((0, 0), (1, 0), (0, 1), (1, 1))
"""Whether a node holds the first stage, the last: none, the first, the last, both (the
order of :func:`grouped_bound`'s blocks per role)."""


def _filled_with_hops(
    problem: Problem,
    rate: Sequence[float],
    caps: Sequence[tuple[int, ...]],
    reads: Sequence[float],
) -> float:
    """A lower bound on the time per token of every pipeline over several nodes: its
    blocks at their nodes' least cost (``rate``, seconds a block), each node holding at
    most the whole blocks its role leaves room for (``caps``, per node and role of
    :data:`_ROLES`: the first stage's node holds the embed, the last's the head), plus
    each node's own network hop, its transfer out but for the last stage's node, and the
    head's read (``reads``) on the last stage's node.

    A pipeline on one node pays no hop; on a set N of several, it leaves each node of N
    over the network once at least (its own latency), and each but the last stage's node
    (whose stages end in the token) sends the activations out over its own link once at
    least.  The least of that over every N is a fixed-charge knapsack, solved exactly
    over whole blocks and roles (one first, one last) by a programme over the nodes
    (alike nodes as one kind, as many of them as could serve).  It couples what
    :func:`_per_block` counts apart: the hops memory forces at the fleet's least
    latencies, and the blocks at any node's cost."""
    cm = problem.cost_model()
    nb = problem.model.num_blocks
    np = numpy_module()
    kinds: dict[tuple[float, tuple[int, ...], float, float, float], int] = {}
    for kind in zip(rate, caps, cm.latency_s, cm.xfer_s, reads, strict=True):
        if kind[1][0] > 0 and math.isfinite(kind[0]):
            kinds[kind] = kinds.get(kind, 0) + 1
    if len(kinds) < 2:
        # Nodes alike: what :func:`_per_block` counts (the fewest nodes that hold the
        # model, each block at its least cost) is at least this.
        return min(reads)
    idx = np.arange(nb + 1, dtype=float)
    gap = idx[:, None] - idx[None, :]  # b - i: the blocks a node adds to i held before
    best = np.full((2, 2, nb + 1), math.inf)  # by first placed, last placed, blocks
    best[0, 0, 0] = 0.0
    for (r, c, hop, send, head), count in sorted(kinds.items()):
        windows = [(gap >= 1) & (gap <= k) for k in c]
        for _ in range(min(count, -(-nb // c[0]))):
            after = best.copy()
            for (first, last), window in zip(_ROLES, windows, strict=True):
                paid = hop + (head if last else 0.0) + (0.0 if last and not first else send)
                for f in range(2 - first):
                    for lst in range(2 - last):
                        ends = best[f, lst] - idx * r
                        before = np.where(window, ends[None, :], math.inf).min(axis=1)
                        reached = before + idx * r + paid
                        here = after[f + first, lst + last]
                        after[f + first, lst + last] = np.minimum(here, reached)
            best = after
    return float(best[1, 1, nb])


def _per_block(problem: Problem, groups: GroupCosts, only: Iterable[int] | None = None) -> float:
    """A lower bound on the time per token: every block (and the head) read, or computed,
    on the group where that costs it least, plus the network crossings memory forces;
    with ``only`` (the groups of one node), of the pipelines on those groups alone (no
    crossing).

    A stage takes ``max(R · a, W · f) + k · b`` (its bytes read ``R`` at ``a`` s/byte, its
    weights ``W`` at ``f`` s/byte, ``b`` per block), at least either sum alone, and each
    sum splits over the stage's blocks.  When no single node holds the model, the cycle
    leaves each of the ``k`` nodes it uses over the network at least once: ``k`` network
    hops of distinct nodes, and ``k - 1`` transfers (only the last stage sends none).
    """
    gcm, nb = groups.cm, problem.model.num_blocks
    held = [v for _, v in groups.distinct()] if only is None else only
    kinds = {(gcm.inv_bw[v], gcm.flop_s_per_byte[v], gcm.block_s[v]) for v in held}
    if not kinds:
        return 0.0
    np = numpy_module()
    weights, read = block_byte_arrays(np, gcm, nb)
    a, f, bs = (np.array(v)[:, None] for v in zip(*kinds, strict=True))
    # Summed in block order, as every bound of this module is.
    reads: float = sum((read * a + bs).min(axis=0).tolist()) + gcm.head * float(a.min())
    computes: float = sum((weights * f + bs).min(axis=0).tolist()) + gcm.head * float(f.min())
    return max(reads, computes) + (_forced_crossings(problem) if only is None else 0.0)


def stage_count_trips(problem: Problem, groups: GroupCosts, top: int) -> list[float]:
    """Per stage count ``S`` (index 0 to ``top``), a lower bound on the time per token of
    every pipeline of exactly ``S`` stages on ``groups`` (infinite where none has): the
    least over the node counts of :func:`stage_count_trips_by_nodes`."""
    return [float(v) for v in stage_count_trips_by_nodes(problem, groups, top).min(axis=1)]


def stage_count_trips_by_nodes(problem: Problem, groups: GroupCosts, top: int) -> Any:
    """Per stage count ``S`` (index 0 to ``top``) and node count ``n`` (index 0 to the
    nodes), a lower bound on the time per token of every pipeline of exactly ``S`` stages
    on exactly ``n`` nodes of ``groups`` (infinite where none has), as a numpy array.

    It adds to :func:`_per_block`'s sum what ``S`` stages cost beyond it: each stage's
    fixed time, and what its group makes one of its blocks pay above that block's least
    cost on any group (every stage holds a block): ``w_t`` for a group of ``t`` GPUs, the
    least over the groups of that size.  ``S`` stages on ``n`` nodes take at most
    ``G_n`` GPUs (``G_n`` the GPUs of the ``n`` nodes with the most), so they add at least
    ``S`` times the lower convex hull of the points ``(t, w_t)`` at a mean size of
    ``G_n / S`` (the
    linear relaxation of choosing their sizes; a smaller mean may cost less, so the
    hull is taken no further than its least point).  The ``n`` nodes number at least the
    fewest that hold the model and at most ``S`` (a stage is a group of one node), and
    ``n ≥ 2`` of them cost ``n`` network hops of distinct nodes and ``n - 1`` transfers,
    as in :func:`_forced_crossings`.  By bytes read and by FLOPs (either bounds a stage,
    as in :func:`_per_block`); the larger of the two.  Every other block pays at least
    the least excess of a group size the count leaves room for on ``n`` nodes (no group
    outgrows its node, nor the GPUs the other stages leave at the smallest size)."""
    np = numpy_module()
    gcm, nb = groups.cm, problem.model.num_blocks
    kinds = {
        (t, gcm.inv_bw[v], gcm.flop_s_per_byte[v], gcm.block_s[v], gcm.stage_s[v])
        for t, v in groups.distinct()
    }
    if not kinds or top < 1:
        return np.full((top + 1, len(problem.nodes) + 1), math.inf)
    most = max(n.num_gpus for n in problem.nodes)
    crossing = _crossings(problem)
    nodes = len(crossing) - 1
    stages = np.arange(top + 1, dtype=float)[:, None]
    used = np.arange(nodes + 1, dtype=float)[None, :]
    # The GPUs of the n nodes with the most, per n.
    gpus = np.array(
        [0, *accumulate(sorted((n.num_gpus for n in problem.nodes), reverse=True))], dtype=float
    )[None, :]
    # Node counts a stage count may use: the fewest holding the model up to itself.
    fewest = _fewest_nodes(problem) or nodes
    usable = (used >= max(1, fewest)) & (used <= stages) & (stages >= 1)
    weights, read = block_byte_arrays(np, gcm, nb)
    listed = list(kinds)
    t, a, f, bs, ss = (np.array(v) for v in zip(*listed, strict=True))
    best = np.zeros((top + 1, nodes + 1))
    for sizes, per_byte in ((read, a), (weights, f)):
        cost = sizes[None, :] * per_byte[:, None] + bs[:, None]
        least = cost.min(axis=0)
        base = sum(least.tolist()) + gcm.head * float(per_byte.min())
        excess = (cost - least[None, :]).min(axis=1) + ss
        steps: dict[int, float] = {}
        for size, w in zip(t.tolist(), excess.tolist(), strict=True):
            steps[size] = min(steps.get(size, math.inf), w)
        hx, hy = _lower_hull(sorted(steps.items()))
        with np.errstate(divide="ignore", invalid="ignore"):
            mean = np.minimum(gpus / np.maximum(stages, 1.0), hx[-1])
        added = stages * np.interp(mean, hx, hy) + np.array(crossing)[None, :]
        # The other blocks pay at least the least excess of a group the stage count
        # leaves room for: no group outgrows its node, nor the GPUs the other stages
        # leave (each takes at least the smallest group).
        extra = (cost - least[None, :]).min(axis=1)
        sizes_up, least_up = _least_by_size(t.tolist(), extra.tolist())
        room = np.minimum(most, gpus - (stages - 1) * sizes_up[0])
        at = np.searchsorted(np.array(sizes_up, dtype=float), room, side="right") - 1
        pay = np.where(at >= 0, np.array([math.inf, *least_up])[at + 1], math.inf)
        others = np.maximum(0.0, nb - stages)
        with np.errstate(invalid="ignore"):
            added = added + np.where(others > 0, others * pay, 0.0)
        added[~usable | (mean < hx[0])] = np.inf
        best = np.maximum(best, base + added)
    return best


def _least_by_size(sizes: list[int], values: list[float]) -> tuple[list[int], list[float]]:
    """The distinct ``sizes`` ascending, and per size the least of ``values`` over the
    sizes up to it."""
    least: dict[int, float] = {}
    for t, v in zip(sizes, values, strict=True):
        least[t] = min(least.get(t, math.inf), v)
    up = sorted(least)
    return up, list(accumulate((least[t] for t in up), min))


def _lower_hull(points: list[tuple[int, float]]) -> tuple[list[float], list[float]]:
    """The lower convex hull of ``points`` (sorted by x) up to its least point: where a
    larger x costs more, the least is kept."""
    hull: list[tuple[float, float]] = []
    for x, y in points:
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (y2 - y1) * (x - x1) >= (y - y1) * (x2 - x1):
                hull.pop()
            else:
                break
        hull.append((float(x), float(y)))
    low = min(range(len(hull)), key=lambda i: (hull[i][1], i))
    hull = hull[: low + 1]
    return [x for x, _ in hull], [y for _, y in hull]


def _fewest_nodes(problem: Problem) -> int | None:
    """The fewest of ``problem``'s nodes whose memory holds the model (None when all of
    them do not)."""
    need, held, k = problem.total_bytes, 0, 0
    for room in sorted(problem.usable.values(), reverse=True):
        if held >= need:
            break
        held, k = held + room, k + 1
    return k if held >= need else None


def _crossings(problem: Problem) -> list[float]:
    """Per node count ``k`` (index), the least seconds of network hops and transfers a
    pipeline leaving ``k`` of ``problem``'s nodes pays: ``k`` hops of distinct nodes and
    ``k - 1`` transfers (none for one node)."""
    cm = problem.cost_model()
    # Prefix sums, left to right as ``sum`` adds them.
    hops = [0, *accumulate(sorted(cm.latency_s))]
    sends = [0, *accumulate(sorted(cm.xfer_s))]
    return [0.0, 0.0, *(hops[k] + sends[k - 1] for k in range(2, len(hops)))]


def _forced_crossings(problem: Problem) -> float:
    """Seconds of network hops and transfers every pipeline of ``problem``'s whole nodes
    pays because the fewest nodes that hold it are several (0 when one does)."""
    k = _fewest_nodes(problem)
    return 0.0 if k is None or k < 2 else _crossings(problem)[k]
