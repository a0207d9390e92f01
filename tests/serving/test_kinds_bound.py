"""The users bound of fleets too large to bound composition by composition
(stowplan.serving.kinds_bound): never below what the independent referee finds — the
bound of one replica spanning all its nodes, the programme over kinds with and without
large kinds, on fleets whose nodes differ only in their links and prices — and what
serve() reports with it."""

from __future__ import annotations

from itertools import combinations

from hypothesis import given
from hypothesis import strategies as st

from stowplan import Constraints, ModelLayout, NodeDescriptor, Workload, serve
from stowplan.models import resolve_model
from stowplan.serving.bounds import FleetRates, fleet_users_bound, rate_bound, users_bound
from stowplan.serving.kinds_bound import fleet_kinds_bound, kinds, kinds_users_bound
from tests.common.serving_models import fleets, loads, models, serve_settings, workload
from tests.common.serving_referee import Load, Referee
from tests.common.typed_fleets import three_card_fleet, typed_fleets

GB = 10**9
SETTINGS = serve_settings(15)


@SETTINGS
@given(models, fleets(2, 4), loads)
def test_a_replica_spanning_all_its_nodes_serves_no_more_than_the_bounds_of_that_span(
    model: ModelLayout, nodes: list[NodeDescriptor], load: Load
) -> None:
    """Users within ``users_bound`` and requests/s within ``rate_bound`` of every span."""
    ref = Referee(model, nodes, load)
    rates = FleetRates.of(model, nodes, Constraints(batch=1), workload(load))
    for size in range(2, len(nodes) + 1):
        for members in combinations(range(len(nodes)), size):
            users, requests = ref.best_replica(members)
            for span in range(1, size + 1):
                assert users <= users_bound(rates, members, workload(load), span=span)
                got = rate_bound(rates, members, workload(load), span=span)
                assert requests <= got * (1 + 1e-9)


@SETTINGS
@given(models, st.one_of(fleets(2, 5), typed_fleets()), loads, st.sampled_from([1, 3, 3000]))
def test_the_kinds_bound_is_never_below_the_most_users_of_disjoint_replicas(
    model: ModelLayout, nodes: list[NodeDescriptor], load: Load, limit: int
) -> None:
    """``limit`` 1 and 3 leave large kinds (of two or more nodes) to the programme."""
    best = Referee(model, nodes, load).fleet_users()
    got = fleet_kinds_bound(model, nodes, workload(load), Constraints(), limit=limit)
    assert got is not None
    assert got >= best - 1e-6


def test_kinds_are_every_composition_up_to_the_most_nodes_the_limit_allows() -> None:
    combos, most = kinds([2, 3, 1], 20)
    assert len(combos) == len(set(combos))
    assert all(1 <= sum(c) <= most for c in combos)
    assert all(c[0] <= 2 and c[1] <= 3 and c[2] <= 1 for c in combos)
    every = [(a, b, c) for a in range(3) for b in range(4) for c in range(2)]
    assert sorted(combos) == sorted(c for c in every if 1 <= sum(c) <= most)
    assert sum(1 for c in every if 1 <= sum(c) <= most + 1) > 20
    assert kinds([2, 3, 1], 10**6)[1] == 6


def test_a_large_kind_counts_no_node_twice() -> None:
    """One type of four nodes, pairs the only kinds: two pairs at most, whatever a
    larger replica would serve (it takes more than two nodes)."""

    def bound(combo: tuple[int, ...], span: int) -> float:
        return {1: 0.0, 2: 5.0}.get(sum(combo), 7.0) if span <= 2 else 7.0

    got = kinds_users_bound([4], bound, [0], limit=2)
    assert got is not None
    assert abs(got - max(2 * 5.0, 7.0 * 4 / 3)) < 1e-9


def test_a_large_fleet_gets_the_kinds_bound() -> None:
    """Twenty single-GPU nodes of three types, links and prices all unlike (more
    compositions than are bounded one by one): the certificate's bound is the kinds
    programme's, above the users served and below the pooled bound of the whole fleet."""
    nodes = three_card_fleet()
    w = Workload(prompt_tokens=1024, output_tokens=256, ttft_s=2.0, tpot_s=0.1)
    sp = serve("llama3.1:70b-q4", nodes, w)
    c = sp.certificate
    assert "replica kinds" in c.method
    assert sp.users <= c.bound
    rates = FleetRates.of(resolve_model("llama3.1:70b-q4"), nodes, Constraints(batch=1), w)
    assert c.bound < fleet_users_bound(rates, list(range(len(nodes))), w, len(nodes))
