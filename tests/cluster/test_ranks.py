"""Rank order of a unified group: NVLink domain, then topological rank, then node, then GPU."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stowplan.cluster.ranks import BundlePlace, rank_order
from stowplan.errors import InputError


def _places(spec: list[tuple[str, int, str | None, int | None]]) -> list[BundlePlace]:
    return [BundlePlace(node_id=n, gpu_id=g, domain=d, topo_rank=r) for n, g, d, r in spec]


def test_spread_bundles_are_regrouped_node_by_node_in_topological_order() -> None:
    # SPREAD deals bundles round-robin: a, b, a, b …; node b sits first in the network.
    places = _places([("a", i // 2, "D", 2) if i % 2 == 0 else ("b", i // 2, "D", 1)
                      for i in range(8)])  # fmt: skip
    order = rank_order(places)
    assert order == (1, 3, 5, 7, 0, 2, 4, 6)
    assert [places[i].node_id for i in order] == ["b"] * 4 + ["a"] * 4
    assert [places[i].gpu_id for i in order] == [0, 1, 2, 3] * 2


def test_domains_come_before_ranks_and_are_ordered_by_their_lowest_rank() -> None:
    places = _places(
        [
            ("x1", 0, "X", 5),
            ("y1", 0, "Y", 1),
            ("x2", 0, "X", 2),
            ("y2", 0, "Y", 9),
            ("u1", 0, None, 0),
            ("u2", 0, "unknown", 3),
            ("z1", 0, "Z", None),
        ]
    )
    assert [places[i].node_id for i in rank_order(places)] == [
        "y1", "y2", "x2", "x1", "z1", "u1", "u2"
    ]  # fmt: skip


def test_tensor_parallel_peers_share_a_node_whenever_the_node_holds_a_whole_group() -> None:
    # 2 domains × 2 nodes × 4 GPUs, shuffled; tp = 4: every TP group is one node.
    spec = [
        (f"{d}{n}", g, d, {"A": 10, "B": 20}[d] + n)
        for d in "AB"
        for n in range(2)
        for g in range(4)
    ]
    random.Random(7).shuffle(spec)
    places = _places(spec)
    order = rank_order(places)
    groups = [{places[i].node_id for i in order[k : k + 4]} for k in range(0, 16, 4)]
    assert groups == [{"A0"}, {"A1"}, {"B0"}, {"B1"}]


def test_without_topology_the_order_is_node_then_gpu() -> None:
    places = _places([("n2", 1, None, None), ("n1", 3, None, None), ("n1", 0, None, None),
                      ("n2", 0, None, None)])  # fmt: skip
    assert rank_order(places) == (2, 1, 3, 0)
    assert rank_order([]) == ()


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["n0", "n1", "n2", "n3"]),
            st.integers(0, 7),
            st.sampled_from([None, "A", "B"]),
            st.one_of(st.none(), st.integers(0, 5)),
        ),
        max_size=24,
    )
)
def test_rank_order_is_a_permutation_that_keeps_each_domain_contiguous(spec) -> None:
    places = _places(spec)
    order = rank_order(places)
    assert sorted(order) == list(range(len(places)))
    domains = [places[i].domain or "unknown" for i in order]
    runs = [d for k, d in enumerate(domains) if k == 0 or domains[k - 1] != d]
    assert len(runs) == len(set(runs))  # one run per domain
    assert (
        all(d == "unknown" for d in domains[domains.index("unknown") :])
        if ("unknown" in domains)
        else True
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"node_id": ""}, "node_id='': must be a non-empty string"),
        ({"node_id": "n", "gpu_id": -1}, "n.gpu_id=-1: must be an integer >= 0"),
        ({"node_id": "n", "topo_rank": 1.5}, "n.topo_rank=1.5: must be an integer >= 0"),
    ],
)
def test_a_bad_place_names_the_field(kwargs, message) -> None:
    with pytest.raises(InputError) as info:
        BundlePlace(**kwargs)
    assert str(info.value) == message
