"""Deprecated: these names live in :mod:`stowplan.stages.gpu_lists`."""

from __future__ import annotations

from stowplan.moved import moved

__getattr__ = moved(
    __name__,
    dict.fromkeys(
        (
            "gpu_range_text",
            "node_stages",
            "stage_gpus_text",
            "stage_place_text",
            "uses_gpu_lists",
            "visible_devices",
        ),
        "stowplan.stages.gpu_lists",
    ),
)
