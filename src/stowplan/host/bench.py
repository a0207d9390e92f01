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
  topology but not measured, and a note says so. A circuit is matched to its
  torch device by UUID (``torch.cuda.get_device_properties(i).uuid``), so
  ``CUDA_VISIBLE_DEVICES`` reordering or hiding GPUs cannot swap figures; by
  index only when torch reports no UUIDs.
* CUDA GPUs also run a short decode-shaped pass (:func:`measure_cuda_decode`):
  the seven f16 GEMVs of a transformer block (q, k, v, o, gate, up, down) over
  a ring of blocks. Large blocks (a Llama-3-8B block) replayed as one CUDA
  graph give the streaming rate ``decode_gbps`` free of launch costs; tiny
  blocks launched kernel by kernel, as an eager runtime runs them, give the
  fixed cost per block ``decode_block_s`` (their time beyond their bytes at
  that rate).
* AMD GPUs and iGPUs are not measured.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from stowplan.circuits import (
    CapabilityMatrix,
    Circuit,
    CircuitCapability,
    CircuitKind,
    HostTopology,
)
from stowplan.errors import DependencyError, InputError

__all__ = [
    "DECODE_SHAPES",
    "BenchSettings",
    "Progress",
    "blas_threads",
    "cuda_indices",
    "decode_figures",
    "last_level_cache_bytes",
    "measure",
    "measure_cpu",
    "measure_cuda_decode",
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


DECODE_SHAPES: tuple[tuple[int, int, int], ...] = ((4096, 14336, 1024), (512, 1536, 128))
"""(hidden, ffn, kv_dim) of the decode run's blocks: a Llama-3-8B block (436 MB in f16) and a
tiny one (6 MB) whose time is mostly the fixed per-block cost."""


def _block_shapes(hidden: int, ffn: int, kv: int) -> list[tuple[int, int]]:
    """(out, in) of q, k, v, o, gate, up, down."""
    attention = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden)]
    return [*attention, (ffn, hidden), (ffn, hidden), (hidden, ffn)]


def decode_figures(large: tuple[float, float], small: tuple[float, float]) -> tuple[float, float]:
    """(bytes/s, seconds per block) from two (block bytes, seconds per block) timings.

    ``large``: big blocks replayed as one CUDA graph, so no launch cost — their
    rate is the streaming bandwidth. ``small``: tiny blocks launched one kernel
    at a time, as an eager runtime does — what their time exceeds their bytes
    at that bandwidth is the fixed cost per block (clamped at 0).
    """
    (b_large, t_large), (b_small, t_small) = large, small
    if not (b_large > 0 and t_large > 0 and b_small >= 0 and t_small >= 0):
        raise InputError("decode timings", (large, small), "need positive bytes and times")
    bytes_per_s = b_large / t_large
    return bytes_per_s, max(t_small - b_small / bytes_per_s, 0.0)


def _time_blocks(
    torch: Any,
    dev: Any,
    shape: tuple[int, int, int],
    ring: int,
    graph: bool,
    settings: BenchSettings,
) -> tuple[float, float]:
    """(block bytes, median seconds per block) of a pass over a ring of f16 blocks."""
    hidden, ffn, kv = shape
    shapes = _block_shapes(hidden, ffn, kv)
    block_bytes = 2 * sum(o * i for o, i in shapes)
    count = max(2, math.ceil(ring / block_bytes))
    blocks = [
        [torch.full(s, 1.0 / s[1], dtype=torch.float16, device=dev) for s in shapes]
        for _ in range(count)
    ]
    x0 = torch.ones(hidden, dtype=torch.float16, device=dev)

    def one_pass() -> Any:
        x = x0
        for wq, wk, wv, wo, wg, wu, wd in blocks:
            q, _k, _v = wq @ x, wk @ x, wv @ x
            h = wo @ q
            x = wd @ (torch.nn.functional.silu(wg @ h) * (wu @ h))
        return x

    run = one_pass
    if graph:
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            one_pass()
        torch.cuda.current_stream(dev).wait_stream(side)
        cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cuda_graph):
            one_pass()
        run = cuda_graph.replay
    times: list[float] = []
    for i in range(settings.warmup + settings.repeats):
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize(dev)
        if i >= settings.warmup:
            times.append((time.perf_counter() - t0) / count)
    return float(block_bytes), statistics.median(times)


def measure_cuda_decode(index: int, settings: BenchSettings) -> tuple[float, float]:
    """(decode GB/s, seconds per block) of CUDA device ``index``: see the module docstring."""
    try:
        import torch
    except ImportError:
        raise DependencyError("torch", "probe") from None
    dev = torch.device("cuda", index)
    large = _time_blocks(torch, dev, DECODE_SHAPES[0], settings.ring_bytes, True, settings)
    torch.cuda.empty_cache()
    small = _time_blocks(torch, dev, DECODE_SHAPES[1], settings.ring_bytes, False, settings)
    torch.cuda.empty_cache()
    bytes_per_s, per_block = decode_figures(large, small)
    return bytes_per_s / 1e9, per_block


def _uuid_key(uuid: str) -> str:
    return uuid.strip().lower().removeprefix("gpu-")


def cuda_indices(circuits: Sequence[Circuit], torch_uuids: Sequence[str | None]) -> dict[str, int]:
    """Torch CUDA device index of each NVIDIA circuit it can see.

    By UUID when torch reports them (``torch_uuids[i]`` of device ``i``; a circuit
    whose UUID torch does not list is not visible); else ``gpuN`` → device ``N``.
    """
    gpus = [c for c in circuits if c.kind is CircuitKind.DGPU and c.id.startswith("gpu")]
    known = {_uuid_key(u): i for i, u in enumerate(torch_uuids) if u}
    if known:
        return {
            c.id: known[_uuid_key(c.uuid)] for c in gpus if c.uuid and _uuid_key(c.uuid) in known
        }
    return {
        c.id: int(c.id.removeprefix("gpu"))
        for c in gpus
        if int(c.id.removeprefix("gpu")) < len(torch_uuids)
    }


def _torch_cuda_uuids() -> list[str | None]:
    """One entry per visible torch CUDA device: its UUID, or None when torch lacks it."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    out: list[str | None] = []
    for i in range(int(torch.cuda.device_count())):
        uuid = getattr(torch.cuda.get_device_properties(i), "uuid", None)
        out.append(str(uuid) if uuid is not None else None)
    return out


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
    uuids = _torch_cuda_uuids() if gpus else []
    index_of = cuda_indices(gpus, uuids)
    for c in gpus:
        if c.id not in index_of:
            why = "torch with CUDA is not installed" if not uuids else "torch does not see it"
            notes.append(f"{c.id} ({c.name}) not measured: {why}")
            continue
        entry = measure_cuda(index_of[c.id], c.id, settings, progress)
        try:
            gbps, per_block = measure_cuda_decode(index_of[c.id], settings)
        except InputError as exc:
            notes.append(f"{c.id} decode run gave no figures: {exc}")
        else:
            entry = replace(entry, decode_gbps=gbps, decode_block_s=per_block)
        entries.append(entry)
    for c in topology.circuits:
        if c.kind is CircuitKind.IGPU or c.id.startswith("amd"):
            notes.append(f"{c.id} ({c.name}) not measured: no backend for it")
    return CapabilityMatrix(entries=tuple(entries), quick=quick), tuple(notes)
