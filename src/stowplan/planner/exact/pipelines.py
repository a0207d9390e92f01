"""The optimum of the workload's objective, and bounds on it (certificates).

* Up to :data:`ENUMERATION_LIMIT` nodes: a dynamic programme over (set of
  nodes already used, blocks placed) with numpy, exact for any layout.  A
  stage's time on a node is a matrix over (first block, end block); the chain
  combines stages with ``+`` (time per token) or ``max`` (bottleneck).  On GPU
  groups its state also knows the last stage's host, so a group passing on to
  another group of its host (or hopping back to stage 0 on it) is charged the
  host's own link.
* Beyond: a MILP solved by HiGHS (``scipy.optimize.milp``) over per-node block
  counts, roles (first/last) and stage times.  Exact when blocks are alike and
  every node is its own host; for other layouts every block is replaced by the
  smallest one, and on GPU groups each is charged the cheaper of its network and
  its host's link, which gives a valid bound.
* :func:`fluid_bound`: a closed-form relaxation in microseconds, used to
  certify plans inline.

numpy and scipy are imported lazily (extra ``exact``).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import Counter
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from stowplan.cost import CostModel
from stowplan.errors import DependencyError
from stowplan.model import Metric
from stowplan.planner.exact.highs import milp
from stowplan.planner.problem import Problem
from stowplan.planner.strategies.fractional import fractional_bound
from stowplan.planner.strategies.throughput import Pipeline

__all__ = [
    "CYCLE_EXACT_LIMIT",
    "ENUMERATION_LIMIT",
    "EXACT_NODE_LIMIT",
    "Optimum",
    "fluid_bound",
    "least_cycle",
    "solve_exact",
    "solve_milp",
    "stage_matrix",
]

CYCLE_EXACT_LIMIT = 8
"""Largest cluster whose least cycle at a stage count :func:`least_cycle` finds exactly."""

ENUMERATION_LIMIT = 10
"""Largest cluster solved by the subset DP; above it the MILP runs."""

EXACT_NODE_LIMIT = 32
"""Most nodes ``strategy="exact"`` takes: its solves grow exponentially with the nodes
(13 s of CPU at 50 nodes, 98 s at 80); a larger fleet is refused, naming the strategies
whose certificate bounds their gap to the optimum instead."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Optimum:
    """The optimum (or a bound) of one objective."""

    objective: Metric | None
    """:attr:`Metric.LATENCY` (seconds per token) or :attr:`Metric.THROUGHPUT` (slowest
    stage, seconds); None for the least cycle itself (:func:`least_cycle`), which both
    rank by."""
    value: float
    """Seconds: time per token, or the slowest stage's time."""
    exact: bool
    method: str
    pipeline: Pipeline | None = None
    found_by: str = ""
    """How :attr:`pipeline` was found where no solve of :attr:`method` found it (a search
    the bounds pointed at); empty otherwise."""


def _np() -> Any:
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy ships with the exact extra
        raise DependencyError("numpy", "exact") from None
    return np


def stage_matrix(
    cm: CostModel,
    d: int,
    first: bool,
    last: bool,
    hop: float,
    xfer: float | None = None,
    cap: float = math.inf,
) -> Any:
    """M[i, j]: time of blocks [i, j) on node d (inf when empty, not fitting or slower than
    ``cap``), plus ``hop``.

    A stage that is not the last sends its activations on at ``xfer`` seconds (default:
    over node d's network link)."""
    np = _np()
    head = cm.head if last else 0
    w, read, blocks = _byte_matrices(cm.read_prefix, cm.kv_prefix, head)
    room = cm.usable[d] - (cm.embed if first else 0) - head
    ok = _fitting(cm.mem_prefix, room)
    with np.errstate(over="ignore", invalid="ignore"):
        t = read * cm.inv_bw[d]
        np.maximum(t, w * cm.flop_s_per_byte[d], out=t)
        steps = blocks * cm.block_s[d]
        steps += cm.stage_s[d]
        t += steps
        if not last:
            t += cm.xfer_s[d] if xfer is None else xfer
        if not hop > -math.inf:
            return np.where(ok, np.where(t <= cap, t, np.inf) + hop, np.inf)
        # An entry over the cap (or not a number) or that does not fit is infinite, and
        # stays so with a hop that is not -inf added: one mask for both.
        keep = t <= cap
        keep &= ok
        t += hop
    return np.where(keep, t, np.inf)


