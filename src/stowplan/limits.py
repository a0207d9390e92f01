"""Deprecated: these names live in :mod:`stowplan.quantities.limits`."""

from __future__ import annotations

from stowplan.moved import moved

__getattr__ = moved(
    __name__,
    dict.fromkeys(
        (
            "MAX_BATCH",
            "MAX_BLOCKS",
            "MAX_BYTE_COUNT",
            "MAX_CONFIG_INT",
            "MAX_CONTEXT_TOKENS",
            "MAX_EXPERTS",
            "MAX_GPUS_PER_NODE",
            "MAX_NAME_CHARS",
            "MAX_NODES",
            "MAX_OWNED_EXPERTS",
            "MAX_RATE",
            "MIN_RATE",
            "MIN_SHARE_RATE",
        ),
        "stowplan.quantities.limits",
    ),
)
