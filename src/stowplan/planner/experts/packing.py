"""Packing the routed experts of every MoE block onto nodes of unequal speed and room.

:func:`pack_experts` is the whole rule in EPLB's shape (a load matrix in, the
copies of every expert out); :mod:`~stowplan.planner.experts.placement` wraps
it for a plan.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from stowplan.errors import InputError
from stowplan.moe.numbering import ValueNumbers
from stowplan.moe.routing import Holders, Pairs, node_loads, slowest_finish
from stowplan.planner.experts.inputs import LOCALITY_TOLERANCE
from stowplan.planner.experts.refine import EPS, Bounds, refine_block

__all__ = ["ExpertPacking", "pack_experts"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertPacking:
    """Where :func:`pack_experts` put every copy of every expert."""

    holders: tuple[Holders, ...]
    """``[layers][experts]``: the indices of the nodes holding a copy of the expert."""
    load_only: tuple[Holders, ...] | None
    """With co-activation pairs: the load-only packing of every layer (the one a grouped
    packing was weighed against, and kept when grouping did not pay); None without."""


def pack_experts(
    weight: Sequence[Sequence[float]],
    speeds: Sequence[float],
    slots: Sequence[int],
    *,
    redundant_per_layer: int,
    experts_per_token: int,
    pairs: Sequence[Pairs] | None = None,
    locality_tolerance: float = LOCALITY_TOLERANCE,
) -> ExpertPacking:
    """Place every routed expert of every MoE layer on a node, with redundant copies.

    Shapes (``L`` MoE layers, ``E`` routed experts per layer, ``N`` nodes):

    * ``weight[L][E]`` — each expert's load (selection probability per token,
      or counts; only ratios within a layer matter);
    * ``speeds[N]`` — each node's expert speed (relative memory bandwidth), > 0;
    * ``slots[N]`` — whole experts each node has room for, over all layers
      (``sum(slots) >= L * E``);
    * ``pairs[L]`` — optional co-selection per layer: ``(e, f, p_ef)`` with
      ``p_ef`` the probability per token that both are selected;
    * result ``holders[L][E]`` — the node indices of the expert's copies.

    Per layer, in layer order:

    1. Quota: the layer may use its even share of every node's remaining
       slots (rounded so that the last layer gets what is left).
    2. Replicas: up to ``redundant_per_layer`` spare slots each get a copy of
       the expert with the heaviest load per copy (EPLB's rule), while a copy
       still carries more than half of a node's mean load; a replicated
       expert's load is split evenly over its copies.
    3. Pack: copies heaviest first, each to the node with room whose finish
       time ``load / speed`` after the addition is least (capacity-weighted
       LPT; copies of one expert on distinct nodes).
    4. Refine: move or swap single-copy experts off the slowest node while
       that lowers its finish time (:func:`refine_block`).
    5. Co-activation (with ``pairs``): experts selected together at least twice
       as often as chance are grouped (at most ``experts_per_token`` per group),
       steps 2-4 are rerun with each group as one item, and the grouped packing
       is kept when its slowest node is within ``locality_tolerance`` (a
       fraction) of step 4's.
    6. The layer's copies are taken from the nodes' remaining slots.

    Deterministic.

    Raises:
        InputError: the shapes disagree, a speed is not > 0, a slot count is
            negative, or the slots cannot hold every expert once.
    """
    got = pack_shared(
        weight,
        speeds,
        slots,
        redundant_per_layer=redundant_per_layer,
        experts_per_token=experts_per_token,
        pairs=pairs,
        locality_tolerance=locality_tolerance,
    )
    return ExpertPacking(
        holders=tuple(map(_copy, got.holders)),
        load_only=None if got.load_only is None else tuple(map(_copy, got.load_only)),
    )


def pack_shared(
    weight: Sequence[Sequence[float]],
    speeds: Sequence[float],
    slots: Sequence[int],
    *,
    redundant_per_layer: int,
    experts_per_token: int,
    pairs: Sequence[Pairs] | None = None,
    locality_tolerance: float = LOCALITY_TOLERANCE,
) -> ExpertPacking:
    """:func:`pack_experts`'s packing, layers packed alike sharing one list of holders (and
    one list per expert): for readers that change none of them."""
    _check(weight, speeds, slots, pairs, redundant_per_layer, locality_tolerance)
    layers = len(weight)
    num_e = len(weight[0]) if layers else 0
    rem = list(slots)
    out: list[Holders] = []
    load_only: list[Holders] = []
    # Steps 2-5 are a pure function of a layer's loads, replica counts, pairs and quota,
    # and the quota enters only through comparisons of a node's limit with its slots
    # taken: every packing keeps, per node, the range of limits those comparisons hold
    # for, and a later layer alike (same loads, counts and pairs) whose quota lies in
    # every node's range is packed the same, without packing it again.
    packed: dict[tuple[int, int, int], list[_Packed]] = {}
    counted: dict[tuple[int, int], tuple[list[int], int]] = {}
    ordered: dict[int, list[int]] = {}
    number = ValueNumbers()
    for li in range(layers):
        # Step 1: this layer's quota of every node's remaining slots.
        left = layers - li
        limits = [
            min(r, max(-(-r // left), r - math.floor(c * (left - 1) / layers)))
            for r, c in zip(rem, slots, strict=True)
        ]
        w = weight[li]
        spare = sum(rem) - num_e * left
        budget = min(redundant_per_layer, max(0, spare) // left)
        layer_pairs = pairs[li] if pairs is not None else None
        # A layer places at most num_e + budget copies, so a quota above that never binds:
        # capped there, layers whose quotas differ only in slack share one packing.
        cap = num_e + budget + 1
        quota = [min(x, cap) for x in limits]
        row = number(w)
        extra = min(budget, max(0, sum(quota) - num_e))
        counts, counts_no = counted.get((row, extra)) or (None, -1)
        if counts is None:
            # A layer's extra copies never exceed redundant_per_layer: the order of every
            # load's copies is found once, up to that many, and each count read off it.
            order = ordered.get(row)
            if order is None:
                order = ordered[row] = _replica_order(w, redundant_per_layer, len(speeds))
            counts = _counts(num_e, order[:extra])
            counts_no = number.value(tuple(counts))
            counted[row, extra] = counts, counts_no
        key = (row, counts_no, -1 if layer_pairs is None else number(layer_pairs))
        found = None
        for p in packed.get(key, ()):
            if all(a <= q <= b for a, q, b in zip(p.lo, quota, p.hi, strict=True)):
                found = p
                break
        if found is None:
            lo, hi = [0] * len(quota), list(slots)
            single, kept = _pack_layer(
                w,
                speeds,
                quota,
                budget,
                layer_pairs,
                experts_per_token,
                locality_tolerance,
                counts=counts,
                bounds=(lo, hi),
            )
            taken = [0] * len(slots)
            for hs in kept:
                for j in hs:
                    taken[j] += 1
            found = _Packed(lo=lo, hi=hi, single=single, kept=kept, taken=taken)
            packed.setdefault(key, []).append(found)
        if layer_pairs is not None:
            load_only.append(found.single)
        out.append(found.kept)
        # Step 6: the copies use up their nodes' slots.
        rem = [r - t for r, t in zip(rem, found.taken, strict=True)]
    return ExpertPacking(
        holders=tuple(out), load_only=tuple(load_only) if pairs is not None else None
    )


def _pack_layer(
    w: Sequence[float],
    speeds: Sequence[float],
    limits: Sequence[int],
    budget: int,
    layer_pairs: Pairs | None,
    experts_per_token: int,
    locality_tolerance: float,
    *,
    counts: Sequence[int] | None = None,
    bounds: Bounds | None = None,
) -> tuple[Holders, Holders]:
    """Steps 2-5 for one layer: (the load-only packing, the packing kept).

    ``counts``: the layer's replica counts when the caller has them (else computed from
    ``budget``).  ``bounds``: ``(lo, hi)`` per node, narrowed in place to the limits for
    which every decision taken here would be the same (see :class:`_Bins`).
    """
    if counts is None:
        counts = _replica_counts(w, min(budget, max(0, sum(limits) - len(w))), len(speeds))
    if bounds is None:
        bounds = ([0] * len(limits), list(limits))
    # Steps 2-4: replicate, pack and refine the experts one by one.
    singles = [[e] for e in range(len(w))]
    holders = _place_block(w, speeds, limits, singles, counts, bounds)
    kept = holders
    if layer_pairs is not None:
        # Step 5: the same with co-activated experts kept together, when it costs little.
        groups = _groups(w, layer_pairs, experts_per_token)
        if any(len(g) > 1 for g in groups):
            grouped = _place_block(w, speeds, limits, groups, counts, bounds)
            worst_g = slowest_finish(node_loads(grouped, w, len(speeds)), speeds)
            worst_s = slowest_finish(node_loads(holders, w, len(speeds)), speeds)
            if worst_g <= worst_s * (1 + locality_tolerance) + EPS:
                kept = grouped
    return holders, kept


def _copy(holders: Holders) -> Holders:
    return list(map(list, holders))


@dataclass(frozen=True, slots=True, kw_only=True)
class _Packed:
    """One layer's packing, kept for the later layers alike whose quota lies in its bounds."""

    lo: list[int]
    hi: list[int]
    single: Holders
    kept: Holders
    taken: list[int]
    """Copies per node of ``kept``."""


