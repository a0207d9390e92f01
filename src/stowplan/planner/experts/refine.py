"""Step 4 of :func:`~stowplan.planner.experts.packing.pack_experts`: lower the slowest node.

After the greedy packing, single-copy items (a co-activation group kept whole,
else one expert) are moved or swapped off the node with the largest finish
time ``load / speed`` onto one of the least loaded nodes while that lowers the
largest finish time, at most :data:`REFINE_STEPS` times.
"""

from __future__ import annotations

import math
from bisect import insort
from collections.abc import Sequence

from stowplan.moe.routing import Holders

__all__ = ["EPS", "REFINE_STEPS", "REFINE_TARGETS", "Bounds", "refine_block"]

EPS = 1e-12
"""Finish times closer than this are equal (the packing then prefers the lower node index)."""

REFINE_STEPS = 32
"""Moves or swaps tried per block at most."""
REFINE_TARGETS = 4
"""The least loaded nodes a move or swap from the slowest node may go to."""

Bounds = tuple[list[int], list[int]]
"""``(lo, hi)`` per node: the slot limits ``lo[j] <= limits[j] <= hi[j]`` for which every
comparison of a limit with the slots taken came out as it did (narrowed in place)."""


def refine_block(
    holders: Holders,
    w: Sequence[float],
    speeds: Sequence[float],
    limits: Sequence[int],
    used: list[int],
    loads: list[float],
    groups: list[list[int]],
    *,
    bounds: Bounds | None = None,
) -> None:
    """Move or swap single-copy items (groups or experts) off the slowest node while it gains.

    ``holders``, ``used`` (slots taken per node) and ``loads`` are updated in place;
    ``bounds`` too, with the limits for which every step here is the same.
    """
    n = len(speeds)
    lo, hi = ([0] * n, [0] * n) if bounds is None else bounds
    items: list[list[int]] = []
    for g in groups:
        single = [e for e in g if len(holders[e]) == 1]
        if len(single) == len(g) and len({holders[e][0] for e in g}) == 1:
            items.append(g)
        else:  # replicated members, or a group split for lack of room: its singles move alone
            items.extend([e] for e in single)
    item_w = [sum(w[e] for e in g) for g in items]
    item_n = [len(g) for g in items]
    where = [holders[g[0]][0] for g in items]
    on: list[list[int]] = [[] for _ in range(n)]  # per node, its items in ascending order
    for i, j in enumerate(where):
        on[j].append(i)
    for _ in range(REFINE_STEPS):
        finish = [load / s for load, s in zip(loads, speeds, strict=True)]
        b = -max((t, -j) for j, t in enumerate(finish))[1]  # the slowest, the lowest index
        cur = finish[b]
        targets = [j for _, j in sorted((t, j) for j, t in enumerate(finish) if j != b)]
        targets = targets[:REFINE_TARGETS]
        # Nothing changes within a step: each target's figures are read once. Every
        # comparison of a limit with the slots taken narrows the bounds.
        tgt = [(j, used[j], limits[j] - used[j], loads[j], speeds[j], on[j]) for j in targets]
        lb, sb, ub, free_b = loads[b], speeds[b], used[b], limits[b] - used[b]
        best: tuple[float, int, int, int] | None = None  # (new max, item, node, other item or -1)
        best_t = math.inf  # best's new max
        for a in on[b]:
            size_a = item_n[a]
            wa = item_w[a]
            rest = (lb - wa) / sb
            for j, uj, free_j, lj, sj, on_j in tgt:
                if free_j >= size_a:
                    if uj + size_a > lo[j]:
                        lo[j] = uj + size_a
                    t = (lj + wa) / sj
                    t = t if t > rest else rest  # max(rest, t)
                    if t < cur - EPS and t < best_t - EPS:
                        best, best_t = (t, a, j, -1), t
                elif uj + size_a - 1 < hi[j]:
                    hi[j] = uj + size_a - 1
                for c in on_j:
                    d = wa - item_w[c]
                    if d <= 0:
                        continue
                    grow = item_n[c] - size_a
                    if free_b < grow:
                        if ub + grow - 1 < hi[b]:
                            hi[b] = ub + grow - 1
                        continue
                    if ub + grow > lo[b]:
                        lo[b] = ub + grow
                    if free_j < -grow:
                        if uj - grow - 1 < hi[j]:
                            hi[j] = uj - grow - 1
                        continue
                    if uj - grow > lo[j]:
                        lo[j] = uj - grow
                    t, t_j = (lb - d) / sb, (lj + d) / sj
                    t = t_j if t_j > t else t  # max(t, t_j)
                    if t < cur - EPS and t < best_t - EPS:
                        best, best_t = (t, a, j, c), t
        if best is None:
            return
        _, a, j, c = best
        moves = [(a, b, j)] + ([(c, j, b)] if c >= 0 else [])
        for item, src, dst in moves:
            for e in items[item]:
                holders[e] = [dst]
            where[item] = dst
            on[src].remove(item)
            insort(on[dst], item)
            loads[src] -= item_w[item]
            loads[dst] += item_w[item]
            used[src] -= item_n[item]
            used[dst] += item_n[item]
