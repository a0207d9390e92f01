"""The reference stage worker: measured vs predicted TTFT and decode tokens/s on this host.

Describes this host's CPU as the node kind of a fleet (one BLAS thread per stage actor, as
``realise`` runs them: bandwidth from a timed copy, FLOPs from a timed matmul, both in one
thread), makes a random Llama checkpoint (``--params``), and for S = 1…4 stages (a local
Ray cluster of S such nodes on 127.0.0.1, the plan forced to S stages) runs U = 1, 4, 16
copies of a prompt as the plan's microbatches.  Prints measured, predicted and
measured / predicted for TTFT and decode tokens/s, medians of ``--rounds`` runs.

    .venv/bin/python benchmarks/runtime.py --params 20M --new-tokens 16 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def host_rates() -> tuple[float, float]:
    """(GB/s, TFLOPS) of one thread of this host: a 256 MB copy and a 1024² float32 matmul."""
    import torch

    torch.set_num_threads(1)
    a = torch.ones(64 << 20)  # 256 MB
    b = torch.empty_like(a)
    copies = []
    for _ in range(5):
        t0 = time.perf_counter()
        b.copy_(a)
        copies.append(time.perf_counter() - t0)
    bandwidth = 2 * a.numel() * 4 / min(copies) / 1e9  # read + write
    m = torch.randn(1024, 1024)
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        m @ m
        runs.append(time.perf_counter() - t0)
    return bandwidth, 2 * 1024**3 / min(runs) / 1e12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="20M")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stages", default="1,2,3,4")
    parser.add_argument("--batches", default="1,4,16")
    args = parser.parse_args()

    from stowplan.cluster.local import FakeNode, start_local_cluster
    from stowplan.cost import predict
    from stowplan.model import Constraints, NodeDescriptor
    from stowplan.runtime.make_checkpoint import SENTENCES
    from stowplan.runtime.make_checkpoint import main as make_main
    from stowplan.runtime.pipeline import realise_checkpoint, run_generation
    from stowplan.runtime.run import plan_checkpoint, predicted_ttft_s, tokenize

    bandwidth, tflops = host_rates()
    folder = Path(tempfile.mkdtemp(prefix="stowplan-bench-")) / "llama"
    make_main([str(folder), "--family", "llama", "--params", args.params])
    prompt = tokenize(folder, SENTENCES[0])
    print(
        f"host, one thread: {bandwidth:.1f} GB/s copy, {tflops * 1e3:.1f} GFLOPS matmul; "
        f"prompt {len(prompt)} tokens, {args.new_tokens} new"
    )
    stages = [int(s) for s in args.stages.split(",")]
    batches = [int(u) for u in args.batches.split(",")]
    print(
        "| S | U | TTFT measured ms | predicted ms | ratio | tok/s measured | predicted | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for s in stages:
        local = start_local_cluster(
            [FakeNode(gpu_name="host-cpu", vram_bytes=64 << 30, num_cpus=2) for _ in range(s)]
        )
        try:
            nodes = [
                NodeDescriptor(
                    id=local.node_id(h),
                    gpu_name="host-cpu",
                    vram_bytes=64 << 30,
                    mem_bandwidth_gbps=bandwidth,
                    flops_estimate=tflops,
                    link_mbps=10_000.0,
                    link_latency_ms=0.5,
                )
                for h in local.workers
            ]
            forced = Constraints(min_stages=s, max_stages=s)
            layout, plan = plan_checkpoint(
                folder,
                nodes,
                prompt_tokens=len(prompt),
                max_new_tokens=args.new_tokens,
                constraints=forced,
            )
            with realise_checkpoint(plan, folder, timeout_s=120) as realisation:
                run_generation(realisation.actors, [prompt], 2)  # warm-up
                for u in batches:
                    asked = replace(
                        forced,
                        batch=u,
                        context_tokens=len(prompt) + args.new_tokens,
                        tensor_parallel=1,
                    )
                    tps_pred = predict(layout, nodes, asked, plan).tokens_per_s
                    ttft_pred = predicted_ttft_s(layout, nodes, plan, len(prompt), u)
                    runs = [
                        run_generation(realisation.actors, [prompt] * u, args.new_tokens)
                        for _ in range(args.rounds)
                    ]
                    ttft = statistics.median(r.ttft_s for r in runs)
                    tps = statistics.median(r.decode_tokens_per_s for r in runs)
                    print(
                        f"| {s} | {u} | {ttft * 1e3:.1f} | {ttft_pred * 1e3:.2f} | "
                        f"{ttft / ttft_pred:.1f} | {tps:.1f} | {tps_pred:.1f} | "
                        f"{tps / tps_pred:.2f} |",
                        flush=True,
                    )
        finally:
            local.shutdown()


if __name__ == "__main__":
    main()
