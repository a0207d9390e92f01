"""Deprecated: a host's circuits, pools and capability matrix are values of
:mod:`stowplan.circuits` (the residency planner reads them without the probes)."""

from __future__ import annotations

from stowplan.moved import moved

__getattr__ = moved(
    __name__,
    dict.fromkeys(
        (
            "MAX_BYTES_PER_S",
            "MAX_GEMV_N",
            "SYSTEM_POOL",
            "CapabilityMatrix",
            "Circuit",
            "CircuitCapability",
            "CircuitKind",
            "HostTopology",
            "MemoryPool",
            "PoolKind",
        ),
        "stowplan.circuits",
    ),
)
