"""One host: discover its circuits (H0), measure them (H1), plan residency (H2).

::

    from stowplan.host import probe_host, plan_employment
    passport = probe_host(quick=True)
    plan = plan_employment(passport.topology, passport.matrix, model_bytes=16 * 2**30)

``discover`` and ``measure`` are the I/O edges (NVML, nvidia-smi, psutil,
numpy/torch benchmarks); ``plan_employment`` is pure.
"""

from __future__ import annotations

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
from stowplan.host.residency import (
    DEFAULT_KV_RESERVE,
    DevicePlacement,
    EmploymentPlan,
    OverflowEstimate,
    PlacementRole,
    ResidencyProtocol,
    employment_from_json,
    employment_to_json,
    plan_employment,
    plan_residency,
    read_bytes_per_token,
)
from stowplan.host.route import (
    ROUTE_ENV,
    last_employment_plan,
    plan_for_model,
    probe_host,
    route_employment_for_model,
    route_employment_from_passport,
    route_enabled,
)
from stowplan.host.topology import (
    CapabilityMatrix,
    Circuit,
    CircuitCapability,
    CircuitKind,
    HostTopology,
    MemoryPool,
    PoolKind,
)

__all__ = [
    "DEFAULT_KV_RESERVE",
    "PASSPORT_SCHEMA_VERSION",
    "ROUTE_ENV",
    "CapabilityMatrix",
    "Circuit",
    "CircuitCapability",
    "CircuitKind",
    "DevicePlacement",
    "EmploymentPlan",
    "GpuRecord",
    "HostTopology",
    "MemoryPool",
    "OverflowEstimate",
    "Passport",
    "PlacementRole",
    "PoolKind",
    "ResidencyProtocol",
    "SmiReport",
    "cache_dir",
    "default_passport_path",
    "employment_from_json",
    "employment_to_json",
    "fingerprint",
    "last_employment_plan",
    "load_passport",
    "node_from_passport",
    "obtain_passport",
    "parse_nvidia_smi",
    "pcie_gbps",
    "plan_employment",
    "plan_for_model",
    "plan_residency",
    "probe_host",
    "read_bytes_per_token",
    "route_employment_for_model",
    "route_employment_from_passport",
    "route_enabled",
    "save_passport",
]
