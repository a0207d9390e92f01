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
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from stowplan.cost import CostModel
from stowplan.model import NodeDescriptor, gpu_group_id
from stowplan.parallel_rules import legal_tensor_parallel
from stowplan.planner.common import Problem

__all__ = ["GROUPED_NODE_LIMIT", "GroupedOptimum", "grouped_bound", "grouped_work", "solve_grouped"]

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


@lru_cache(maxsize=16384)
def group_node(node: NodeDescriptor, new_id: str, size: int) -> NodeDescriptor:
    """``size`` of ``node``'s GPUs as a node of their own (their share of its figures)."""
    from dataclasses import replace

    if size == node.num_gpus:
        return node if new_id == node.id else replace(node, id=new_id)
    g = node.num_gpus
    bw = node.mem_bandwidth_gbps
    return replace(
        node,
        id=new_id,
        num_gpus=size,
        vram_bytes=node.vram_bytes * size // g,
        flops_estimate=node.flops_estimate * size / g,
        mem_bandwidth_gbps=None if bw is None else bw * size / g,
    )


def grouped_work(problem: Problem, allowed: Sequence[int] | None) -> int:
    """Element operations the exact solve needs (to decide whether to run it inline)."""
    n = problem.model.num_blocks + 1
    kinds = {
        (_signature(node), len(degrees(problem, node, allowed)), node.num_gpus)
        for node in problem.nodes
    }
    cube = len(problem.nodes) >= 3  # interior nodes need whole matrices
    per_node = sum(2 * g * k * (n**3 if cube else 4 * n * n) for _, k, g in kinds)
    return per_node + (1 << len(problem.nodes)) * len(problem.nodes) * n * n


def _signature(node: NodeDescriptor) -> tuple[object, ...]:
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
                gid = node.id if t == node.num_gpus else gpu_group_id(node.id, 0, t)
                kinds[t] = len(vnodes)
                vnodes.append(group_node(node, gid, t))
                parents.append(node.id)
            self.kinds.append(kinds)
        self.cm = CostModel(problem.model, vnodes, problem.constraints, parents=parents)


