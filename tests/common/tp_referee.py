"""The tensor-parallel referee: per-stage tensor parallel inside nodes × pipeline across
them, solved exactly.  ``benchmarks/tensor_parallel.py`` and
``tests/test_tensor_parallel_benchmark.py`` score stowplan's plans against it.

The referee is written from the first-order cost model's formula alone; it calls
neither stowplan's planner nor its cost model (only the model layouts and the node
descriptors it generates, every figure explicit so no spec table is involved).  U
concurrent sequences (the batch) on a pipeline of S stages form m = min(U, S)
microbatches of u = ⌈U / m⌉ sequences.  A stage on ``tp`` GPUs of node d holding blocks
[lo, hi):

* memory: (block bytes + KV of all U sequences + embed if first + head if last) / tp
  ≤ the GPU's VRAM × 0.8;
* time per microbatch: max(read / (tp · bw_gpu), 2 · params read · u / (tp · flops_gpu))
  + (hi − lo) · 2 · AR(tp) + the transfer to the next stage, where read counts the KV of
  u sequences, AR(tp) = 0 for tp = 1, else intra_latency + 2 (tp − 1) / tp · u · hidden ·
  act / intra_bw; the transfer is u · hidden · act / intra_bw when the next stage is on
  the same node, else over the sender's network link;
* hops: the intra-node latency between two stages on one node, else the sender's link
  latency, the return from the last stage to the first included;
* every sequence gets one token per cycle = max(Σ stage times + hops, m · slowest stage):
  the value minimised, per-sequence seconds per token; tokens/s = U / cycle.  The latency
  objective runs one sequence (U = 1: the cycle is Σ stage times + hops); throughput
  runs the instance's batch.

Legal degrees: tp ≤ the node's GPUs, tp divides the attention heads, and tp divides the
KV heads or is a multiple of them.  The referee enumerates every layout (per node any
multiset of legal degrees using at most its GPUs; a node may be left out), every stage
order and every contiguous block split, for four rules: ``free`` (the optimum),
``whole`` (every used node one group of all its GPUs), ``uniform`` (one degree for every
stage, as vLLM and SGLang run) and ``adjacent`` (the stages of one node next to each
other around the pipeline's cycle).  The stage times depend on the stage count (through
u), so the depth-first search runs once per range of stage counts sharing u and m; its
pruning is exact because the trip so far and min(U, stages so far) × the slowest stage
so far never decrease.  Large models (the case study) use a second exact method: every
stage sequence, each with its optimal split by dynamic programming over the blocks; for
m > 1 the programme minimises the trip under a cap on every stage's time, and the cap
is bisected over every stage time there is (the least cycle is min over caps C of
max(least trip under C, m · C), the trip falling and m · C rising with C).
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction

import numpy as np

from stowplan import (
    Constraints,
    ModelLayout,
    NodeDescriptor,
    Plan,
    PlanError,
    Prediction,
    plan,
)
from stowplan.cost import predict

HEADROOM = Fraction(1, 5)
"""Constraints' default VRAM headroom (20 %), kept exact."""

Objective = str  # "latency" | "throughput"
Rule = str  # "free" | "whole" | "uniform" | "adjacent"


# -- the instance, in the referee's own terms -----------------------------------------------
@dataclass(frozen=True, slots=True)
class Node:
    """One node's per-GPU figures in SI units, read from its descriptor."""

    id: str
    gpus: int
    vram_gpu: Fraction
    bw_gpu: float
    flops_gpu: float
    link: float
    link_lat: float
    intra: float
    intra_lat: float


def node_of(d: NodeDescriptor) -> Node:
    """``d``'s figures; every one must be given (no table is consulted)."""
    assert d.mem_bandwidth_gbps is not None and d.flops_estimate > 0
    assert d.intra_link_gbps is not None and d.intra_link_latency_us is not None
    g = d.num_gpus
    return Node(
        id=d.id,
        gpus=g,
        vram_gpu=Fraction(d.vram_bytes, g),
        bw_gpu=d.mem_bandwidth_gbps * 1e9 / g,
        flops_gpu=d.flops_estimate * 1e12 / g,
        link=d.link_mbps * 1e6 / 8 if d.link_mbps > 0 else math.inf,
        link_lat=d.link_latency_ms / 1e3,
        intra=d.intra_link_gbps * 1e9,
        intra_lat=d.intra_link_latency_us / 1e6,
    )


def legal(tp: int, heads: int | None, kv: int | None) -> bool:
    """Whether ``tp`` GPUs can split every block of a model with these heads."""
    if heads and heads % tp:
        return False
    return not kv or (kv % tp == 0 if tp <= kv else tp % kv == 0)


