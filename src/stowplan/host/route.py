"""The H2 route hook: where a model loader asks for this host's employment plan.

Gated by ``STOWPLAN_ROUTE`` (case-insensitive ``1``/``true``/``yes``/``on``
enable it; unset, empty, ``0``/``false``/``no``/``off`` leave it off). Any
other value leaves it off too, with one warning per process naming the value
and the accepted spellings. Off, every hook is one environment read and
returns None: no plan, no store, no device touched. On, the plan is
computed, logged on the ``stowplan.host`` logger and kept for
:func:`last_employment_plan`.

A hook never raises into the model load that calls it: when the passport is
unusable or the model cannot be placed, it logs one warning line and returns
None. The hooks never probe: an absent or unusable passport is reported, and
``stowplan probe`` makes a new one.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from stowplan.circuits import CapabilityMatrix, HostTopology
from stowplan.errors import StowplanError
from stowplan.files.fileio import path_exists
from stowplan.host.passport import (
    Passport,
    PassportUnreadable,
    default_passport_path,
    read_passport,
)
from stowplan.moved import renamed_keywords
from stowplan.planner.residency import (
    DEFAULT_RESIDENCY_HEADROOM_FRAC,
    EmploymentPlan,
    plan_employment,
)

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

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})
log = logging.getLogger("stowplan.host")
_last: EmploymentPlan | None = None
_warned: set[str] = set()


def route_enabled() -> bool:
    """Whether residency routing is enabled (``STOWPLAN_ROUTE``). Default off.

    An unrecognised value counts as off and is warned about once per process.
    """
    raw = os.environ.get(ROUTE_ENV)
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value not in _FALSE and raw not in _warned:
        _warned.add(raw)
        log.warning(
            "%s=%r is not understood; residency routing stays off "
            "(on: 1, true, yes, on; off: 0, false, no, off)",
            ROUTE_ENV,
            raw,
        )
    return False


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


@renamed_keywords(kv_reserve="vram_headroom_frac")
def route_employment_for_model(
    topology: HostTopology,
    matrix: CapabilityMatrix,
    model_bytes: int,
    vram_headroom_frac: float = DEFAULT_RESIDENCY_HEADROOM_FRAC,
) -> EmploymentPlan | None:
    """When enabled: plan for ``model_bytes`` on the already-probed host, record and return it.

    None when the route is off, or when no plan can be made (one warning line says why).
    ``vram_headroom_frac`` as in :func:`~stowplan.planner.residency.plan_employment`
    (``kv_reserve=`` is its deprecated spelling).
    """
    if not route_enabled():
        return None
    return _plan(topology, matrix, model_bytes, vram_headroom_frac)


def _plan(
    topology: HostTopology,
    matrix: CapabilityMatrix,
    model_bytes: int,
    vram_headroom_frac: float,
) -> EmploymentPlan | None:
    try:
        plan = plan_employment(topology, matrix, model_bytes, vram_headroom_frac)
    except StowplanError as exc:
        log.warning("residency route: no plan, the load goes on unrouted: %s", exc)
        return None
    return _record(plan)


@renamed_keywords(kv_reserve="vram_headroom_frac")
def route_employment_from_passport(
    model_bytes: int,
    *,
    path: str | Path | None = None,
    vram_headroom_frac: float = DEFAULT_RESIDENCY_HEADROOM_FRAC,
) -> EmploymentPlan | None:
    """When enabled: plan from the cached passport (no probe, no benchmark, no GPU touched).

    Returns None when the route is off, when no passport exists yet (one info
    line on the ``stowplan.host`` logger says so), when the passport is
    unusable or the model cannot be placed (one warning line each). Never probes.
    ``kv_reserve=`` is the deprecated spelling of ``vram_headroom_frac``.
    """
    if not route_enabled():
        return None
    p = Path(path) if path is not None else default_passport_path()
    if not path_exists(p):
        log.info("residency route: no hardware passport yet; run `stowplan probe` to make one")
        return None
    try:
        passport = read_passport(p)
    except PassportUnreadable as exc:
        log.warning(
            "residency route: hardware passport unusable, not routing (the route never "
            "probes; run `stowplan probe --refresh`): %s",
            exc,
        )
        return None
    return _plan(passport.topology, passport.matrix, model_bytes, vram_headroom_frac)


def probe_host(*, quick: bool = False, progress: Progress | None = None) -> Passport:
    """Discover and measure this host now (heavy: runs the benchmark)."""
    from stowplan.host.bench import measure
    from stowplan.host.discover import discover

    topology = discover()
    matrix, notes = measure(topology, quick=quick, progress=progress)
    return Passport.create(topology, matrix, (*topology.notes, *notes))


@renamed_keywords(kv_reserve="vram_headroom_frac")
def plan_for_model(
    model_bytes: int,
    *,
    quick: bool = False,
    vram_headroom_frac: float = DEFAULT_RESIDENCY_HEADROOM_FRAC,
) -> EmploymentPlan:
    """Probe the real host (H0 + H1) and plan for ``model_bytes``. Heavy; not gated.
    ``kv_reserve=`` is the deprecated spelling of ``vram_headroom_frac``."""
    passport = probe_host(quick=quick)
    return plan_employment(passport.topology, passport.matrix, model_bytes, vram_headroom_frac)