@lru_cache(maxsize=16)
def _byte_matrices(
    read_prefix: tuple[int, ...], kv_prefix: tuple[float, ...], head: int
) -> tuple[Any, Any, Any]:
    """For :func:`stage_matrix`, per block range ``[i, j)``: the bytes of its weights (and
    ``head``), the bytes a step reads of it, and its block count (read-only); the same
    for every node and role of one cost model, so made once."""
    np = _np()
    r = np.asarray(read_prefix, dtype=float)
    kv = np.asarray(kv_prefix, dtype=float)
    w = r[None, :] - r[:, None] + head
    read = w + kv[None, :] - kv[:, None]
    blocks = np.arange(len(r))[None, :] - np.arange(len(r))[:, None]
    for made in (w, read, blocks):
        made.flags.writeable = False
    return w, read, blocks


@lru_cache(maxsize=32)
def _fitting(mem_prefix: tuple[int, ...], room: float) -> Any:
    """For :func:`stage_matrix`: whether blocks ``[i, j)`` (``j > i``) fit in ``room`` bytes
    (read-only)."""
    np = _np()
    # Which stages fit is decided in integers (floats lose bytes beyond 2**53): the
    # bytes of [i, j) grow with j, so each i has a last end that fits.
    mp = mem_prefix
    n = len(mp)
    reach = np.array(
        [bisect_right(mp, mp[i] + room, lo=i) - 1 if room >= 0 else -1 for i in range(n)]
    )
    ends = np.arange(n)
    ok = (ends[None, :] > ends[:, None]) & (ends[None, :] <= reach[:, None])
    ok.flags.writeable = False
    return ok


def _best_single_stage(problem: Problem, cm: CostModel) -> tuple[float, Pipeline | None]:
    """The fastest node that holds the whole model alone (its stage time, its pipeline);
    ``(inf, None)`` when none does or the constraints ask for two stages or more."""
    best_val = math.inf
    best: Pipeline | None = None
    nb = cm.num_blocks
    if problem.min_stages <= 1:
        for d in range(len(cm.nodes)):
            if cm.fits(d, 0, nb, True, True):
                v = cm.stage_time(d, 0, nb, True, True)
                if v < best_val:
                    best_val, best = v, ([d], [0, nb])
    return best_val, best


StageMatrices = dict[tuple[int, bool, bool, bool], Any]
"""Node d's :func:`stage_matrix` as first, middle or last stage, sending over the
network or (``own``) over its host's own link, keyed ``(d, first, last, own)``:
uncapped, with no hop (what :func:`least_cycle` builds once for every cap)."""


def _stage_matrices(cm: CostModel, stages: int) -> StageMatrices:
    roles = [(True, True)] if stages == 1 else [(True, False), (False, False), (False, True)]
    grouped = _host_classes(cm)
    return {
        (d, first, last, own): stage_matrix(
            cm, d, first, last, 0.0, cm.intra_xfer_s[d] if own else None
        )
        for d in range(len(cm.nodes))
        for first, last in roles
        for own in ((False, True) if grouped[d] >= 0 and not last else (False,))
    }


def _capped(np: Any, base: Any, cap: float, hop: float) -> Any:
    """``base`` (uncapped, no hop) as :func:`stage_matrix` with ``cap`` and ``hop`` gives
    it: the same float operations, so the same values."""
    return np.where(base <= cap, base, np.inf) + hop


def _host_classes(cm: CostModel) -> list[int]:
    """Per node: the index of its host among the hosts split into several GPU groups, or
    -1 where the node is its host's only one."""
    count = Counter(cm.parent)
    shared = {p: i for i, p in enumerate(dict.fromkeys(p for p in cm.parent if count[p] > 1))}
    return [shared.get(p, -1) for p in cm.parent]


def _subset_dp(
    problem: Problem,
    cm: CostModel,
    objective: Metric,
    cap: float = math.inf,
    mats: StageMatrices | None = None,
) -> Optimum:
    """The optimum over pipelines of 2..``max_stages`` stages (and one node alone), every
    stage at most ``cap``: a dynamic programme over (nodes used, blocks placed).

    A stage's transfer and hop go over its node's network unless the next stage (for the
    last, stage 0) is another GPU group of its host.  So where hosts are split into groups,
    the state also says which host the last stage is on and whether it was charged the
    host's own link (the next stage then must be, or must not be, a group of that host);
    and, for the trip's hops, each host of groups takes stage 0 in a programme of its own
    (one more for the nodes that are whole hosts).  Where every node is its own host this
    is the plain programme over (nodes used, blocks placed).
    """
    np = _np()
    n, nb = len(cm.nodes), cm.num_blocks
    add = objective == Metric.LATENCY
    comb = np.add if add else np.maximum
    best_val, best = _best_single_stage(problem, cm)
    if best is not None and cm.stage_time(best[0][0], 0, nb, True, True) > cap:
        best_val, best = math.inf, None
    if problem.max_stages >= 2 and n >= 2:
        host = _host_classes(cm)
        stages = _Stages(cm, add, cap, mats, [h >= 0 for h in host])
        shared = max(host) + 1
        # The host of stage 0 matters only for the hop back to it (-1: nodes that are their
        # own host, where there are any).
        heads: list[int | None] = [None]
        if add and shared:
            heads = [*([-1] if -1 in host else []), *range(shared)]
        if shared:
            found = _chain(problem, stages, host, heads, comb, best_val)
        else:
            found = _plain_chain(problem, stages, comb, best_val)
        if found is not None:
            best_val, best = found
    return Optimum(
        objective=objective,
        value=best_val,
        exact=True,
        method=f"subset dynamic programme over {n} nodes",
        pipeline=best,
    )


