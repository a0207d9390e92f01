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
) -> Any:
    """What :func:`trip._knapsack` figures, as its docstring states it, every count of
    stages each node's stage may reach (and the rest) figured in full: with ``hollow``
    (h), f = e for none first yet and e of the first stages holding none taken beside
    it, f = h + e for the first taken and e beside it."""
    inf = math.inf
    half = hollow if empty is not None and hollow else 1
    g = np.full((2 * half, 2, top + 1, nb + 1), inf)
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
            before = step[:, 0]
            leading = trip._leading_piece(f)
            if leading is not None:
                last = _plain_take(before, f.tail, leading[0]) + leading[1]
            else:
                last = _plain_take(before, f.tail, f.rate) + cm.head * min(f.inv_bw, f.flop_s)
                for r, c in f.pieces:
                    last = np.maximum(last, _plain_take(before, f.tail, r) + c)
            fresh[:, 1] = np.minimum(fresh[:, 1], last + f.hop)
        if empty is not None and hollow:
            mid, first_role = empty[f.node][:2]
            paid = f.hop + f.out + other
            for e in range(half):
                if first_role:  # the first, beside e taken
                    fresh[half + e] = np.minimum(fresh[half + e], step[e] + paid)
                if mid and e + 1 < half:  # one more beside it, the first taken or not
                    fresh[e + 1] = np.minimum(fresh[e + 1], step[e] + paid)
                    fresh[half + e + 1] = np.minimum(fresh[half + e + 1], step[half + e] + paid)
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
        ahead = trip._hollow(cm, figures, nb - count)[0]
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
                        np, cm, figures, count, top, open_top, None, roles, light, ahead
                    ),
                    _plain_knapsack(cm, figures, count, top, open_top, roles, light, ahead),
                )
            )
        for got, want in pairs:
            assert np.array_equal(np.isinf(got), np.isinf(want))
            finite = np.isfinite(want)
            assert np.allclose(got[finite], want[finite], rtol=1e-9, atol=1e-12)
