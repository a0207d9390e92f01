"""Deprecated: these names live in :mod:`stowplan.moe.stats`."""

from __future__ import annotations

from stowplan.moved import moved

__getattr__ = moved(
    __name__,
    dict.fromkeys(
        (
            "CoActivation",
            "ExpertLoad",
            "Pair",
            "coactivation_from_data",
            "expert_load_from_data",
            "load_coactivation",
            "load_expert_load",
            "zipf_load",
        ),
        "stowplan.moe.stats",
    ),
)