class _Stages:
    """Each node's stage matrices (:func:`stage_matrix`, capped, with the hop) as first,
    middle and last stage, sending over the network; and for the GPU groups of a host
    split into several (``grouped``), the ``_own`` ones: sending to, or for the last
    stage hopping back to, another group of the host over its own link."""

    def __init__(
        self, cm: CostModel, add: bool, cap: float, mats: StageMatrices | None, grouped: list[bool]
    ) -> None:
        np = _np()
        n, nb = len(cm.nodes), cm.num_blocks
        self.n, self.nb = n, nb

        def role(first: bool, last: bool, own: bool) -> list[Any]:
            out: list[Any] = []
            for d in range(n):
                if own and not grouped[d]:
                    out.append(None)
                    continue
                hop = (cm.intra_latency_s[d] if own else cm.latency_s[d]) if add else 0.0
                sends = own and not last
                if mats is not None:
                    m = mats[d, first, last, sends]
                    m = m[0] if first else m[:, nb] if last else m
                    out.append(_capped(np, m, cap, hop))
                    continue
                xfer = cm.intra_xfer_s[d] if sends else None
                m = stage_matrix(cm, d, first, last, hop, xfer, cap)
                out.append(m[0] if first else m[:, nb] if last else m)
            return out

        self.first = role(True, False, False)
        self.mid = role(False, False, False)
        self.last = role(False, True, False)
        self.first_own = role(True, False, True)
        self.mid_own = role(False, False, True)
        self.last_own = role(False, True, True)


def _plain_chain(
    problem: Problem, stages: _Stages, comb: Any, beat: float
) -> tuple[float, Pipeline] | None:
    """:func:`_chain` where every node is its own host: one programme, one class."""
    np = _np()
    n, nb = stages.n, stages.nb
    first, mid, last = stages.first, stages.mid, stages.last
    size = 1 << n
    g = np.full((size, nb + 1), np.inf)
    for d in range(n):
        g[1 << d] = first[d]
    best_val, best_end = beat, None
    lo, hi = problem.min_stages, problem.max_stages
    for mask in range(1, size):
        row = g[mask]
        count = mask.bit_count()
        if count + 1 > hi or not np.isfinite(row).any():
            continue
        for e in range(n):
            if mask >> e & 1:
                continue
            if count + 1 >= lo:
                v = float(comb(row, last[e]).min())
                if v < best_val:
                    best_val, best_end = v, (mask, e)
            if count + 2 <= hi:
                cand = comb(row[:, None], mid[e]).min(axis=0)
                np.minimum(g[mask | 1 << e], cand, out=g[mask | 1 << e])
    if best_end is None:
        return None
    mask, e = best_end
    j = int(np.argmin(comb(g[mask], last[e])))
    return best_val, _walked_back(g[None], mask, e, j, 0, [-1] * n, [[0]] * n, stages, comb)


def _diagonals(np: Any, mats: Any) -> Any:
    """Stage matrices over (first block, end block), stacked on leading axes, by
    diagonals: ``out[..., k - 1, j] = mats[..., j - k, j]``, inf where ``j < k``, for ``k``
    up to the most blocks any finite entry spans (None where none is finite).  A stage's
    blocks are few where memory is short, so the chain reads that band alone."""
    size = mats.shape[-1]
    first, end = np.nonzero(np.isfinite(mats).reshape(-1, size, size).any(axis=0))
    if not first.size:
        return None
    reach = int((end - first).max())
    ends = np.arange(size)[None, :]
    starts = ends - np.arange(1, reach + 1)[:, None]
    return np.where(starts >= 0, mats[..., np.maximum(starts, 0), ends], np.inf)


