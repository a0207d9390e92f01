"""H1 measurement: GEMV throughput and upload bandwidth of every circuit.

Each circuit runs f32 matrix-vector products (``gemv_n`` × ``gemv_n``) over a
ring of matrices of at least twice the last-level cache, so the figure
is the memory-bound rate at which weights stream through the circuit — what
decode does. After a warm-up pass, every repeat times one pass over the ring;
``ms_per_gemv`` is the median per GEMV and ``ms_spread`` the (max - min) /
median of the repeats.

* CPU: numpy, with the BLAS numpy links at ``BenchSettings.threads`` threads
  (None: the BLAS's own setting, normally every core). The thread count is
  part of the figure and is recorded in ``backend`` (for example
  ``numpy (openblas, 1 thread)``): a multi-threaded BLAS splits every GEMV
  across its threads and joins them at the end of the call, so on a host
  whose cores are busy with other work each call waits for its slowest
  thread. That wait is paid per call, not per byte — a decode of many small
  matrices pays it more often than this probe's few large ones — so a
  runtime reproduces the probe's rate only at the probe's thread count.
  :func:`blas_threads` applies the same limit to any code (the fidelity
  benchmark's decode uses it).
* CUDA GPUs: torch when it is installed (GEMV on the device; upload measured
  with pinned host→device copies). Without torch a dGPU is listed in the
  topology but not measured, and a note says so.
* AMD GPUs and iGPUs are not measured.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stowplan.errors import DependencyError, InputError
from stowplan.host.topology import CapabilityMatrix, CircuitCapability, CircuitKind, HostTopology

__all__ = [
    "BenchSettings",
    "Progress",
    "blas_threads",
    "last_level_cache_bytes",
    "measure",
    "measure_cpu",
    "settings_for",
]

Progress = Callable[[str, int, int], None]
"""``progress(label, done, total)``, called after every timed pass."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchSettings:
    """How hard the probe works."""

    gemv_n: int = 4096
    ring_bytes: int = 1 << 30
    """Total bytes of the matrices one pass reads on a CPU (raised to twice the last-level
    cache when that is larger)."""
    warmup: int = 1
    repeats: int = 15
    upload_bytes: int = 256 << 20
    quick: bool = False
    threads: int | None = None
    """BLAS threads for the CPU GEMVs; None leaves the BLAS's own setting (every core unless
    ``OPENBLAS_NUM_THREADS``/``OMP_NUM_THREADS`` say otherwise). Needs ``threadpoolctl``."""

    def __post_init__(self) -> None:
        if self.threads is not None and (
            isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1
        ):
            raise InputError("threads", self.threads, "must be an integer >= 1, or None")


def settings_for(quick: bool, threads: int | None = None) -> BenchSettings:
    """Quick: 256 MiB ring, 5 repeats (about a second on a CPU). Full: 1 GiB ring, 15 repeats."""
    if quick:
        return BenchSettings(
            ring_bytes=256 << 20, repeats=5, upload_bytes=64 << 20, quick=True, threads=threads
        )
    return BenchSettings(threads=threads)


