"""Step 1 of the joint solve (:mod:`stowplan.planner.tensor.exact`): every allowed GPU
group of every node as a planning node of one cost model, and per node the best
sub-pipeline of its groups over every block range (a knapsack over its GPUs)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from stowplan.cost import CostModel
from stowplan.model import NodeDescriptor, gpu_group_node
from stowplan.planner.exact.pipelines import stage_matrix
from stowplan.planner.problem import Problem
from stowplan.rules.tensor_parallel import legal_tensor_parallel

__all__ = [
    "GroupCosts",
    "NodeSolver",
    "block_byte_arrays",
    "degrees",
    "node_signature",
    "numpy_module",
    "row_then",
]


def numpy_module() -> Any:
    import numpy as np

    return np


def block_byte_arrays(np: Any, cm: CostModel, nb: int) -> tuple[Any, Any]:
    """Each block's weight bytes, and the bytes a step reads of it (weights and KV)."""
    weights = np.diff(np.array(cm.read_prefix[: nb + 1], dtype=float))
    return weights, weights + np.diff(np.array(cm.kv_prefix[: nb + 1], dtype=float))


def degrees(problem: Problem, node: NodeDescriptor, allowed: Sequence[int] | None) -> list[int]:
    """The degrees a group of ``node`` may take (legal for the model, allowed by the rule)."""
    legal = legal_tensor_parallel(problem.model, node.num_gpus)
    return [t for t in legal if allowed is None or t in allowed]


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


_TOEPLITZ_FROM = 16
"""Square matrices from this size are taken by their first rows (:meth:`NodeSolver._row`)
when they are upper Toeplitz."""


@lru_cache(maxsize=8)
def _offsets(size: int) -> tuple[Any, Any]:
    """For a square matrix of ``size``: each entry's ``j - i`` (clipped at 0, to index a
    row with) and whether ``j > i``."""
    np = numpy_module()
    ends = np.arange(size)
    offset = ends[None, :] - ends[:, None]
    upper = offset > 0
    offset = np.where(upper, offset, 0)
    offset.flags.writeable = False
    upper.flags.writeable = False
    return offset, upper


def _upper_toeplitz(np: Any, m: Any, known: dict[int, tuple[Any, Any]]) -> Any:
    """The first row of ``m`` when every entry ``m[i, j]`` is ``m[0, j - i]`` above the
    diagonal and infinite on and below it (None otherwise); ``known``: the answers so far
    by the matrix's identity (each kept with its matrix, so no other takes its id)."""
    if id(m) in known:
        return known[id(m)][1]
    offset, upper = _offsets(m.shape[0])
    row = m[0]
    found = row if np.array_equal(np.where(upper, row[offset], np.inf), m) else None
    known[id(m)] = (m, found)
    return found


def _shifted(np: Any, g: Any) -> Any:
    """``shifted[d, e]``: ``g[e - d]`` where ``e > d``, else infinite."""
    offset, upper = _offsets(len(g))
    return np.where(upper, g[offset], np.inf)


def _row_product(np: Any, f: Any, shifted: Any, add: bool) -> Any:
    """The first row of the product of the upper Toeplitz matrices of first rows ``f`` and
    ``g`` (:func:`_shifted` of ``g`` given; best over the block between them: the least
    sum, or the least larger of the two for ``add`` False): per offset ``e``, the least
    over ``d`` of ``f[d]`` with ``g[e - d]``.

    Every block alike makes a stage's time depend on its block count only, so the stage
    matrices of a node's non-first roles are upper Toeplitz, and so are their products:
    entry ``[i, k]`` of the whole product is the least of the same sums (or maxima) over
    the blocks between, met here once per offset instead of once per row."""
    # f[0] is infinite (the diagonal), so offset 0 never wins.
    return row_then(np, f, shifted, add)


def row_then(np: Any, row: Any, matrix: Any, add: bool) -> Any:
    """Per column ``k``, the least over ``j`` of ``row[j]`` with ``matrix[j, k]`` (their
    sum, or the larger of the two for ``add`` False).

    Only the ``j`` from ``row``'s first finite entry to its last take part: the others
    give infinite terms (the matrices here hold no -inf and no NaN), which never change
    a least value that some finite ``row[j]`` takes part in, and leave it infinite
    otherwise — the same least values."""
    finite = np.isfinite(row)
    lo = int(finite.argmax())
    if not finite[lo]:
        return np.full(matrix.shape[1], np.inf)
    hi = len(row) - int(finite[::-1].argmax())
    part = row[lo:hi, None]
    terms = part + matrix[lo:hi] if add else np.maximum(part, matrix[lo:hi])
    return terms.min(axis=0)