def _check(
    weight: Sequence[Sequence[float]],
    speeds: Sequence[float],
    slots: Sequence[int],
    pairs: Sequence[Pairs] | None,
    redundant: int,
    tolerance: float,
) -> None:
    num_e = len(weight[0]) if weight else 0
    for li, row in enumerate(weight):
        if len(row) != num_e:
            raise InputError(f"weight[{li}]", f"<{len(row)} experts>", f"must have {num_e} values")
    if len(slots) != len(speeds):
        raise InputError(
            "slots", f"<{len(slots)} nodes>", f"must have one per speed ({len(speeds)})"
        )
    for j, s in enumerate(speeds):
        if not 0 < s < math.inf:
            raise InputError(f"speeds[{j}]", s, "must be a finite number > 0")
    for j, c in enumerate(slots):
        if c < 0:
            raise InputError(f"slots[{j}]", c, "must be an integer >= 0")
    if sum(slots) < len(weight) * num_e:
        raise InputError(
            "slots", sum(slots), f"must hold every expert of every layer ({len(weight) * num_e})"
        )
    if pairs is not None and len(pairs) != len(weight):
        raise InputError(
            "pairs", f"<{len(pairs)} layers>", f"must have one per layer ({len(weight)})"
        )
    if redundant < 0:
        raise InputError("redundant_per_layer", redundant, "must be an integer >= 0")
    if not 0 <= tolerance < math.inf:
        raise InputError("locality_tolerance", tolerance, "must be a number >= 0")


