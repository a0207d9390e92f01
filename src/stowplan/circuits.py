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

from stowplan.errors import InputError
from stowplan.quantities.checks import check_choice, check_int, check_number
from stowplan.quantities.limits import MAX_BYTE_COUNT

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

MAX_BYTES_PER_S = 1e15
"""Upper bound of a plausible measured GEMV rate (1 PB/s, well above any memory system)."""

MAX_GEMV_N = 2**20
"""Largest GEMV side a passport may record (the probe uses a few thousand)."""


def _field(d: Any, key: str, where: str) -> Any:
    """``d[key]``; InputError naming ``where.key`` when ``d`` is no object or lacks it."""
    if not isinstance(d, dict):
        raise InputError(where, d, "must be a JSON object")
    if key not in d:
        raise InputError(f"{where}.{key}", None, "is required")
    return d[key]


def _str(d: Any, key: str, where: str) -> str:
    v = _field(d, key, where)
    if not isinstance(v, str) or not v:
        raise InputError(f"{where}.{key}", v, "must be a non-empty string")
    return v


def _opt_str(d: dict[str, Any], key: str, where: str) -> str | None:
    v = d.get(key)
    if v is not None and not isinstance(v, str):
        raise InputError(f"{where}.{key}", v, "must be a string or null")
    return v


def _opt_int(d: dict[str, Any], key: str, where: str) -> int | None:
    v = d.get(key)
    return None if v is None else check_int(f"{where}.{key}", v)


def _num(v: Any, field: str, *, positive: bool = False) -> float:
    """A finite JSON number (``"inf"`` is not one); InputError otherwise."""
    return check_number(field, v, positive=positive)


def _opt_num(d: dict[str, Any], key: str, where: str, *, positive: bool = False) -> float | None:
    v = d.get(key)
    return None if v is None else _num(v, f"{where}.{key}", positive=positive)


def _list(d: Any, key: str, where: str) -> list[Any]:
    v = _field(d, key, where)
    if not isinstance(v, list):
        raise InputError(f"{where}.{key}", v, "must be a JSON list")
    return v