def _blas_pools(info: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [i for i in info if i.get("user_api") == "blas"]


@contextlib.contextmanager
def blas_threads(threads: int | None) -> Iterator[str]:
    """Run the block with numpy's BLAS limited to ``threads`` (None: as it is).

    Yields the label recorded as a CPU circuit's ``backend``: ``numpy (openblas,
    2 threads)``, or plain ``numpy`` when ``threadpoolctl`` is missing and no limit
    was asked for. Import numpy first: only loaded BLAS libraries are seen.
    """
    try:
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError:
        if threads is not None:
            raise DependencyError("threadpoolctl", "probe") from None
        yield "numpy"
        return
    with threadpool_limits(limits=threads, user_api="blas"):
        pools = _blas_pools(threadpool_info())
        if not pools:
            yield "numpy"
            return
        n = int(pools[0]["num_threads"])
        yield f"numpy ({pools[0]['internal_api']}, {n} thread{'' if n == 1 else 's'})"


def last_level_cache_bytes() -> int:
    """Size of the largest CPU cache (Linux sysfs); 32 MiB when it cannot be read."""
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        if size and size[-1] in units and size[:-1].isdigit():
            best = max(best, int(size[:-1]) * units[size[-1]])
    return best or 32 << 20


def _summary(per_gemv_ms: list[float]) -> tuple[float, float]:
    med = statistics.median(per_gemv_ms)
    return med, (max(per_gemv_ms) - min(per_gemv_ms)) / med


def measure_cpu(
    settings: BenchSettings, progress: Progress | None = None, circuit: str = "cpu"
) -> CircuitCapability:
    """GEMV throughput of the CPU with numpy at ``settings.threads`` BLAS threads."""
    try:
        import numpy as np
    except ImportError:
        raise DependencyError("numpy", "probe") from None
    n = settings.gemv_n
    ring = max(settings.ring_bytes, 2 * last_level_cache_bytes())
    count = max(1, math.ceil(ring / (4 * n * n)))
    mats = [np.full((n, n), 1.0 / n, dtype=np.float32) for _ in range(count)]
    x = np.ones(n, dtype=np.float32)
    times: list[float] = []
    total = settings.warmup + settings.repeats
    with blas_threads(settings.threads) as backend:
        for i in range(total):
            t0 = time.perf_counter()
            for m in mats:
                x = m @ x
            dt = time.perf_counter() - t0
            if i >= settings.warmup:
                times.append(dt * 1e3 / count)
            if progress is not None:
                progress(circuit, i + 1, total)
    med, spread = _summary(times)
    return CircuitCapability(
        circuit=circuit,
        backend=backend,
        gemv_n=n,
        ms_per_gemv=med,
        ms_spread=spread,
        repeats=settings.repeats,
        upload_gbps=math.inf,
    )


def measure_cuda(
    index: int, circuit: str, settings: BenchSettings, progress: Progress | None = None
) -> CircuitCapability:
    """GEMV throughput and pinned upload bandwidth of CUDA device ``index`` with torch."""
    try:
        import torch
    except ImportError:
        raise DependencyError("torch", "probe") from None
    dev = torch.device("cuda", index)
    n = settings.gemv_n * 2
    count = max(1, math.ceil(settings.ring_bytes / (4 * n * n)))
    mats = [torch.full((n, n), 1.0 / n, dtype=torch.float32, device=dev) for _ in range(count)]
    x = torch.ones(n, dtype=torch.float32, device=dev)
    total = 2 * (settings.warmup + settings.repeats)
    times: list[float] = []
    for i in range(settings.warmup + settings.repeats):
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for m in mats:
            x = m @ x
        torch.cuda.synchronize(dev)
        if i >= settings.warmup:
            times.append((time.perf_counter() - t0) * 1e3 / count)
        if progress is not None:
            progress(circuit, i + 1, total)
    med, spread = _summary(times)
    host = torch.empty(settings.upload_bytes // 4, dtype=torch.float32).pin_memory()
    target = torch.empty_like(host, device=dev)
    rates: list[float] = []
    for i in range(settings.warmup + settings.repeats):
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        target.copy_(host, non_blocking=True)
        torch.cuda.synchronize(dev)
        if i >= settings.warmup:
            rates.append(settings.upload_bytes / (time.perf_counter() - t0) / 1e9)
        if progress is not None:
            progress(circuit, settings.warmup + settings.repeats + i + 1, total)
    del mats, host, target
    torch.cuda.empty_cache()
    return CircuitCapability(
        circuit=circuit,
        backend="torch-cuda",
        gemv_n=n,
        ms_per_gemv=med,
        ms_spread=spread,
        repeats=settings.repeats,
        upload_gbps=statistics.median(rates),
    )


def _torch_cuda_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def measure(
    topology: HostTopology,
    *,
    quick: bool = False,
    progress: Progress | None = None,
    threads: int | None = None,
) -> tuple[CapabilityMatrix, tuple[str, ...]]:
    """Measure every circuit this host can benchmark; return the matrix and notes.

    ``threads`` limits the CPU's BLAS (None: its own setting); see :class:`BenchSettings`.
    """
    settings = settings_for(quick, threads)
    entries = [measure_cpu(settings, progress)]
    notes: list[str] = []
    gpus = [c for c in topology.circuits if c.kind is CircuitKind.DGPU and c.id.startswith("gpu")]
    cuda = _torch_cuda_count() if gpus else 0
    for c in gpus:
        index = int(c.id.removeprefix("gpu"))
        if index < cuda:
            entries.append(measure_cuda(index, c.id, settings, progress))
        else:
            notes.append(f"{c.id} ({c.name}) not measured: torch with CUDA is not installed")
    for c in topology.circuits:
        if c.kind is CircuitKind.IGPU or c.id.startswith("amd"):
            notes.append(f"{c.id} ({c.name}) not measured: no backend for it")
    return CapabilityMatrix(entries=tuple(entries), quick=quick), tuple(notes)
