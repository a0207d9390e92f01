"""Deprecated: the peer placement rules live in :mod:`stowplan.planner.baselines`."""

from __future__ import annotations

from stowplan.moved import moved

__getattr__ = moved(
    __name__,
    dict.fromkeys(
        ("BASELINES", "BaselineResult", "compare", "compare_plans", "run_baseline"),
        "stowplan.planner.baselines",
    ),
)