def _chain(
    problem: Problem,
    stages: _Stages,
    host: list[int],
    heads: list[int | None],
    comb: Any,
    beat: float,
) -> tuple[float, Pipeline] | None:
    """The best pipeline of two or more stages below ``beat``, and its value; None where
    there is none.

    Each programme of ``heads`` (all run at once, on a leading axis) takes stage 0 on a
    node of one host: ``-1``, a node that is its own host; ``h``, a group of host ``h``
    (the last stage hops back to it over the host's link when it is another group of
    ``h``); None, any node, every hop back the network's.  Classes of the last stage
    placed: 0, a node that is its own host; ``1 + 2h``, a group of host ``h`` sending
    over the network (the next stage is not on ``h``); ``2 + 2h``, one sending over the
    host's link (the next stage is another group of ``h``)."""
    np = _np()
    n, nb = stages.n, stages.nb
    shared = max(host) + 1
    # Per node e: the classes a stage on e may follow; the classes a middle stage on e
    # may take, and their matrices; its last stage's matrix in each programme.
    after = [
        [0, *(1 + 2 * h for h in range(shared) if h != host[e])]
        + ([2 + 2 * host[e]] if host[e] >= 0 else [])
        for e in range(n)
    ]
    takes = [[0] if host[e] < 0 else [1 + 2 * host[e], 2 + 2 * host[e]] for e in range(n)]
    ends = [
        np.stack(
            [
                stages.last_own[e] if h is not None and h >= 0 and host[e] == h else stages.last[e]
                for h in heads
            ]
        )
        for e in range(n)
    ]
    # Bit masks: the nodes each programme may start on.
    starts = [sum(1 << d for d in range(n) if h is None or host[d] == h) for h in heads]
    size = 1 << n
    g = np.full((len(heads), 1 + 2 * shared, size, nb + 1), np.inf)
    for i, start in enumerate(starts):
        for d in range(n):
            if not start >> d & 1:
                continue
            if host[d] < 0:
                g[i, 0, 1 << d] = stages.first[d]
            else:
                g[i, 1 + 2 * host[d], 1 << d] = stages.first[d]
                g[i, 2 + 2 * host[d], 1 << d] = stages.first_own[d]
    # The row k blocks back, row[:, j - k], read as a window of a buffer holding nb infs
    # then the row.
    buf = np.full((len(heads), 2 * nb + 1), np.inf)
    view = np.lib.stride_tricks.sliding_window_view(buf, nb + 1, axis=1)
    # The nodes by host (-1: their own), each kind with: the classes its stages may follow
    # and may take (the same for every node of it), its nodes' last stages, and their
    # middle stages by diagonals (``mids[e, o, k - 1, j]``: stage [j - k, j) with option
    # o: passing on over the network, or to another group of the host) and the row's
    # windows that read them.
    kinds: list[tuple[Any, Any, list[int], Any, Any, Any]] = []
    for q in range(-1, shared):
        on = [e for e in range(n) if host[e] == q]
        if not on:
            continue
        options = [stages.mid] if q < 0 else [stages.mid, stages.mid_own]
        mids = _diagonals(np, np.stack([np.stack([o[e] for o in options]) for e in on]))
        reads = None if mids is None else view[:, nb - mids.shape[2] : nb][:, ::-1]
        kinds.append(
            (
                np.asarray(after[on[0]])[None, :],
                np.asarray(takes[on[0]])[None, None, :],
                on,
                np.stack([ends[e] for e in on], axis=1),
                mids,
                reads,
            )
        )

    best_val, best_end = beat, None
    lo, hi = problem.min_stages, problem.max_stages
    for mask in range(1, size):
        count = mask.bit_count()
        if count + 1 > hi:
            continue
        # The programmes whose stage 0 may be among these nodes (the others' rows are inf).
        live = [i for i in range(len(heads)) if mask & starts[i]]
        if not live:
            continue
        at = np.asarray(live)[:, None]
        if not np.isfinite(g[at, :, mask]).any():
            continue
        for cls, into, on, last, mids, reads in kinds:
            free = [k for k, e in enumerate(on) if not mask >> e & 1]
            if not free:
                continue
            row = g[at, cls, mask].min(axis=1)
            if count + 1 >= lo:
                v = comb(row[:, None, :], last[live][:, free]).min(axis=2)
                i, k = divmod(int(np.argmin(v)), len(free))
                if v[i, k] < best_val:
                    best_val, best_end = float(v[i, k]), (live[i], mask, on[free[k]])
            if count + 2 > hi or mids is None:
                continue
            # A group passes on inside its host only to another group of it left free.
            took = 2 if len(free) > 1 else 1
            buf[: len(live), nb:] = row
            mat = mids[:, :took] if len(free) == len(on) else mids[free, :took]
            cand = comb(reads[: len(live), None, None], mat[None]).min(axis=3)
            to = np.asarray([mask | 1 << on[k] for k in free])[None, :, None]
            at_to = (at[:, :, None], into[:, :, :took], to)
            g[at_to] = np.minimum(g[at_to], cand)
    if best_end is None:
        return None
    i, mask, e = best_end
    g = g[i]
    row = g[after[e], mask].min(axis=0)
    j = int(np.argmin(comb(row, ends[e][i])))
    c = next(c for c in after[e] if g[c, mask][j] <= row[j])
    return best_val, _walked_back(g, mask, e, j, c, host, after, stages, comb)