def _expand(np: Any, row: Any) -> Any:
    """The upper Toeplitz matrix of first row ``row``."""
    offset, upper = _offsets(len(row))
    return np.where(upper, row[offset], np.inf)


class GroupCosts:
    """Every allowed group of every node as a planning node of one cost model."""

    def __init__(
        self, problem: Problem, allowed: Sequence[int] | None, like: GroupCosts | None = None
    ) -> None:
        """``like``: the groups of the same nodes and degrees at another microbatch, whose
        cost model's view at ``problem``'s microbatch these groups use."""
        self._stages: dict[tuple[bool | float | int, ...], Any] = {}
        self._distinct: list[tuple[int, int]] | None = None
        self.toeplitz: dict[int, tuple[Any, Any]] = {}
        """Per matrix of these groups' solves (by identity, kept with it): its first row
        when it is upper Toeplitz, else None."""
        self.node_matrices: dict[tuple[object, ...], Any] = {}
        """:meth:`NodeSolver.node_matrix`, its prefixes and suffixes per node alike
        (:attr:`NodeSolver.alike`) and role, shared by the solves of these groups (never
        changed once made)."""
        self.kinds: list[dict[int, int]]
        """Per node index: degree → planning node index."""
        self.cm: CostModel
        if like is not None:
            self.kinds = like.kinds
            self.cm = like.cm.at_microbatch(problem.microbatch or problem.constraints.batch)
            return
        vnodes: list[NodeDescriptor] = []
        parents: list[str] = []
        self.kinds = []
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

    def distinct(self) -> list[tuple[int, int]]:
        """One ``(degree, planning node index)`` per degree and stage class of the groups
        (groups of one class have the same rates, block and stage costs, transfer and
        room: every figure a bound over the groups reads)."""
        if self._distinct is None:
            cls = self.cm.stage_class
            seen: dict[tuple[int, int], int] = {}
            for per_node in self.kinds:
                for t, v in per_node.items():
                    seen.setdefault((t, cls[v]), v)
            self._distinct = [(t, v) for (t, _), v in seen.items()]
        return self._distinct

    def stage(self, v: int, first: bool, last: bool, hop: float, xfer: float | None = None) -> Any:
        """:func:`~stowplan.planner.exact.pipelines.stage_matrix` of group ``v``: the times
        without ``hop`` are computed once and shared by every solve of these groups."""
        cm = self.cm
        # Groups alike in every figure the matrix reads share it.
        key = (
            first,
            last,
            cm.xfer_s[v] if xfer is None else xfer,
            cm.inv_bw[v],
            cm.flop_s_per_byte[v],
            cm.block_s[v],
            cm.stage_s[v],
            cm.usable[v],
        )
        base = self._stages.get(key)
        if base is None:
            base = self._stages[key] = stage_matrix(cm, v, first, last, 0.0, xfer=xfer)
        return base + hop if hop else base


