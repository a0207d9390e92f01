"""Which device a calibration run measured: its profile key and its datasheet peak bandwidth.

Pure: the peak comes from the GPU spec table (:func:`stowplan.gpus.lookup_gpu`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from stowplan.calibration.profile import normalise_gpu_name
from stowplan.errors import InputError
from stowplan.gpus import lookup_gpu

__all__ = [
    "choose_device_name",
    "device_key",
    "device_match",
    "peak_bandwidth_gbps",
    "spec_bandwidth_gbps",
]


def device_key(name: str) -> str:
    """The profile key of GPU ``name``: ``NVIDIA GeForce RTX 4090`` → ``rtx-4090``."""
    return re.sub(r"[^a-z0-9]+", "-", normalise_gpu_name(name)).strip("-") or "device"


def device_match(name: str) -> tuple[str, ...]:
    """The match tokens of GPU ``name`` (its normalised words): ``("rtx", "4090")``."""
    return tuple(normalise_gpu_name(name).split())


def spec_bandwidth_gbps(gpu_name: str) -> float | None:
    """Peak memory bandwidth (GB/s) from the GPU spec table; None when the GPU is not in it."""
    spec = lookup_gpu(gpu_name)
    return spec.mem_bandwidth_gbps if spec is not None else None


def choose_device_name(device: str | None, listed: Sequence[str], missing: str) -> str:
    """``device`` when given, else the one GPU the benchmark file names.

    Raises:
        InputError: (field ``--device``) when the file names several GPUs and no
            ``device`` is given, or names none (the message is then ``missing``).
    """
    if device is None and len(listed) > 1:
        raise InputError(
            "--device",
            ", ".join(listed),
            "the runs used different GPUs; fit one device at a time (pass --device)",
        )
    name = device or (listed[0] if listed else None)
    if not name:
        raise InputError("--device", None, missing)
    return name


def peak_bandwidth_gbps(name: str, bandwidth_gbps: float | None) -> float:
    """``bandwidth_gbps`` when given, else the spec table's peak for GPU ``name`` (GB/s).

    Raises:
        InputError: (field ``--bandwidth-gbps``) when neither settles it.
    """
    bw = bandwidth_gbps if bandwidth_gbps is not None else spec_bandwidth_gbps(name)
    if bw is None:
        raise InputError(
            "--bandwidth-gbps", None, f"no spec bandwidth known for {name!r}; pass it in GB/s"
        )
    return bw
