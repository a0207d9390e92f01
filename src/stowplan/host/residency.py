"""Deprecated: the residency planner is pure and lives in :mod:`stowplan.planner.residency`."""

from __future__ import annotations

from stowplan.moved import moved

_NEW = "stowplan.planner.residency"

MOVED_NAMES = (
    "DEFAULT_KV_RESERVE",
    "DEFAULT_RESIDENCY_HEADROOM_FRAC",
    "DevicePlacement",
    "EmploymentPlan",
    "OverflowEstimate",
    "PlacementRole",
    "ResidencyProtocol",
    "employment_from_json",
    "employment_to_json",
    "plan_employment",
    "plan_residency",
    "read_bytes_per_token",
)
"""The residency names this path and ``stowplan.host`` still answer, with a warning."""

__getattr__ = moved(__name__, dict.fromkeys(MOVED_NAMES, _NEW))
