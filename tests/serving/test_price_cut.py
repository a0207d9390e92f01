"""The price cut of serve() for a target: its covering and fronts are lower bounds, and on
random fleets (multi-GPU nodes, side-by-side copies, pipelines across nodes) the search
that skips the compositions it rules out pays no more than the one planning them all."""

from __future__ import annotations

import math
from dataclasses import replace
from itertools import product

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from stowplan import Infeasible, ModelLayout, NodeDescriptor, Workload, serve
from stowplan.serving.price_cut import ClassMemory, PriceCut, front, holding_front
from tests.common.serving_models import dense, mixed_fleets, models, serve_settings

GB = 10**9
SETTINGS = serve_settings(20)

pairs = st.lists(
    st.tuples(st.floats(0.1, 10.0), st.integers(0, 12).map(float)), min_size=1, max_size=4
)


def brute_cover(items: list[tuple[float, float]], need: int) -> float:
    """The least price of copies of ``items`` serving ``need``, by trying every count."""
    best = math.inf
    useful = [(p, v) for p, v in items if v > 0]
    for counts in product(range(need + 1), repeat=len(useful)):
        if sum(c * v for c, (_, v) in zip(counts, useful, strict=True)) >= need:
            best = min(best, sum(c * p for c, (p, _) in zip(counts, useful, strict=True)))
    return best


@SETTINGS
@given(pairs, st.integers(0, 9))
def test_the_rest_is_covered_at_the_least_price_of_copies(items, need):
    cut = PriceCut(9.0, integral=True)
    cut.update(items)
    want = 0.0 if need == 0 else brute_cover(items, need)
    assert cut.rest_price(need) == pytest.approx(want)
    # Fractionally (requests/s): never above the integral price.
    loose = PriceCut(9.0, integral=False)
    loose.update(items)
    assert loose.rest_price(need) <= want + 1e-9


@SETTINGS
@given(pairs, st.lists(st.integers(0, 3), min_size=4, max_size=4), st.integers(0, 9))
def test_with_counts_the_rest_is_covered_at_the_least_price_of_that_many_copies(
    items, counts, need
):
    limits = counts[: len(items)]
    cut = PriceCut(9.0, integral=True)
    cut.update(items, limits)
    useful = [(p, v, m) for (p, v), m in zip(items, limits, strict=True) if v > 0]
    want = 0.0 if need == 0 else math.inf
    for taken in product(*(range(m + 1) for _, _, m in useful)):
        if need and sum(t * v for t, (_, v, _) in zip(taken, useful, strict=True)) >= need:
            want = min(want, sum(t * p for t, (p, _, _) in zip(taken, useful, strict=True)))
    assert cut.rest_price(need) == pytest.approx(want)
    # Never above the covering without counts' limits... and never below it.
    free = PriceCut(9.0, integral=True)
    free.update(items)
    assert free.rest_price(need) <= cut.rest_price(need) + 1e-9
    assert cut.least_cover(items, limits) == pytest.approx(cut.rest_price(9))


def test_counts_stop_the_covering_from_taking_the_cheapest_replica_twice():
    cut = PriceCut(10.0, integral=True)
    cut.update([(1.0, 5.0), (3.0, 5.0)], [1, 1])
    assert cut.rest_price(10) == pytest.approx(4.0)
    cut.found(4.5)
    assert cut.cuts([(1.0, 4.0)])  # 1 + 1 + 3: the cheap pair once only
    free = PriceCut(10.0, integral=True)
    free.update([(1.0, 5.0), (3.0, 5.0)])
    free.found(4.5)
    assert not free.cuts([(1.0, 4.0)])  # 1 + two copies of (1, 5)


@SETTINGS
@given(
    st.lists(st.tuples(st.floats(0.1, 10.0), st.floats(0.05, 3.0)), min_size=1, max_size=3),
    st.floats(0.5, 6.0),
    st.floats(0.0, 1.0),
)
def test_requests_per_s_are_covered_in_whole_units_no_dearer_than_copies(items, target, part):
    need = target * part
    cut = PriceCut(target, integral=False)
    cut.update(items)
    useful = [(p, v) for p, v in items if v > 0]
    most = [math.ceil(need / v) if v > 0 else 0 for _, v in useful]
    best = 0.0 if need <= 0 else math.inf
    for counts in product(*(range(m + 1) for m in most)):
        if sum(c * v for c, (_, v) in zip(counts, useful, strict=True)) >= need:
            best = min(best, sum(c * p for c, (p, _) in zip(counts, useful, strict=True)))
    assert cut.rest_price(need) <= best + 1e-9