def _strings(d: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    v = d.get(key, [])
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise InputError(f"{where}.{key}", v, "must be a list of strings")
    return tuple(v)


def _unique(field: str, ids: list[str]) -> None:
    seen: set[str] = set()
    repeated: set[str] = set()
    for i in ids:  # one pass: linear in the ids
        (repeated if i in seen else seen).add(i)
    dupes = sorted(repeated)
    if dupes:
        raise InputError(field, dupes, "ids must be unique")


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

    def __post_init__(self) -> None:
        check_int(f"pool {self.id}.capacity_bytes", self.capacity_bytes, maximum=MAX_BYTE_COUNT)
        check_int(f"pool {self.id}.free_bytes", self.free_bytes, maximum=MAX_BYTE_COUNT)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind.value,
            "capacity_bytes": self.capacity_bytes,
            "free_bytes": self.free_bytes,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryPool:
        """From JSON; InputError naming the field for a missing or ill-typed value."""
        pid = _str(d, "id", "pool")
        where = f"pool {pid}"
        return cls(
            id=pid,
            kind=check_choice(f"{where}.kind", _field(d, "kind", where), PoolKind),
            capacity_bytes=check_int(
                f"{where}.capacity_bytes",
                _field(d, "capacity_bytes", where),
                maximum=MAX_BYTE_COUNT,
            ),
            free_bytes=check_int(
                f"{where}.free_bytes", _field(d, "free_bytes", where), maximum=MAX_BYTE_COUNT
            ),
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
        """From JSON; InputError naming the field for a missing or ill-typed value."""
        cid = _str(d, "id", "circuit")
        where = f"circuit {cid}"
        bus = d.get("bus_gbps")
        fabric = d.get("fabric")
        if fabric is not None and not (
            isinstance(fabric, dict)
            and all(isinstance(v, str) or v is None for v in fabric.values())
        ):
            raise InputError(f"{where}.fabric", fabric, "must be an object of strings or null")
        return cls(
            id=cid,
            kind=check_choice(f"{where}.kind", _field(d, "kind", where), CircuitKind),
            name=_str(d, "name", where),
            pool=_str(d, "pool", where),
            uuid=_opt_str(d, "uuid", where),
            pcie_gen=_opt_int(d, "pcie_gen", where),
            pcie_width=_opt_int(d, "pcie_width", where),
            bus_gbps=None if bus is None else _num(bus, f"{where}.bus_gbps"),
            fabric=fabric,
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
    intra_link_gbps: float | None = None
    """GB/s per direction between two of its GPUs, probed (``nvidia-smi topo -m``); None: not
    probed (fewer than two GPUs, or no tool)."""
    intra_link_latency_us: float | None = None
    """One collective step between two of its GPUs, from the same probe."""
    intra_link_source: str | None = None
    """How the probe read them (the weakest GPU pair and its path)."""

    def __post_init__(self) -> None:
        if self.intra_link_gbps is not None:
            check_number("topology.intra_link_gbps", self.intra_link_gbps, positive=True)
        if self.intra_link_latency_us is not None:
            check_number("topology.intra_link_latency_us", self.intra_link_latency_us)
        _unique("topology.circuits", [c.id for c in self.circuits])
        _unique("topology.pools", [p.id for p in self.pools])
        pools = [p.id for p in self.pools]
        for c in self.circuits:
            if c.pool not in pools:
                raise InputError(
                    f"circuit {c.id}.pool", c.pool, f"must name a pool of the host {pools}"
                )

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
            **{
                key: value
                for key, value in (
                    ("intra_link_gbps", self.intra_link_gbps),
                    ("intra_link_latency_us", self.intra_link_latency_us),
                    ("intra_link_source", self.intra_link_source),
                )
                if value is not None
            },
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HostTopology:
        """From JSON; InputError naming the field for a missing, ill-typed or dangling value."""
        where = "topology"
        source = d.get("source", "none") if isinstance(d, dict) else None
        if not isinstance(source, str):
            raise InputError(f"{where}.source", source, "must be a string")
        return cls(
            hostname=_str(d, "hostname", where),
            circuits=tuple(Circuit.from_dict(c) for c in _list(d, "circuits", where)),
            pools=tuple(MemoryPool.from_dict(p) for p in _list(d, "pools", where)),
            driver_version=_opt_str(d, "driver_version", where),
            cpu_count=check_int(f"{where}.cpu_count", d.get("cpu_count", 1), minimum=1),
            link_mbps=_num(d.get("link_mbps", 0.0), f"{where}.link_mbps"),
            source=source,
            notes=_strings(d, "notes", where),
            intra_link_gbps=_opt_num(d, "intra_link_gbps", where, positive=True),
            intra_link_latency_us=_opt_num(d, "intra_link_latency_us", where),
            intra_link_source=_opt_str(d, "intra_link_source", where),
        )


def _gbps_to_json(v: float) -> float | None:
    """A rate as a JSON number; an unbounded one (in-pool: no transfer) as null."""
    return None if math.isinf(v) else v


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
    """Measured host→device GB/s (pinned copies); ``inf`` for an in-pool circuit (JSON: null)."""
    decode_gbps: float | None = None
    """GB/s of a decode-shaped run (f16 GEMVs of transformer-block shapes), net of the
    per-block cost; None when not measured (CPU, or no torch)."""
    decode_block_s: float | None = None
    """Fixed seconds per block of that run (kernel launches and sync), None when not measured."""

    def __post_init__(self) -> None:
        check_int(f"{self.circuit}.gemv_n", self.gemv_n, minimum=1, maximum=MAX_GEMV_N)
        if self.decode_gbps is not None:
            check_number(f"{self.circuit}.decode_gbps", self.decode_gbps, positive=True)
        if self.decode_block_s is not None:
            check_number(f"{self.circuit}.decode_block_s", self.decode_block_s)
        check_number(f"{self.circuit}.ms_per_gemv", self.ms_per_gemv, positive=True)
        up = self.upload_gbps
        if isinstance(up, bool) or not isinstance(up, int | float) or not up > 0:
            raise InputError(f"{self.circuit}.upload_gbps", up, "must be > 0 (inf when in-pool)")
        rate = self.compute_bytes_per_s
        if not rate <= MAX_BYTES_PER_S:
            raise InputError(
                f"{self.circuit}.ms_per_gemv",
                self.ms_per_gemv,
                f"gives {rate:.3g} bytes/s for gemv_n={self.gemv_n}; "
                f"a measured rate must be <= {MAX_BYTES_PER_S:.0e} bytes/s",
            )

    @property
    def compute_bytes_per_s(self) -> float:
        """Weight bytes this circuit streams through a GEMV per second."""
        seconds = self.ms_per_gemv / 1e3
        return 4.0 * self.gemv_n**2 / seconds if seconds > 0 else math.inf  # 5e-324 / 1e3 == 0

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
            **({} if self.decode_gbps is None else {"decode_gbps": self.decode_gbps}),
            **({} if self.decode_block_s is None else {"decode_block_s": self.decode_block_s}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CircuitCapability:
        """From JSON; InputError naming the field for a missing or ill-typed value."""
        cid = _str(d, "circuit", "matrix entry")
        where = f"matrix entry {cid}"
        up = _field(d, "upload_gbps", where)
        return cls(
            circuit=cid,
            backend=_str(d, "backend", where),
            gemv_n=check_int(f"{where}.gemv_n", _field(d, "gemv_n", where), minimum=1),
            ms_per_gemv=_num(
                _field(d, "ms_per_gemv", where), f"{where}.ms_per_gemv", positive=True
            ),
            ms_spread=_num(d.get("ms_spread", 0.0), f"{where}.ms_spread"),
            repeats=check_int(f"{where}.repeats", d.get("repeats", 1), minimum=1),
            upload_gbps=math.inf  # null: in pool; "inf": as passports before it wrote null
            if up is None or up == "inf"
            else _num(up, f"{where}.upload_gbps", positive=True),
            decode_gbps=d.get("decode_gbps"),
            decode_block_s=d.get("decode_block_s"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CapabilityMatrix:
    """Measured capability of every benchmarked circuit, best first (seed D30)."""

    entries: tuple[CircuitCapability, ...]
    quick: bool = False
    """Measured in quick mode (smaller matrices, fewer repeats)."""

    def __post_init__(self) -> None:
        _unique("matrix.entries", [e.circuit for e in self.entries])
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
        """From JSON; InputError naming the field for a missing or ill-typed value."""
        quick = d.get("quick", False) if isinstance(d, dict) else None
        if not isinstance(quick, bool):
            raise InputError("matrix.quick", quick, "must be true or false")
        return cls(
            entries=tuple(CircuitCapability.from_dict(e) for e in _list(d, "entries", "matrix")),
            quick=quick,
        )
