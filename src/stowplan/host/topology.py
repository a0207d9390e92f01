"""What one host has (H0) and what it measured (H1): pure value types with JSON forms.

A **circuit** is one compute device (dGPU, iGPU or CPU) together with the
memory **pool** it reads weights from: a dGPU reads its own VRAM; the CPU and
an iGPU share system RAM. ``HostTopology`` lists circuits and pools;
``CapabilityMatrix`` holds one measured ``CircuitCapability`` per benchmarked
circuit, ordered best first (seed D30: priority is measured, never a fixed
hierarchy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from stowplan.checks import check_int, check_number
from stowplan.errors import InputError

__all__ = [
    "CapabilityMatrix",
    "Circuit",
    "CircuitCapability",
    "CircuitKind",
    "HostTopology",
    "MemoryPool",
    "PoolKind",
]

SYSTEM_POOL = "system"
"""Id of the system-RAM pool."""


class CircuitKind(StrEnum):
    """The kind of compute device."""

    DGPU = "dgpu"
    """Discrete GPU with its own VRAM behind a bus."""
    IGPU = "igpu"
    """Integrated GPU reading system RAM."""
    CPU = "cpu"
    """The host CPU (all cores as one circuit)."""


class PoolKind(StrEnum):
    """The kind of memory pool."""

    VRAM = "vram"
    SYSTEM = "system"


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryPool:
    """One memory pool: a dGPU's VRAM or the host's RAM."""

    id: str
    kind: PoolKind
    capacity_bytes: int
    free_bytes: int
    """Free at discovery time."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind.value,
            "capacity_bytes": self.capacity_bytes,
            "free_bytes": self.free_bytes,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryPool:
        return cls(
            id=str(d["id"]),
            kind=PoolKind(d["kind"]),
            capacity_bytes=int(d["capacity_bytes"]),
            free_bytes=int(d["free_bytes"]),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Circuit:
    """One compute device and the pool it reads."""

    id: str
    """``cpu``, ``gpu0``, ``gpu1`` …, ``igpu0``, ``amd0`` …"""
    kind: CircuitKind
    name: str
    pool: str
    """Id of the :class:`MemoryPool` it reads weights from."""
    uuid: str | None = None
    pcie_gen: int | None = None
    """Maximum PCIe generation of its host link (dGPU)."""
    pcie_width: int | None = None
    """Maximum PCIe lanes of its host link (dGPU)."""
    bus_gbps: float | None = None
    """Theoretical host→device GB/s from generation and width; None for in-pool circuits."""
    fabric: dict[str, str] | None = None
    """NVLink fabric facts (state, clique, cluster), filled by the fabric parser; None here."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind.value,
            "name": self.name,
            "pool": self.pool,
            "uuid": self.uuid,
            "pcie_gen": self.pcie_gen,
            "pcie_width": self.pcie_width,
            "bus_gbps": self.bus_gbps,
            "fabric": self.fabric,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Circuit:
        return cls(
            id=str(d["id"]),
            kind=CircuitKind(d["kind"]),
            name=str(d["name"]),
            pool=str(d["pool"]),
            uuid=d.get("uuid"),
            pcie_gen=d.get("pcie_gen"),
            pcie_width=d.get("pcie_width"),
            bus_gbps=d.get("bus_gbps"),
            fabric=d.get("fabric"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class HostTopology:
    """Every circuit and pool of one host (H0)."""

    hostname: str
    circuits: tuple[Circuit, ...]
    pools: tuple[MemoryPool, ...]
    driver_version: str | None = None
    """NVIDIA driver, when a GPU was found."""
    cpu_count: int = 1
    """Logical CPUs."""
    link_mbps: float = 0.0
    """Fastest network interface, Mbit/s (0: unknown)."""
    source: str = "none"
    """How GPUs were discovered: ``nvml``, ``nvidia-smi``, ``fixture`` or ``none``."""
    notes: tuple[str, ...] = field(default=())
    """What discovery could not see, one line each."""

    def pool(self, pool_id: str) -> MemoryPool:
        """The pool with ``pool_id``; KeyError when absent."""
        for p in self.pools:
            if p.id == pool_id:
                return p
        raise KeyError(pool_id)

    def circuit(self, circuit_id: str) -> Circuit:
        """The circuit with ``circuit_id``; KeyError when absent."""
        for c in self.circuits:
            if c.id == circuit_id:
                return c
        raise KeyError(circuit_id)

    @property
    def ram_bytes(self) -> int:
        """Capacity of the system pool (0 when absent)."""
        return next((p.capacity_bytes for p in self.pools if p.kind is PoolKind.SYSTEM), 0)

    @property
    def gpu_uuids(self) -> tuple[str, ...]:
        """UUIDs of every GPU, sorted."""
        return tuple(sorted(c.uuid for c in self.circuits if c.uuid))

    def to_dict(self) -> dict[str, Any]:
        return {
            "hostname": self.hostname,
            "circuits": [c.to_dict() for c in self.circuits],
            "pools": [p.to_dict() for p in self.pools],
            "driver_version": self.driver_version,
            "cpu_count": self.cpu_count,
            "link_mbps": self.link_mbps,
            "source": self.source,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HostTopology:
        return cls(
            hostname=str(d["hostname"]),
            circuits=tuple(Circuit.from_dict(c) for c in d["circuits"]),
            pools=tuple(MemoryPool.from_dict(p) for p in d["pools"]),
            driver_version=d.get("driver_version"),
            cpu_count=int(d.get("cpu_count", 1)),
            link_mbps=float(d.get("link_mbps", 0.0)),
            source=str(d.get("source", "none")),
            notes=tuple(d.get("notes", ())),
        )


def _gbps_to_json(v: float) -> float | str:
    return "inf" if math.isinf(v) else v


@dataclass(frozen=True, slots=True, kw_only=True)
class CircuitCapability:
    """Measured figures of one circuit (H1).

    ``compute_bytes_per_s`` is the seed's GEMV throughput: a ``gemv_n`` ×
    ``gemv_n`` f32 matrix-vector product reads ``4 * gemv_n**2`` bytes, done in
    ``ms_per_gemv`` (median), so ``4 * gemv_n**2 / (ms_per_gemv / 1000)``.
    """

    circuit: str
    backend: str
    """``numpy`` (CPU) or ``torch-cuda``; ``synthetic`` for hand-made profiles."""
    gemv_n: int
    ms_per_gemv: float
    """Median milliseconds per GEMV."""
    ms_spread: float = 0.0
    """(max - min) / median of the repeats; 0.1 means the repeats differed by 10 %."""
    repeats: int = 1
    upload_gbps: float = math.inf
    """Measured host→device GB/s (pinned copies); ``inf`` for an in-pool circuit."""

    def __post_init__(self) -> None:
        check_int(f"{self.circuit}.gemv_n", self.gemv_n, minimum=1)
        check_number(f"{self.circuit}.ms_per_gemv", self.ms_per_gemv, positive=True)
        up = self.upload_gbps
        if isinstance(up, bool) or not isinstance(up, int | float) or not up > 0:
            raise InputError(f"{self.circuit}.upload_gbps", up, "must be > 0 (inf when in-pool)")

    @property
    def compute_bytes_per_s(self) -> float:
        """Weight bytes this circuit streams through a GEMV per second."""
        return 4.0 * self.gemv_n**2 / (self.ms_per_gemv / 1e3)

    @property
    def in_pool(self) -> bool:
        """Whether it reads overflow in place (no per-token transfer)."""
        return math.isinf(self.upload_gbps)

    def to_dict(self) -> dict[str, Any]:
        return {
            "circuit": self.circuit,
            "backend": self.backend,
            "gemv_n": self.gemv_n,
            "ms_per_gemv": self.ms_per_gemv,
            "ms_spread": self.ms_spread,
            "repeats": self.repeats,
            "upload_gbps": _gbps_to_json(self.upload_gbps),
            "compute_bytes_per_s": self.compute_bytes_per_s,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CircuitCapability:
        return cls(
            circuit=str(d["circuit"]),
            backend=str(d["backend"]),
            gemv_n=int(d["gemv_n"]),
            ms_per_gemv=float(d["ms_per_gemv"]),
            ms_spread=float(d.get("ms_spread", 0.0)),
            repeats=int(d.get("repeats", 1)),
            upload_gbps=float(d["upload_gbps"]),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CapabilityMatrix:
    """Measured capability of every benchmarked circuit, best first (seed D30)."""

    entries: tuple[CircuitCapability, ...]
    quick: bool = False
    """Measured in quick mode (smaller matrices, fewer repeats)."""

    def __post_init__(self) -> None:
        ranked = tuple(sorted(self.entries, key=lambda e: (-e.compute_bytes_per_s, e.circuit)))
        object.__setattr__(self, "entries", ranked)

    @property
    def order(self) -> tuple[str, ...]:
        """Circuit ids, most capable first."""
        return tuple(e.circuit for e in self.entries)

    def get(self, circuit_id: str) -> CircuitCapability | None:
        """The entry of ``circuit_id``, or None when it was not measured."""
        return next((e for e in self.entries if e.circuit == circuit_id), None)

    def to_dict(self) -> dict[str, Any]:
        return {"quick": self.quick, "entries": [e.to_dict() for e in self.entries]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CapabilityMatrix:
        return cls(
            entries=tuple(CircuitCapability.from_dict(e) for e in d["entries"]),
            quick=bool(d.get("quick", False)),
        )
