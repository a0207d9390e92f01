"""Segment selection (pure) and what a node registers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stowplan.cluster.topology import (
    TOPO_RANK_UNKNOWN,
    UNKNOWN_DOMAIN,
    node_resources,
    select_segment_nodes,
    topo_rank_from,
    topology_from_nodes,
)
from stowplan.errors import Infeasible, InputError
from tests.common.paths import FIXTURES

# Two domains of uneven size, out of rank order in the mapping, plus unknown nodes.
TOPO: dict[str, tuple[str, int | None]] = {
    "b3": ("B", 13),
    "a1": ("A", 2),
    "b1": ("B", 11),
    "a3": ("A", 4),
    "u1": (UNKNOWN_DOMAIN, 1),
    "a2": ("A", 3),
    "b2": ("B", 12),
    "u2": (UNKNOWN_DOMAIN, None),
}


def test_segments_follow_topological_order_domain_by_domain() -> None:
    sel = select_segment_nodes(TOPO, segment_size=2, num_nodes=4)
    assert sel.segments == (("a1", "a2"), ("b1", "b2"))
    assert sel.domains == ("A", "B")
    assert sel.selected == ("a1", "a2", "b1", "b2")
    assert sel.remainder == ("a3", "b3", "u1", "u2")


def test_a_segment_never_spills_across_domains() -> None:
    sel = select_segment_nodes(TOPO, segment_size=3, num_nodes=6)
    assert sel.segments == (("a1", "a2", "a3"), ("b1", "b2", "b3"))
    with pytest.raises(Infeasible) as info:
        select_segment_nodes(TOPO, segment_size=2, num_nodes=6)
    assert str(info.value) == (
        "constraints unsatisfiable: 6 nodes need 3 complete NVLink segments of 2; only 2 can "
        "be formed (A: 3 nodes → 1, B: 3 nodes → 1; 2 nodes without a known domain excluded)"
    )


def test_unknown_nodes_are_never_selected() -> None:
    only_unknown = {f"u{i}": (UNKNOWN_DOMAIN, i + 1) for i in range(4)}
    with pytest.raises(Infeasible, match=r"no NVLink domain registered; 4 nodes"):
        select_segment_nodes(only_unknown, segment_size=1, num_nodes=1)


def test_segment_size_must_divide_num_nodes() -> None:
    with pytest.raises(InputError) as info:
        select_segment_nodes(TOPO, segment_size=3, num_nodes=4)
    assert str(info.value) == "segment_size=3: must divide num_nodes=4 (4 % 3 = 1)"


@given(
    st.dictionaries(
        st.text("abcdefgh", min_size=1, max_size=3),
        st.tuples(st.sampled_from(["A", "B", "C", UNKNOWN_DOMAIN]), st.none() | st.integers(1, 9)),
        max_size=12,
    ),
    st.integers(1, 3),
    st.integers(1, 4),
)
def test_selected_segments_are_complete_disjoint_and_single_domain(
    topology: dict[str, tuple[str, int | None]], size: int, count: int
) -> None:
    try:
        sel = select_segment_nodes(topology, size, size * count)
    except Infeasible:
        per_domain = {}
        for d, _ in topology.values():
            per_domain[d] = per_domain.get(d, 0) + 1
        per_domain.pop(UNKNOWN_DOMAIN, None)
        assert sum(n // size for n in per_domain.values()) < count
        return
    assert len(sel.segments) == count
    for seg, domain in zip(sel.segments, sel.domains, strict=True):
        assert len(seg) == size
        assert {topology[n][0] for n in seg} == {domain}
        assert domain != UNKNOWN_DOMAIN
    assert sorted(sel.selected + sel.remainder) == sorted(topology)


@pytest.mark.parametrize(
    ("env", "host", "expected"),
    [
        (
            {"SLURM_TOPOLOGY_ADDR": "s1.s12.node3", "SLURM_PROCID": "5"},
            "gpu7",
            (100120004, "SLURM_TOPOLOGY_ADDR"),
        ),
        ({"SLURM_PROCID": "0"}, "gpu7", (1, "SLURM_PROCID")),
        ({}, "gb200-rack2-n17", (18, "hostname")),
        ({}, "login", (1, "default")),
    ],
)
def test_topo_rank_is_at_least_one_and_names_its_source(
    env: dict[str, str], host: str, expected: tuple[int, str]
) -> None:
    assert topo_rank_from(env, host) == expected


def test_node_resources_from_a_gb200_fabric_block() -> None:
    text = (FIXTURES / "nvidia-smi" / "issue_excerpts" / "gb200_fabric_q_snippets.txt").read_text()
    healthy = text[text.index("## 1)") : text.index("## 2)")]
    res = node_resources(healthy, {"SLURM_PROCID": "3"}, "n1")
    assert res.as_resources() == {
        "topo_rank": 4.0,
        "nvlink_domain_dc6e40c4-d722-4357-9ba6-5291dd461278_2": 1.0,
    }
    assert node_resources(None, {}, "n1").as_resources() == {"topo_rank": 2.0}


def test_live_topology_skips_dead_nodes_and_defaults_to_unknown() -> None:
    nodes = [
        {
            "NodeID": "n1",
            "Alive": True,
            "Resources": {"GPU": 4.0, "nvlink_domain_x_1": 1.0, "topo_rank": 3.0},
        },
        {"NodeID": "n2", "Alive": True, "Resources": {"CPU": 2.0}},
        {"NodeID": "n3", "Alive": False, "Resources": {"nvlink_domain_x_1": 1.0}},
    ]
    assert topology_from_nodes(nodes) == {"n1": ("x_1", 3), "n2": (UNKNOWN_DOMAIN, None)}


def test_a_topo_rank_label_serves_when_the_resource_is_absent() -> None:
    nodes = [
        {
            "NodeID": "n1",
            "Alive": True,
            "Resources": {"topo_rank": 3.0},
            "Labels": {"topo_rank": "9"},
        },
        {"NodeID": "n2", "Alive": True, "Resources": {}, "Labels": {"topo_rank": "7"}},
    ]
    assert topology_from_nodes(nodes) == {"n1": (UNKNOWN_DOMAIN, 3), "n2": (UNKNOWN_DOMAIN, 7)}
    bad = [{"NodeID": "n3", "Alive": True, "Resources": {}, "Labels": {"topo_rank": "-1"}}]
    with pytest.raises(InputError) as info:
        topology_from_nodes(bad)
    assert str(info.value) == "node n3.labels.topo_rank='-1': must be an integer in [0, 2**53]"


def test_unknown_domain_nodes_excluded_from_selection() -> None:
    """NeMo-RL's scenario (tests/unit/distributed/test_topology_placement.py): nodes
    without NVLink-domain information, marked ``(unknown, -1)``, are accepted and never
    selected; they fall through to the remainder."""
    topo = {
        "node_000": (UNKNOWN_DOMAIN, TOPO_RANK_UNKNOWN),
        "node_001": (UNKNOWN_DOMAIN, TOPO_RANK_UNKNOWN),
        "node_002": ("domain_A", 0),
        "node_003": ("domain_A", 1),
        "node_004": ("domain_B", 2),
        "node_005": ("domain_B", 3),
    }
    sel = select_segment_nodes(topo, segment_size=2, num_nodes=4)
    assert sel.segments == (("node_002", "node_003"), ("node_004", "node_005"))
    assert sel.domains == ("domain_A", "domain_B")
    assert {topo[n][0] for n in sel.remainder} == {UNKNOWN_DOMAIN}
    assert set(sel.selected) | set(sel.remainder) == set(topo)
    only_unknown = {f"u{i}": (UNKNOWN_DOMAIN, TOPO_RANK_UNKNOWN) for i in range(4)}
    with pytest.raises(Infeasible, match="only 0 can be formed"):
        select_segment_nodes(only_unknown, segment_size=2, num_nodes=4)


def test_a_known_domain_node_of_unknown_rank_comes_after_the_ranked_ones() -> None:
    topo = {"a": ("d", TOPO_RANK_UNKNOWN), "b": ("d", 7), "c": ("d", 3)}
    sel = select_segment_nodes(topo, segment_size=2, num_nodes=2)
    assert sel.segments == (("c", "b"),)
    assert sel.remainder == ("a",)
    with pytest.raises(InputError, match=r"-1 \(unknown\) or None"):
        select_segment_nodes({"a": ("d", -2)}, segment_size=1, num_nodes=1)
