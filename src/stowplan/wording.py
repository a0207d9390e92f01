"""Deprecated: these names live in :mod:`stowplan.text.wording`."""

from __future__ import annotations

from stowplan.moved import moved

__getattr__ = moved(
    __name__,
    dict.fromkeys(
        (
            "RAY_NODE_ID_CHARS",
            "plural",
            "short_node_id",
        ),
        "stowplan.text.wording",
    ),
)
