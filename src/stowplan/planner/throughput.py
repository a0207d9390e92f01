"""``throughput``: maximum pipelined tokens/s (minimise the slowest stage).

For a fixed node order the min-max contiguous split is solved exactly by
bisection on the bottleneck time T with a greedy feasibility test: each node
in turn takes the most blocks it can within T and its VRAM (a node that can
take none is skipped); the first node that can hold all remaining blocks plus
the head finishes.  Taking the most blocks is never worse because every later
stage's feasibility is monotone in where it starts.

Which nodes, and which go at the two ends, is chosen by the same bisection on
a capacity test: at bottleneck T each node can hold some number of blocks as
an interior stage, as stage 0 (with the embed) or as the last stage (with the
head, and no outbound transfer); T is feasible when the best first node, the
best last node and the best ``max_stages − 2`` others hold every block.  For
models whose blocks are all alike (dense decoders) that test is exact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from stowplan.cost import CostModel
from stowplan.planner.common import Problem

__all__ = [
    "Pipeline",
    "greedy_split",
    "min_bottleneck_split",
    "role_capacity",
    "throughput_pipeline",
]

Pipeline = tuple[list[int], list[int]]
"""Node indices in stage order and block boundaries (len N+1)."""

_ITERATIONS = 48


def _ok(cm: CostModel, d: int, lo: int, hi: int, first: bool, last: bool, t_max: float) -> bool:
    return cm.fits(d, lo, hi, first, last) and cm.stage_time(d, lo, hi, first, last) <= t_max


def _reach(cm: CostModel, d: int, lo: int, t_max: float, first: bool) -> int:
    """Largest ``hi`` such that ``[lo, hi)`` as a non-last stage on ``d`` fits; ``lo`` if none."""
    nb = cm.num_blocks
    if lo >= nb or not _ok(cm, d, lo, lo + 1, first, False, t_max):
        return lo
    good, bad = lo + 1, nb + 1
    while bad - good > 1:
        mid = (good + bad) // 2
        if _ok(cm, d, lo, mid, first, False, t_max):
            good = mid
        else:
            bad = mid
    return good


def greedy_split(
    cm: CostModel, order: Sequence[int], t_max: float, min_stages: int = 1
) -> Pipeline | None:
    """A split of the blocks over a subsequence of ``order`` with every stage ≤ ``t_max``."""
    nb = cm.num_blocks
    pos = 0
    used: list[int] = []
    bounds = [0]
    for d in order:
        first = not used
        if len(used) + 1 >= min_stages and _ok(cm, d, pos, nb, first, True, t_max):
            used.append(d)
            bounds.append(nb)
            return used, bounds
        reach = min(_reach(cm, d, pos, t_max, first), nb - max(min_stages - len(used) - 1, 1))
        if reach > pos:
            used.append(d)
            bounds.append(reach)
            pos = reach
    return None


def min_bottleneck_split(
    cm: CostModel, order: Sequence[int], min_stages: int = 1, upper: float | None = None
) -> Pipeline | None:
    """The split of ``order`` (nodes may be skipped) minimising the slowest stage."""
    hi = math.inf if upper is None else upper
    best = greedy_split(cm, order, hi, min_stages)
    if best is None:
        return None
    hi = max(cm.evaluate(*best).stage_time_s)
    lo = 0.0
    for _ in range(_ITERATIONS):
        if hi - lo <= 1e-12 * hi:
            break
        mid = (lo + hi) / 2
        found = greedy_split(cm, order, mid, min_stages)
        if found is None:
            lo = mid
        else:
            best = found
            hi = max(cm.evaluate(*found).stage_time_s)
    return best


def role_capacity(cm: CostModel, d: int, t_max: float, first: bool, last: bool) -> int:
    """Blocks node ``d`` can hold in the given role within ``t_max`` and its VRAM."""
    nb = cm.num_blocks

    def ok(k: int) -> bool:
        lo, hi = (nb - k, nb) if last else (0, k)
        return _ok(cm, d, lo, hi, first, last, t_max)

    if cm.uniform:
        # Stage time and bytes are affine in k; greedy_split verifies the final split.
        return max(0, min(nb, _affine_guess(cm, d, t_max, first, last)))
    if not ok(1):
        return 0
    good, bad = 1, nb + 1
    while bad - good > 1:
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good


def _affine_guess(cm: CostModel, d: int, t_max: float, first: bool, last: bool) -> int:
    per_read = cm.read_prefix[1] + cm.kv_prefix[1]
    per_w = cm.read_prefix[1]
    head = cm.head if last else 0
    budget = t_max - (0.0 if last else cm.xfer_s[d])
    limits = [float(cm.num_blocks)]
    if per_read * cm.inv_bw[d] > 0:
        limits.append((budget / cm.inv_bw[d] - head) / per_read)
    if per_w * cm.flop_s_per_byte[d] > 0:
        limits.append((budget / cm.flop_s_per_byte[d] - head) / per_w)
    mem = cm.mem_prefix[1]
    if mem > 0:
        anchors = (cm.embed if first else 0) + head
        limits.append((cm.usable[d] - anchors) / mem)
    return math.floor(min(limits) + 1e-9)


def _capacity_test(
    cm: CostModel, nodes: Sequence[int], t_max: float, max_stages: int
) -> Pipeline | None:
    """An order whose greedy split may meet ``t_max``, per the capacity test; None if not."""
    nb = cm.num_blocks
    mid = {d: role_capacity(cm, d, t_max, False, False) for d in nodes}
    first = {d: role_capacity(cm, d, t_max, True, False) for d in nodes}
    last = {d: role_capacity(cm, d, t_max, False, True) for d in nodes}
    ranked = sorted((d for d in nodes if mid[d] > 0), key=lambda d: (-mid[d], d))
    top_first = _top_ends(nodes, first, mid)
    top_last = _top_ends(nodes, last, mid)
    best: tuple[int, list[int]] | None = None
    for f in top_first:
        for lst in top_last:
            if f == lst:
                continue
            inner = [d for d in ranked[:max_stages] if d not in (f, lst)][: max_stages - 2]
            total = first[f] + last[lst] + sum(mid[d] for d in inner)
            if total >= nb and (best is None or total > best[0]):
                best = (total, [f, *inner, lst])
    if best is None:
        return None
    return best[1], []


def _top_ends(nodes: Sequence[int], role: dict[int, int], mid: dict[int, int]) -> list[int]:
    """End candidates: the largest capacities in the role and the smallest losses vs interior."""
    able = [d for d in nodes if role[d] > 0]
    by_cap = sorted(able, key=lambda d: (-role[d], d))[:4]
    by_gain = sorted(able, key=lambda d: (mid[d] - role[d], -role[d], d))[:4]
    return sorted(set(by_cap) | set(by_gain))


def throughput_pipeline(problem: Problem, cm: CostModel) -> Pipeline | None:
    """The best pipeline this strategy finds (node indices, bounds); None if none fits."""
    nodes = list(range(len(cm.nodes)))
    min_n, max_n = problem.min_stages, problem.max_stages
    candidates: list[Pipeline] = []
    # One stage: the fastest single node that holds everything.
    if min_n <= 1:
        singles = [d for d in nodes if cm.fits(d, 0, cm.num_blocks, True, True)]
        if singles:
            d = min(singles, key=lambda d: (cm.stage_time(d, 0, cm.num_blocks, True, True), d))
            candidates.append(([d], [0, cm.num_blocks]))
    if max_n >= 2:
        # Bisection on T with the capacity test chooses the nodes and the ends.
        hi = _initial_upper(cm, nodes)
        lo = 0.0
        order: list[int] | None = None
        for _ in range(_ITERATIONS):
            if hi - lo <= 1e-9 * hi:
                break
            t = (lo + hi) / 2
            found = _capacity_test(cm, nodes, t, max_n)
            if found is None:
                lo = t
            else:
                hi, order = t, found[0]
        if order is None:
            found = _capacity_test(cm, nodes, hi, max_n)
            order = None if found is None else found[0]
        if order is not None:
            split = greedy_split(cm, order, hi * (1 + 1e-9), min_n)
            if split is None or not cm.uniform:
                split = min_bottleneck_split(cm, order, min_n) or split
            if split is not None:
                candidates.append(split)
    candidates = [c for c in candidates if min_n <= len(c[0]) <= max_n]
    if not candidates:
        return None
    return min(candidates, key=lambda c: _throughput_key(cm, c))


def _throughput_key(cm: CostModel, c: Pipeline) -> tuple[float, float, int]:
    ev = cm.evaluate(*c)
    return (ev.bottleneck_s, ev.time_per_token_s, len(c[0]))


def _initial_upper(cm: CostModel, nodes: Sequence[int]) -> float:
    """A bottleneck no stage can exceed: every block plus the head on the slowest node."""
    nb = cm.num_blocks
    return max(cm.stage_time(d, 0, nb, True, False) for d in nodes) + max(
        cm.stage_time(d, 0, nb, True, True) for d in nodes
    )
