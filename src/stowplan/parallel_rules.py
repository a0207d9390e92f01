"""Deprecated: these names live in :mod:`stowplan.rules.tensor_parallel`."""

from __future__ import annotations

from stowplan.moved import moved

__getattr__ = moved(
    __name__,
    dict.fromkeys(
        (
            "kv_heads_allow",
            "legal_tensor_parallel",
            "tensor_parallel_violation",
        ),
        "stowplan.rules.tensor_parallel",
    ),
)
