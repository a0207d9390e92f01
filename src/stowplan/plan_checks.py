"""Deprecated: these names live in :mod:`stowplan.rules.plan_fit`."""

from __future__ import annotations

from stowplan.moved import moved

__getattr__ = moved(
    __name__,
    dict.fromkeys(
        ("check_plan_fits",),
        "stowplan.rules.plan_fit",
    ),
)