def _groups(w: Sequence[float], pairs: Pairs | None, k: int) -> list[list[int]]:
    """Experts grouped by strong co-activation (union of pairs >= twice chance, size <= k)."""
    n = len(w)
    parent = list(range(n))
    size = [1] * n

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    if pairs:
        total = sum(w)
        p = [k * x / total for x in w]
        chance = (k - 1) / k
        for e, f, c in sorted(pairs, key=lambda t: (-t[2], t[0], t[1])):
            if c < 2.0 * p[e] * p[f] * chance:
                break
            a, b = root(e), root(f)
            if a != b and size[a] + size[b] <= k:
                a, b = min(a, b), max(a, b)
                parent[b] = a
                size[a] += size[b]
    out: dict[int, list[int]] = {}
    for e in range(n):
        out.setdefault(root(e), []).append(e)
    return list(out.values())


def _replica_counts(w: Sequence[float], redundant: int, num_nodes: int) -> list[int]:
    """EPLB's rule: give each extra copy to the expert with the heaviest load per copy.

    Stops early once no copy carries more than half of a node's mean load.
    """
    return _counts(len(w), _replica_order(w, redundant, num_nodes)[:redundant])


def _replica_order(w: Sequence[float], most: int, num_nodes: int) -> list[int]:
    """The experts :func:`_replica_counts` gives an extra copy, in the order it gives them,
    ``most`` at most: the first ``r`` of them are its copies for any ``r <= most`` (the
    rule never looks at how many it may still give), and a shorter list is all it gives."""
    counts = [1] * len(w)
    order: list[int] = []
    heap = [(-x, e) for e, x in enumerate(w) if x > 0]
    heapq.heapify(heap)
    light = sum(w) / num_nodes / 2
    for _ in range(most):
        if not heap or -heap[0][0] <= light:
            break
        _, e = heapq.heappop(heap)
        counts[e] += 1
        order.append(e)
        heapq.heappush(heap, (-w[e] / counts[e], e))
    return order


