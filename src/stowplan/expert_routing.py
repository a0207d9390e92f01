"""Deprecated: these names live in :mod:`stowplan.moe.routing`."""

from __future__ import annotations

from stowplan.moved import moved

__getattr__ = moved(
    __name__,
    dict.fromkeys(
        (
            "Holders",
            "Pairs",
            "Routing",
            "backbone_layout",
            "block_reaches",
            "copy_shares",
            "holders_of",
            "imbalance",
            "node_loads",
            "node_reach",
            "nodes_in_order",
            "remote_transfers",
            "slowest_finish",
            "stage_of_block",
            "token_routing",
        ),
        "stowplan.moe.routing",
    ),
)
