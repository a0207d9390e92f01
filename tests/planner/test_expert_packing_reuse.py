"""pack_experts packs a layer once for every later layer alike whose quota keeps its decisions."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from stowplan.moe.routing import Holders, Pairs
from stowplan.planner.experts.packing import _pack_layer, pack_experts
from stowplan.planner.experts.refine import EPS, REFINE_STEPS, REFINE_TARGETS, refine_block


def _plain(
    weight: list[list[float]],
    speeds: list[float],
    slots: list[int],
    redundant: int,
    k: int,
    pairs: list[Pairs] | None,
) -> tuple[list[Holders], list[Holders]]:
    """Every layer packed afresh (no reuse): steps 1 and 6 as pack_experts states them."""
    layers, num_e = len(weight), len(weight[0])
    rem = list(slots)
    out, load_only = [], []
    for li in range(layers):
        left = layers - li
        limits = [
            min(r, max(-(-r // left), r - math.floor(c * (left - 1) / layers)))
            for r, c in zip(rem, slots, strict=True)
        ]
        budget = min(redundant, max(0, sum(rem) - num_e * left) // left)
        quota = [min(x, num_e + budget + 1) for x in limits]
        layer_pairs = pairs[li] if pairs is not None else None
        single, holders = _pack_layer(weight[li], speeds, quota, budget, layer_pairs, k, 0.05)
        load_only.append(single)
        for hs in holders:
            for j in hs:
                rem[j] -= 1
        out.append(holders)
    return out, load_only


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.lists(st.sampled_from([1.0, 1.0, 2.0, 3.0, 0.5]), min_size=12, max_size=12),
        min_size=1,
        max_size=2,
    ),
    experts=st.integers(1, 12),
    speeds=st.lists(st.sampled_from([1.0, 1.0, 1.5, 2.0]), min_size=1, max_size=6),
    layers=st.integers(1, 12),
    extra=st.integers(0, 40),
    redundant=st.integers(0, 4),
    k=st.integers(1, 3),
    with_pairs=st.booleans(),
    data=st.data(),
)
def test_reused_layers_match_every_layer_packed_afresh(
    rows: list[list[float]],
    experts: int,
    speeds: list[float],
    layers: int,
    extra: int,
    redundant: int,
    k: int,
    with_pairs: bool,
    data: st.DataObject,
) -> None:
    weight = [rows[data.draw(st.integers(0, len(rows) - 1))][:experts] for _ in range(layers)]
    n = len(speeds)
    shares = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    total = layers * experts + extra
    weights = [s + 1 for s in shares]
    slots = [total * x // sum(weights) for x in weights]
    slots[0] += total - sum(slots)
    pairs = None
    if with_pairs and experts > 1:
        pair_rows: list[Pairs] = [[(0, 1, 0.9)], [(0, experts - 1, 0.7), (0, 1, 0.2)]]
        pairs = [pair_rows[data.draw(st.integers(0, 1))] for _ in range(layers)]
    got = pack_experts(
        weight, speeds, slots, redundant_per_layer=redundant, experts_per_token=k, pairs=pairs
    )
    holders, load_only = _plain(weight, speeds, slots, redundant, k, pairs)
    assert list(got.holders) == holders
    assert got.load_only == (tuple(load_only) if pairs is not None else None)


@settings(max_examples=200, deadline=None)
@given(
    w=st.lists(st.sampled_from([1.0, 2.0, 3.0, 5.0]), min_size=1, max_size=12),
    speeds=st.lists(st.sampled_from([1.0, 1.5, 2.0]), min_size=1, max_size=5),
    budget=st.integers(0, 4),
    pairs=st.booleans(),
    data=st.data(),
)
def test_any_quota_within_the_kept_bounds_packs_the_same(
    w: list[float], speeds: list[float], budget: int, pairs: bool, data: st.DataObject
) -> None:
    n = len(speeds)
    limits = data.draw(st.lists(st.integers(0, len(w) + 2), min_size=n, max_size=n))
    limits[0] += max(0, len(w) - sum(limits))
    layer_pairs: Pairs | None = [(0, len(w) - 1, 0.9)] if pairs and len(w) > 1 else None
    big = 10 * (len(w) + budget + 2)
    bounds = ([0] * n, [big] * n)
    counts = [1] * len(w)  # the counts are part of the reuse key: kept fixed here
    first = _pack_layer(
        w, speeds, limits, budget, layer_pairs, 2, 0.05, counts=counts, bounds=bounds
    )
    lo, hi = bounds
    assert all(a <= q <= b for a, q, b in zip(lo, limits, hi, strict=True))
    other = [data.draw(st.integers(a, min(b, a + 3))) for a, b in zip(lo, hi, strict=True)]
    assert _pack_layer(w, speeds, other, budget, layer_pairs, 2, 0.05, counts=counts) == first


def _plain_refine(
    holders: Holders,
    w: list[float],
    speeds: list[float],
    limits: list[int],
    used: list[int],
    loads: list[float],
    groups: list[list[int]],
) -> None:
    """refine_block as first written: every step rebuilt from scratch."""
    n = len(speeds)
    items: list[list[int]] = []
    for g in groups:
        single = [e for e in g if len(holders[e]) == 1]
        if len(single) == len(g) and len({holders[e][0] for e in g}) == 1:
            items.append(g)
        else:
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
        best: tuple[float, int, int, int] | None = None
        for a in on[b]:
            size_a = len(items[a])
            for j in targets:
                if limits[j] - used[j] >= size_a:
                    t = max((loads[b] - item_w[a]) / speeds[b], (loads[j] + item_w[a]) / speeds[j])
                    if t < cur - EPS and (best is None or t < best[0] - EPS):
                        best = (t, a, j, -1)
                for c in on[j]:
                    d = item_w[a] - item_w[c]
                    grow = len(items[c]) - size_a
                    if d <= 0 or limits[b] - used[b] < grow or limits[j] - used[j] < -grow:
                        continue
                    t = max((loads[b] - d) / speeds[b], (loads[j] + d) / speeds[j])
                    if t < cur - EPS and (best is None or t < best[0] - EPS):
                        best = (t, a, j, c)
        if best is None:
            return
        _, a, j, c = best
        for item, src, dst in [(a, b, j)] + ([(c, j, b)] if c >= 0 else []):
            for e in items[item]:
                holders[e] = [dst]
            where[item] = dst
            loads[src] -= item_w[item]
            loads[dst] += item_w[item]
            used[src] -= len(items[item])
            used[dst] += len(items[item])


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 7),
    w=st.lists(st.floats(0.0, 10.0), min_size=1, max_size=20),
    data=st.data(),
)
def test_refine_matches_the_plain_refine(n: int, w: list[float], data: st.DataObject) -> None:
    speeds = data.draw(st.lists(st.sampled_from([0.5, 1.0, 1.5, 2.0]), min_size=n, max_size=n))
    holders: Holders = [
        sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=min(n, 2)))) for _ in w
    ]
    used = [0] * n
    loads = [0.0] * n
    for e, hs in enumerate(holders):
        for j in hs:
            used[j] += 1
            loads[j] += w[e] / len(hs)
    limits = [u + data.draw(st.integers(0, 3)) for u in used]
    groups: list[list[int]] = []
    e = 0
    while e < len(w):  # consecutive experts in groups of 1 to 3
        size = data.draw(st.integers(1, 3))
        groups.append(list(range(e, min(e + size, len(w)))))
        e += size
    mine = ([list(hs) for hs in holders], list(used), list(loads))
    plain = ([list(hs) for hs in holders], list(used), list(loads))
    refine_block(mine[0], w, speeds, limits, mine[1], mine[2], groups)
    _plain_refine(plain[0], w, speeds, limits, plain[1], plain[2], groups)
    assert mine == plain