def _counts(num_e: int, extra: Sequence[int]) -> list[int]:
    """One copy of each of ``num_e`` experts, and one more per entry of ``extra``."""
    counts = [1] * num_e
    for e in extra:
        counts[e] += 1
    return counts


class _Bins:
    """Nodes grouped by speed, each group a heap of ``(load, node)``: the least loaded first.

    Every comparison of a node's limit with its slots taken narrows ``bounds``
    (``lo[j] <= limits[j] <= hi[j]``) to the limits for which it comes out the same.
    """

    def __init__(self, speeds: Sequence[float], limits: Sequence[int], bounds: Bounds) -> None:
        self.speeds = speeds
        self.limits = limits
        self.lo, self.hi = bounds
        self.used = [0] * len(speeds)
        self.loads = [0.0] * len(speeds)
        self.heaps: dict[float, list[tuple[float, int]]] = {}
        for j, s in enumerate(speeds):
            if limits[j] > 0:
                self.lo[j] = max(self.lo[j], 1)
                self.heaps.setdefault(s, []).append((0.0, j))
            else:
                self.hi[j] = min(self.hi[j], 0)

    def best(self, size: int, weight: float, exclude: Sequence[int]) -> int:
        """The node with room for ``size`` and least finish time after ``weight`` (-1: none)."""
        best, best_t = -1, math.inf
        loads, used, limits, lo, hi = self.loads, self.used, self.limits, self.lo, self.hi
        for heap in self.heaps.values():
            skipped = []
            while heap:
                load, j = heap[0]
                if load != loads[j]:
                    heapq.heappop(heap)  # a stale entry
                    continue
                u = used[j]
                if u >= limits[j]:
                    if u < hi[j]:
                        hi[j] = u
                    heapq.heappop(heap)  # a full node
                    continue
                if limits[j] - u < size:  # room for less than the group
                    if u + 1 > lo[j]:
                        lo[j] = u + 1
                    if u + size - 1 < hi[j]:
                        hi[j] = u + size - 1
                    skipped.append(heapq.heappop(heap))
                    continue
                if u + size > lo[j]:
                    lo[j] = u + size
                if j in exclude:
                    skipped.append(heapq.heappop(heap))
                    continue
                t = (load + weight) / self.speeds[j]
                if t < best_t - EPS or (abs(t - best_t) <= EPS and j < best):
                    best, best_t = j, t
                break
            for item in skipped:
                heapq.heappush(heap, item)
        return best

    def add(self, j: int, size: int, weight: float) -> None:
        self.used[j] += size
        self.loads[j] += weight
        u = self.used[j]
        if u < self.limits[j]:
            if u + 1 > self.lo[j]:
                self.lo[j] = u + 1
            heapq.heappush(self.heaps[self.speeds[j]], (self.loads[j], j))
        elif u < self.hi[j]:
            self.hi[j] = u


def _place_block(
    w: Sequence[float],
    speeds: Sequence[float],
    limits: Sequence[int],
    groups: list[list[int]],
    counts: Sequence[int],
    bounds: Bounds,
) -> Holders:
    """Pack one MoE block: every expert once within ``limits``, ``counts[e]`` copies at most."""
    holders: Holders = [[] for _ in w]
    queue: list[tuple[list[int], float]] = []
    for g in groups:
        if len(g) > 1 and all(counts[e] == 1 for e in g):
            queue.append((g, sum(w[e] for e in g)))
        else:
            for e in g:
                c = counts[e]
                share = w[e] / c
                for _ in range(c):
                    queue.append(([e], share))
    queue.sort(key=lambda item: (-item[1], item[0][0]))
    bins = _Bins(speeds, limits, bounds)
    i = 0
    while i < len(queue):
        group, weight = queue[i]
        i += 1
        exclude = holders[group[0]] if len(group) == 1 else []
        best = bins.best(len(group), weight, exclude)
        if best < 0:
            if len(group) == 1:
                continue  # a copy with no distinct node left: the expert keeps fewer copies
            queue[i:] = sorted(
                queue[i:] + [([e], w[e]) for e in group], key=lambda item: (-item[1], item[0][0])
            )
            continue
        for e in group:
            holders[e].append(best)
        bins.add(best, len(group), weight)
    used, loads = bins.used, bins.loads
    refine_block(holders, w, speeds, limits, used, loads, groups, bounds=bounds)
    return holders