class NodeSolver:
    """Step 1: the best sub-pipeline of GPU groups of one node over every block range."""

    def __init__(self, groups: GroupCosts, d: int, gpus: int, add: bool) -> None:
        self.cm = groups.cm
        self.groups = groups
        self.kinds = groups.kinds[d]
        self.gpus = gpus
        self.add = add
        self.np = numpy_module()
        self._memo: dict[tuple[int, bool, bool, str, float], Any] = {}
        self._ends: dict[tuple[str, tuple[int, ...]], Any] = {}
        cm = self.cm
        self.alike = (
            gpus,
            add,
            tuple(
                (
                    t,
                    cm.inv_bw[v],
                    cm.flop_s_per_byte[v],
                    cm.block_s[v],
                    cm.stage_s[v],
                    cm.xfer_s[v],
                    cm.usable[v],
                    cm.latency_s[v],
                    cm.intra_latency_s[v],
                    cm.intra_xfer_s[v],
                )
                for t, v in self.kinds.items()
            ),
        )
        """Every figure this node's matrices read (its groups' degrees, rates, room, links
        and the solve's objective): nodes alike in it have the same matrices."""

    def apply_mid(self, row: Any) -> Any:
        """``row ⊗ N_mid``: per end block j, the best over i of ``row[i]`` then an interior
        sub-pipeline of [i, j) on this node (vector-matrix steps only)."""
        np = self.np
        vec = row[None, :]
        p: list[Any] = [None] * (self.gpus + 1)
        # No final group fits after a chain on more GPUs: none is built.
        longest = self.gpus - min(self.kinds)
        for u in range(1, longest + 1):
            for t, v in self.kinds.items():
                if t > u:
                    continue
                src = vec if t == u else p[u - t]
                if src is None:
                    continue
                cand = self.combine(src, self._stage(v, False, False, "intra"))
                p[u] = cand if p[u] is None else np.minimum(p[u], cand)
        best = self.combine(vec, self._least_end(self.gpus))[0]
        for u in range(1, longest + 1):
            if p[u] is not None:
                best = np.minimum(best, self.combine(p[u], self._least_end(self.gpus - u))[0])
        return best

    def _least_end(self, most: int) -> Any:
        """Per entry, the least of the interior final stages of the degrees up to ``most``
        (kept per set of degrees).

        A chain then the best of these ends is the best of the chain then each end, bit
        for bit: a sum (or the larger of two) rounds to a value that never falls as an
        operand grows, so the least operand gives the least result."""
        np = self.np
        used = tuple(t for t in self.kinds if t <= most)
        key = ("least end", used)
        got = self._ends.get(key)
        if got is None:
            got = None
            for t, v in self.kinds.items():
                if t <= most:
                    end = self._stage(v, False, False, "net")
                    got = end if got is None else np.minimum(got, end)
            self._ends[key] = got
        return got

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
                    # Per start block i, the least over j of s[i, j] with q[u - t][j].
                    s = self._stage(v, False, False, "intra")
                    cand = row_then(np, q[u - t], s.T, self.add)
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
        cm, groups = self.cm, self.groups
        if last:
            return groups.stage(v, first, True, ret if self.add else 0.0)
        if out == "intra":
            hop = cm.intra_latency_s[v] if self.add else 0.0
            return groups.stage(v, first, False, hop, xfer=cm.intra_xfer_s[v])
        return groups.stage(v, first, False, cm.latency_s[v] if self.add else 0.0)

    def combine(self, a: Any, b: Any) -> Any:
        """Chain ``a`` (rows: start block) then ``b``: best over the block between them."""
        np = self.np
        if a.shape[0] == 1:
            return row_then(np, a[0], b, self.add)[None, :]
        with np.errstate(invalid="ignore"):
            if self.add:
                return (a[:, :, None] + b[None, :, :]).min(axis=1)
            return np.maximum(a[:, :, None], b[None, :, :]).min(axis=1)

    def _row(self, m: Any) -> Any:
        """The first row of ``m`` when it is a square upper Toeplitz matrix of
        :data:`_TOEPLITZ_FROM` rows or more (kept per matrix), else None."""
        size = m.shape[0]
        if m.ndim != 2 or size < _TOEPLITZ_FROM or m.shape != (size, size):
            return None
        return _upper_toeplitz(self.np, m, self.groups.toeplitz)

    def _shifted_of(self, m: Any, row: Any) -> Any:
        """:func:`_shifted` of ``m``'s first row ``row``, kept per matrix."""
        key = ("shifted", id(m))
        kept = self.groups.node_matrices.get(key)
        if kept is None or kept[0] is not m:
            kept = self.groups.node_matrices[key] = (m, _shifted(self.np, row))
        return kept[1]

    def _chain_rows(self) -> list[Any] | None:
        """:meth:`chains` of every start block as the first rows of its matrices, when
        every interior stage matrix of the node's groups is upper Toeplitz (None
        otherwise): the chains are then upper Toeplitz too, and their products and least
        values are taken row by row."""
        stages = {v: self._stage(v, False, False, "intra") for v in self.kinds.values()}
        rows = {v: self._row(m) for v, m in stages.items()}
        if any(r is None for r in rows.values()):
            return None
        return self._chained(
            rows.__getitem__,
            lambda before, v: _row_product(
                self.np, before, self._shifted_of(stages[v], rows[v]), self.add
            ),
        )

    def _chained(self, alone: Callable[[int], Any], then: Callable[[Any, int], Any]) -> list[Any]:
        """``P[u]`` for u = 0..gpus: the least over the degrees ``t`` ≤ u of group ``v``
        alone (``alone(v)``, t = u) or the chain on u − t GPUs then ``v``
        (``then(P[u − t], v)``); ``None`` where there is none."""
        p: list[Any] = [None] * (self.gpus + 1)
        for u in range(1, self.gpus + 1):
            best = None
            for t, v in self.kinds.items():
                if t > u:
                    continue
                if t == u:
                    cand = alone(v)
                elif p[u - t] is not None:
                    cand = then(p[u - t], v)
                else:
                    continue
                best = cand if best is None else self.np.minimum(best, cand)
            p[u] = best
        return p

    def chains(self, first: bool, rows: slice) -> list[Any]:
        """``P[u]`` for u = 0..gpus: chains of groups on u GPUs that pass on inside the node
        (``None`` where there is none); only the start blocks ``rows``."""
        if not first and rows == slice(None):
            chain_rows = self._chain_rows()
            if chain_rows is not None:
                made: list[Any] = []
                for row in chain_rows:
                    if row is None:
                        made.append(None)
                        continue
                    matrix = _expand(self.np, row)
                    self.groups.toeplitz[id(matrix)] = (matrix, matrix[0])
                    made.append(matrix)
                return made
        return self._chained(
            lambda v: self._stage(v, first, False, "intra")[rows],
            lambda before, v: self.combine(before, self._stage(v, False, False, "intra")),
        )

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
        with the chains and final stages it was built from (for backtracking); made once
        per node alike and role for the solves of these groups."""
        key = (self.alike, first, last, alone)
        made = self.groups.node_matrices.get(key)
        if made is None:
            made = self.groups.node_matrices[key] = self._node_matrix(first, last, alone)
        return made

    def _node_matrix(
        self, first: bool, last: bool, alone: bool
    ) -> tuple[Any, list[Any], list[Any]]:
        rows = slice(0, 1) if first else slice(None)
        p = self.chains(first, rows)
        fin = self.finals(first, last, alone, rows)
        if not first:
            best_row = self._node_row(p, fin)
            if best_row is not None:
                return _expand(self.np, best_row), p, fin
        best = None
        for t, lone, end in fin:
            best = lone if best is None else self.np.minimum(best, lone)
            for u in range(1, self.gpus - t + 1):
                if p[u] is not None:
                    best = self.np.minimum(best, self.combine(p[u], end))
        return best, p, fin

    def _node_row(self, p: list[Any], fin: list[tuple[int, Any, Any]]) -> Any:
        """:meth:`node_matrix`'s least values as the first row of an upper Toeplitz
        matrix, when the chains ``p`` and final stages ``fin`` all are (None otherwise)."""
        np = self.np
        chain_rows = [None if m is None else self._row(m) for m in p]
        if any(m is not None and r is None for m, r in zip(p, chain_rows, strict=True)):
            return None
        ends = [(t, self._row(lone), end, self._row(end)) for t, lone, end in fin]
        if any(lone is None or row is None for _, lone, _, row in ends):
            return None
        best = None
        for t, lone, end, end_row in ends:
            best = lone if best is None else np.minimum(best, lone)
            for u in range(1, self.gpus - t + 1):
                if chain_rows[u] is not None:
                    shifted = self._shifted_of(end, end_row)
                    best = np.minimum(best, _row_product(np, chain_rows[u], shifted, self.add))
        return best

    def suffixes(self, nb: int, wrap: bool = False) -> list[Any]:
        """``Q[u]``: per start block, the best chain of groups on u GPUs that ends the
        pipeline (its last group owns the head and sends the token back over the
        network, or to a group of this node with ``wrap``), the others passing on inside
        the node.  Vectors only: O(G · k · nb²)."""
        key = (self.alike, "suffixes", nb, wrap)
        made = self.groups.node_matrices.get(key)
        if made is None:
            ret = self.cm.intra_latency_s if wrap else self.cm.latency_s
            made = self._backward(lambda v: self._stage(v, False, True, "", ret[v])[:, nb])
            self.groups.node_matrices[key] = made
        return made

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
        key = (self.alike, "prefixes")
        made = self.groups.node_matrices.get(key)
        if made is None:
            made = self.groups.node_matrices[key] = self._prefixes()
        return made

    def _prefixes(self) -> list[Any]:
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