def _walked_back(
    g: Any,
    mask: int,
    e: int,
    j: int,
    c: int,
    host: list[int],
    after: list[list[int]],
    stages: _Stages,
    comb: Any,
) -> Pipeline:
    """The pipeline a chain programme's value ``g[c, mask][j]`` came from, its last stage
    on node ``e`` from block ``j`` on (classes and ``after`` as in :func:`_chain`; one
    class, 0, where every node is its own host)."""
    np = _np()
    order, bounds = [e], [stages.nb, j]
    while mask.bit_count() > 1:
        for d in range(stages.n):
            if not mask >> d & 1 or host[d] != (c - 1) // 2:
                continue
            mat = stages.mid_own[d] if c and c % 2 == 0 else stages.mid[d]
            prev = g[after[d], mask ^ 1 << d].min(axis=0)
            vals = comb(prev, mat[:, j])
            k = int(np.argmin(vals))
            if np.isfinite(vals[k]) and vals[k] <= g[c, mask][j] * (1 + 1e-12):
                c = next(c for c in after[d] if g[c, mask ^ 1 << d][k] <= prev[k])
                order.append(d)
                bounds.append(k)
                mask ^= 1 << d
                j = k
                break
        else:
            raise AssertionError("no stage leads to the programme's value")
    order.append(mask.bit_length() - 1)
    bounds.append(0)
    return order[::-1], bounds[::-1]


