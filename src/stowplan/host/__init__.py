"""One host: discover its circuits (H0), measure them (H1); its residency plan (H2) is
:mod:`stowplan.planner.residency`'s.

::

    from stowplan.host import probe_host
    from stowplan.planner.residency import plan_employment
    passport = probe_host(quick=True)
    plan = plan_employment(passport.topology, passport.matrix, model_bytes=16 * 2**30)

``discover`` and ``measure`` are the I/O edges (NVML, nvidia-smi, psutil,
numpy/torch benchmarks); ``plan_employment`` is pure.  The residency names once
re-exported here still resolve, with a :class:`DeprecationWarning`.
"""

from __future__ import annotations

from stowplan.circuits import (
    CapabilityMatrix,
    Circuit,
    CircuitCapability,
    CircuitKind,
    HostTopology,
    MemoryPool,
    PoolKind,
)
from stowplan.host.node import node_from_passport
from stowplan.host.nvidia_smi import GpuRecord, SmiReport, parse_nvidia_smi, pcie_gbps
from stowplan.host.passport import (
    PASSPORT_SCHEMA_VERSION,
    Passport,
    cache_dir,
    default_passport_path,
    fingerprint,
    load_passport,
    obtain_passport,
    save_passport,
)
from stowplan.host.residency import MOVED_NAMES
from stowplan.host.route import (
    ROUTE_ENV,
    last_employment_plan,
    plan_for_model,
    probe_host,
    route_employment_for_model,
    route_employment_from_passport,
    route_enabled,
)
from stowplan.moved import moved

__all__ = [
    "PASSPORT_SCHEMA_VERSION",
    "ROUTE_ENV",
    "CapabilityMatrix",
    "Circuit",
    "CircuitCapability",
    "CircuitKind",
    "GpuRecord",
    "HostTopology",
    "MemoryPool",
    "Passport",
    "PoolKind",
    "SmiReport",
    "cache_dir",
    "default_passport_path",
    "fingerprint",
    "last_employment_plan",
    "load_passport",
    "node_from_passport",
    "obtain_passport",
    "parse_nvidia_smi",
    "pcie_gbps",
    "plan_for_model",
    "probe_host",
    "route_employment_for_model",
    "route_employment_from_passport",
    "route_enabled",
    "save_passport",
]

__getattr__ = moved(__name__, dict.fromkeys(MOVED_NAMES, "stowplan.planner.residency"))