@SETTINGS
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=3),
    st.lists(st.floats(0.1, 5.0), min_size=3, max_size=3),
    st.lists(st.integers(1, 40), min_size=3, max_size=3),
    st.integers(1, 60),
    st.integers(1, 50),
)
def test_every_sub_multiset_holding_the_weights_has_a_front_pair_no_dearer_serving_more(
    combo, prices, usable, weights, top
):
    k = len(combo)
    memory = ClassMemory(
        prices=tuple(prices[:k]),
        usable=tuple(float(u) for u in usable[:k]),
        weight_bytes=float(weights),
        kv_per_request=1.0,
    )
    got = holding_front(tuple(combo), memory, float(top), users=True)
    assert got == front(got)
    several = sum(combo) > 1
    for sub in product(*(range(c + 1) for c in combo)):
        held = sum(s * u for s, u in zip(sub, memory.usable, strict=True))
        if held < weights + 1:
            continue
        price = sum(s * p for s, p in zip(sub, memory.prices, strict=True))
        served = min(top, held - weights) if several else top
        assert any(p <= price + 1e-12 and v >= served for p, v in got)


def test_no_composition_is_cut_before_a_packing_is_found():
    cut = PriceCut(10.0, integral=True)
    cut.update([(1.0, 5.0)])
    assert not cut.cuts([(100.0, 1.0)])
    cut.found(3.0)
    assert cut.cuts([(2.0, 4.0)])  # 2 + two copies of (1, 5) for the other 6 users
    assert not cut.cuts([(0.5, 10.0)])


FEW = settings(SETTINGS, max_examples=max(1, SETTINGS.max_examples // 4))
"""Each example serves three times on up to eight nodes: fewer of them."""

LOAD = Workload(prompt_tokens=512, output_tokens=128, ttft_s=2.0, tpot_s=0.1)


def _cut_pays_no_more_than_every_composition(
    model: ModelLayout, nodes: list[NodeDescriptor], share: float, by_rate: bool
) -> None:
    """A target of ``share`` of the most the fleet serves (users, or requests/s with
    ``by_rate``): served with the cut, and at no more $/h than planning every composition
    (the cut's test switched off)."""
    try:
        most = serve(model, nodes, LOAD)
    except Infeasible:
        assume(False)
        return
    target = replace(
        LOAD,
        users=None if by_rate else max(1, math.floor(most.users * share)),
        rate_per_s=most.rate_per_s * share if by_rate else None,
    )
    cut = serve(model, nodes, target)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(PriceCut, "beats", lambda self, floor: False)
        every = serve(model, nodes, target)
    if by_rate:
        assert cut.rate_per_s >= (target.rate_per_s or 0.0)
    else:
        assert cut.users >= (target.users or 0)
    assert cut.price_per_hour <= every.price_per_hour * (1 + 1e-9)


@SETTINGS
@given(
    st.one_of(
        models,
        st.builds(dense, st.integers(2, 4), st.integers(500, 4000), st.just(50_000), st.just(4096)),
    ),
    mixed_fleets(),
    st.floats(0.2, 0.9),
    st.booleans(),
)
def test_serve_with_the_cut_pays_no_more_than_planning_every_composition(
    model, nodes, share, by_rate
):
    _cut_pays_no_more_than_every_composition(model, nodes, share, by_rate)


@st.composite
def fleets_with_alike_nodes(draw: st.DrawFn) -> list[NodeDescriptor]:
    """A mixed fleet whose single-GPU nodes come in classes of up to three alike (copies
    but for the id): the counts of copies a packing takes are then above one."""
    out: list[NodeDescriptor] = []
    for n in draw(mixed_fleets()):
        for j in range(draw(st.integers(1, 3)) if n.num_gpus == 1 else 1):
            if len(out) < 8:
                out.append(replace(n, id=f"{n.id}-{j}"))
    return out


@FEW
@given(models, fleets_with_alike_nodes(), st.floats(0.2, 0.9), st.booleans())
def test_on_classes_of_alike_nodes_the_cut_pays_no_more_than_planning_every_composition(
    model, nodes, share, by_rate
):
    _cut_pays_no_more_than_every_composition(model, nodes, share, by_rate)
