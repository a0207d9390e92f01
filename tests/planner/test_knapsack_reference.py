"""The trip knapsack's tables (stowplan.planner.exact.trip._knapsack) against a plain
reference: every count of stages figured for every node, each stage's least cost over
its window of blocks by trying every block count in turn."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from stowplan import Constraints
from stowplan.cost import CostModel
from stowplan.planner.exact import trip
from stowplan.planner.problem import prepare
from tests.common.gpu_fleets import nodes_of
from tests.common.instances import RANGED, ranged, sized_model, small_first
from tests.common.refusals import rejected_if_refused


def _plain_take(x: Any, cap: int, rate: float) -> Any:
    """y[..., j] = the least x[..., j − k] + k · rate over 1 ≤ k ≤ min(cap, j)."""
    y = np.full_like(x, math.inf)
    for j in range(x.shape[-1]):
        for k in range(1, min(cap, j) + 1):
            y[..., j] = np.minimum(y[..., j], x[..., j - k] + k * rate)
    return y


def _plain_knapsack(
    cm: CostModel,
    figures: list[trip.Figures],
    nb: int,
    top: int,
    open_top: bool,
    empty: trip.Roles | None = None,
    light: trip.Light | None = None,
    hollow: int = 0,
    dense: trip.Dense | None = None,
) -> Any:
    """What :func:`trip._knapsack` figures, as its docstring states it, every count of
    stages each node's stage may reach (and the rest) figured in full: with ``hollow``
    (h), row d for d of the h blocks before those counted placed and no first stage yet
    (d < h), row h − 1 + d for the first taken (d ≥ 1)."""
    inf = math.inf
    size = hollow if empty is not None and hollow else 1

    def row(first: int, d: int) -> int | None:
        if first:
            return size - 1 + d if 1 <= d <= size else None
        return d if d < size else None

    g = np.full((2 * size, 2, top + 1, nb + 1), inf)
    g[0, 0, 0, 0] = 0.0
    for f in figures:
        fresh = g.copy()
        if top == 0:
            step = g
        else:
            step = np.full_like(g, inf)
            step[..., 1:, :] = g[..., :-1, :]
            if open_top:
                step[..., top, :] = np.minimum(step[..., top, :], g[..., top, :])
        if f.inner > 0:
            fresh = np.minimum(fresh, _plain_take(step, f.inner, f.rate) + (f.hop + f.out))
        other, other_last, ahead = (0.0, 0.0, 0.0) if light is None else light[f.node]
        if f.lead > 0:
            first = _plain_take(step[0], f.lead, f.rate) + (f.hop + f.out + ahead)
            fresh[-1] = np.minimum(fresh[-1], first)
        if f.tail > 0:
            fresh[:, 1] = np.minimum(fresh[:, 1], _plain_last(cm, f, step[:, 0], f.tail) + f.hop)
        if empty is not None and hollow:
            mid, first_role = empty[f.node][:2]
            moves = []
            """(rows before, rows after, the stage's cost from before)"""
            for d in range(size + 1):
                for z in range(1, size + 1):  # a stage of z of the blocks before
                    paid = f.hop + f.out + z * other
                    if first_role and row(0, d) is not None and row(1, d + z) is not None:
                        moves.append((row(0, d), row(1, d + z), step[row(0, d)] + paid))
                    for first in (0, 1):
                        if mid and row(first, d) is not None and row(first, d + z) is not None:
                            was = step[row(first, d)]
                            moves.append((row(first, d), row(first, d + z), was + paid))
                for x, (added, held, ends) in enumerate(() if dense is None else dense[f.node], 1):
                    for first in (0, 1):
                        src, dst = row(first, d), row(first, d + x)
                        if src is None or dst is None:
                            continue
                        was = step[src]
                        if f.inner > 0 and held > 0:
                            stage = _plain_take(was, held, f.rate) + (f.hop + f.out + added)
                            moves.append((src, dst, stage))
                        if f.tail > 0 and ends > 0:
                            stage = np.full_like(was, inf)
                            stage[1] = _plain_last(cm, f, was[0], ends) + (f.hop + added)
                            moves.append((src, dst, stage))
            for _, dst, stage in moves:
                fresh[dst] = np.minimum(fresh[dst], stage)
        elif empty is not None:
            mid, first_role, last_role = empty[f.node]
            if mid:
                fresh = np.minimum(fresh, step + (f.hop + f.out + other))
            if first_role:
                fresh[1] = np.minimum(fresh[1], step[0] + (f.hop + f.out + other))
            if last_role:
                headed = max(trip._stage_cost(cm, f, "last", 0), other_last) + f.hop
                fresh[:, 1] = np.minimum(fresh[:, 1], step[:, 0] + headed)
        g = fresh
    return g


def _plain_last(cm: CostModel, f: trip.Figures, before: Any, most: int) -> Any:
    """A last stage of 1 to ``most`` blocks after each entry of ``before``, its hop apart."""
    leading = trip._leading_piece(f)
    if leading is not None:
        return _plain_take(before, most, leading[0]) + leading[1]
    last = _plain_take(before, most, f.rate) + cm.head * min(f.inv_bw, f.flop_s)
    for r, c in f.pieces:
        last = np.maximum(last, _plain_take(before, most, r) + c)
    return last


def _each_knapsack_as_the_plain_one(cm: CostModel, asked: Any) -> None:
    """Every knapsack ``asked()`` solves, against :func:`_plain_knapsack`: the same inf
    entries and the rest within rounding (the sliding minima subtract and add back each
    block count's seconds)."""
    solved: list[tuple[tuple[Any, ...], Any]] = []
    knapsack = trip._knapsack

    def kept(np_: Any, cm_: CostModel, figures: list[trip.Figures], *args: Any) -> Any:
        got = knapsack(np_, cm_, figures, *args)
        solved.append(((cm_, figures, *args), got))
        return got

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trip, "_knapsack", kept)
        asked()
    for (cm_, figures, nb, top, open_top, _layers, *rest), got in solved:
        want = _plain_knapsack(cm_, figures, nb, top, open_top, *rest)
        assert got.shape == want.shape
        assert np.array_equal(np.isinf(got), np.isinf(want))
        finite = np.isfinite(want)
        assert np.allclose(got[finite], want[finite], rtol=1e-9, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(small_first(), st.sampled_from([1, 3, 8]), st.integers(1, 5), st.integers(1, 5))
def test_the_heaviest_blocks_knapsack_is_the_plain_one(inst, batch, fewest, most):
    """Small blocks before the heaviest (dense blocks, then MoE ones): the heaviest
    blocks' knapsack counts the first stages holding none of them, each on a node of its
    own, and the knapsack of every block; each table is the plain reference's."""
    problem, c, lo, hi = ranged(inst, batch, fewest, most)
    cm = CostModel(*inst, c).for_stages(hi)
    held = replace(problem, min_stages=lo, max_stages=hi)
    _each_knapsack_as_the_plain_one(cm, lambda: trip.trip_bound(held, cm))


@settings(max_examples=60, deadline=None)
@given(*RANGED, st.floats(0.3, 1.5))
def test_the_capped_knapsacks_are_the_plain_ones(inst, batch, fewest, most, share):
    """Blocks alike or not, of ranges of stage counts (the top count standing for more or
    not), uncapped and within a cap: each table is the plain reference's."""
    problem, c, lo, hi = ranged(inst, batch, fewest, most)
    cm = CostModel(*inst, c).for_stages(hi)
    held = replace(problem, min_stages=lo, max_stages=hi)
    free = trip.trip_bound(held, cm)
    cap = share * (free if free is not None and math.isfinite(free) else 1.0)
    _each_knapsack_as_the_plain_one(cm, lambda: trip.capped_trip_bound(held, cm, cap))


@st.composite
def _many_stages(draw: st.DrawFn) -> tuple:
    """A model of 14–17 blocks, its first one to three small and the rest heavy (2–6 GB,
    all alike), on 13–15 single-GPU nodes: ranges of more stages than the knapsack
    counts (its top count standing for that many or more)."""
    nb = draw(st.integers(14, 17))
    small = draw(st.integers(1, 3))
    heavy = draw(st.integers(2, 6)) * 10**9
    sizes = [draw(st.integers(1, 6)) * 10**8 if b < small else heavy for b in range(nb)]
    model = sized_model("many-stages", sizes, sizes)
    kinds = [("RTX 4090", 24), ("L40S", 48), ("H100 SXM5", 80)]
    n = draw(st.integers(13, 15))
    nodes = nodes_of(
        [
            (*draw(st.sampled_from(kinds)), 1, 10_000.0, draw(st.sampled_from([0.05, 2.0])))
            for _ in range(n)
        ]
    )
    return model, nodes


def _kinds_apart() -> tuple:
    """15 blocks, two small first, on 14 nodes of the three kinds: the heaviest blocks'
    knapsack is sought (a widest window holds small blocks beside the heavy)."""
    sizes = [3 * 10**8, 10**8] + [3 * 10**9] * 13
    kinds = [("RTX 4090", 24), ("L40S", 48), ("H100 SXM5", 80)]
    spec = [(*kinds[i % 3], 1, 10_000.0, 2.0 if i % 4 == 0 else 0.05) for i in range(14)]
    return sized_model("kinds-apart", sizes, sizes), nodes_of(spec)


@settings(max_examples=15, deadline=None)
@given(_many_stages(), st.sampled_from([1, 16]), st.integers(1, 12))
@example(_kinds_apart(), 16, 12)
@example(_kinds_apart(), 1, 3)
def test_knapsacks_whose_top_count_stands_for_more_are_the_plain_ones(inst, batch, top):
    """On every node (none left out), counted up to ``top`` stages, the top standing for
    that many or more or not: the knapsack of every block and, where it is sought (some
    node's widest window holds small blocks beside the heavy: nearly every draw, and the
    examples always), the heaviest blocks' (the first stages holding none of them
    counted, each on a node of its own) are the plain reference's."""
    model, nodes = inst
    c = Constraints(batch=batch)
    with rejected_if_refused():
        prepare(model, nodes, c)
    cm = CostModel(model, nodes, c).for_stages(min(len(nodes), model.num_blocks))
    every, nb = trip._figures(cm), cm.num_blocks
    heavy = trip._heavy(cm)
    assert heavy is not None or model.name != "kinds-apart"
    if heavy is not None:
        assert trip._suffix(cm)
        count, figures, roles, light = heavy
        ahead = nb - count
        dense = trip._dense(cm, figures, ahead, math.inf) if ahead > 1 else None
    for open_top in (False, True):
        pairs = [
            (
                trip._knapsack(np, cm, every, nb, top, open_top),
                _plain_knapsack(cm, every, nb, top, open_top),
            )
        ]
        if heavy is not None:
            pairs.append(
                (
                    trip._knapsack(
                        np, cm, figures, count, top, open_top, None, roles, light, ahead, dense
                    ),
                    _plain_knapsack(cm, figures, count, top, open_top, roles, light, ahead, dense),
                )
            )
        for got, want in pairs:
            assert np.array_equal(np.isinf(got), np.isinf(want))
            finite = np.isfinite(want)
            assert np.allclose(got[finite], want[finite], rtol=1e-9, atol=1e-12)
