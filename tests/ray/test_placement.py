"""Placement groups, the virtual cluster and NVLink segments on a real 3-node Ray cluster.

Nodes (fake GPUs, 127.0.0.1): a1 (the head) and a2 in NVLink domain A; u1 in no
domain.  Each has 2 GPUs, 2 CPUs, a ``topo_rank`` and a ``stowplan.io/name`` label.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from stowplan.cli import main
from stowplan.cluster import (
    FleetRole,
    FleetSpec,
    ParallelismSpec,
    RayVirtualCluster,
    build_cluster,
    create_placement_group,
    get_ray_cluster_topology,
    live_groups,
)
from stowplan.cluster.errors import InsufficientResources, PlacementInfeasible, PlacementTimeout
from stowplan.cluster.ray_runtime import OBJECT_STORE_BYTES
from stowplan.cluster.topology import UNKNOWN_DOMAIN
from tests.common.ray_env import HEAD_ARGS

pytestmark = pytest.mark.ray

DOM_A = "aaaaaaaa-0000-4000-8000-000000000001_7"
NODES = {
    "a1": (DOM_A, 1),
    "a2": (DOM_A, 2),
    "u1": (None, 3),
}


@pytest.fixture(scope="module")
def cluster(ray_env: dict[str, str]) -> Iterator[dict[str, Any]]:
    """The module's cluster; yields ``{"cluster": Cluster, "ids": name → node id}``."""
    from ray.cluster_utils import Cluster

    import ray

    def node_args(name: str) -> dict[str, Any]:
        domain, rank = NODES[name]
        resources = {"topo_rank": float(rank)}
        if domain is not None:
            resources[f"nvlink_domain_{domain}"] = 1.0
        return {
            "num_cpus": 2,
            "num_gpus": 2,
            "resources": resources,
            "labels": {"stowplan.io/name": name},
            "object_store_memory": OBJECT_STORE_BYTES,
        }

    # The head is node a1: three raylets in all keep start-up light on two cores.
    c = Cluster(initialize_head=True, head_node_args=HEAD_ARGS | node_args("a1"))
    handles = {name: c.add_node(**node_args(name)) for name in NODES if name != "a1"}
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    ids = {}
    for node in ray.nodes():
        label = node.get("Labels", {}).get("stowplan.io/name")
        if label:
            ids[label] = node["NodeID"]
    try:
        yield {"cluster": c, "ids": ids, "handles": handles}
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(autouse=True)
def no_group_leaks(cluster: dict[str, Any]) -> Iterator[None]:
    """Every test leaves no group behind; wait until Ray's resource view has settled."""
    import ray

    yield
    assert live_groups() == []
    deadline = time.monotonic() + 10
    while ray.available_resources().get("GPU", 0) < ray.cluster_resources().get("GPU", 0):
        assert time.monotonic() < deadline, "GPUs still held after every group was removed"
        time.sleep(0.1)


def _placement(pg: Any) -> dict[int, str]:
    from ray.util.placement_group import placement_group_table

    return dict(placement_group_table(pg)["bundles_to_node_id"])


def test_live_topology_reads_domains_and_ranks(cluster: dict[str, Any]) -> None:
    ids = cluster["ids"]
    topo = get_ray_cluster_topology()
    assert {n: topo[ids[n]] for n in NODES} == {
        "a1": (DOM_A, 1),
        "a2": (DOM_A, 2),
        "u1": (UNKNOWN_DOMAIN, 3),
    }
    assert len(topo) == len(NODES)


def test_domain_pinned_groups_land_in_their_domain(cluster: dict[str, Any]) -> None:
    ids = cluster["ids"]
    spec = FleetSpec(role=FleetRole.TRAINER, num_nodes=2, gpus_per_node=2, segment_size=2)
    vc = build_cluster(spec, timeout_s=20)
    assert vc.node_domains == (DOM_A, DOM_A)
    groups = vc._init_placement_groups()
    assert vc._init_placement_groups() is groups  # idempotent
    assert len(groups) == 2
    where = [set(_placement(pg).values()) for pg in groups]
    assert all(len(w) == 1 for w in where)  # STRICT_PACK: one node per group
    assert set().union(*where) == {ids["a1"], ids["a2"]}
    vc.shutdown()
    vc.shutdown()


def test_segment_groups_land_on_the_selected_nodes_not_elsewhere_in_the_domain(
    cluster: dict[str, Any],
) -> None:
    ids = cluster["ids"]
    spec = FleetSpec(role=FleetRole.TRAINER, num_nodes=1, gpus_per_node=2, segment_size=1)
    # Domain A has two nodes; a one-node segment leaves the other free in the same domain.
    for chosen, other in (("a1", "a2"), ("a2", "a1")):
        topology = {
            ids[chosen]: (DOM_A, 1),
            ids[other]: (DOM_A, 2),
            ids["u1"]: (UNKNOWN_DOMAIN, 3),
        }
        vc = build_cluster(spec, topology=topology, timeout_s=20)
        assert (vc.node_domains, vc.node_ids) == ((DOM_A,), (ids[chosen],))
        (pg,) = vc._init_placement_groups()
        try:
            assert set(_placement(pg).values()) == {ids[chosen]}
        finally:
            vc.shutdown()


