"""Device tags and the environment forwarded to Ray workers (pure parts of init_ray)."""

from __future__ import annotations

import pytest

from stowplan.cluster.bootstrap import device_tag, worker_env


@pytest.mark.parametrize(
    ("visible", "tag"),
    [
        ("3,1", "stowplan_devices_1_3"),
        ("1,3", "stowplan_devices_1_3"),
        ("10,2", "stowplan_devices_2_10"),
        (" 0 , 1 ", "stowplan_devices_0_1"),
        ("GPU-8a1f,0", "stowplan_devices_0_GPU-8a1f"),
        ("", "stowplan_devices_none"),
        (None, "stowplan_devices_none"),
    ],
)
def test_device_tag_does_not_depend_on_device_order(visible: str | None, tag: str) -> None:
    assert device_tag(visible) == tag


def test_launcher_variables_and_device_masks_are_withheld_from_workers() -> None:
    env = {
        "STOWPLAN_FLEET_ROLE": "inference",
        "NCCL_SOCKET_IFNAME": "eth0",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "TOKENIZERS_PARALLELISM": "false",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "SLURM_PROCID": "0",
        "OMPI_COMM_WORLD_SIZE": "8",
        "PMI_RANK": "0",
        "PMIX_RANK": "0",
        "RAY_ADDRESS": "10.0.0.1:6379",
    }
    forwarded, stripped = worker_env(env)
    assert forwarded == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "NCCL_SOCKET_IFNAME": "eth0",
        "STOWPLAN_FLEET_ROLE": "inference",
        "TOKENIZERS_PARALLELISM": "false",
    }
    assert stripped == (
        "CUDA_VISIBLE_DEVICES",
        "OMPI_COMM_WORLD_SIZE",
        "PMIX_RANK",
        "PMI_RANK",
        "RAY_ADDRESS",
        "SLURM_PROCID",
    )


PREPARE = """
import json, os
import ray
from stowplan.cluster.ray_runtime import prepare_local_ray
from ray._private import ray_constants
before = ray_constants.ENABLE_RAY_CLUSTER
prepare_local_ray()
print(json.dumps({
    "before": before,
    "after": ray_constants.ENABLE_RAY_CLUSTER,
    "wait": os.environ.get("RAY_raylet_start_wait_time_s"),
    "auth": os.environ.get("RAY_AUTH_MODE"),
}))
"""


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        ({}, {"before": True, "after": False, "wait": "120", "auth": "disabled"}),
        (
            {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "RAY_raylet_start_wait_time_s": "7"},
            {"before": True, "after": True, "wait": "7", "auth": "disabled"},
        ),
    ],
)
def test_prepare_local_ray_applies_loopback_after_ray_was_imported_and_user_settings_win(
    user: dict[str, str], expected: dict[str, object]
) -> None:
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | user
    done = subprocess.run(
        [sys.executable, "-c", PREPARE], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == expected
