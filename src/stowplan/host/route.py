"""The H2 route hook: where a model loader asks for this host's employment plan.

Gated by ``STOWPLAN_ROUTE`` (``1``/``true``/``yes``/``on`` enable it; default
off). Off, every hook is one environment read and returns None: no plan, no
store, no device touched. On, the plan is computed, logged on the
``stowplan.host`` logger and kept for :func:`last_employment_plan`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from stowplan.host.passport import Passport, load_passport
from stowplan.host.residency import DEFAULT_KV_RESERVE, EmploymentPlan, plan_employment
from stowplan.host.topology import CapabilityMatrix, HostTopology

if TYPE_CHECKING:
    from stowplan.host.bench import Progress

__all__ = [
    "ROUTE_ENV",
    "last_employment_plan",
    "plan_for_model",
    "probe_host",
    "route_employment_for_model",
    "route_employment_from_passport",
    "route_enabled",
]

ROUTE_ENV = "STOWPLAN_ROUTE"
"""Env flag gating residency routing. Default off."""

_TRUE = {"1", "true", "yes", "on"}
log = logging.getLogger("stowplan.host")
_last: EmploymentPlan | None = None


def route_enabled() -> bool:
    """Whether residency routing is enabled (``STOWPLAN_ROUTE``). Default off."""
    return os.environ.get(ROUTE_ENV, "").strip().lower() in _TRUE


def last_employment_plan() -> EmploymentPlan | None:
    """The last plan the route recorded in this process; None when none was."""
    return _last


def _record(plan: EmploymentPlan) -> EmploymentPlan:
    global _last
    _last = plan
    log.info(
        "residency route: %s, primary %s, %d overflow bytes, %.4f s/token predicted",
        plan.protocol.value,
        plan.primary,
        plan.overflow_bytes,
        plan.predicted_s_per_token,
    )
    return plan


def route_employment_for_model(
    topology: HostTopology,
    matrix: CapabilityMatrix,
    model_bytes: int,
    kv_reserve: float = DEFAULT_KV_RESERVE,
) -> EmploymentPlan | None:
    """When enabled: plan for ``model_bytes`` on the already-probed host, record and return it."""
    if not route_enabled():
        return None
    return _record(plan_employment(topology, matrix, model_bytes, kv_reserve))


def route_employment_from_passport(
    model_bytes: int,
    *,
    path: str | Path | None = None,
    kv_reserve: float = DEFAULT_KV_RESERVE,
) -> EmploymentPlan | None:
    """When enabled: plan from the cached passport (no probe, no benchmark, no GPU touched).

    Returns None when the route is off, or when no passport exists yet (one
    info line on the ``stowplan.host`` logger says so).
    """
    if not route_enabled():
        return None
    passport = load_passport(path)
    if passport is None:
        log.info("residency route: no hardware passport yet; run `stowplan probe` to make one")
        return None
    return _record(plan_employment(passport.topology, passport.matrix, model_bytes, kv_reserve))


def probe_host(*, quick: bool = False, progress: Progress | None = None) -> Passport:
    """Discover and measure this host now (heavy: runs the benchmark)."""
    from stowplan.host.bench import measure
    from stowplan.host.discover import discover

    topology = discover()
    matrix, notes = measure(topology, quick=quick, progress=progress)
    return Passport.create(topology, matrix, (*topology.notes, *notes))


def plan_for_model(
    model_bytes: int, *, quick: bool = False, kv_reserve: float = DEFAULT_KV_RESERVE
) -> EmploymentPlan:
    """Probe the real host (H0 + H1) and plan for ``model_bytes``. Heavy; not gated."""
    passport = probe_host(quick=quick)
    return plan_employment(passport.topology, passport.matrix, model_bytes, kv_reserve)