def _milp(problem: Problem, cm: CostModel, objective: Metric, time_limit_s: float) -> Optimum:
    np = _np()
    try:
        from scipy.optimize import Bounds, LinearConstraint
        from scipy.sparse import lil_matrix
    except ImportError:
        raise DependencyError("scipy", "exact") from None
    n, nb = len(cm.nodes), cm.num_blocks
    single, single_p = _best_single_stage(problem, cm)
    lat = objective == Metric.LATENCY
    # Smallest block: exact for uniform layouts, a relaxation otherwise.
    rd, kvr, mem = cm.smallest_block()
    window = cm.max_window()
    # variables: k_d, u_d, f_d, l_d, t_d for d in nodes, then T (throughput only)
    nv = 5 * n + 1

    def k(d: int) -> int:
        return d

    def u(d: int) -> int:
        return n + d

    def f(d: int) -> int:
        return 2 * n + d

    def lv(d: int) -> int:
        return 3 * n + d

    def t(d: int) -> int:
        return 4 * n + d

    big_t = 5 * n
    rows: list[tuple[dict[int, float], float, float]] = []
    rows.append(({k(d): 1.0 for d in range(n)}, nb, nb))
    rows.append(({f(d): 1.0 for d in range(n)}, 1, 1))
    rows.append(({lv(d): 1.0 for d in range(n)}, 1, 1))
    rows.append(({u(d): 1.0 for d in range(n)}, max(2, problem.min_stages), problem.max_stages))
    gb = 1e-9
    # Times in units of the slowest block (the stage times and T come out near 1..nb):
    # in seconds, a stage of ~1 ms sits within HiGHS's feasibility tolerance of 1e-7 and
    # the solver may report a bottleneck a few 1e-7 s below the stage it bounds.
    slowest_block = max(
        max((rd + kvr) * cm.inv_bw[d], rd * cm.flop_s_per_byte[d]) + cm.block_s[d] for d in range(n)
    )
    scale = 1.0 / slowest_block if 0 < slowest_block < math.inf else 1.0
    # A GPU group passing to another group of its host sends over the host's own link,
    # which the MILP (no order) cannot tell: each is charged the cheaper, a bound.
    xfer, hop = cm.xfer_s, cm.latency_s
    if not cm.own_hosts:
        xfer = tuple(map(min, xfer, cm.intra_xfer_s))
        hop = tuple(map(min, hop, cm.intra_latency_s))
    if not cm.uniform:
        # Blocks taken as small as the smallest hold little; the nodes used must still hold
        # every byte, and a node no more blocks than its widest window that fits.
        total = cm.mem_prefix[nb] + cm.embed + cm.head
        rows.append(({u(d): cm.usable[d] * gb for d in range(n)}, total * gb, np.inf))
    for d in range(n):
        rows.append(({k(d): 1.0, u(d): -float(nb)}, -np.inf, 0))
        rows.append(({u(d): 1.0, k(d): -1.0}, -np.inf, 0))
        rows.append(({f(d): 1.0, lv(d): 1.0, u(d): -1.0}, -np.inf, 0))
        rows.append(
            (
                {k(d): mem * gb, f(d): cm.embed * gb, lv(d): cm.head * gb},
                -np.inf,
                cm.usable[d] * gb,
            )
        )
        target = t(d) if lat else big_t
        for per_block, head_rate in (
            ((rd + kvr) * cm.inv_bw[d], cm.head * cm.inv_bw[d]),
            (rd * cm.flop_s_per_byte[d], cm.head * cm.flop_s_per_byte[d]),
        ):
            coeffs = {
                k(d): (per_block + cm.block_s[d]) * scale,
                lv(d): (head_rate - xfer[d]) * scale,
                u(d): (xfer[d] + cm.stage_s[d] + (hop[d] if lat else 0.0)) * scale,
            }
            coeffs[target] = coeffs.get(target, 0.0) - 1.0
            rows.append((coeffs, -np.inf, 0))
    a = lil_matrix((len(rows), nv))
    lb = np.empty(len(rows))
    ub = np.empty(len(rows))
    for r, (coeffs, lo, hi) in enumerate(rows):
        for col, val in coeffs.items():
            a[r, col] = val
        lb[r], ub[r] = lo, hi
    c = np.zeros(nv)
    if lat:
        c[4 * n : 5 * n] = 1.0
    else:
        c[big_t] = 1.0
    integrality = np.zeros(nv)
    integrality[: 4 * n] = 1
    upper = np.full(nv, np.inf)
    upper[:n] = [min(nb, w) for w in window]
    upper[n : 4 * n] = 1
    res = milp(
        c,
        integrality=integrality,
        bounds=Bounds(np.zeros(nv), upper),
        constraints=LinearConstraint(a.tocsr(), lb, ub),
        options={"time_limit": time_limit_s, "mip_rel_gap": 1e-7},
    )
    optimal = res.status == 0
    bound = getattr(res, "mip_dual_bound", None)
    if optimal:
        value = float(res.fun) / scale
    elif res.status == 2:  # infeasible: no pipeline of two or more stages fits
        value = math.inf
    else:
        value = float(bound) / scale if bound is not None and math.isfinite(bound) else 0.0
    # Past the time limit the best pipeline found so far still comes back (not exact).
    pipeline = _milp_pipeline(cm, res.x) if res.x is not None and res.status in (0, 1) else None
    exact = optimal and cm.uniform and cm.own_hosts
    if single <= value:
        return Optimum(
            objective=objective,
            value=single,
            exact=exact,
            method="one node beats every MILP pipeline",
            pipeline=single_p,
        )
    what = "exact" if exact else "bound (every block as small as the smallest)"
    if optimal and cm.uniform and not cm.own_hosts:
        what = "bound (each GPU group passing on over the cheaper of its two links)"
    if not optimal:
        what = f"bound (HiGHS dual bound after {time_limit_s:g} s)"
    return Optimum(
        objective=objective,
        value=value,
        exact=exact,
        method=f"MILP over {n} nodes, HiGHS via scipy.optimize.milp: {what}",
        pipeline=pipeline if cm.uniform else None,
    )


def _milp_pipeline(cm: CostModel, x: Any) -> Pipeline | None:
    n = len(cm.nodes)
    counts = {d: round(x[d]) for d in range(n) if x[n + d] > 0.5 and round(x[d]) > 0}
    firsts = [d for d in counts if x[2 * n + d] > 0.5]
    lasts = [d for d in counts if x[3 * n + d] > 0.5]
    if len(firsts) != 1 or len(lasts) != 1:
        return None
    order = [firsts[0], *(d for d in sorted(counts) if d not in (firsts[0], lasts[0])), lasts[0]]
    bounds = [0]
    for d in order:
        bounds.append(bounds[-1] + counts[d])
    return (order, bounds) if bounds[-1] == cm.num_blocks else None


def solve_exact(
    problem: Problem, cm: CostModel, objective: Metric, *, time_limit_s: float = 60.0
) -> Optimum:
    """The optimum of ``objective`` (``latency`` or ``throughput``), or a bound on it.

    Its pipeline, when there is one, fits every node's usable VRAM (checked
    in integers: the MILP works in floats).
    """
    if len(cm.nodes) <= ENUMERATION_LIMIT:
        opt = _subset_dp(problem, cm, objective)
    else:
        opt = _milp(problem, cm, objective, time_limit_s)
    if opt.pipeline is not None and not cm.fits_pipeline(*opt.pipeline):
        opt = replace(opt, pipeline=None, exact=False)
    return opt