def test_per_node_groups_land_on_the_pinned_nodes(cluster: dict[str, Any]) -> None:
    ids = cluster["ids"]
    vc = RayVirtualCluster(
        [2, 1],
        num_gpus_per_node=2,
        name="pinned",
        node_ids=[ids["u1"], ids["a2"]],
        timeout_s=20,
    )
    groups = vc._init_placement_groups()
    assert [sorted(set(_placement(pg).values())) for pg in groups] == [[ids["u1"]], [ids["a2"]]]
    assert [len(_placement(pg)) for pg in groups] == [2, 1]
    vc.shutdown()


def test_replica_larger_than_a_node_gets_one_unified_group(cluster: dict[str, Any]) -> None:
    spec = FleetSpec(role=FleetRole.INFERENCE, num_nodes=2, gpus_per_node=2)
    vc = build_cluster(spec, ParallelismSpec(tensor_parallel=2, pipeline=2), timeout_s=20)
    (pg,) = vc._init_placement_groups()
    placed = list(_placement(pg).values())
    assert len(placed) == 4
    assert sorted(placed.count(n) for n in set(placed)) == [2, 2]  # PACK over two full nodes
    vc.shutdown()


def test_precheck_names_what_is_missing_before_creating_anything(
    cluster: dict[str, Any],
) -> None:
    with pytest.raises(InsufficientResources) as info:
        create_placement_group([{"GPU": 100.0}, {"nvlink_domain_zzz": 0.001}], "PACK", name="big")
    assert str(info.value) == (
        "placement group 'big' cannot be placed: needs GPU=100 (available 6 of 6), "
        "nvlink_domain_zzz=0.001 (no live node registers 'nvlink_domain_zzz')"
    )


def test_infeasible_group_fails_fast_and_is_removed(cluster: dict[str, Any]) -> None:
    start = time.monotonic()
    with pytest.raises(PlacementInfeasible) as info:
        create_placement_group([{"GPU": 3.0}], "STRICT_PACK", name="wide", timeout_s=10)
    assert time.monotonic() - start < 5
    assert str(info.value).startswith(
        "placement group 'wide' (STRICT_PACK, 1 bundles) is infeasible: no live node can ever "
        "hold it; unplaced bundles: 0 {GPU: 3}; removed it after "
    )


def test_group_waiting_for_busy_resources_times_out_and_is_removed(
    cluster: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    ids = cluster["ids"]
    holder = create_placement_group(
        [{"GPU": 1.0}] * 3,
        "STRICT_SPREAD",
        name="holder",
        bundle_label_selector=[{"stowplan.io/name": n} for n in NODES],
        timeout_s=20,
    )
    try:
        assert sorted(_placement(holder).values()) == sorted(ids[n] for n in NODES)
        caplog.set_level(logging.WARNING, logger="stowplan.cluster")
        start = time.monotonic()
        with pytest.raises(PlacementTimeout) as info:
            # 3 GPUs are free in total, but no node has 2 of them.
            create_placement_group(
                [{"GPU": 2.0}], "STRICT_PACK", name="pair", timeout_s=1.5, log_every_s=0.5
            )
        assert 1.5 <= time.monotonic() - start < 4
        assert str(info.value) == (
            "placement group 'pair' (STRICT_PACK, 1 bundles) not ready after 1.5 s (state "
            "PENDING, NO_RESOURCES: the resources exist but are in use); unplaced bundles: "
            "0 {GPU: 2}; removed it"
        )
        assert isinstance(info.value, TimeoutError)
        pending = [r.getMessage() for r in caplog.records if "pending for" in r.getMessage()]
        assert pending and "unplaced bundles: 0 {GPU: 2}" in pending[0]
    finally:
        from stowplan.cluster import remove_groups

        remove_groups([holder])


def test_node_removed_while_waiting_fails_the_group_cleanly(cluster: dict[str, Any]) -> None:
    import ray

    c = cluster["cluster"]
    extra = c.add_node(
        num_cpus=1, num_gpus=1, resources={"spare": 1.0}, object_store_memory=OBJECT_STORE_BYTES
    )
    c.wait_for_nodes()
    extra_id = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "spare" in n["Resources"])
    holder = create_placement_group(
        [{"GPU": 1.0}],
        "STRICT_PACK",
        name="spare-holder",
        bundle_label_selector=[{"ray.io/node-id": extra_id}],
        timeout_s=20,
    )
    remover = threading.Timer(0.5, c.remove_node, args=(extra,))
    try:
        remover.start()
        start = time.monotonic()
        with pytest.raises(PlacementInfeasible) as info:
            # Waits for the spare node's GPU (held), then the node disappears.
            create_placement_group(
                [{"GPU": 1.0, "spare": 1.0}], "STRICT_PACK", name="on-spare", timeout_s=30
            )
        assert time.monotonic() - start < 15
        assert "'on-spare'" in str(info.value)
        assert "no live node can ever hold it" in str(info.value)
    finally:
        remover.join(timeout=30)
        from stowplan.cluster import remove_groups

        remove_groups([holder])


def test_cli_topology_shows_segments_of_the_live_cluster(
    cluster: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    ids = cluster["ids"]
    address = cluster["cluster"].address
    args = ["cluster", "topology", "--address", address, "--segment-size", "2", "--num-nodes", "2"]
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["segments"] == [{"domain": DOM_A, "nodes": [ids["a1"], ids["a2"]]}]
    assert doc["remainder"] == [ids["u1"]]
