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
