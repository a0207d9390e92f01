"""H0 discovery: which circuits and memory pools this host has.

Sources, in order:

* NVIDIA GPUs through NVML (``nvidia-ml-py``): name, UUID, memory, PCIe
  generation and width, and the NVLink fabric registration
  (``nvmlDeviceGetGpuFabricInfo``). When NVML cannot be loaded (no driver: the
  ``NVMLError_LibraryNotFound`` case) the host has no usable NVIDIA GPU; when
  it loads but a query fails, ``nvidia-smi -q -x`` is parsed instead. When
  NVML gives no fabric facts (older driver or bindings), the ``Fabric`` blocks
  of ``nvidia-smi -q`` are read with :func:`stowplan.host.fabric.parse_fabric`.
  Each NVIDIA circuit's ``fabric`` then holds ``state``, ``status``,
  ``clique_id``, ``cluster_uuid`` and, when it is in a real NVLink domain,
  ``domain``.
* The links between its NVIDIA GPUs through ``nvidia-smi topo -m`` when it has
  two or more (:func:`with_intra_link`): ``intra_link_gbps`` and
  ``intra_link_latency_us`` of the weakest pair, recorded as probed.
* CPU and RAM through ``psutil`` (``os`` when psutil is missing).
* AMD GPUs through ``rocm-smi`` when that tool is on PATH (best effort:
  listed with their VRAM, not benchmarked).
* Integrated GPUs through ``/sys/class/drm`` on Linux (best effort: an Intel
  or AMD display device without its own VRAM is listed as an iGPU in the
  system pool and not benchmarked).

No GPU gives a CPU-only topology, never an error.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from stowplan.circuits import (
    SYSTEM_POOL,
    Circuit,
    CircuitKind,
    HostTopology,
    MemoryPool,
    PoolKind,
)
from stowplan.errors import InputError
from stowplan.host.fabric import GpuFabric, parse_fabric
from stowplan.host.nvidia_smi import SmiReport, parse_nvidia_smi, parse_query_xml
from stowplan.host.nvidia_topo import ProbedIntraLink, parse_topo_matrix, probed_intra_link
from stowplan.host.rocm_smi import parse_rocm_smi

__all__ = ["discover", "fabric_facts", "probe_gpu_links", "topology_from_smi", "with_intra_link"]

_TOOL_TIMEOUT_S = 10.0


def _cpu_and_ram() -> tuple[int, int, int, float]:
    """(logical cpus, RAM bytes, available RAM bytes, fastest NIC Mbit/s)."""
    try:
        import psutil
    except ImportError:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return os.cpu_count() or 1, pages, pages, 0.0
    vm = psutil.virtual_memory()
    speeds = [s.speed for s in psutil.net_if_stats().values() if s.isup and s.speed > 0]
    return psutil.cpu_count() or 1, int(vm.total), int(vm.available), float(max(speeds, default=0))


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "cpu"


def _bus_key(bus_id: str) -> str:
    """``00000000:18:00.0`` and ``0000:18:00.0`` alike: ``0000:18:00.0`` (lower case)."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return bus_id.strip().lower()


def fabric_facts(fabric: GpuFabric) -> dict[str, str]:
    """A circuit's ``fabric`` dict: the reported fields that are present, plus ``domain``."""
    facts = {
        "state": fabric.state,
        "status": fabric.status,
        "clique_id": fabric.clique_id,
        "cluster_uuid": fabric.cluster_uuid,
        "domain": fabric.domain,
    }
    return {k: v for k, v in facts.items() if v is not None}


def _nvml_fabric(pynvml: Any, handle: Any, bus_id: str) -> GpuFabric | None:
    """The GPU's fabric registration through NVML; None when the driver or bindings lack it."""
    query = getattr(pynvml, "nvmlDeviceGetGpuFabricInfo", None)
    if query is None:
        return None
    try:
        info = query(handle)
        return GpuFabric.from_nvml(
            gpu=bus_id,
            state=int(info.state),
            status=int(info.status),
            clique_id=int(info.cliqueId),
            cluster_uuid=bytes(info.clusterUuid),
        )
    except (pynvml.NVMLError, AttributeError, TypeError, ValueError):
        return None