def microbatches(sequences: int, stages: int) -> tuple[int, int]:
    """``(m, u)``: ``sequences`` on ``stages`` stages form m = min(U, S) microbatches of
    u = ⌈U / m⌉ sequences."""
    m = min(sequences, stages)
    return m, -(-sequences // m)


def stage_groups(sequences: int, most: int) -> list[tuple[int, int]]:
    """The stage counts 1..``most`` as ranges (fewest, most) sharing m and u: each count
    below U alone, every count from U on together (m = U, u = 1); one range at U = 1."""
    below = [(s, s) for s in range(1, min(sequences, most + 1))]
    return below + ([(sequences, most)] if most >= sequences else [])


@dataclass
class Spec:
    """A planning problem: model figures, nodes, U sequences (the batch), context; the
    stage times are those of microbatches of ``micro`` sequences (see :meth:`at`)."""

    model: ModelLayout
    descriptors: list[NodeDescriptor]
    batch: int
    context_tokens: int | None
    micro: int = 0
    """Sequences a stage steps at once (u); 0: all of them (a one-stage pipeline)."""
    nodes: list[Node] = field(init=False)
    nb: int = field(init=False)
    mem: list[int] = field(init=False)
    """Bytes each block holds: weights + the KV of all U sequences."""
    read: list[float] = field(init=False)
    """Bytes a microbatch step reads in each block: weights read + the KV of u sequences
    at half the reserve (a sequence's mean context)."""
    wread: list[int] = field(init=False)
    """Weight bytes a step reads in each block."""
    ppb: float = field(init=False)
    act: float = field(init=False)
    """Activation bytes of one microbatch."""

    def __post_init__(self) -> None:
        m = self.model
        self.micro = self.micro or self.batch
        assert 1 <= self.micro <= self.batch
        assert not m.kv_window_tokens, "the referee reads every block's KV in full"
        self.nodes = [node_of(d) for d in self.descriptors]
        self.nb = m.num_blocks
        sizes = list(m.block_bytes or (m.block_params_bytes,) * self.nb)
        wread = list(m.block_read_bytes or sizes)
        ctx = self.context_tokens or 0
        per_token = m.kv_bytes_per_token or (0,) * self.nb
        self.mem = [s + k * ctx * self.batch for s, k in zip(sizes, per_token, strict=True)]
        # A step reads each sequence's KV at its mean context, half the reserve.
        self.read = [w + k * ctx / 2 * self.micro for w, k in zip(wread, per_token, strict=True)]
        self.wread = wread
        self._mem_prefix = [0, *itertools.accumulate(self.mem)]
        self._cap: dict[tuple[int, int], int] = {}
        self._views: dict[int, Spec] = {}
        assert m.active_params, "the referee needs the layout's active parameters"
        self.ppb = m.active_params / (sum(wread) + m.head_params_bytes + m.embed_params_bytes)
        self.act = self.micro * m.hidden_dim * m.bytes_per_activation_elem

    def at(self, stages: int) -> Spec:
        """This problem as a pipeline of ``stages`` stages runs it (microbatch u)."""
        u = microbatches(self.batch, stages)[1]
        if u == self.micro:
            return self
        if u not in self._views:
            self._views[u] = replace(self, micro=u)
        return self._views[u]

    # -- one stage ---------------------------------------------------------------------------
    def fits(self, d: int, tp: int, lo: int, hi: int, first: bool, last: bool) -> bool:
        m = self.model
        held = self._mem_prefix[hi] - self._mem_prefix[lo]
        held += (m.embed_params_bytes if first else 0) + (m.head_params_bytes if last else 0)
        cap = self._cap.get((d, tp))
        if cap is None:  # held is an integer: held <= x exactly when held <= floor(x)
            cap = self._cap[d, tp] = math.floor(tp * self.nodes[d].vram_gpu * (1 - HEADROOM))
        return held <= cap

    def base(self, d: int, tp: int, lo: int, hi: int, last: bool) -> float:
        """The stage's time per microbatch without its outbound transfer."""
        n, m = self.nodes[d], self.model
        head = m.head_params_bytes if last else 0
        read = sum(self.read[lo:hi]) + head
        weights = sum(self.wread[lo:hi]) + head
        t = max(read / (tp * n.bw_gpu), 2 * self.ppb * weights * self.micro / (tp * n.flops_gpu))
        return t + (hi - lo) * 2 * self.all_reduce(d, tp)

    def all_reduce(self, d: int, tp: int) -> float:
        n = self.nodes[d]
        return 0.0 if tp == 1 else n.intra_lat + 2 * (tp - 1) / tp * self.act / n.intra

    def transfer(self, d: int, same_node: bool) -> float:
        n = self.nodes[d]
        return self.act / (n.intra if same_node else n.link)

    def hop(self, d: int, same_node: bool) -> float:
        n = self.nodes[d]
        return n.intra_lat if same_node else n.link_lat

    def degrees(self, d: int) -> list[int]:
        m = self.model
        g = self.nodes[d].gpus
        return [t for t in range(1, g + 1) if legal(t, m.num_attention_heads, m.num_kv_heads)]


@dataclass(frozen=True, slots=True)
class Layout:
    """A pipeline: (node index, tp) per stage and the block bounds."""

    stages: tuple[tuple[int, int], ...]
    bounds: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Score:
    stage_time_s: tuple[float, ...]
    """Per stage, seconds per microbatch."""
    hops_s: float
    batch: int
    microbatches: int

    @property
    def trip_s(self) -> float:
        """One token's way through the pipeline: Σ stage times + hops."""
        return sum(self.stage_time_s) + self.hops_s

    @property
    def cycle_s(self) -> float:
        """Seconds between two tokens of one sequence: max(trip, m · slowest stage)."""
        return max(self.trip_s, self.microbatches * max(self.stage_time_s))

    @property
    def time_per_token_s(self) -> float:
        return self.cycle_s

    @property
    def tokens_per_s(self) -> float:
        return self.batch / self.cycle_s


def score(spec: Spec, layout: Layout) -> Score:
    """The formula applied to one pipeline (no legality or memory check)."""
    st, b = layout.stages, layout.bounds
    n = len(st)
    view = spec.at(n)
    times = []
    for s, (d, tp) in enumerate(st):
        t = view.base(d, tp, b[s], b[s + 1], s == n - 1)
        if s < n - 1:
            t += view.transfer(d, st[s + 1][0] == d)
        times.append(t)
    hops = sum(spec.hop(d, st[(s + 1) % n][0] == d) for s, (d, _) in enumerate(st)) if n > 1 else 0
    m = microbatches(spec.batch, n)[0]
    return Score(stage_time_s=tuple(times), hops_s=float(hops), batch=spec.batch, microbatches=m)


def violations(spec: Spec, layout: Layout) -> list[str]:
    """Why ``layout`` is not a legal pipeline (empty: it is)."""
    out = []
    st, b = layout.stages, layout.bounds
    if b[0] != 0 or b[-1] != spec.nb or any(x >= y for x, y in itertools.pairwise(b)):
        out.append(f"bounds {b} are not a split of {spec.nb} blocks")
    used = [0] * len(spec.nodes)
    for s, (d, tp) in enumerate(st):
        used[d] += tp
        if tp not in spec.degrees(d):
            out.append(f"stage {s}: tp {tp} is not legal on {spec.nodes[d].id}")
        if not spec.fits(d, tp, b[s], b[s + 1], s == 0, s == len(st) - 1):
            out.append(f"stage {s}: does not fit {tp} GPU(s) of {spec.nodes[d].id}")
    out += [
        f"{spec.nodes[d].id}: {u} GPUs used" for d, u in enumerate(used) if u > spec.nodes[d].gpus
    ]
    return out


# -- referee 1: depth-first search over layouts, orders and splits --------------------------
def allowed(spec: Spec, rule: Rule, degree: int | None = None) -> list[list[int]]:
    """Per node, the degrees a stage may use under ``rule``."""
    out = []
    for d, n in enumerate(spec.nodes):
        legal_here = spec.degrees(d)
        if rule == "whole":
            out.append([n.gpus] if n.gpus in legal_here else [])
        elif rule == "uniform":
            out.append([degree] if degree in legal_here else [])
        else:
            out.append(legal_here)
    return out


def search(
    spec: Spec,
    degrees: list[list[int]],
    *,
    prune: bool = True,
    gpus: Sequence[int] | None = None,
    counts: Mapping[tuple[int, int], int] | None = None,
    adjacent: bool = False,
) -> tuple[float, Layout] | None:
    """The pipeline of least cycle whose stages use ``degrees`` (cycle, layout); None if
    none fits.

    Every sequence of (node, tp) stages whose degrees per node sum to at most its GPUs
    (or ``gpus``, per node; stages of one node on the same degree are interchangeable GPU
    groups, so sequences cover every layout once), every contiguous split, once per range
    of stage counts sharing m and u (:func:`stage_groups`).  ``counts`` limits how many
    groups of each (node, tp) there are; ``adjacent`` keeps the stages of one node next
    to each other around the cycle (the token returns from the last stage to the first,
    so one node may hold both ends).  ``prune`` skips a branch once max(trip so far,
    min(U, stages so far) × slowest stage so far) — which later stages can only raise —
    reaches the best found; without it every layout is scored by :func:`score`.
    """
    nb, sequences = spec.nb, spec.batch
    items = [(d, t) for d, ts in enumerate(degrees) for t in ts]
    budget = [n.gpus for n in spec.nodes] if gpus is None else list(gpus)
    left = {i: (counts or {}).get(i, spec.nb) for i in items}
    best: list[float | tuple[tuple[int, int], ...] | tuple[int, ...] | None] = [
        math.inf,
        None,
        None,
    ]
    seq: list[tuple[int, int]] = []
    bounds = [0]

    for fewest, most in stage_groups(sequences, nb):
        view = spec.at(fewest)
        base: dict[tuple[int, int, int, int], float] = {}
        for d, t in items:
            for lo in range(nb):
                for hi in range(lo + 1, nb + 1):
                    base[d, t, lo, hi] = view.base(d, t, lo, hi, hi == nb)
        xfer = [[view.transfer(d, s) for s in (False, True)] for d in range(len(spec.nodes))]
        hopc = [[view.hop(d, s) for s in (False, True)] for d in range(len(spec.nodes))]

        def rec(
            pos: int,
            trip: float,
            slow: float,
            pending: float,
            fewest: int = fewest,
            most: int = most,
            base: dict[tuple[int, int, int, int], float] = base,
            xfer: list[list[float]] = xfer,
            hopc: list[list[float]] = hopc,
        ) -> None:
            """``seq[-1]`` (if any) is pending: its time ``pending`` lacks the transfer;
            ``trip`` and ``slow`` cover the stages before it."""
            first_d = seq[0][0] if seq else -1
            prev = seq[-1][0] if seq else -1
            k = len(seq) + 1  # stages once the next one joins
            mk = min(sequences, k)  # m of any pipeline that has at least k stages
            for d, t in items:
                if budget[d] < t or not left[d, t]:
                    continue
                if adjacent and seq and not adjacent_next(seq, d):
                    continue
                new_trip, new_slow = 0.0, 0.0
                if seq:
                    same = prev == d
                    done = pending + xfer[prev][same]
                    new_trip = trip + done + hopc[prev][same]
                    new_slow = max(slow, done)
                    if prune and max(new_trip, mk * new_slow) >= best[0]:  # type: ignore[operator]
                        continue
                budget[d] -= t
                left[d, t] -= 1
                seq.append((d, t))
                for hi in range(pos + 1, nb + 1):
                    last = hi == nb
                    if not spec.fits(d, t, pos, hi, pos == 0, last):
                        break  # more blocks hold more bytes
                    b = base[d, t, pos, hi]
                    if prune and max(new_trip + b, mk * max(new_slow, b)) >= best[0]:  # type: ignore[operator]
                        break  # more blocks take longer
                    bounds.append(hi)
                    if last and k >= fewest:
                        back = hopc[d][first_d == d] if k > 1 else 0.0
                        total = max(new_trip + b + back, mk * max(new_slow, b))
                        if not prune:
                            total = score(spec, Layout(tuple(seq), tuple(bounds))).cycle_s
                        if total < best[0]:  # type: ignore[operator]
                            best[:] = [total, tuple(seq), tuple(bounds)]
                    elif not last and k < most:
                        rec(hi, new_trip, new_slow, b)
                    bounds.pop()
                seq.pop()
                left[d, t] += 1
                budget[d] += t

        rec(0, 0.0, 0.0, 0.0)
    if best[1] is None:
        return None
    return float(best[0]), Layout(stages=best[1], bounds=best[2])  # type: ignore[arg-type]


def adjacent_next(seq: Sequence[tuple[int, int]], d: int) -> bool:
    """Whether a stage on node ``d`` may follow ``seq`` with every node's stages adjacent
    around the pipeline's cycle (the first node's may also close it)."""
    first = seq[0][0]
    wrapped = any(seq[i][0] == first != seq[i - 1][0] for i in range(1, len(seq)))
    if wrapped:
        return d == first
    return d == seq[-1][0] or d == first or all(e != d for e, _ in seq)


def solve(spec: Spec, rule: Rule) -> tuple[float, Layout] | None:
    """The referee's least cycle under ``rule``: ``free``, ``whole``, ``uniform`` (the
    best over every degree) or ``adjacent`` (any groups, but the stages of one node next
    to each other around the cycle)."""
    found = []
    if rule == "uniform":
        for t in sorted({t for d in range(len(spec.nodes)) for t in spec.degrees(d)}):
            found.append(search(spec, allowed(spec, "uniform", t)))
    elif rule == "adjacent":
        found.append(search(spec, allowed(spec, "free"), adjacent=True))
    else:
        found.append(search(spec, allowed(spec, rule)))
    got = [f for f in found if f is not None]
    return min(got, key=lambda f: f[0]) if got else None


# -- referee 2: every stage sequence, each split by dynamic programming ----------------------
class _TripProgramme:
    """The least trip (Σ stage times + hops) over pipelines of ``fewest``..``most``
    stages whose every stage takes at most a cap: every sequence of (node, tp) stages (as
    :func:`search`), each with its optimal contiguous split by a dynamic programme over
    the blocks, one stage at a time, shared by every sequence with the same prefix."""

    def __init__(
        self,
        spec: Spec,
        degrees: list[list[int]],
        fewest: int,
        most: int,
        gpus: Sequence[int] | None,
        counts: Mapping[tuple[int, int], int] | None,
    ) -> None:
        self.spec, self.fewest, self.most = spec, fewest, most
        nb, m = spec.nb, spec.model
        self.items = [(d, t) for d, ts in enumerate(degrees) for t in ts]
        self.budget = [n.gpus for n in spec.nodes] if gpus is None else list(gpus)
        self.left = {i: (counts or {}).get(i, nb) for i in self.items}
        mem = np.array([0, *itertools.accumulate(spec.mem)], dtype=np.int64)
        read = np.array([0, *itertools.accumulate(spec.read)], dtype=np.float64)
        wread = np.array([0, *itertools.accumulate(spec.wread)], dtype=np.float64)
        lo_i, hi_i = np.meshgrid(np.arange(nb + 1), np.arange(nb + 1), indexing="ij")
        self.times: dict[tuple[int, int, bool, bool, int], np.ndarray] = {}
        """Per (node, tp, first, last, transfer: 0 none, 1 network, 2 intra-node): the
        stage's time with its transfer by [lo, hi]; inf where it does not fit."""
        for d, t in self.items:
            n = spec.nodes[d]
            cap = math.floor(t * n.vram_gpu * (1 - HEADROOM))
            for first in (False, True):
                for last in (False, True):
                    head = m.head_params_bytes if last else 0
                    held = mem[hi_i] - mem[lo_i] + (m.embed_params_bytes if first else 0) + head
                    r = read[hi_i] - read[lo_i] + head
                    w = wread[hi_i] - wread[lo_i] + head
                    with np.errstate(invalid="ignore"):
                        base = np.maximum(
                            r / (t * n.bw_gpu), 2 * spec.ppb * w * spec.micro / (t * n.flops_gpu)
                        ) + (hi_i - lo_i) * 2 * spec.all_reduce(d, t)
                    ok = (lo_i < hi_i) & (held <= cap)
                    if not last:
                        ok[:, nb] = False  # a stage before the last leaves it a block
                    base = np.where(ok, base, np.inf)
                    if last:
                        self.times[d, t, first, last, 0] = base
                    else:
                        self.times[d, t, first, last, 1] = base + spec.transfer(d, False)
                        self.times[d, t, first, last, 2] = base + spec.transfer(d, True)

    def stage_times(self) -> np.ndarray:
        """Every stage time there is, ascending (the candidate caps)."""
        everything = np.concatenate([v[np.isfinite(v)] for v in self.times.values()])
        return np.unique(everything)

    def least_trip(self, cap: float, bar: float) -> tuple[float, Layout] | None:
        """The least trip below ``bar`` with every stage at most ``cap`` (None: none)."""
        spec, nb, items = self.spec, self.spec.nb, self.items
        budget, left = self.budget, self.left
        capped: dict[tuple[int, int, bool, bool, int], np.ndarray] = {}

        def times(d: int, t: int, first: bool, last: bool, kind: int) -> np.ndarray:
            key = (d, t, first, last, kind)
            if key not in capped:
                v = self.times[key]
                capped[key] = v if cap == math.inf else np.where(v <= cap, v, np.inf)
            return capped[key]

        best: list[object] = [bar, None]
        seq: list[tuple[int, int]] = []
        args: list[np.ndarray] = []

        def finish(value: float, last_arg: int) -> None:
            bounds = [nb, last_arg]
            for arg in reversed(args):
                bounds.append(int(arg[bounds[-1]]))
            best[:] = [value, Layout(stages=tuple(seq), bounds=tuple(reversed(bounds)))]

        def rec(cost: np.ndarray) -> None:
            """``seq[-1]`` is pending; ``cost`` covers the stages before it, by their end."""
            d, t = seq[-1]
            first = len(seq) == 1
            if len(seq) >= self.fewest:
                back = spec.hop(d, seq[0][0] == d) if not first else 0.0
                end = cost + times(d, t, first, True, 0)[:, nb] + back
                lo = int(end.argmin())
                if end[lo] < best[0]:
                    finish(float(end[lo]), lo)
            if len(seq) == min(nb, self.most):
                return
            after: dict[bool, tuple[np.ndarray, np.ndarray]] = {}
            for e, t2 in items:
                if budget[e] < t2 or not left[e, t2]:
                    continue
                same = e == d
                if same not in after:
                    both = cost[:, None] + (
                        times(d, t, first, False, 2 if same else 1) + spec.hop(d, same)
                    )
                    arg = both.argmin(axis=0)
                    after[same] = both[arg, np.arange(nb + 1)], arg
                nxt, arg = after[same]
                if not nxt.min() < best[0]:
                    continue  # later stages only add
                budget[e] -= t2
                left[e, t2] -= 1
                seq.append((e, t2))
                args.append(arg)
                rec(nxt)
                args.pop()
                seq.pop()
                left[e, t2] += 1
                budget[e] += t2

        start = np.full(nb + 1, np.inf)
        start[0] = 0.0
        for d, t in items:
            if budget[d] >= t and left[d, t]:
                budget[d] -= t
                left[d, t] -= 1
                seq.append((d, t))
                rec(start)
                seq.pop()
                left[d, t] += 1
                budget[d] += t
        if best[1] is None:
            return None
        return float(best[0]), best[1]  # type: ignore[arg-type,return-value]


def solve_by_sequences(
    spec: Spec,
    degrees: list[list[int]],
    *,
    gpus: Sequence[int] | None = None,
    counts: Mapping[tuple[int, int], int] | None = None,
) -> tuple[float, Layout] | None:
    """The pipeline of least cycle whose stages use ``degrees``, for models of many blocks:
    per range of stage counts sharing m and u, :func:`_least_cycle`'s pipelines, scored."""
    found: tuple[float, Layout] | None = None
    for fewest, most in stage_groups(spec.batch, spec.nb):
        m = microbatches(spec.batch, fewest)[0]
        prog = _TripProgramme(spec.at(fewest), degrees, fewest, most, gpus, counts)
        for layout in _least_cycle(prog, m, found[0] if found else math.inf):
            cycle = score(spec, layout).cycle_s
            if found is None or cycle < found[0]:
                found = (cycle, layout)
    return found


def _least_cycle(prog: _TripProgramme, m: int, bar: float) -> list[Layout]:
    """Pipelines among which one has the least cycle of ``prog``'s, when that is below
    ``bar`` (none when no trip is).

    At m = 1 the cycle is the trip.  Else, over the ascending stage times C (the
    candidate caps on the slowest stage), the least cycle is min over C of max(T(C),
    m · C) with T(C) the least trip under cap C, non-increasing in C: the first C with
    T(C) ≤ m · C (found by bisection) gives m · C, the one before it T of that C, and the
    lesser of the two is the least cycle.  Trips and caps that cannot beat ``bar`` are
    left out (T then reads infinite, which keeps it non-increasing).
    """
    unbounded = prog.least_trip(math.inf, bar)
    if unbounded is None or m == 1:
        return [unbounded[1]] if unbounded else []
    caps = prog.stage_times()
    caps = caps[m * caps < bar]
    trips: dict[int, tuple[float, Layout] | None] = {}

    def trip(i: int) -> tuple[float, Layout] | None:
        if i not in trips:
            trips[i] = prog.least_trip(float(caps[i]), bar)
        return trips[i]

    lo, hi = 0, len(caps)  # T(C) > m·C below lo, T(C) <= m·C from hi on
    while lo < hi:
        mid = (lo + hi) // 2
        got = trip(mid)
        if got is not None and got[0] <= m * caps[mid]:
            hi = mid
        else:
            lo = mid + 1
    return [g[1] for i in (lo - 1, lo) if 0 <= i < len(caps) and (g := trip(i))]


# -- stowplan's plan, scored by the referee ---------------------------------------------------
def layout_of(spec: Spec, p: Plan) -> tuple[Layout, list[str]]:
    """``p`` as a referee layout, and whatever makes it illegal (GPU indices included)."""
    index = {n.id: d for d, n in enumerate(spec.nodes)}
    problems: list[str] = []
    gpus_taken: dict[int, set[int]] = {}
    stages = []
    for a in p.assignments:
        d = index[a.node_id]
        g = spec.nodes[d].gpus
        ids = a.gpu_indices or tuple(range(g))
        if len(ids) != a.tensor_parallel or any(not 0 <= i < g for i in ids):
            problems.append(f"stage {a.stage}: gpu_indices {ids} for tp {a.tensor_parallel}")
        taken = gpus_taken.setdefault(d, set())
        if taken & set(ids):
            problems.append(f"stage {a.stage}: GPUs {sorted(taken & set(ids))} used twice")
        taken |= set(ids)
        stages.append((d, a.tensor_parallel))
    bounds = (*(a.block_range[0] for a in p.assignments), p.assignments[-1].block_range[1])
    layout = Layout(stages=tuple(stages), bounds=bounds)
    return layout, problems + violations(spec, layout)


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


def disagreement(spec: Spec, pred: Prediction | None, mine: Score) -> float:
    """The largest relative gap between the referee's score and stowplan's prediction."""
    assert pred is not None
    gaps = [
        rel(mine.time_per_token_s, pred.time_per_token_s),
        rel(mine.tokens_per_s, pred.tokens_per_s),
    ]
    gaps += [rel(a, b) for a, b in zip(mine.stage_time_s, pred.stage_time_s, strict=True)]
    if len(pred.stage_time_s) != len(mine.stage_time_s):
        gaps.append(1.0)
    return max(gaps)


def groups_of(spec: Spec, layout: Layout) -> tuple[list[list[int]], dict[tuple[int, int], int]]:
    """The degrees per node of ``layout``'s GPU groups and how many groups of each, for
    :func:`search` and :func:`solve_by_sequences` restricted to those groups."""
    counts: dict[tuple[int, int], int] = {}
    for stage in layout.stages:
        counts[stage] = counts.get(stage, 0) + 1
    degrees = [sorted(t for e, t in counts if e == d) for d in range(len(spec.nodes))]
    return degrees, counts


def broken_certificate(p: Plan, objective: Objective, optimum: float, batch: int) -> str | None:
    """``p``'s certificate, described, when the referee's least cycle ``optimum`` beats its
    bound (seconds per token for latency, tokens/s = U / cycle for throughput)."""
    cert = p.rationale.certificate
    if cert is None:
        return None
    if objective == "latency":
        beaten, best = optimum < cert.bound * (1 - 1e-9), f"{optimum:.6g} s/token"
    else:
        beaten, best = batch / optimum > cert.bound * (1 + 1e-9), f"{batch / optimum:.6g} tokens/s"
    if not beaten:
        return None
    kind = "optimum" if cert.exact else "bound"
    return f"{kind} {cert.bound:.6g} [{cert.method}] but the referee finds {best}"


def describe(spec: Spec, layout: Layout) -> str:
    """``a:tp4[0,3) → b:tp2[3,8)``."""
    return " → ".join(
        f"{spec.nodes[d].id}:tp{t}[{layout.bounds[s]},{layout.bounds[s + 1]})"
        for s, (d, t) in enumerate(layout.stages)
    )


# -- random fleets --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Kind:
    name: str
    memory_gb: int
    bw_gbps: float
    tflops: float
    intra_gbps: float
    intra_us: float


NVLINK = [
    Kind("H100 SXM5", 80, 3350, 989, 450, 3),
    Kind("H200", 141, 4800, 989, 450, 3),
    Kind("A100 80GB SXM4", 80, 2039, 312, 300, 3),
    Kind("A100 40GB SXM4", 40, 1555, 312, 300, 3),
]
PCIE = [
    Kind("L40S", 48, 864, 362, 31.5, 12),
    Kind("RTX A6000", 48, 768, 154.8, 31.5, 12),
    Kind("RTX 4090", 24, 1008, 165, 31.5, 12),
    Kind("A10G", 24, 600, 125, 31.5, 12),
    Kind("L4", 24, 300, 121, 31.5, 12),
    Kind("RTX 3090", 24, 936, 71, 15.8, 15),
]
HEADS = [(32, 8), (64, 8), (48, 48), (24, 24), (56, 1), (40, 8), (16, 2)]
"""(attention heads, KV heads) of the synthetic models: degrees {1,2,4,8}, {1,2,3,4,6,8},
{1,2,4,7,8} … up to 8 GPUs."""


def descriptor(
    kind: Kind, node_id: str, gpus: int, link_mbps: float, latency_ms: float
) -> NodeDescriptor:
    return NodeDescriptor(
        id=node_id,
        gpu_name=kind.name,
        num_gpus=gpus,
        vram_bytes=kind.memory_gb * 10**9 * gpus,
        mem_bandwidth_gbps=kind.bw_gbps * gpus,
        flops_estimate=kind.tflops * gpus,
        link_mbps=link_mbps,
        link_latency_ms=latency_ms,
        intra_link_gbps=kind.intra_gbps,
        intra_link_latency_us=kind.intra_us,
    )


@dataclass(slots=True)
class Instance:
    seed: int
    model: ModelLayout
    nodes: list[NodeDescriptor]
    batch: int
    """The throughput workload's batch (latency runs at 1)."""
    context_tokens: int | None

    def spec(self, objective: Objective) -> Spec:
        b = 1 if objective == "latency" else self.batch
        return Spec(self.model, self.nodes, b, self.context_tokens)

    def text(self) -> str:
        fleet = ", ".join(
            f"{n.id} {n.num_gpus}×{n.gpu_name} "
            f"({n.link_mbps / 1000:.3g} Gbit/s, {n.link_latency_ms:.2g} ms)"
            for n in self.nodes
        )
        m = self.model
        ctx = ""
        if self.context_tokens and m.kv_bytes_per_token:
            kv = m.kv_bytes_per_token[0] * self.context_tokens * self.batch
            ctx = f", context {self.context_tokens} (KV {kv / m.block_params_bytes:.0%} of a block)"
        return (
            f"{m.num_blocks} blocks of {m.block_params_bytes / 1e9:.3g} GB, heads "
            f"{m.num_attention_heads}/{m.num_kv_heads}, batch {self.batch}{ctx}; {fleet}"
        )


def draw(seed: int, max_blocks: int = 8) -> Instance:
    """Instance ``seed``: 2–3 nodes of 1–8 GPUs (NVLink or PCIe), a synthetic model of
    3–``max_blocks`` blocks sized to 10–85 % of the fleet's usable VRAM."""
    rng = random.Random(f"tp-{seed}")
    wan = rng.random() < 0.3
    nodes = []
    for i in range(rng.randint(2, 3)):
        kind = rng.choice(NVLINK if rng.random() < 0.4 else PCIE)
        link = rng.uniform(100, 1000) if wan else rng.uniform(10_000, 100_000)
        lat = rng.uniform(5, 40) if wan else rng.uniform(0.05, 0.5)
        nodes.append(descriptor(kind, f"n{i}", rng.randint(1, 8), round(link, 1), round(lat, 3)))
    usable = sum(n.vram_bytes for n in nodes) * 0.8
    nb = rng.randint(3, max_blocks)
    heads, kv_heads = rng.choice(HEADS)
    hidden = rng.choice([4096, 8192])
    total = rng.uniform(0.1, 0.85) * usable
    unit = total / (nb + rng.uniform(0.2, 2.0))
    alike = rng.random() < 0.5  # else blocks differ by up to ±30 %
    sizes = [2 * int(unit * (1.0 if alike else rng.uniform(0.7, 1.3)) / 2) for _ in range(nb)]
    head = 2 * int(unit * rng.uniform(0.1, 1.0) / 2)
    embed = 2 * int(unit * rng.uniform(0.1, 1.0) / 2)
    batch = rng.choice([4, 8, 16, 32])
    kv_per_token = 2 * kv_heads * (hidden // heads) * 2
    ctx = None
    if rng.random() < 0.5:  # KV at 5–40 % of a block's bytes for the throughput batch
        ctx = max(1, round(rng.uniform(0.05, 0.4) * unit / (kv_per_token * batch)))
    total_bytes = sum(sizes) + head + embed
    model = ModelLayout(
        name=f"synthetic-{seed}",
        num_blocks=nb,
        hidden_dim=hidden,
        bytes_per_activation_elem=2,
        block_params_bytes=round(sum(sizes) / nb),
        block_bytes=tuple(sizes),
        head_params_bytes=head,
        embed_params_bytes=embed,
        kv_bytes_per_token=(kv_per_token,) * nb,
        total_params=total_bytes // 2,
        active_params=total_bytes // 2,
        dtype="bf16",
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
    )
    return Instance(seed=seed, model=model, nodes=nodes, batch=batch, context_tokens=ctx)


# -- part 1: quality on random fleets -------------------------------------------------------
@dataclass(slots=True)
class Outcome:
    seed: int
    objective: Objective
    ratios: dict[str, float]
    """stowplan, adjacent, whole, uniform: value / optimum (1.0 optimal, 0.0 no plan)."""
    whole_legal: bool
    """Every node's GPU count is a legal degree (so every node can run as one group)."""
    disagreement: float | None
    """Referee vs the plan's own prediction (largest relative gap)."""
    repredicted: float | None
    """Referee vs ``stowplan.cost.predict`` re-scoring the plan."""
    illegal: list[str]
    certificate: str | None
    """The plan's certificate when the referee's optimum beats its bound (else None)."""
    own_groups: float | None
    """stowplan's value / the referee's optimum on the GPU groups the plan uses."""
    own_certificate: str | None
    """The certificate when the referee's optimum on those groups beats its bound."""
    claimed_gap: float | None
    """The gap the plan's certificate states (None: no certificate)."""
    ours: str
    best: str
    text: str
    seconds: dict[str, float]


def ratio(optimum: float, value: float | None) -> float:
    """Higher is better, 1.0 optimal: the least cycle over this one's (optimum time /
    time per token, or tokens/s / optimum tokens/s)."""
    if value is None or value <= 0:
        return 0.0
    return optimum / value


def run_instance(inst: Instance, objective: Objective) -> Outcome | None:
    spec = inst.spec(objective)
    t0 = time.perf_counter()
    opt = solve(spec, "free")
    t_ref = time.perf_counter() - t0
    if opt is None:
        return None
    others = {rule: solve(spec, rule) for rule in ("adjacent", "whole", "uniform")}
    c = Constraints(batch=spec.batch, context_tokens=inst.context_tokens)
    t0 = time.perf_counter()
    illegal: list[str] = []
    gap: float | None = None
    again: float | None = None
    cert: str | None = None
    own_ratio: float | None = None
    own_cert: str | None = None
    ours_value: float | None = None
    ours_text = "no plan (PlanError)"
    try:
        p = plan(inst.model, inst.nodes, c)
    except PlanError as exc:
        p = None
        illegal.append(f"PlanError: {exc}")
    t_plan = time.perf_counter() - t0
    if p is not None:
        layout, illegal = layout_of(spec, p)
        mine = score(spec, layout)
        gap = disagreement(spec, p.rationale.prediction, mine)
        again = disagreement(spec, predict(inst.model, inst.nodes, c, p), mine)
        cert = broken_certificate(p, objective, opt[0], spec.batch)
        ours_value = None if illegal else mine.cycle_s
        if not illegal:
            degrees, counts = groups_of(spec, layout)
            own = search(spec, degrees, counts=counts)
            assert own is not None
            own_ratio = ratio(own[0], ours_value)
            own_cert = broken_certificate(p, objective, own[0], spec.batch)
        ours_text = describe(spec, layout)
    return Outcome(
        seed=inst.seed,
        objective=objective,
        ratios={
            "stowplan": ratio(opt[0], ours_value),
            **{rule: ratio(opt[0], got[0] if got else None) for rule, got in others.items()},
        },
        whole_legal=all(n.gpus in spec.degrees(d) for d, n in enumerate(spec.nodes)),
        disagreement=gap,
        repredicted=again,
        illegal=illegal,
        certificate=cert,
        own_groups=own_ratio,
        own_certificate=own_cert,
        claimed_gap=p.rationale.certificate.gap if p and p.rationale.certificate else None,
        ours=ours_text,
        best=describe(spec, opt[1]),
        text=inst.text(),
        seconds={"referee": t_ref, "plan": t_plan},
    )
