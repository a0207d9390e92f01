"""Builders shared by the host tests: fixture reports, synthetic hosts, capture sections."""

from __future__ import annotations

import math
import re
from pathlib import Path

from stowplan.circuits import (
    SYSTEM_POOL,
    CapabilityMatrix,
    Circuit,
    CircuitCapability,
    CircuitKind,
    HostTopology,
    MemoryPool,
    PoolKind,
)
from stowplan.host.discover import topology_from_smi
from stowplan.host.nvidia_smi import parse_nvidia_smi
from tests.common.paths import FIXTURES

SMI = FIXTURES / "nvidia-smi"
GIB = 2**30
N = 50_000
"""gemv_n of synthetic capabilities: 4 * N**2 = 1e10 bytes, so ms = 1e4 / GB/s."""


def capture_sections(path: Path) -> dict[str, str]:
    """The sections of one nvidia_gpu_exporter capture file, by title."""
    text = path.read_text(encoding="utf-8")
    parts = re.split(r"^#{80}\n# (.+?)\n(?:# \$.*\n)?#{80}\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def cap(circuit: str, gbps: float, upload_gbps: float = math.inf) -> CircuitCapability:
    """A synthetic capability streaming ``gbps`` GB/s through its GEMV."""
    return CircuitCapability(
        circuit=circuit,
        backend="synthetic",
        gemv_n=N,
        ms_per_gemv=1e4 / gbps,
        upload_gbps=upload_gbps,
    )


def host(
    *,
    vram: int | None = None,
    ram: int = 64 * GIB,
    igpu: bool = False,
) -> HostTopology:
    """A host with a CPU, optionally one dGPU of ``vram`` bytes and an iGPU."""
    circuits = [Circuit(id="cpu", kind=CircuitKind.CPU, name="cpu", pool=SYSTEM_POOL)]
    pools = [MemoryPool(id=SYSTEM_POOL, kind=PoolKind.SYSTEM, capacity_bytes=ram, free_bytes=ram)]
    if vram is not None:
        circuits.append(
            Circuit(id="gpu0", kind=CircuitKind.DGPU, name="dgpu", pool="vram:gpu0", uuid="GPU-a")
        )
        pools.append(
            MemoryPool(id="vram:gpu0", kind=PoolKind.VRAM, capacity_bytes=vram, free_bytes=vram)
        )
    if igpu:
        circuits.append(Circuit(id="igpu0", kind=CircuitKind.IGPU, name="igpu", pool=SYSTEM_POOL))
    return HostTopology(hostname="synthetic", circuits=tuple(circuits), pools=tuple(pools))


def matrix(*entries: CircuitCapability) -> CapabilityMatrix:
    return CapabilityMatrix(entries=entries)


def fixture_topology(relpath: str, ram: int = 256 * GIB) -> HostTopology:
    """The topology of a fixture machine (its GPUs, plus a CPU with ``ram`` bytes)."""
    report = parse_nvidia_smi((SMI / relpath).read_text(encoding="utf-8"))
    return topology_from_smi(
        report,
        hostname=Path(relpath).stem,
        cpu_name="cpu",
        cpu_count=32,
        ram_bytes=ram,
        ram_free_bytes=ram,
    )
