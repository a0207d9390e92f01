"""Launching every replica of a serve plan on a real local multi-node Ray cluster (fake
GPUs on 127.0.0.1): each replica's placement groups land on its own nodes, each stage
gets its replica's env, and a fleet that cannot hold a replica is refused in one line
with nothing left behind."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from stowplan import ServePlan
from stowplan.cli import main
from stowplan.cluster.local import start_local_cluster
from stowplan.cluster.nodes import ray_node_descriptors
from stowplan.cluster.realise import contract_stage_class
from stowplan.cluster.replicas import ReplicaUnplaceable, realise_serve_plan
from tests.common.serve_fleet import FLEET, serve_fleet

TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def cluster():
    local = start_local_cluster(FLEET)
    try:
        yield local
    finally:
        local.shutdown()


@pytest.fixture(scope="module")
def served(cluster) -> ServePlan:
    sp = serve_fleet(ray_node_descriptors(timeout_s=TIMEOUT_S))
    assert len(sp.replicas) == 3 and sum(r.plan.num_stages for r in sp.replicas) == 4
    return sp


def _groups_left() -> list[str]:
    from ray.util.placement_group import placement_group_table

    return [k for k, v in placement_group_table().items() if v["state"] != "REMOVED"]


@pytest.mark.ray
def test_every_replica_lands_on_its_own_nodes_with_its_env(cluster, served) -> None:
    from ray.util.placement_group import placement_group_table

    import ray

    with realise_serve_plan(served, contract_stage_class(), timeout_s=TIMEOUT_S) as running:
        assert len(running.replicas) == 3
        for i, (r, got) in enumerate(zip(served.replicas, running.replicas, strict=True)):
            # One group per stage, on the node the replica's plan names.
            assert len(got.groups) == r.plan.num_stages
            for a, group in zip(r.plan.assignments, got.groups, strict=True):
                table = placement_group_table(group)
                assert table["state"] == "CREATED"
                assert set(table["bundles_to_node_id"].values()) == {a.node_id}
                assert table["bundles"][0].get("GPU", 0.0) == a.tensor_parallel
            infos = ray.get([s.info.remote() for s in got.actors], timeout=TIMEOUT_S)
            for a, info in zip(r.plan.assignments, infos, strict=True):
                assert info["node_id"] == info["plan_node_id"] == a.node_id
                assert info["replica"] == i
                assert tuple(info["block_range"]) == a.block_range
                assert len(info["gpu_ids"]) == a.tensor_parallel
        held = [g.id.hex() for r in running.replicas for g in r.groups]
        assert len(set(held)) == 4
    assert _groups_left() == []


@pytest.mark.ray
def test_launch_cli_starts_every_replica_and_releases_them(cluster, served, tmp_path, capsys):
    path = tmp_path / "serve.json"
    path.write_text(served.to_json())
    args = ["launch", str(path), "--ray", cluster.address, "--timeout", str(TIMEOUT_S)]
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [[s["node_id"] for s in rep] for rep in doc["replicas"]] == [
        [a.node_id for a in r.plan.assignments] for r in served.replicas
    ]
    assert all(s["node_id"] == s["plan_node_id"] for rep in doc["replicas"] for s in rep)
    assert _groups_left() == []


@pytest.mark.ray
def test_a_fleet_that_cannot_hold_a_replica_is_refused_in_one_line(
    cluster, served, tmp_path, capsys
) -> None:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    import ray

    # The last replica's first node is busy: its GPU is held by another actor.
    last = len(served.replicas) - 1
    stage = served.replicas[last].plan.assignments[0]

    @ray.remote(num_cpus=0)
    class Hold:
        def ping(self) -> int:
            return 1

    hold = Hold.options(
        num_gpus=stage.tensor_parallel,
        scheduling_strategy=NodeAffinitySchedulingStrategy(stage.node_id, soft=False),
    ).remote()
    try:
        assert ray.get(hold.ping.remote(), timeout=TIMEOUT_S) == 1
        path = tmp_path / "serve.json"
        path.write_text(served.to_json())
        assert main(["launch", str(path), "--ray", cluster.address, "--timeout", "3"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert err.startswith(f"stowplan: error: replica {last} of 3 cannot be placed")
        assert f"stage 0 on node {stage.node_id}" in err
        # The replicas started before it were released: no group is left.
        assert _groups_left() == []
    finally:
        ray.kill(hold)
    # A node that is gone is refused before anything is created.
    gone = served.replicas[0].node_ids[0]
    data = json.loads(served.to_json().replace(gone, "f" * len(gone)))
    with pytest.raises(ReplicaUnplaceable, match=r"^replica 0 of 3 cannot be placed.*not alive"):
        realise_serve_plan(ServePlan.from_dict(data), contract_stage_class(), timeout_s=3)
    assert _groups_left() == []


@pytest.mark.ray
def test_replicas_side_by_side_on_one_node_get_gpus_of_their_own(cluster) -> None:
    import ray

    # The two-GPU node alone, its GPUs joined by a slow link: two one-GPU replicas
    # serve more than one tensor-parallel replica.
    (two,) = [n for n in ray_node_descriptors(timeout_s=TIMEOUT_S) if n.num_gpus == 2]
    slow = replace(two, intra_link_gbps=0.001, intra_link_latency_us=50_000.0)
    sp = serve_fleet([slow])
    assert [r.node_ids for r in sp.replicas] == [(two.id,), (two.id,)]
    assert [a.gpu_indices for r in sp.replicas for a in r.plan.assignments] == [(0,), (1,)]
    with realise_serve_plan(sp, contract_stage_class(), timeout_s=TIMEOUT_S) as running:
        infos = [
            ray.get(s.info.remote(), timeout=TIMEOUT_S) for r in running.replicas for s in r.actors
        ]
        assert [info["node_id"] for info in infos] == [two.id, two.id]
        gpus = [tuple(info["gpu_ids"]) for info in infos]
        assert all(len(g) == 1 for g in gpus) and gpus[0] != gpus[1]
    assert _groups_left() == []


@pytest.mark.ray
def test_a_replica_short_of_a_cpu_is_refused_naming_the_cpu(cluster) -> None:
    """Every stage's bundle takes a CPU: with one of the two-GPU node's two CPUs held,
    the second replica side by side there cannot start, and the reason names the CPU
    (its GPU is free)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    import ray

    (two,) = [n for n in ray_node_descriptors(timeout_s=TIMEOUT_S) if n.num_gpus == 2]
    slow = replace(two, intra_link_gbps=0.001, intra_link_latency_us=50_000.0)
    sp = serve_fleet([slow])
    assert len(sp.replicas) == 2

    @ray.remote(num_cpus=1)
    class Hold:
        def ping(self) -> int:
            return 1

    hold = Hold.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(two.id, soft=False)
    ).remote()
    try:
        assert ray.get(hold.ping.remote(), timeout=TIMEOUT_S) == 1
        with pytest.raises(ReplicaUnplaceable) as info:
            realise_serve_plan(sp, contract_stage_class(), timeout_s=3)
        text = str(info.value)
        assert text.startswith("replica 1 of 2 cannot be placed"), text
        assert "the stage needs 1 CPU of the node (0 of 2 free now)" in text
        assert "GPU" not in text.split("the stage needs", 1)[1]
        assert _groups_left() == []
    finally:
        ray.kill(hold)
