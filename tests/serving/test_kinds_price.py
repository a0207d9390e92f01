"""The price floor of the programme over replica kinds (stowplan.serving.kinds_price):
never above the cheapest set of nodes the independent referee finds for a users or a
requests/s target — with and without large kinds, on fleets whose nodes differ only in
their links and prices — nor above a price serve() proves on multi-GPU nodes, and
tighter than the pooled floor where each replica needs several nodes."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import assume, given
from hypothesis import strategies as st

from stowplan import Constraints, Infeasible, ModelLayout, NodeDescriptor, Workload, serve
from stowplan.models import resolve_model
from stowplan.serving.bounds import FleetRates
from stowplan.serving.kinds_price import fleet_kinds_price_floor, kinds_price_floor
from stowplan.serving.price_floor import price_floor
from tests.common.serving_models import (
    fleets,
    loads,
    mixed_fleets,
    models,
    serve_settings,
    workload,
)
from tests.common.serving_referee import Load, Referee, share_target
from tests.common.typed_fleets import three_card_fleet, typed_fleets

GB = 10**9
SETTINGS = serve_settings(20)


@SETTINGS
@given(
    models,
    st.one_of(fleets(2, 5), typed_fleets()),
    loads,
    st.floats(0.1, 1.0),
    st.booleans(),
    st.sampled_from([1, 3, 3000]),
)
def test_the_kinds_floor_is_never_above_the_cheapest_nodes_reaching_the_target(
    model: ModelLayout,
    nodes: list[NodeDescriptor],
    load: Load,
    share: float,
    by_rate: bool,
    limit: int,
) -> None:
    """``limit`` 1 and 3 leave large kinds (of two or more nodes) to the programme."""
    ref = Referee(model, nodes, load)
    target, cheapest = share_target(ref, nodes, share, by_rate)
    floor = fleet_kinds_price_floor(
        model, nodes, workload(load), Constraints(), target, by_rate=by_rate, limit=limit
    )
    assert floor is not None
    assert 0 < floor <= cheapest * (1 + 1e-9) + 1e-9


MIXED = Workload(prompt_tokens=512, output_tokens=128, ttft_s=2.0, tpot_s=0.1)


@SETTINGS
@given(models, mixed_fleets(), st.floats(0.2, 0.9), st.booleans())
def test_the_kinds_floor_is_never_above_an_exact_price_on_multi_gpu_nodes(
    model: ModelLayout, nodes: list[NodeDescriptor], share: float, by_rate: bool
) -> None:
    """Nodes of 1, 2 or 4 GPUs (replicas side by side on a node): below every price
    serve() proves optimal."""
    try:
        most = serve(model, nodes, MIXED)
    except Infeasible:
        assume(False)
        return
    target = (most.rate_per_s if by_rate else math.floor(most.users)) * share
    assume(target > 0 and (by_rate or target >= 1))
    w = replace(
        MIXED,
        users=None if by_rate else max(1, math.floor(target)),
        rate_per_s=target if by_rate else None,
    )
    sp = serve(model, nodes, w)
    assume(sp.certificate.exact)
    goal = target if by_rate else float(w.users or 0)
    floor = fleet_kinds_price_floor(model, nodes, w, Constraints(), goal, by_rate=by_rate)
    assert floor is not None
    assert floor <= sp.price_per_hour * (1 + 1e-9)


def test_pairs_rent_the_cheapest_nodes_of_their_type() -> None:
    """One type of four nodes at $1–4/h, a pair serving 5 users, one node none and a
    replica of three or more 7 (a large kind, at three nodes for 7 users dearer than
    pairs): 10 users rent all four nodes, 5 the two cheapest."""

    def bound(combo: tuple[int, ...], span: int) -> float:
        return {1: 0.0, 2: 5.0}.get(sum(combo), 7.0) if span <= 2 else 7.0

    prices = [[3.0, 1.0, 4.0, 2.0]]
    got = kinds_price_floor(prices, bound, [0], 10.0, limit=2)
    assert got is not None and abs(got - 10.0) < 1e-9
    got = kinds_price_floor(prices, bound, [0], 5.0, limit=2)
    assert got is not None and abs(got - 3.0) < 1e-9
    assert kinds_price_floor(prices, bound, [0], 100.0, limit=2) is None


def test_the_kinds_floor_is_tighter_than_the_pooled_one_where_replicas_need_several_nodes() -> None:
    """Twenty single-GPU nodes of three types, links and prices all unlike, none
    holding Llama 3.1 70B (4-bit) alone: the pooled floor lets any card join any
    replica, the kinds charge each replica the cards that hold its weights.  The
    certificate takes the kinds floor, at most the price found."""
    nodes = three_card_fleet()
    w = Workload(prompt_tokens=1024, output_tokens=256, ttft_s=2.0, tpot_s=0.1, users=12)
    model = resolve_model("llama3.1:70b-q4")
    rates = FleetRates.of(model, nodes, Constraints(), w)
    pooled = price_floor(rates, [n.price_per_hour or 0.0 for n in nodes], w, 12.0, by_rate=False)
    by_kind = fleet_kinds_price_floor(model, nodes, w, Constraints(), 12.0, by_rate=False)
    assert pooled is not None and by_kind is not None
    assert by_kind > pooled * 1.2
    sp = serve(model, nodes, w)
    c = sp.certificate
    assert "replica kinds" in c.method
    assert c.bound == min(by_kind, sp.price_per_hour)
    assert by_kind <= sp.price_per_hour * (1 + 1e-9)
