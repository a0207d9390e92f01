"""Tensor-parallel stages on a real 2-node Ray cluster with 4 fake GPUs per node.

Node ``a`` (the head) has ``topo_rank`` 2 and node ``b`` rank 1, both in one
NVLink domain; both carry ``gpu_name``/``vram_bytes`` labels.  An
``nvidia-smi`` on the nodes' PATH prints a real 4-GPU ``topo -m`` matrix (a
GB200 board, NV18 between every pair) and fails for anything else, as the tool
does on a host without a driver.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from typing import Any

import pytest

from stowplan.cluster import (
    FleetRole,
    FleetSpec,
    ParallelismSpec,
    PlacementStrategy,
    build_cluster,
    create_placement_group,
    live_groups,
    remove_groups,
)
from stowplan.cluster.nodes import ray_node_descriptors
from stowplan.cluster.ray_runtime import OBJECT_STORE_BYTES
from stowplan.cluster.realise import ContractStage, StageUnplaceable, realise, stage_actor_env
from stowplan.demo.model import DemoConfig, demo_layout
from tests.common.paths import FIXTURES
from tests.common.ray_env import HEAD_ARGS
from tests.common.tp_plans import tp_plan

pytestmark = pytest.mark.ray

DOMAIN = "bbbbbbbb-0000-4000-8000-000000000002_3"
RANKS = {"a": 2, "b": 1}
LAYOUT = demo_layout(DemoConfig())
TIMEOUT_S = 30.0
TOPO = FIXTURES / "nvidia-smi" / "issue_excerpts" / "gb200_4gpu_topo_sglang-11208.txt"


def _fake_nvidia_smi(directory: str) -> None:
    """An ``nvidia-smi`` that knows only ``topo -m``."""
    path = os.path.join(directory, "nvidia-smi")
    with open(path, "w", encoding="utf-8") as f:
        f.write(f'#!/bin/sh\n[ "$1 $2" = "topo -m" ] && exec cat "{TOPO}"\nexit 9\n')
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


@pytest.fixture(scope="module")
def cluster(ray_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """The module's cluster; yields node name → Ray node id."""
    from ray.cluster_utils import Cluster

    import ray

    def node_args(name: str) -> dict[str, Any]:
        return {
            "num_cpus": 4,
            "num_gpus": 4,
            "resources": {"topo_rank": float(RANKS[name]), f"nvlink_domain_{DOMAIN}": 1.0},
            "labels": {"stowplan.io/name": name, "gpu_name": "GB200", "vram_bytes": "64MiB"},
            "object_store_memory": OBJECT_STORE_BYTES,
        }

    tools = ray_env["RAY_TMPDIR"] + "/bin"
    os.makedirs(tools)
    _fake_nvidia_smi(tools)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", tools + os.pathsep + os.environ["PATH"])
        c = Cluster(initialize_head=True, head_node_args=HEAD_ARGS | node_args("a"))
        c.add_node(**node_args("b"))
        c.wait_for_nodes()
        ray.init(address=c.address, log_to_driver=False)
        try:
            ids = {
                n["Labels"]["stowplan.io/name"]: n["NodeID"]
                for n in ray.nodes()
                if n["Alive"] and "stowplan.io/name" in n.get("Labels", {})
            }
            yield ids
        finally:
            ray.shutdown()
            c.shutdown()


@pytest.fixture(autouse=True)
def no_group_leaks(cluster: dict[str, str]) -> Iterator[None]:
    """Every test leaves no group behind and every GPU free again."""
    import ray

    yield
    assert live_groups() == []
    deadline = time.monotonic() + 10
    while ray.available_resources().get("GPU", 0) < 8:
        assert time.monotonic() < deadline, "GPUs still held after every group was removed"
        time.sleep(0.1)


class TpStage(ContractStage):
    """The contract stage, also reporting the env it was given."""

    def env(self, keys: list[str]) -> dict[str, str | None]:
        return {k: os.environ.get(k) for k in keys}


def _free_gpus() -> dict[str, float]:
    from ray._private.state import available_resources_per_node

    return {k: v.get("GPU", 0.0) for k, v in available_resources_per_node().items()}


