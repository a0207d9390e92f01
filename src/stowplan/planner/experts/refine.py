"""Step 4 of :func:`~stowplan.planner.experts.packing.pack_experts`: lower the slowest node.

After the greedy packing, single-copy items (a co-activation group kept whole,
else one expert) are moved or swapped off the node with the largest finish
time ``load / speed`` onto one of the least loaded nodes while that lowers the
largest finish time, at most :data:`REFINE_STEPS` times.
"""

from __future__ import annotations

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

    def room(j: int, size: int) -> bool:
        """``limits[j] - used[j] >= size``, its outcome kept in the bounds."""
        need = used[j] + size
        if limits[j] >= need:
            lo[j] = max(lo[j], need)
            return True
        hi[j] = min(hi[j], need - 1)
        return False

    items: list[list[int]] = []
    for g in groups:
        single = [e for e in g if len(holders[e]) == 1]
        if len(single) == len(g) and len({holders[e][0] for e in g}) == 1:
            items.append(g)
        else:  # replicated members, or a group split for lack of room: its singles move alone
            items.extend([e] for e in single)
    item_w = [sum(w[e] for e in g) for g in items]
    where = [holders[g[0]][0] for g in items]
    for _ in range(REFINE_STEPS):
        b = max(range(n), key=lambda j: (loads[j] / speeds[j], -j))
        cur = loads[b] / speeds[b]
        targets = sorted((j for j in range(n) if j != b), key=lambda j: (loads[j] / speeds[j], j))
        targets = targets[:REFINE_TARGETS]
        on: dict[int, list[int]] = {j: [] for j in (b, *targets)}
        for i, j in enumerate(where):
            if j in on:
                on[j].append(i)
        best: tuple[float, int, int, int] | None = None  # (new max, item, node, other item or -1)
        for a in on[b]:
            size_a = len(items[a])
            for j in targets:
                if room(j, size_a):
                    t = max((loads[b] - item_w[a]) / speeds[b], (loads[j] + item_w[a]) / speeds[j])
                    if t < cur - EPS and (best is None or t < best[0] - EPS):
                        best = (t, a, j, -1)
                for c in on[j]:
                    d = item_w[a] - item_w[c]
                    grow = len(items[c]) - size_a
                    if d <= 0 or not room(b, grow) or not room(j, -grow):
                        continue
                    t = max((loads[b] - d) / speeds[b], (loads[j] + d) / speeds[j])
                    if t < cur - EPS and (best is None or t < best[0] - EPS):
                        best = (t, a, j, c)
        if best is None:
            return
        _, a, j, c = best
        moves = [(a, b, j)] + ([(c, j, b)] if c >= 0 else [])
        for item, src, dst in moves:
            for e in items[item]:
                holders[e] = [dst]
            where[item] = dst
            loads[src] -= item_w[item]
            loads[dst] += item_w[item]
            used[src] -= len(items[item])
            used[dst] += len(items[item])
