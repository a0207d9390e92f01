"""``latency``: minimum single-stream time per token (one sequence in flight).

Time per token is the sum of every stage's time plus every hop's latency, so
fewer, faster, better-connected nodes win.  With blocks alike, a stage's time
is affine in its block count; for a chosen node set the best split fills the
fastest nodes first (each keeps at least one block), the head goes where it
costs least (its read time minus the outbound transfer the last stage saves)
and the embed goes to the slowest node that can hold it.  The node set is
chosen by seeding from several rankings (fastest per block, best connected,
cheapest per block when full) and improving by dropping and swapping nodes
until no move helps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from operator import attrgetter
from weakref import WeakKeyDictionary

from stowplan.cost import CostModel
from stowplan.planner.problem import Problem
from stowplan.planner.strategies.throughput import Pipeline

__all__ = ["latency_pipeline", "latency_split"]

_POOL_PER_KEY = 16
_MAX_ROUNDS = 30


class _Node:
    """A node's surrogate figures: blocks all as the average one."""

    __slots__ = (
        "cap_first",
        "cap_last",
        "cap_mid",
        "end_key",
        "first_key",
        "head",
        "index",
        "lat",
        "slope",
        "slope_key",
        "xfer",
    )

    def __init__(
        self,
        index: int,
        slope: float,
        head: float,
        xfer: float,
        lat: float,
        caps: tuple[int, int, int],
    ) -> None:
        self.index = index
        self.slope = slope
        """Seconds per (average) block."""
        self.head = head
        """Seconds the head adds on this node."""
        self.xfer = xfer
        self.lat = lat
        self.cap_mid, self.cap_first, self.cap_last = caps
        self.end_key = (head - xfer, index)
        """The last stage goes to the least of these (the head's cost less the transfer)."""
        self.first_key = (slope, -index)
        """Stage 0 (the embed) goes to the greatest of these: the slowest node."""
        self.slope_key = (slope, index)
        """Blocks fill the nodes in this order: fastest first."""