def _nvml() -> tuple[SmiReport | None, str, tuple[GpuFabric, ...]]:
    """GPUs through NVML: (report or None, note, fabrics). None, empty note: no NVIDIA GPU."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed; NVIDIA GPUs are read from nvidia-smi", ()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        # NVMLError_LibraryNotFound / DriverNotLoaded: no usable NVIDIA GPU on this host.
        return None, f"NVML unavailable ({type(exc).__name__}): no NVIDIA GPU", ()
    from stowplan.host.nvidia_smi import GpuRecord

    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        gpus = []
        fabrics = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            bus_id = str(pynvml.nvmlDeviceGetPciInfo(h).busId)
            fabric = _nvml_fabric(pynvml, h, bus_id)
            if fabric is not None:
                fabrics.append(fabric)

            def opt(fn: Any, handle: Any = h) -> int | None:
                try:
                    return int(fn(handle))
                except pynvml.NVMLError:
                    return None

            gpus.append(
                GpuRecord(
                    index=i,
                    name=str(pynvml.nvmlDeviceGetName(h)),
                    uuid=str(pynvml.nvmlDeviceGetUUID(h)),
                    bus_id=bus_id,
                    memory_total_mib=int(mem.total) // 2**20,
                    memory_free_mib=int(mem.free) // 2**20,
                    pcie_gen_max=opt(pynvml.nvmlDeviceGetMaxPcieLinkGeneration),
                    pcie_gen_current=opt(pynvml.nvmlDeviceGetCurrPcieLinkGeneration),
                    pcie_width_max=opt(pynvml.nvmlDeviceGetMaxPcieLinkWidth),
                    pcie_width_current=opt(pynvml.nvmlDeviceGetCurrPcieLinkWidth),
                )
            )
        report = SmiReport(format="nvml", driver_version=str(driver), gpus=tuple(gpus))
        return report, "", tuple(fabrics)
    except pynvml.NVMLError as exc:
        return None, f"NVML query failed ({exc}); falling back to nvidia-smi", ()
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _run(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=_TOOL_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _igpus() -> list[str]:
    """Names of integrated GPUs seen in /sys/class/drm (Linux, best effort)."""
    names = []
    vendors = {"0x8086": "Intel integrated GPU", "0x1002": "AMD integrated GPU"}
    for card in sorted(Path("/sys/class/drm").glob("card[0-9]")):
        try:
            vendor = (card / "device" / "vendor").read_text().strip()
            has_vram = (card / "device" / "mem_info_vram_total").exists()
            boot_vga = (card / "device" / "boot_vga").exists()
        except OSError:
            continue
        if vendor in vendors and not has_vram and boot_vga:
            names.append(vendors[vendor])
    return names


def topology_from_smi(
    report: SmiReport | None,
    *,
    hostname: str,
    cpu_name: str,
    cpu_count: int,
    ram_bytes: int,
    ram_free_bytes: int,
    link_mbps: float = 0.0,
    source: str = "fixture",
    extra_notes: tuple[str, ...] = (),
    fabrics: Sequence[GpuFabric] = (),
) -> HostTopology:
    """Build a topology from a parsed NVIDIA report plus the host's CPU and RAM.

    ``fabrics`` (from NVML or :func:`~stowplan.host.fabric.parse_fabric`) fill each
    GPU circuit's ``fabric``, matched by PCI bus id, else by position when the
    fabric records carry no bus id and there is one per GPU.
    """
    by_bus = {_bus_key(f.gpu): f for f in fabrics if ":" in f.gpu}
    gpu_list = report.gpus if report else ()
    by_position = dict(enumerate(fabrics)) if not by_bus and len(fabrics) == len(gpu_list) else {}
    circuits = [Circuit(id="cpu", kind=CircuitKind.CPU, name=cpu_name, pool=SYSTEM_POOL)]
    pools = [
        MemoryPool(
            id=SYSTEM_POOL,
            kind=PoolKind.SYSTEM,
            capacity_bytes=ram_bytes,
            free_bytes=ram_free_bytes,
        )
    ]
    notes = list(extra_notes)
    for position, g in enumerate(gpu_list):
        cid = f"gpu{g.index}"
        fabric = by_bus.get(_bus_key(g.bus_id)) if g.bus_id else None
        fabric = fabric or by_position.get(position)
        total = g.memory_total_bytes
        if total is None:
            notes.append(f"{cid} ({g.name}): memory total unknown; skipped")
            continue
        free = total if g.memory_free_mib is None else g.memory_free_mib * 2**20
        pools.append(
            MemoryPool(id=f"vram:{cid}", kind=PoolKind.VRAM, capacity_bytes=total, free_bytes=free)
        )
        circuits.append(
            Circuit(
                id=cid,
                kind=CircuitKind.DGPU,
                name=g.name,
                pool=f"vram:{cid}",
                uuid=g.uuid,
                pcie_gen=g.pcie_gen_max,
                pcie_width=g.pcie_width_max,
                bus_gbps=g.bus_gbps,
                fabric=fabric_facts(fabric) if fabric is not None else None,
            )
        )
    return HostTopology(
        hostname=hostname,
        circuits=tuple(circuits),
        pools=tuple(pools),
        driver_version=report.driver_version if report else None,
        cpu_count=cpu_count,
        link_mbps=link_mbps,
        source=source if report and report.gpus else "none",
        notes=tuple(notes),
    )


def probe_gpu_links(gpu_name: str = "") -> tuple[int, ProbedIntraLink] | None:
    """(GPUs in the matrix, the weakest pair's figures) from this host's ``nvidia-smi topo
    -m``; None without the tool, with fewer than two GPUs, or when its output is unreadable."""
    text = _run(["nvidia-smi", "topo", "-m"])
    if text is None:
        return None
    try:
        matrix = parse_topo_matrix(text)
    except InputError:
        return None
    link = probed_intra_link(matrix, gpu_name=gpu_name)
    return None if link is None else (matrix.num_gpus, link)


def with_intra_link(topology: HostTopology, topo_text: str | None) -> HostTopology:
    """``topology`` with the GPU-to-GPU figures read from ``nvidia-smi topo -m`` output.

    Unchanged when there is no output or fewer than two NVIDIA GPUs; a note (and
    no figures) when the output cannot be read or lists another number of GPUs.
    PCIe pairs take the GPUs' host link (their slowest ``bus_gbps``) when every
    GPU reported one.
    """
    gpus = [c for c in topology.circuits if c.kind is CircuitKind.DGPU and c.id.startswith("gpu")]
    if topo_text is None or len(gpus) < 2:
        return topology
    try:
        matrix = parse_topo_matrix(topo_text)
    except InputError as exc:
        return replace(topology, notes=(*topology.notes, f"GPU links not probed: {exc}"))
    if matrix.num_gpus != len(gpus):
        note = (
            f"GPU links not probed: nvidia-smi topo -m lists {matrix.num_gpus} GPUs, "
            f"discovery found {len(gpus)}"
        )
        return replace(topology, notes=(*topology.notes, note))
    buses = [c.bus_gbps for c in gpus if c.bus_gbps]
    link = probed_intra_link(
        matrix, gpu_name=gpus[0].name, pcie_gbps=min(buses) if len(buses) == len(gpus) else None
    )
    assert link is not None  # two or more GPUs
    return replace(
        topology,
        intra_link_gbps=link.gbps,
        intra_link_latency_us=link.latency_us,
        intra_link_source=link.source,
    )


def discover() -> HostTopology:
    """Discover this host's circuits and pools (cheap: no benchmark, no GPU memory touched)."""
    cpus, ram, ram_free, link = _cpu_and_ram()
    notes: list[str] = []
    report, note, fabrics = _nvml()
    source = "nvml"
    if note:
        notes.append(note)
    text: str | None = None  # ``nvidia-smi -q``, run at most once
    if report is None and "no NVIDIA GPU" not in note:
        xml = _run(["nvidia-smi", "-q", "-x"])
        if xml is not None:
            report, source = parse_query_xml(xml), "nvidia-smi"
            fabrics = parse_fabric(xml)
        else:
            text = _run(["nvidia-smi", "-q"])
            if text is not None:
                report, source = parse_nvidia_smi(text), "nvidia-smi"
                fabrics = parse_fabric(text)
    if report is not None and report.gpus and not fabrics and text is None:
        text = _run(["nvidia-smi", "-q"])
        fabrics = parse_fabric(text) if text is not None else ()
    topo = topology_from_smi(
        report,
        hostname=socket.gethostname(),
        cpu_name=_cpu_name(),
        cpu_count=cpus,
        ram_bytes=ram,
        ram_free_bytes=ram_free,
        link_mbps=link,
        source=source,
        extra_notes=tuple(notes),
        fabrics=fabrics,
    )
    if report is not None and len(report.gpus) > 1:
        topo = with_intra_link(topo, _run(["nvidia-smi", "topo", "-m"]))
    extra_circuits: list[Circuit] = []
    extra_pools: list[MemoryPool] = []
    rocm = _run(["rocm-smi", "--showproductname", "--showmeminfo", "vram", "--showuniqueid"])
    for a in parse_rocm_smi(rocm or ""):
        if a.memory_total_bytes is None:
            continue
        pid = f"vram:amd{a.index}"
        extra_pools.append(
            MemoryPool(
                id=pid,
                kind=PoolKind.VRAM,
                capacity_bytes=a.memory_total_bytes,
                free_bytes=a.memory_total_bytes - (a.memory_used_bytes or 0),
            )
        )
        extra_circuits.append(
            Circuit(id=f"amd{a.index}", kind=CircuitKind.DGPU, name=a.name, pool=pid)
        )
    for i, name in enumerate(_igpus()):
        extra_circuits.append(
            Circuit(id=f"igpu{i}", kind=CircuitKind.IGPU, name=name, pool=SYSTEM_POOL)
        )
    if not extra_circuits:
        return topo
    return replace(
        topo,
        circuits=topo.circuits + tuple(extra_circuits),
        pools=topo.pools + tuple(extra_pools),
        notes=(*topo.notes, "AMD GPUs and iGPUs are listed but not benchmarked"),
    )
