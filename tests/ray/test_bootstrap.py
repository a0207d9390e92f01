"""init_ray on real local clusters: reuse by device tag, restart on a new tag, env forwarding."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from stowplan.cluster import FleetRole, InitMode, init_ray, stop_local_head
from stowplan.cluster.ray_runtime import OBJECT_STORE_BYTES

pytestmark = pytest.mark.ray

EXTRA = {
    "STOWPLAN_FLEET_ROLE": "trainer",
    "STOWPLAN_PROBE_VALUE": "x42",
    "SLURM_JOB_ID": "77",
    "OMPI_COMM_WORLD_RANK": "3",
    "PMI_RANK": "3",
}
PROBED = ("STOWPLAN_FLEET_ROLE", "STOWPLAN_PROBE_VALUE", "SLURM_JOB_ID", "OMPI_COMM_WORLD_RANK")


@pytest.fixture(scope="module")
def local_ray(ray_env: dict[str, str]) -> Iterator[None]:
    import ray

    yield
    ray.shutdown()
    for tag in ("stowplan_devices_0_1", "stowplan_devices_2"):
        stop_local_head(tag)


def _env(devices: str, **more: str) -> dict[str, str]:
    return dict(os.environ) | EXTRA | {"CUDA_VISIBLE_DEVICES": devices} | more


def _worker_env() -> dict[str, str | None]:
    import ray

    @ray.remote(num_cpus=1)
    def probe() -> dict[str, str | None]:
        return {k: os.environ.get(k) for k in PROBED}

    result: dict[str, str | None] = ray.get(probe.remote(), timeout=120)
    return result


def test_init_ray_reuses_by_device_tag_and_restarts_on_a_new_one(local_ray: None) -> None:
    import ray

    kw = {"num_cpus": 1, "object_store_memory": OBJECT_STORE_BYTES}
    first = init_ray(_env("1,0"), **kw)
    assert first.mode is InitMode.STARTED
    assert first.device_tag == "stowplan_devices_0_1"
    assert first.role is FleetRole.TRAINER
    assert first.address.startswith("127.0.0.1:")
    assert ray.cluster_resources()["stowplan_devices_0_1"] == 1
    assert {"SLURM_JOB_ID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"} <= set(first.stripped)
    assert "CUDA_VISIBLE_DEVICES" in first.stripped

    # The process environment reaches workers; launcher variables do not.
    assert _worker_env() == {
        "STOWPLAN_FLEET_ROLE": "trainer",
        "STOWPLAN_PROBE_VALUE": "x42",
        "SLURM_JOB_ID": None,
        "OMPI_COMM_WORLD_RANK": None,
    }

    again = init_ray(_env("0,1"), **kw)
    assert again.mode is InitMode.REUSED
    assert again.address == first.address

    attached = init_ray(_env("0,1", RAY_ADDRESS=first.address))
    assert attached.mode is InitMode.ATTACHED
    assert attached.address == first.address

    other = init_ray(_env("2"), **kw)
    assert other.mode is InitMode.STARTED
    assert other.device_tag == "stowplan_devices_2"
    resources = ray.cluster_resources()
    assert resources.get("stowplan_devices_2") == 1
    assert "stowplan_devices_0_1" not in resources