class _NodeSolver:
    """Step 1: the best sub-pipeline of GPU groups of one node over every block range."""

    def __init__(self, groups: _Groups, d: int, gpus: int, add: bool) -> None:
        self.cm = groups.cm
        self.kinds = groups.kinds[d]
        self.gpus = gpus
        self.add = add
        self.np = _np()

    def _stage(self, v: int, first: bool, last: bool, out: str, ret: float = 0.0) -> Any:
        from stowplan.planner.exact import _stage_matrix

        cm = self.cm
        if last:
            return _stage_matrix(cm, v, first, True, ret if self.add else 0.0)
        if out == "intra":
            hop = cm.intra_latency_s[v] if self.add else 0.0
            return _stage_matrix(cm, v, first, False, hop, xfer=cm.intra_xfer_s[v])
        return _stage_matrix(cm, v, first, False, cm.latency_s[v] if self.add else 0.0)

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

    def suffixes(self, nb: int) -> list[Any]:
        """``Q[u]``: per start block, the best chain of groups on u GPUs that ends the
        pipeline (its last group owns the head and sends the token back over the
        network), the others passing on inside the node.  Vectors only: O(G · k · nb²)."""
        np, cm = self.np, self.cm
        q: list[Any] = [None] * (self.gpus + 1)
        for u in range(1, self.gpus + 1):
            best = None
            for t, v in self.kinds.items():
                if t > u:
                    continue
                if t == u:
                    cand = self._stage(v, False, True, "", cm.latency_s[v])[:, nb]
                elif q[u - t] is not None:
                    s = self._stage(v, False, False, "intra")
                    with np.errstate(invalid="ignore"):
                        both = (
                            s + q[u - t][None, :] if self.add else np.maximum(s, q[u - t][None, :])
                        )
                    cand = both.min(axis=1)
                else:
                    continue
                best = cand if best is None else np.minimum(best, cand)
            q[u] = best
        return q

    def last_vector(self, nb: int) -> Any:
        """N[i, nb] for the pipeline's last node (not alone)."""
        q = [x for x in self.suffixes(nb) if x is not None]
        return self.np.minimum.reduce(q) if q else self.np.full(nb + 1, self.np.inf)

    def backtrack_last(self, i: int, nb: int, value: float) -> list[tuple[int, int, int]]:
        """The groups (degree, lo, hi) of the best ending sub-pipeline from block ``i``."""
        q = self.suffixes(nb)
        tol = 1e-12 * max(abs(value), 1e-300)
        np, cm = self.np, self.cm
        for u in range(1, self.gpus + 1):
            if q[u] is None or abs(q[u][i] - value) > tol:
                continue
            out: list[tuple[int, int, int]] = []
            while True:
                for t, v in self.kinds.items():
                    if t > u:
                        continue
                    if t == u:
                        lone = self._stage(v, False, True, "", cm.latency_s[v])[i, nb]
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

    def backtrack(
        self, first: bool, last: bool, alone: bool, i: int, j: int, value: float
    ) -> list[tuple[int, int, int]]:
        """The groups (degree, lo, hi) of the best sub-pipeline of [i, j)."""
        if last and not alone:
            return self.backtrack_last(i, j, value)
        _, p, fin = self.node_matrix(first, last, alone)
        r = 0 if first else i
        tol = 1e-12 * max(abs(value), 1e-300)
        for t, lone, end in fin:
            if abs(lone[r, j] - value) <= tol:
                return [(t, i, j)]
            for u in range(1, self.gpus - t + 1):
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
    problem: Problem, objective: str, allowed: Sequence[int] | None = None
) -> GroupedOptimum | None:
    """The best pipeline over every grouping of ``problem``'s nodes into GPU groups of the
    ``allowed`` degrees (None: every legal one); None when nothing fits.

    ``problem`` holds whole nodes; the stage count is free (1 to the number of groups).
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
    cache: dict[tuple[object, ...], tuple[Any, Any, Any, float]] = {}
    first, mid, last = [], [], []
    best_val = math.inf
    best_alone: int | None = None
    best_chain: tuple[int, int] | None = None
    for d, node in enumerate(problem.nodes):
        solver = solvers[d]
        if solver is None:
            first.append(np.full(nb + 1, np.inf))
            mid.append(np.full((nb + 1, nb + 1), np.inf))
            last.append(np.full(nb + 1, np.inf))
            continue
        key = (_signature(node), tuple(solver.kinds))
        if key not in cache:
            f = solver.node_matrix(True, False, False)[0][0]
            # Interior nodes exist from three nodes on; only they need whole matrices.
            m = (
                solver.node_matrix(False, False, False)[0]
                if n >= 3
                else np.full((nb + 1, nb + 1), np.inf)
            )
            la = solver.last_vector(nb)
            alone = float(solver.node_matrix(True, True, True)[0][0, nb])
            cache[key] = (f, m, la, alone)
        f, m, la, alone = cache[key]
        first.append(f)
        mid.append(m)
        last.append(la)
        if alone < best_val:
            best_val, best_alone = alone, d
    comb = np.add if add else np.maximum
    size = 1 << n
    g = np.full((size, nb + 1), np.inf)
    for d in range(n):
        g[1 << d] = first[d]
    for mask in range(1, size):
        row = g[mask]
        if not np.isfinite(row).any():
            continue
        for e in range(n):
            if mask >> e & 1:
                continue
            v = float(comb(row, last[e]).min())
            if v < best_val:
                best_val, best_chain = v, (mask, e)
            cand = comb(row[:, None], mid[e]).min(axis=0)
            np.minimum(g[mask | 1 << e], cand, out=g[mask | 1 << e])
    # Step 3: the nodes' ranges, then each node's groups.
    if best_chain is not None:
        mask, e = best_chain
        parts = _backtrack_nodes(g, mask, e, first, mid, last, comb, nb, best_val)
    elif best_alone is not None:
        parts = [(best_alone, True, True, True, 0, nb, best_val)]
    else:
        return None
    stages: list[tuple[str, int, int, int]] = []
    for d, is_first, is_last, alone_, i, j, val in parts:
        solver = solvers[d]
        assert solver is not None
        for t, lo, hi in solver.backtrack(is_first, is_last, alone_, i, j, val):
            stages.append((problem.nodes[d].id, t, lo, hi))
    return GroupedOptimum(value=best_val, stages=tuple(stages))


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
            prev = g[mask ^ (1 << d)]
            vals = comb(prev, mid[d][:, j])
            k = int(np.argmin(vals))
            if np.isfinite(vals[k]) and vals[k] <= target * (1 + 1e-12):
                out.append((d, False, False, False, k, j, float(mid[d][k, j])))
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
