"""Deprecated: these names live in :mod:`stowplan.files.fleets`."""

from __future__ import annotations

from stowplan.moved import moved

__getattr__ = moved(
    __name__,
    dict.fromkeys(
        (
            "MAX_COUNT",
            "load_nodes",
            "load_offers",
            "nodes_from_data",
            "nodes_from_offers",
        ),
        "stowplan.files.fleets",
    ),
)
