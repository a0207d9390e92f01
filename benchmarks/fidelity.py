"""Fidelity of the residency prediction: measured vs predicted seconds per token.

CPU: a synthetic memory-bound decode. f32 matrices shaped like a small
Llama's blocks (q, k, v, o, gate, up, down; hidden 2048, ffn 5632), each token
multiplying one activation vector through every matrix once, so every weight
byte is read once per token. The prediction is ``plan_employment(...)
.predicted_s_per_token`` from a quick CPU probe. Probe and decode run at the
same BLAS thread count, and every thread count (1 and all cores) is measured
in each round, round robin, so the configurations see the same load. Medians
are compared, and so are the fastest rounds (on a shared machine the fastest
round is the one least disturbed by other processes).

CUDA (when torch sees a GPU): the same blocks on the GPU. *Resident*: every
block in VRAM; predicted by the plan from the GPU's measured GEMV rate; run
eagerly (one Python-issued launch per kernel) and replayed as a CUDA graph.
*Streaming*: the GPU's pool is capped at half the model (KV reserve 0), so
the plan streams the other half from pinned host memory over the bus every
token; it is run with one copy per block, double-buffered on a copy stream,
and predicted by the plan's Streaming estimate (resident part + overflow
compute + overflow transfer, no overlap assumed). *HeterogeneousOverflow*:
the same half on the GPU, the other half as numpy matrices on the CPU (all
cores), predicted by the plan's estimate for it.

    .venv/bin/python benchmarks/fidelity.py [--rounds 7] [--blocks 4] [--tokens 3]
        [--gpu-blocks 16]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from stowplan.circuits import CapabilityMatrix, CircuitKind, HostTopology
from stowplan.host.bench import blas_threads, measure_cpu, measure_cuda, settings_for
from stowplan.host.discover import discover
from stowplan.planner.residency import ResidencyProtocol, plan_employment

HIDDEN = 2048
KV = 512
FFN = 5632
SHAPES = [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN)]
SHAPES += [(FFN, HIDDEN), (FFN, HIDDEN), (HIDDEN, FFN)]
BLOCK_ELEMS = sum(r * c for r, c in SHAPES)


def make_blocks(num_blocks: int) -> list[list[np.ndarray]]:
    return [[np.full(s, 1e-3, dtype=np.float32) for s in SHAPES] for _ in range(num_blocks)]


def decode_token(blocks: list[list[Any]], x: Any) -> Any:
    """One token through every block: 7 GEMVs per block, each weight read once (numpy or torch)."""
    for q, k, v, o, gate, up, down in blocks:
        _ = k @ x, v @ x
        x = o @ (q @ x)
        x = down @ ((gate @ x) * (up @ x))
        x = x / (abs(x).max() + 1.0)
    return x


def _row(label: str, predicted: list[float], measured: list[float]) -> str:
    p, m = statistics.median(predicted), statistics.median(measured)
    return (
        f"| {label} | {p * 1e3:.1f} | {m * 1e3:.1f} | {m / p:.2f} "
        f"| {min(predicted) * 1e3:.1f} | {min(measured) * 1e3:.1f} "
        f"| {min(measured) / min(predicted):.2f} |"
    )


HEADER = (
    "| configuration | predicted ms/token (median) | measured ms/token (median) "
    "| ratio (medians) | predicted (fastest) | measured (fastest) | ratio (fastest) |\n"
    "| --- | --- | --- | --- | --- | --- | --- |"
)


def cpu_topology(topo: HostTopology) -> HostTopology:
    """The host with its CPU alone, so the plan runs the model on the CPU."""
    return dataclasses.replace(
        topo, circuits=tuple(c for c in topo.circuits if c.kind is CircuitKind.CPU)
    )


def run_cpu(args: argparse.Namespace) -> None:
    topo = cpu_topology(discover())
    blocks = make_blocks(args.blocks)
    model_bytes = sum(m.nbytes for b in blocks for m in b)
    cores = len(os.sched_getaffinity(0))
    configs = sorted({1, cores})
    predicted: dict[int, list[float]] = {t: [] for t in configs}
    measured: dict[int, list[float]] = {t: [] for t in configs}
    labels: dict[int, str] = {}
    x = np.ones(HIDDEN, dtype=np.float32)
    for t in configs:
        with blas_threads(t):
            x = decode_token(blocks, x)  # warm-up
    for _ in range(args.rounds):
        for t in configs:
            cap = measure_cpu(settings_for(True, threads=t))
            labels[t] = cap.backend
            plan = plan_employment(topo, CapabilityMatrix(entries=(cap,), quick=True), model_bytes)
            assert plan.protocol is ResidencyProtocol.RESIDENT and plan.primary == "cpu"
            predicted[t].append(plan.predicted_s_per_token)
            times = []
            with blas_threads(t):
                for _ in range(args.tokens):
                    t0 = time.perf_counter()
                    x = decode_token(blocks, x)
                    times.append(time.perf_counter() - t0)
            measured[t].append(statistics.median(times))
    try:
        load = f"load average {os.getloadavg()[0]:.1f} at the end"
    except OSError:
        load = "load average unknown"
    print(
        f"CPU: {args.blocks} blocks, {model_bytes / 2**20:.0f} MiB f32, hidden {HIDDEN}; "
        f"{cores} cores, {load}"
    )
    print(
        f"rounds: {args.rounds}; each round, per thread count: quick probe (median of 5 passes) "
        f"then {args.tokens} decode tokens (median)"
    )
    print(HEADER)
    for t in configs:
        print(_row(f"CPU, {labels[t]}", predicted[t], measured[t]))


def run_cuda(args: argparse.Namespace) -> None:
    try:
        import torch
    except ImportError:
        print("CUDA: skipped (torch is not installed)")
        return
    if not torch.cuda.is_available():
        print("CUDA: skipped (torch sees no CUDA device)")
        return
    topo = discover()
    gpu = next((c for c in topo.circuits if c.id == "gpu0"), None)
    if gpu is None:
        print("CUDA: skipped (discovery found no gpu0 although torch sees a device)")
        return
    dev = torch.device("cuda", 0)
    elems = BLOCK_ELEMS * args.gpu_blocks
    model_bytes = 4 * elems
    resident_blocks = args.gpu_blocks // 2
    cap_bytes = 4 * BLOCK_ELEMS * resident_blocks

    def views(flat: Any) -> list[Any]:
        out, off = [], 0
        for r, c in SHAPES:
            out.append(flat[off : off + r * c].view(r, c))
            off += r * c
        return out

    flats = [
        torch.full((BLOCK_ELEMS,), 1e-3, dtype=torch.float32, device=dev)
        for _ in range(args.gpu_blocks)
    ]
    on_gpu = [views(f) for f in flats]
    host = [
        torch.full((BLOCK_ELEMS,), 1e-3, dtype=torch.float32).pin_memory()
        for _ in range(args.gpu_blocks - resident_blocks)
    ]
    slots = [torch.empty(BLOCK_ELEMS, dtype=torch.float32, device=dev) for _ in range(2)]
    slot_views = [views(s) for s in slots]
    copy_stream = torch.cuda.Stream(dev)
    compute = torch.cuda.current_stream(dev)

    def resident_token() -> float:
        x = torch.ones(HIDDEN, dtype=torch.float32, device=dev)
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        decode_token(on_gpu, x)
        torch.cuda.synchronize(dev)
        return time.perf_counter() - t0

    # The same token captured once as a CUDA graph: replay issues every kernel without
    # Python or per-launch overhead, as decode runtimes do.
    static_x = torch.ones(HIDDEN, dtype=torch.float32, device=dev)
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(2):
            decode_token(on_gpu, static_x)
    torch.cuda.current_stream(dev).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_token(on_gpu, static_x)

    def resident_graph_token() -> float:
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize(dev)
        return time.perf_counter() - t0

    # HeterogeneousOverflow: the second half of the blocks as numpy matrices on the CPU.
    cpu_blocks = make_blocks(args.gpu_blocks - resident_blocks)

    def overflow_token() -> float:
        x = torch.ones(HIDDEN, dtype=torch.float32, device=dev)
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        x = decode_token(on_gpu[:resident_blocks], x)
        decode_token(cpu_blocks, x.cpu().numpy())
        return time.perf_counter() - t0

    def streaming_token() -> float:
        x = torch.ones(HIDDEN, dtype=torch.float32, device=dev)
        ready = [torch.cuda.Event() for _ in range(2)]
        free = [torch.cuda.Event() for _ in range(2)]
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()

        def upload(i: int) -> None:
            s = i % 2
            with torch.cuda.stream(copy_stream):
                copy_stream.wait_event(free[s])
                slots[s].copy_(host[i], non_blocking=True)
                ready[s].record(copy_stream)

        for s in range(2):
            free[s].record(compute)
        upload(0)
        x = decode_token(on_gpu[:resident_blocks], x)
        for i in range(len(host)):
            if i + 1 < len(host):
                upload(i + 1)
            compute.wait_event(ready[i % 2])
            x = decode_token([slot_views[i % 2]], x)
            free[i % 2].record(compute)
        torch.cuda.synchronize(dev)
        return time.perf_counter() - t0

    settings = settings_for(True)
    capped = dataclasses.replace(
        topo,
        pools=tuple(
            dataclasses.replace(p, capacity_bytes=cap_bytes, free_bytes=cap_bytes)
            if p.id == gpu.pool
            else p
            for p in topo.pools
        ),
    )
    names = ("resident", "resident, CUDA graph", "streaming", "heterogeneous-overflow (CPU)")
    runs: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in names}
    protocol: dict[str, str] = {}
    for f in (resident_token, resident_graph_token, streaming_token, overflow_token):
        f()  # warm-up
    for _ in range(args.rounds):
        cap = measure_cuda(0, "gpu0", settings)
        cpu_cap = measure_cpu(settings)
        matrix = CapabilityMatrix(entries=(cap, cpu_cap), quick=True)
        resident = plan_employment(topo, matrix, model_bytes)
        assert resident.protocol is ResidencyProtocol.RESIDENT and resident.primary == "gpu0"
        capped_plan = plan_employment(capped, matrix, model_bytes, vram_headroom_frac=0.0)
        stream = next(e for e in capped_plan.estimates if e.protocol is ResidencyProtocol.STREAMING)
        hetero = next(
            e
            for e in capped_plan.estimates
            if e.protocol is ResidencyProtocol.HETEROGENEOUS_OVERFLOW and e.circuit == "cpu"
        )
        protocol["streaming"] = f"plan chose {capped_plan.protocol.value}"
        assert capped_plan.resident_bytes == cap_bytes
        plans: dict[str, tuple[float, Callable[[], float]]] = {
            "resident": (resident.predicted_s_per_token, resident_token),
            "resident, CUDA graph": (resident.predicted_s_per_token, resident_graph_token),
            "streaming": (cap_bytes / cap.compute_bytes_per_s + stream.total_s, streaming_token),
            "heterogeneous-overflow (CPU)": (
                cap_bytes / cap.compute_bytes_per_s + hetero.total_s,
                overflow_token,
            ),
        }
        for name, (pred, token) in plans.items():
            runs[name][0].append(pred)
            runs[name][1].append(statistics.median(token() for _ in range(args.tokens)))
        upload_gbps = cap.upload_gbps
    print()
    print(
        f"CUDA: {torch.cuda.get_device_name(dev)}, {args.gpu_blocks} blocks, "
        f"{model_bytes / 2**20:.0f} MiB f32; streaming: {resident_blocks} blocks resident, "
        f"{len(host)} streamed from pinned memory or run on the CPU ({protocol['streaming']}); "
        f"measured upload {upload_gbps:.1f} GB/s, GPU GEMV {cap.compute_bytes_per_s / 1e9:.0f} GB/s, "
        f"CPU GEMV {cpu_cap.compute_bytes_per_s / 1e9:.1f} GB/s ({cpu_cap.backend})"
    )
    print(HEADER)
    for name, (pred, meas) in runs.items():
        print(_row(f"GPU {name}", pred, meas))


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=3)
    ap.add_argument("--gpu-blocks", type=int, default=16)
    ap.add_argument("--skip-cpu", action="store_true")
    args = ap.parse_args()
    if not args.skip_cpu:
        run_cpu(args)
    run_cuda(args)


if __name__ == "__main__":
    main()