def test_nodes_report_four_gpus_and_the_probed_nvlink(cluster: dict[str, str]) -> None:
    nodes = {n.id: n for n in ray_node_descriptors(timeout_s=TIMEOUT_S)}
    assert set(nodes) == set(cluster.values())
    for node in nodes.values():
        assert (node.num_gpus, node.vram_bytes) == (4, 64 << 20)
        assert (node.intra_link_gbps, node.intra_link_latency_us) == (900.0, 3.0)
        labels = dict(node.labels)
        assert labels["measured"] == "intra_link"
        assert labels["intra_link"] == (
            "nvidia-smi topo -m: weakest pair GPU0-GPU1 NV18 (18 NVLinks × 50 GB/s: 900 GB/s)"
        )


def test_two_tp2_stages_share_a_node_on_disjoint_gpus(cluster: dict[str, str]) -> None:
    from ray.util.placement_group import placement_group_table

    import ray

    a, b = cluster["a"], cluster["b"]
    plan = tp_plan(LAYOUT, [(a, (2, 3)), (a, (0, 1)), (b, (0, 1))])
    printed = stage_actor_env(plan)
    with realise(plan, ray.remote(TpStage), timeout_s=TIMEOUT_S) as realisation:
        tables = [placement_group_table(pg) for pg in realisation.groups]
        assert [t["strategy"] for t in tables] == ["STRICT_PACK"] * 3
        assert [t["bundles"] for t in tables] == [{0: {"CPU": 1.0, "GPU": 2.0}}] * 3
        assert [t["bundles_to_node_id"][0] for t in tables] == [a, a, b]
        infos = ray.get([s.info.remote() for s in realisation.actors], timeout=TIMEOUT_S)
        envs = ray.get(
            [s.env.remote(sorted(e)) for s, e in zip(realisation.actors, printed, strict=True)],
            timeout=TIMEOUT_S,
        )
        free = _free_gpus()
    assert [i["node_id"] for i in infos] == [a, a, b]
    assert [sorted(i["gpu_ids"]) for i in infos] == [["2", "3"], ["0", "1"], ["0", "1"]]
    assert envs == printed  # exactly what --plan-debug prints, Ray's rewrite held off
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["2,3", "0,1", "0,1"]
    assert [e["PLAN_TP_SIZE"] for e in envs] == ["2", "2", "2"]
    assert (free[a], free[b]) == (0.0, 2.0)  # Ray counted two bundles of two on node a


def test_a_node_without_the_gpus_fails_at_once_naming_stage_node_and_gpus(
    cluster: dict[str, str],
) -> None:
    import ray

    a = cluster["a"]
    plan = tp_plan(LAYOUT, [(a, (0, 1, 2, 3)), (a, (4, 5))])
    start = time.monotonic()
    with pytest.raises(StageUnplaceable) as info:
        realise(plan, ray.remote(TpStage), timeout_s=TIMEOUT_S)
    assert time.monotonic() - start < 5
    assert str(info.value).endswith(
        f"stage 1 on node {a}: needs 2 GPUs (indices 4,5) but the node has GPUs 0-3, 4 free now"
    )


def test_gpus_in_use_time_out_naming_the_gpus_needed_and_free(cluster: dict[str, str]) -> None:
    import ray

    b = cluster["b"]
    holder = create_placement_group(
        [{"GPU": 3.0}], "STRICT_PACK", bundle_label_selector=[{"ray.io/node-id": b}]
    )
    try:
        with pytest.raises(StageUnplaceable) as info:
            realise(tp_plan(LAYOUT, [(b, (0, 1))]), ray.remote(TpStage), timeout_s=1.5)
    finally:
        remove_groups([holder])
    (failure,) = info.value.failures
    assert (failure.stage, failure.node_id) == (0, b)
    assert "NO_RESOURCES" in failure.reason
    assert failure.reason.endswith("; the stage needs 2 GPUs of the node (1 of 4 free now)")


def test_a_tp_group_wider_than_a_node_ranks_peers_node_by_node(cluster: dict[str, str]) -> None:
    from ray.util.placement_group import placement_group_table

    spec = FleetSpec(
        role=FleetRole.INFERENCE,
        num_nodes=2,
        gpus_per_node=4,
        placement_strategy=PlacementStrategy.SPREAD,
    )
    vc = build_cluster(spec, ParallelismSpec(tensor_parallel=8), timeout_s=TIMEOUT_S)
    try:
        (pg,) = vc._init_placement_groups()
        (order,) = vc.rank_orders()
        where = placement_group_table(pg)["bundles_to_node_id"]
        assert sorted(order) == list(range(8))
        # Node b sits first in the network (topo_rank 1): ranks 0-3 are its GPUs, then a's.
        assert [where[i] for i in order] == [cluster["b"]] * 4 + [cluster["a"]] * 4
    finally:
        vc.shutdown()