def solve_milp(
    problem: Problem, cm: CostModel, objective: Metric, *, time_limit_s: float
) -> Optimum:
    """The MILP's optimum of ``objective`` whatever the cluster's size (:func:`solve_exact`
    uses the subset DP on small ones), or its dual bound past ``time_limit_s``; its
    pipeline fits every node's usable VRAM."""
    opt = _milp(problem, cm, objective, time_limit_s)
    if opt.pipeline is not None and not cm.fits_pipeline(*opt.pipeline):
        opt = replace(opt, pipeline=None, exact=False)
    return opt


def least_cycle(problem: Problem, cm: CostModel, stages: int) -> Optimum:
    """The least cycle over pipelines of exactly ``stages`` stages (``cm`` at their
    microbatch), exact, by the subset DP on clusters of up to :data:`CYCLE_EXACT_LIMIT`;
    two stages on nodes of their own hosts, on any cluster (:func:`_two_stage_cycle`).

    cycle = max(trip, m · slowest) with trip = Σ t + hops.  Let ``L(T)`` be the least trip
    with every stage at most ``T``: it never grows with ``T`` while ``m · T`` grows, so over
    the sorted stage times ``T_k`` the least ``max(L(T_k), m · T_k)`` is at the first
    ``k`` with ``L(T_k) ≤ m · T_k`` or just before it, found by bisection (the DP's
    pipeline at ``T_k`` has a cycle of at most that value, so both are scored exactly).
    """
    np = _np()
    if stages == 2 and cm.own_hosts:
        return _two_stage_cycle(np, cm)
    if len(cm.nodes) > CYCLE_EXACT_LIMIT:
        raise DependencyError("numpy", "exact")  # too large: the caller bounds instead
    m = min(cm.batch, stages)
    sub = replace(problem, min_stages=stages, max_stages=stages)
    n = len(cm.nodes)
    mats = _stage_matrices(cm, stages)
    finite = [m[np.isfinite(m)] for m in mats.values()]
    caps = [float(v) for v in np.unique(np.concatenate(finite))] if finite else []
    method = f"bisection on the slowest stage, subset dynamic programme over {n} nodes"
    if not caps:
        return Optimum(objective=None, value=math.inf, exact=True, method=method)

    trips: dict[int, Optimum] = {}

    def trip(k: int) -> Optimum:
        """The least trip with every stage at most ``caps[k]`` (each cap solved once)."""
        if k not in trips:
            trips[k] = _subset_dp(sub, cm, Metric.LATENCY, caps[k] * (1 + 1e-12), mats)
        return trips[k]

    lo, hi = 0, len(caps) - 1
    if trip(hi).value > m * caps[hi]:
        lo = hi + 1  # even with no cap the trip decides: the uncapped optimum
    else:
        while lo < hi:
            mid = (lo + hi) // 2
            if trip(mid).value <= m * caps[mid]:
                hi = mid
            else:
                lo = mid + 1
    # lo == len(caps) (the trip decides everywhere) leaves only the uncapped optimum, lo - 1.
    found = [o.pipeline for k in (lo - 1, lo) if 0 <= k < len(caps) and (o := trip(k)).pipeline]
    scored = [(cm.evaluate(*p).cycle_s, p) for p in found if p and cm.fits_pipeline(*p)]
    if not scored:
        return Optimum(objective=None, value=math.inf, exact=True, method=method)
    value, best = min(scored, key=lambda vp: vp[0])
    return Optimum(objective=None, value=value, exact=True, method=method, pipeline=best)


