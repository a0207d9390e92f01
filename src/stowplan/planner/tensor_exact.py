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
   (or, for the last node, sends the token back);
2. a dynamic programme over (set of nodes used, blocks placed) chains the nodes, as
   the single-stage subset DP does;
3. backtracking gives each node's groups and block bounds.

Stages combine with ``+`` for the time per token and ``max`` for the slowest stage,
so one code serves both objectives.  numpy is imported lazily (extra ``exact``).

Bound (:func:`grouped_bound`): the fractional relaxation of
:func:`~stowplan.planner.exact.fluid_bound` on the whole nodes with every node at its
full bandwidth and FLOPs, no all-reduce, and the cheaper of its network and
intra-node hop: no grouping of any node is faster.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from stowplan.cost import CostModel
from stowplan.model import NodeDescriptor, gpu_group_node
from stowplan.parallel_rules import legal_tensor_parallel
from stowplan.planner.common import Problem

__all__ = [
    "GROUPED_NODE_LIMIT",
    "GroupedOptimum",
    "grouped_bound",
    "grouped_work",
    "node_signature",
    "solve_grouped",
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


def _np() -> Any:
    import numpy as np

    return np


def degrees(problem: Problem, node: NodeDescriptor, allowed: Sequence[int] | None) -> list[int]:
    """The degrees a group of ``node`` may take (legal for the model, allowed by the rule)."""
    legal = legal_tensor_parallel(problem.model, node.num_gpus)
    return [t for t in legal if allowed is None or t in allowed]


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


def node_signature(node: NodeDescriptor) -> tuple[object, ...]:
    return (
        node.gpu_name,
        node.vram_bytes,
        node.flops_estimate,
        node.link_mbps,
        node.mem_bandwidth_gbps,
        node.link_latency_ms,
        node.num_gpus,
        node.intra_link_gbps,
        node.intra_link_latency_us,
    )


class _Groups:
    """Every allowed group of every node as a planning node of one cost model."""

    def __init__(self, problem: Problem, allowed: Sequence[int] | None) -> None:
        vnodes: list[NodeDescriptor] = []
        parents: list[str] = []
        self.kinds: list[dict[int, int]] = []
        """Per node index: degree → planning node index."""
        for node in problem.nodes:
            kinds: dict[int, int] = {}
            for t in degrees(problem, node, allowed):
                kinds[t] = len(vnodes)
                vnodes.append(gpu_group_node(node, 0, t))
                parents.append(node.id)
            self.kinds.append(kinds)
        self.cm = CostModel(
            problem.model,
            vnodes,
            problem.constraints,
            parents=parents,
            microbatch=problem.microbatch,
        )


class _NodeSolver:
    """Step 1: the best sub-pipeline of GPU groups of one node over every block range."""

    def __init__(self, groups: _Groups, d: int, gpus: int, add: bool) -> None:
        self.cm = groups.cm
        self.kinds = groups.kinds[d]
        self.gpus = gpus
        self.add = add
        self.np = _np()
        self._memo: dict[tuple[int, bool, bool, str, float], Any] = {}

    def apply_mid(self, row: Any) -> Any:
        """``row ⊗ N_mid``: per end block j, the best over i of ``row[i]`` then an interior
        sub-pipeline of [i, j) on this node (vector-matrix steps only)."""
        np = self.np
        vec = row[None, :]
        p: list[Any] = [None] * (self.gpus + 1)
        best = np.full(row.shape, np.inf)
        for u in range(1, self.gpus + 1):
            for t, v in self.kinds.items():
                if t > u:
                    continue
                src = vec if t == u else p[u - t]
                if src is None:
                    continue
                cand = self.combine(src, self._stage(v, False, False, "intra"))
                p[u] = cand if p[u] is None else np.minimum(p[u], cand)
        for t, v in self.kinds.items():
            end = self._stage(v, False, False, "net")
            best = np.minimum(best, self.combine(vec, end)[0])
            for u in range(1, self.gpus - t + 1):
                if p[u] is not None:
                    best = np.minimum(best, self.combine(p[u], end)[0])
        return best

    def column_mid(self, j: int) -> Any:
        """``N_mid[:, j]``: per start block, the best interior sub-pipeline ending at j."""
        np = self.np
        q = self._backward(lambda v: self._stage(v, False, False, "net")[:, j])
        got = [x for x in q if x is not None]
        return np.minimum.reduce(got) if got else np.full(self.cm.num_blocks + 1, np.inf)

    def _backward(self, end: Callable[[int], Any]) -> list[Any]:
        """``Q[u]``: per start block, the best chain of groups on u GPUs whose last group's
        times (per start block) are ``end(v)`` and whose others pass on inside the node."""
        np = self.np
        q: list[Any] = [None] * (self.gpus + 1)
        for u in range(1, self.gpus + 1):
            for t, v in self.kinds.items():
                if t > u:
                    continue
                if t == u:
                    cand = end(v)
                elif q[u - t] is not None:
                    s = self._stage(v, False, False, "intra")
                    with np.errstate(invalid="ignore"):
                        both = (
                            s + q[u - t][None, :] if self.add else np.maximum(s, q[u - t][None, :])
                        )
                    cand = both.min(axis=1)
                else:
                    continue
                q[u] = cand if q[u] is None else np.minimum(q[u], cand)
        return q

    def _stage(self, v: int, first: bool, last: bool, out: str, ret: float = 0.0) -> Any:
        key = (v, first, last, out, ret)
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = self._stage_matrix(v, first, last, out, ret)
        return got

    def _stage_matrix(self, v: int, first: bool, last: bool, out: str, ret: float) -> Any:
        from stowplan.planner.exact import stage_matrix

        cm = self.cm
        if last:
            return stage_matrix(cm, v, first, True, ret if self.add else 0.0)
        if out == "intra":
            hop = cm.intra_latency_s[v] if self.add else 0.0
            return stage_matrix(cm, v, first, False, hop, xfer=cm.intra_xfer_s[v])
        return stage_matrix(cm, v, first, False, cm.latency_s[v] if self.add else 0.0)

    def combine(self, a: Any, b: Any) -> Any:
        """Chain ``a`` (rows: start block) then ``b``: best over the block between them."""
        np = self.np
        with np.errstate(invalid="ignore"):
            if self.add:
                return (a[:, :, None] + b[None, :, :]).min(axis=1)
            return np.maximum(a[:, :, None], b[None, :, :]).min(axis=1)

    def chains(self, first: bool, rows: slice) -> list[Any]:
        """``P[u]`` for u = 0..gpus: chains of groups on u GPUs that pass on inside the node
        (``None`` where there is none); only the start blocks ``rows``."""
        p: list[Any] = [None] * (self.gpus + 1)
        for u in range(1, self.gpus + 1):
            best = None
            for t, v in self.kinds.items():
                if t > u:
                    continue
                if t == u:
                    cand = self._stage(v, first, False, "intra")[rows]
                elif p[u - t] is not None:
                    cand = self.combine(p[u - t], self._stage(v, False, False, "intra"))
                else:
                    continue
                best = cand if best is None else self.np.minimum(best, cand)
            p[u] = best
        return p

    def finals(
        self, first: bool, last: bool, alone: bool, rows: slice
    ) -> list[tuple[int, Any, Any]]:
        """Per degree t: (t, one group alone, a group ending a chain) stage matrices."""
        cm, out = self.cm, []
        for t, v in self.kinds.items():
            if last:
                lone = 0.0 if alone else cm.latency_s[v]
                chain = cm.intra_latency_s[v] if alone else cm.latency_s[v]
                out.append(
                    (
                        t,
                        self._stage(v, first, True, "", lone)[rows],
                        self._stage(v, False, True, "", chain),
                    )
                )
            else:
                out.append(
                    (
                        t,
                        self._stage(v, first, False, "net")[rows],
                        self._stage(v, False, False, "net"),
                    )
                )
        return out

    def node_matrix(self, first: bool, last: bool, alone: bool) -> tuple[Any, list[Any], list[Any]]:
        """N[i, j]: the best sub-pipeline of blocks [i, j) on this node in the role given,
        with the chains and final stages it was built from (for backtracking)."""
        rows = slice(0, 1) if first else slice(None)
        p = self.chains(first, rows)
        fin = self.finals(first, last, alone, rows)
        best = None
        for t, lone, end in fin:
            best = lone if best is None else self.np.minimum(best, lone)
            for u in range(1, self.gpus - t + 1):
                if p[u] is not None:
                    best = self.np.minimum(best, self.combine(p[u], end))
        return best, p, fin

    def suffixes(self, nb: int, wrap: bool = False) -> list[Any]:
        """``Q[u]``: per start block, the best chain of groups on u GPUs that ends the
        pipeline (its last group owns the head and sends the token back over the
        network, or to a group of this node with ``wrap``), the others passing on inside
        the node.  Vectors only: O(G · k · nb²)."""
        ret = self.cm.intra_latency_s if wrap else self.cm.latency_s
        return self._backward(lambda v: self._stage(v, False, True, "", ret[v])[:, nb])

    def last_vector(self, nb: int) -> Any:
        """N[i, nb] for the pipeline's last node (not alone)."""
        q = [x for x in self.suffixes(nb) if x is not None]
        return self.np.minimum.reduce(q) if q else self.np.full(nb + 1, self.np.inf)

    def backtrack_last(
        self, i: int, nb: int, value: float, budget: int | None = None, wrap: bool = False
    ) -> list[tuple[int, int, int]]:
        """The groups (degree, lo, hi) of the best ending sub-pipeline from block ``i`` on
        at most ``budget`` GPUs."""
        q = self.suffixes(nb, wrap)
        tol = 1e-12 * max(abs(value), 1e-300)
        np, cm = self.np, self.cm
        ret = cm.intra_latency_s if wrap else cm.latency_s
        for u in range(1, (budget or self.gpus) + 1):
            if q[u] is None or abs(q[u][i] - value) > tol:
                continue
            out: list[tuple[int, int, int]] = []
            while True:
                for t, v in self.kinds.items():
                    if t > u:
                        continue
                    if t == u:
                        lone = self._stage(v, False, True, "", ret[v])[i, nb]
                        if abs(lone - value) <= tol:
                            return [*out, (t, i, nb)]
                        continue
                    if q[u - t] is None:
                        continue
                    s = self._stage(v, False, False, "intra")[i]
                    vals = s + q[u - t] if self.add else np.maximum(s, q[u - t])
                    m = int(np.argmin(vals))
                    if abs(vals[m] - value) <= tol:
                        out.append((t, i, m))
                        i, u, value = m, u - t, float(q[u - t][m])
                        break
                else:
                    raise AssertionError("no ending chain attains its value")
        raise AssertionError("no ending sub-pipeline attains the node's value")

    def prefixes(self) -> list[Any]:
        """``R[b]``: per end block, the best chain of groups on at most b GPUs that starts
        the pipeline (its first group owns the embed) and passes on over the network."""
        np = self.np
        rows = slice(0, 1)
        p = self.chains(True, rows)
        fin = self.finals(True, False, False, rows)
        exact: list[Any] = [None] * (self.gpus + 1)
        for t, lone, end in fin:
            cands = [(t, lone[0])]
            cands += [
                (u + t, self.combine(p[u], end)[0])
                for u in range(1, self.gpus - t + 1)
                if p[u] is not None
            ]
            for used, vec in cands:
                exact[used] = vec if exact[used] is None else np.minimum(exact[used], vec)
        out: list[Any] = [None] * (self.gpus + 1)
        for b in range(1, self.gpus + 1):
            got = [x for x in exact[1 : b + 1] if x is not None]
            out[b] = np.minimum.reduce(got) if got else None
        return out

    def backtrack(
        self,
        first: bool,
        last: bool,
        alone: bool,
        i: int,
        j: int,
        value: float,
        budget: int | None = None,
    ) -> list[tuple[int, int, int]]:
        """The groups (degree, lo, hi) of the best sub-pipeline of [i, j) on at most
        ``budget`` GPUs (default: all of them)."""
        if last and not alone:
            return self.backtrack_last(i, j, value, budget)
        most = self.gpus if budget is None else budget
        _, p, fin = self.node_matrix(first, last, alone)
        r = 0 if first else i
        tol = 1e-12 * max(abs(value), 1e-300)
        for t, lone, end in fin:
            if t > most:
                continue
            if abs(lone[r, j] - value) <= tol:
                return [(t, i, j)]
            for u in range(1, most - t + 1):
                if p[u] is None:
                    continue
                vals = (p[u][r] + end[:, j]) if self.add else self.np.maximum(p[u][r], end[:, j])
                m = int(self.np.argmin(vals))
                if abs(vals[m] - value) <= tol:
                    return [*self._chain_back(p, first, u, r, i, m, float(p[u][r, m])), (t, m, j)]
        raise AssertionError("no sub-pipeline attains the node's value")

    def _chain_back(
        self, p: list[Any], first: bool, u: int, r: int, i: int, j: int, value: float
    ) -> list[tuple[int, int, int]]:
        tol = 1e-12 * max(abs(value), 1e-300)
        for t, v in self.kinds.items():
            if t > u:
                continue
            if t == u:
                if abs(self._stage(v, first, False, "intra")[i, j] - value) <= tol:
                    return [(t, i, j)]
                continue
            if p[u - t] is None:
                continue
            s = self._stage(v, False, False, "intra")[:, j]
            vals = (p[u - t][r] + s) if self.add else self.np.maximum(p[u - t][r], s)
            m = int(self.np.argmin(vals))
            if abs(vals[m] - value) <= tol:
                return [
                    *self._chain_back(p, first, u - t, r, i, m, float(p[u - t][r, m])),
                    (t, m, j),
                ]
        raise AssertionError("no chain attains its value")


def solve_grouped(
    problem: Problem, objective: str, allowed: Sequence[int] | None = None, *, wrap: bool = True
) -> GroupedOptimum | None:
    """The best pipeline over every grouping of ``problem``'s nodes into GPU groups of the
    ``allowed`` degrees (None: every legal one); None when nothing fits.

    ``problem`` holds whole nodes; the stage count is free (1 to the number of groups).
    Without ``wrap`` a node's stages are consecutive in pipeline order (no node holds
    both ends unless it is the only one), as engines that rank a node's GPUs together
    need.
    """
    np = _np()
    add = objective == "latency"
    groups = _Groups(problem, allowed)
    nb = problem.model.num_blocks
    n = len(problem.nodes)
    solvers = [
        _NodeSolver(groups, d, node.num_gpus, add) if groups.kinds[d] else None
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
    for d, node in enumerate(problem.nodes):
        solver = solvers[d]
        if solver is None:
            first.append(np.full(nb + 1, np.inf))
            mid.append(_Interior(None, None, nb, comb))
            last.append(np.full(nb + 1, np.inf))
            continue
        key = (node_signature(node), tuple(solver.kinds))
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
    for w, solver in enumerate(solvers):
        if not wrap or solver is None or solver.gpus < 2 or n < 2:
            continue
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
    np = _np()
    n = len(first)
    size = 1 << n
    g = np.full((size, nb + 1), np.inf)
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
            np.minimum(g[mask | 1 << e], mid[e].apply(row), out=g[mask | 1 << e])
    return g, best, at


class _Interior:
    """A node as an interior part of the pipeline: ``row ⊗ N_mid`` and ``N_mid[:, j]``,
    from its whole matrix when many rows will pass through it, else vector by vector."""

    def __init__(self, solver: _NodeSolver | None, matrix: Any, nb: int, comb: Any) -> None:
        self.solver = solver
        self.matrix = matrix
        self.nb = nb
        self.comb = comb
        self.empty = solver is None and matrix is None

    def apply(self, row: Any) -> Any:
        if self.matrix is not None:
            return self.comb(row[:, None], self.matrix).min(axis=0)
        assert self.solver is not None
        return self.solver.apply_mid(row)

    def column(self, j: int) -> Any:
        if self.matrix is not None:
            return self.matrix[:, j]
        if self.solver is None:
            return _np().full(self.nb + 1, _np().inf)
        return self.solver.column_mid(j)


def _backtrack_nodes(
    g: Any, mask: int, e: int, first: Any, mid: Any, last: Any, comb: Any, nb: int, value: float
) -> list[tuple[int, bool, bool, bool, int, int, float]]:
    """(node, first?, last?, alone?, lo, hi, its value) in pipeline order."""
    np = _np()
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


def grouped_bound(problem: Problem, objective: str, allowed: Sequence[int] | None = None) -> float:
    """A valid lower bound (seconds) on ``objective`` over every grouping: see the module.

    For the time per token each block is also charged the least it can cost on any
    group of its node (its degree's share of the bandwidth plus its all-reduces), which
    a block on a tensor-parallel group always pays.
    """
    from stowplan.planner.exact import fluid_bound

    cm = problem.cost_model()
    cm.relax_groups()
    relaxed = fluid_bound(problem, cm, objective)
    if objective != "latency":
        return relaxed
    groups = _Groups(problem, allowed)
    gcm = groups.cm
    nb = cm.num_blocks
    rd, kvr, mem = cm.smallest_block()
    rate = [
        min((gcm.block_seconds(v, rd + kvr, rd) for v in kinds.values()), default=math.inf)
        for kinds in groups.kinds
    ]
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
        return relaxed
    # The blocks' least cost, the head's least read, and no hop at all (a one-stage plan
    # has none) when that is all the fluid bound's hops could add.
    head = min(cm.head * min(cm.inv_bw[d], cm.flop_s_per_byte[d]) for d in range(len(rate)))
    return max(relaxed, total + head)