def _surrogates(cm: CostModel) -> list[_Node]:
    nb = cm.num_blocks
    read = (cm.read_prefix[nb] + cm.kv_prefix[nb]) / nb
    weights = cm.read_prefix[nb] / nb
    mem = cm.mem_prefix[nb] / nb

    def cap(anchor: int, u: int) -> int:
        room = u - anchor
        if room < 0:
            return 0
        return nb if mem <= 0 else min(nb, int(room // mem))

    # Nodes alike in bandwidth, compute and block cost share a slope; in memory, capacities.
    rates: dict[tuple[float, float, float], tuple[float, float]] = {}
    capacities: dict[int, tuple[int, int, int]] = {}
    out = []
    for d in range(len(cm.nodes)):
        ib, fl = cm.inv_bw[d], cm.flop_s_per_byte[d]
        key = (ib, fl, cm.block_s[d])
        rate = rates.get(key)
        if rate is None:
            rate = rates[key] = (
                cm.block_seconds(d, read, weights),
                max(cm.head * ib, cm.head * fl),
            )
        u = cm.usable[d]
        caps = capacities.get(u)
        if caps is None:
            caps = capacities[u] = (cap(0, u), cap(cm.embed, u), cap(cm.head, u))
        out.append(_Node(d, rate[0], rate[1], cm.xfer_s[d], cm.latency_s[d] + cm.stage_s[d], caps))
    return out


_Arranged = tuple[float, list[int], list[int]]


def _arrange(nodes: Sequence[_Node], nb: int) -> _Arranged | None:
    """Surrogate time per token, stage order and block counts of a node set (≥ 2 nodes)."""
    lasts = [x for x in nodes if x.cap_last >= 1]
    if not lasts:
        return None
    last = min(lasts, key=_END)
    firsts = [x for x in nodes if x is not last and x.cap_first >= 1]
    if not firsts:
        return None
    first = max(firsts, key=_FIRST)
    caps = {x.index: x.cap_mid for x in nodes}
    caps[first.index] = first.cap_first
    caps[last.index] = last.cap_last
    if min(caps.values()) < 1 or sum(caps.values()) < nb:
        return None
    counts = dict.fromkeys(caps, 1)
    left = nb - len(nodes)
    if left < 0:
        return None
    for x in sorted(nodes, key=_SLOPE):
        if not left:
            break  # every later node keeps its one block
        take = min(left, caps[x.index] - 1)
        counts[x.index] += take
        left -= take
    time = last.head + sum([x.slope * counts[x.index] + x.lat for x in nodes])
    time += sum([x.xfer for x in nodes if x is not last])
    middle = sorted(x.index for x in nodes if x is not first and x is not last)
    order = [first.index, *middle, last.index]
    return time, order, [counts[d] for d in order]


_END = attrgetter("end_key")
_FIRST = attrgetter("first_key")
_SLOPE = attrgetter("slope_key")


def _to_pipeline(order: list[int], counts: list[int]) -> Pipeline:
    bounds = [0]
    for c in counts:
        bounds.append(bounds[-1] + c)
    return order, bounds


_KEYS = (
    lambda x: (x.slope, x.index),
    lambda x: (x.lat + x.xfer, x.slope, x.index),
    lambda x: ((x.lat + x.xfer) / max(x.cap_mid, 1) + x.slope, x.index),
    lambda x: (-x.cap_mid, x.slope, x.index),
)
"""The rankings the node sets are seeded from: fastest per block, best connected,
cheapest per block when full, largest."""


class _Surrogates:
    """A cost model's surrogate nodes, their rankings and every node list arranged so far
    (by its order: the time is summed in it).  The searches on one model share them: the
    stage counts that step at one microbatch plan on one model."""

    def __init__(self, cm: CostModel) -> None:
        self.nodes = _surrogates(cm)
        self.rankings = [sorted(self.nodes, key=k) for k in _KEYS]
        self.arranged: dict[tuple[int, ...], _Arranged | None] = {}


_SURROGATES: WeakKeyDictionary[CostModel, _Surrogates] = WeakKeyDictionary()


def _surrogates_of(cm: CostModel) -> _Surrogates:
    found = _SURROGATES.get(cm)
    if found is None:
        found = _SURROGATES[cm] = _Surrogates(cm)
    return found


def latency_pipeline(problem: Problem, cm: CostModel) -> Pipeline | None:
    """The pipeline with the least time per token this strategy finds; None if none fits."""
    nb = cm.num_blocks
    min_n, max_n = max(problem.min_stages, 2), problem.max_stages
    candidates: list[Pipeline] = []
    if problem.min_stages <= 1:
        # One stage: its time depends only on the node's rates, so of nodes alike only
        # the first (the one ``min`` would keep among equal keys) is a candidate.
        alike: set[tuple[float, float, float, float]] = set()
        for d in range(len(cm.nodes)):
            if cm.fits(d, 0, nb, True, True):
                key = (cm.inv_bw[d], cm.flop_s_per_byte[d], cm.block_s[d], cm.stage_s[d])
                if key not in alike:
                    alike.add(key)
                    candidates.append(([d], [0, nb]))
    if max_n >= 2:
        shared = _surrogates_of(cm)
        nodes, rankings, arranged = shared.nodes, shared.rankings, shared.arranged
        seen: dict[tuple[int, ...], _Arranged | None] = {}

        def score(members: Sequence[_Node]) -> _Arranged | None:
            key = tuple(sorted(x.index for x in members))
            if key not in seen:
                got = None
                if min_n <= len(members) <= max_n:
                    ordered = tuple(x.index for x in members)
                    if ordered in arranged:
                        got = arranged[ordered]
                    else:
                        got = arranged[ordered] = _arrange(members, nb)
                seen[key] = got
            return seen[key]

        best: tuple[float, list[_Node]] | None = None
        for ranking in rankings:
            total = 0
            for size in range(1, min(len(ranking), max_n) + 1):
                total += ranking[size - 1].cap_mid
                if size < min_n or total < nb:
                    continue
                for extra in range(3):
                    members = ranking[: size + extra]
                    got = score(members)
                    if got is not None and (best is None or got[0] < best[0]):
                        best = (got[0], list(members))
                break
        if best is not None:
            pool_ids = {x.index for r in rankings for x in r[:_POOL_PER_KEY]}
            pool = [nodes[i] for i in sorted(pool_ids)]
            best = _improve(best, pool, score)
            got = score(best[1])
            assert got is not None
            candidates.append(_to_pipeline(got[1], got[2]))
            if not cm.uniform:
                # Blocks differ: the surrogate's counts are averages.  Split the chosen
                # nodes exactly, in its order and in the orders of their VRAM.
                order = got[1]
                by_room = sorted(order, key=lambda d: (cm.usable[d], d))
                tried: set[tuple[int, ...]] = set()
                for o in (order, by_room, by_room[::-1]):
                    if tuple(o) in tried:
                        continue  # the same split again: the first of equal candidates wins
                    tried.add(tuple(o))
                    split = latency_split(cm, o)
                    if split is not None and min_n <= len(split[0]) <= max_n:
                        candidates.append(split)
    candidates = [c for c in candidates if cm.fits_pipeline(*c)]
    if not candidates:
        return None
    return min(candidates, key=lambda c: _latency_key(cm, c))


def latency_split(cm: CostModel, order: Sequence[int]) -> Pipeline | None:
    """The least time per token over subsequences (≥ 2 stages) of ``order``, any block sizes.

    A dynamic programme over (node position, blocks placed): each node in turn
    is skipped, or takes the next contiguous run of blocks that fits its VRAM.
    """
    nb = cm.num_blocks
    inf = math.inf
    g = [inf] * (nb + 1)
    """g[j]: least time with blocks [0, j) placed as stages before the last."""
    best, at = inf, (-1, -1)
    choices: list[list[int]] = []
    # Nodes alike in every figure the stage times use share their tables.
    tables: dict[tuple[float | int, ...], tuple[list[float], list[list[float]]]] = {}
    for p, d in enumerate(order):
        lat = cm.latency_s[d]
        key: tuple[float | int, ...] = (cm.inv_bw[d], cm.flop_s_per_byte[d], cm.block_s[d])
        key += (cm.stage_s[d], cm.xfer_s[d], cm.usable[d])
        if key not in tables:
            tables[key] = _stage_tables(cm, d)
        last_s, stage_s = tables[key]
        for j in range(1, nb):
            if g[j] < inf and last_s[j] < inf:
                v = g[j] + last_s[j] + lat
                if v < best:
                    best, at = v, (p, j)
        new = g[:]
        choice = [-1] * (nb + 1)
        for j in range(nb - 1):
            base = lat if j == 0 else g[j] + lat
            if base == inf:
                continue
            for k, s in enumerate(stage_s[j], start=j + 1):
                v = base + s
                if v < new[k]:
                    new[k], choice[k] = v, j
        choices.append(choice)
        g = new
    if best == inf:
        return None
    p, j = at
    stages = [(order[p], j)]
    q = p - 1
    while j > 0:
        while choices[q][j] < 0:
            q -= 1
        stages.append((order[q], choices[q][j]))
        j = choices[q][j]
        q -= 1
    stages.reverse()
    return [d for d, _ in stages], [lo for _, lo in stages] + [nb]


def _stage_tables(cm: CostModel, d: int) -> tuple[list[float], list[list[float]]]:
    """Node ``d``'s stage times for :func:`latency_split`, as :meth:`CostModel.stage_time`
    computes them: as the last stage from each block ``j`` (inf where it does not fit),
    and as an earlier stage from each ``j`` to every ``k`` while it fits."""
    nb = cm.num_blocks
    rp, kp, mp = cm.read_prefix, cm.kv_prefix, cm.mem_prefix
    head, embed = cm.head, cm.embed
    ib, fl, bs, ss = cm.inv_bw[d], cm.flop_s_per_byte[d], cm.block_s[d], cm.stage_s[d]
    xfer, room = cm.xfer_s[d], cm.usable[d]
    last = [math.inf] * nb
    for j in range(1, nb):
        if mp[nb] - mp[j] + head <= room:
            weights = rp[nb] - rp[j] + head
            t = max((weights + kp[nb] - kp[j]) * ib, weights * fl)
            last[j] = t + ((nb - j) * bs + ss)
    runs: list[list[float]] = []
    for j in range(nb - 1):
        extra = embed if j == 0 else 0
        run = []
        for k in range(j + 1, nb):
            if mp[k] - mp[j] + extra > room:
                break
            weights = rp[k] - rp[j]
            t = max((weights + kp[k] - kp[j]) * ib, weights * fl)
            run.append(t + ((k - j) * bs + ss) + xfer)
        runs.append(run)
    return last, runs


def _improve(
    best: tuple[float, list[_Node]],
    pool: Sequence[_Node],
    score: object,
) -> tuple[float, list[_Node]]:
    """Drop and swap moves while one lowers the surrogate time (best improvement)."""
    assert callable(score)
    for _ in range(_MAX_ROUNDS):
        _, members = best
        inside = {x.index for x in members}
        outside = [x for x in pool if x.index not in inside]
        trial: list[list[_Node]] = []
        for i in range(len(members)):
            rest = members[:i] + members[i + 1 :]
            trial.append(rest)
            trial.extend([*rest, y] for y in outside)
        trial.extend([*members, y] for y in outside)
        improved = best
        for members_t in trial:
            got = score(members_t)
            if got is not None and got[0] < improved[0] - 1e-15:
                improved = (got[0], members_t)
        if improved is best:
            return best
        best = improved
    return best


def _latency_key(cm: CostModel, c: Pipeline) -> tuple[float, float, int]:
    ev = cm.evaluate_here(*c)
    return (ev.time_per_token_s, ev.bottleneck_s, len(c[0]))
