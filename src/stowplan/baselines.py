"""The peer placement rules, now :mod:`stowplan.planner.baselines.peers`; re-exported here."""

from __future__ import annotations

from stowplan.planner.baselines.peers import (
    BASELINES,
    BaselineResult,
    compare,
    compare_plans,
    run_baseline,
)

__all__ = ["BASELINES", "BaselineResult", "compare", "compare_plans", "run_baseline"]
