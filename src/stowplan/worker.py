"""Deprecated: these names live in :mod:`stowplan.stages.worker`."""

from __future__ import annotations

from stowplan.moved import moved

__getattr__ = moved(
    __name__,
    dict.fromkeys(
        (
            "CONTRACT_KEYS",
            "VISIBLE_DEVICES",
            "WorkerStage",
            "even_split",
            "stage_env",
            "stage_from_env",
        ),
        "stowplan.stages.worker",
    ),
)