def _two_stage_cycle(np: Any, cm: CostModel) -> Optimum:
    """The least cycle of two-stage pipelines (``cm`` at their microbatch), exact for any
    layout where no two nodes share a host: every first node, last node and split.

    With the split after block k, the first stage on node f takes ``A[f, k]`` (blocks
    ``[0, k)`` and its transfer out, inf where they do not fit beside the embed), the
    last on node l ``B[l, k]`` (blocks ``[k, nb)`` and the head), and the cycle is
    ``max(A + lat_f + B + lat_l, m · max(A, B))``.  A split whose least first and least
    last stage already give a cycle above a pipeline in hand (the fastest node of each
    side, or the next fastest where they coincide) is passed over; the rest are
    enumerated whole, and the best pipeline is scored by the cost model."""
    n, nb = len(cm.nodes), cm.num_blocks
    m = min(cm.batch, 2)
    method = f"every first node, last node and split of two stages over {n} nodes"
    if n < 2 or nb < 2:
        return Optimum(objective=None, value=math.inf, exact=True, method=method)
    rp = np.asarray(cm.read_prefix, dtype=float)
    kp = np.asarray(cm.kv_prefix, dtype=float)
    ks = np.arange(nb + 1)
    ib = np.asarray(cm.inv_bw, dtype=float)[:, None]
    fl = np.asarray(cm.flop_s_per_byte, dtype=float)[:, None]
    bs = np.asarray(cm.block_s, dtype=float)[:, None]
    ss = np.asarray(cm.stage_s, dtype=float)[:, None]
    lat = np.asarray(cm.latency_s, dtype=float)
    with np.errstate(over="ignore", invalid="ignore"):
        w = rp[None, :]
        first = np.maximum((w + kp[None, :]) * ib, w * fl) + (ks[None, :] * bs + ss)
        first = first + np.asarray(cm.xfer_s, dtype=float)[:, None]
        w = rp[nb] - rp[None, :] + cm.head
        last = np.maximum((w + (kp[nb] - kp[None, :])) * ib, w * fl)
        last = last + ((nb - ks)[None, :] * bs + ss)
    # What fits is decided in integers: the first stage holds [0, k) beside the embed,
    # the last [k, nb) beside the head.
    mp = cm.mem_prefix
    lead = [bisect_right(mp, u - cm.embed) - 1 if u >= cm.embed else -1 for u in cm.usable]
    tail = [bisect_left(mp, mp[nb] - (u - cm.head)) if u >= cm.head else nb + 1 for u in cm.usable]
    inner = (ks >= 1) & (ks <= nb - 1)
    first = np.where((ks[None, :] <= np.asarray(lead)[:, None]) & inner, first, np.inf)
    last = np.where((ks[None, :] >= np.asarray(tail)[:, None]) & inner, last, np.inf)
    lead_hop, last_hop = first + lat[:, None], last + lat[:, None]
    # A pipeline in hand per split: the fastest first node and the fastest other last one.
    order_a = np.argsort(first, axis=0, kind="stable")[:2]
    order_b = np.argsort(last, axis=0, kind="stable")[:2]
    cols = np.arange(nb + 1)
    best_in_hand = math.inf
    for i, j in ((0, 0), (0, 1), (1, 0)):
        f, lv = order_a[i], order_b[j]
        a, b = first[f, cols], last[lv, cols]
        c = np.maximum(a + lat[f] + b + lat[lv], m * np.maximum(a, b))
        c = np.where(f != lv, c, np.inf)
        best_in_hand = min(best_in_hand, float(np.min(c)))
    if not math.isfinite(best_in_hand):
        return Optimum(objective=None, value=math.inf, exact=True, method=method)
    least = np.maximum(
        lead_hop.min(axis=0) + last_hop.min(axis=0),
        m * np.maximum(first.min(axis=0), last.min(axis=0)),
    )
    cap = best_in_hand * (1 + 1e-9)
    found: list[tuple[float, int, int, int]] = []
    for k in np.flatnonzero(least <= cap).tolist():
        fs = np.flatnonzero(m * first[:, k] <= cap)
        ls = np.flatnonzero(m * last[:, k] <= cap)
        if not fs.size or not ls.size:
            continue
        a, b = first[fs, k][:, None], last[ls, k][None, :]
        c = np.maximum(lead_hop[fs, k][:, None] + last_hop[ls, k][None, :], m * np.maximum(a, b))
        c = np.where(fs[:, None] != ls[None, :], c, np.inf)
        at = int(np.argmin(c))
        fi, li = divmod(at, ls.size)
        if math.isfinite(c[fi, li]):
            found.append((float(c[fi, li]), int(fs[fi]), int(ls[li]), k))
    scored = [
        (cm.evaluate([f, lv], [0, k, nb]).cycle_s, ([f, lv], [0, k, nb]))
        for _, f, lv, k in sorted(found)[:4]
        if cm.fits_pipeline([f, lv], [0, k, nb])
    ]
    if not scored:
        return Optimum(objective=None, value=math.inf, exact=True, method=method)
    value, best = min(scored, key=lambda vp: vp[0])
    return Optimum(objective=None, value=value, exact=True, method=method, pipeline=best)


def fluid_bound(problem: Problem, cm: CostModel, objective: Metric) -> float:
    """A valid lower bound (seconds) on the objective, from a fractional relaxation.

    Every block is taken as small as the smallest; blocks flow to nodes
    fractionally up to their VRAM; the embed, head and the roles are dropped
    except for the hop terms every multi-stage pipeline pays
    (:func:`~stowplan.planner.strategies.fractional.fractional_bound`, which keeps
    each cost model's figures).
    """
    return fractional_bound(problem, cm, objective)
