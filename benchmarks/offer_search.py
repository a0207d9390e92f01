"""Cheapest-set search (``plan --target``) over synthetic vast.ai-style offers: time by target.

python benchmarks/offer_search.py --offers 100 --seeds 5
python benchmarks/offer_search.py --model llama3.1:70b --offers 100 --seeds 5 --consumer

Each seed draws ``--offers`` offers (consumer and datacenter GPUs, 1-8 GPUs per
offer, 100-1000 Mbit/s uplinks, no hop latency: vast.ai's offer JSON carries
none), plans the fastest pipeline on all of them (its served rate R) and then
searches the cheapest node set at targets from 5 % to 99 % of R.  Times are
wall-clock seconds of ``plan()`` with scipy already imported; the table gives
the median and the largest over the seeds, and the most node sets planned.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import scipy.optimize  # noqa: F401  (imported once, outside the timings)

from stowplan import Constraints, NodeDescriptor, Objective, PlanError, plan
from stowplan.models import resolve_model

# (GPU, MiB per GPU, $/hour per GPU around which offers are drawn)
GPUS = [
    ("RTX 3090", 24576, 0.20),
    ("RTX 4090", 24564, 0.35),
    ("RTX 5090", 32607, 0.65),
    ("RTX 4080", 16376, 0.18),
    ("L40S", 46068, 0.85),
    ("A100 80GB PCIe", 81920, 1.10),
    ("H100 SXM5", 81559, 2.20),
]
GPU_COUNTS = [1] * 12 + [2] * 4 + [4] * 3 + [8]
FRACTIONS = [0.05, 0.25, 0.5, 0.75, 0.9, 0.99]


def offers(count: int, seed: int, *, consumer: bool = False) -> list[NodeDescriptor]:
    """``count`` offers drawn from ``seed``: GPU kind, GPU count, price and uplink.

    ``consumer``: one RTX card per offer (large models then need many offers).
    """
    rng = random.Random(seed)
    kinds = [g for g in GPUS if g[0].startswith("RTX")] if consumer else GPUS
    out = []
    for i in range(count):
        gpu, mib, price = rng.choice(kinds)
        g = 1 if consumer else rng.choice(GPU_COUNTS)
        out.append(
            NodeDescriptor(
                id=f"offer-{i:03d}",
                gpu_name=gpu,
                vram_bytes=mib * 2**20 * g,
                num_gpus=g,
                flops_estimate=0.0,
                link_mbps=rng.uniform(100, 1000),
                price_per_hour=round(price * g * rng.uniform(0.8, 1.2), 3),
            )
        )
    return out


def served(p: object) -> float:
    pred = p.rationale.prediction  # type: ignore[attr-defined]
    return 1.0 / pred.time_per_token_s if pred.batch == 1 else pred.tokens_per_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama3.1:70b-q4_0")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--offers", type=int, default=100)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--consumer", action="store_true", help="one RTX card per offer")
    args = ap.parse_args()
    model = resolve_model(args.model, dtype=args.dtype) if args.dtype else resolve_model(args.model)
    times: dict[float, list[float]] = {f: [] for f in FRACTIONS}
    planned: dict[float, list[int]] = {f: [] for f in FRACTIONS}
    refused = dict.fromkeys(FRACTIONS, 0)
    reach = []
    for seed in range(args.seeds):
        nodes = offers(args.offers, seed, consumer=args.consumer)
        rate = served(plan(model, nodes, Constraints(batch=args.batch)))
        reach.append(rate)
        for f in FRACTIONS:
            c = Constraints(
                batch=args.batch, objective=Objective.COST, target_tokens_per_s=rate * f
            )
            t0 = time.perf_counter()
            try:
                p = plan(model, nodes, c)
            except PlanError:  # every target here is reachable: a refusal is a miss
                times[f].append(time.perf_counter() - t0)
                refused[f] += 1
                continue
            times[f].append(time.perf_counter() - t0)
            note = p.rationale.notes[0]
            planned[f].append(int(note.rsplit("(", 1)[1].split(", ")[-1].split(" ")[0]))
    print(
        f"{args.model}{'@' + args.dtype if args.dtype else ''}, {args.offers} "
        f"{'consumer ' if args.consumer else ''}offers, "
        f"batch {args.batch}, {args.seeds} seeds; fastest plan on all offers: "
        f"{statistics.median(reach):.1f} tokens/s (median)"
    )
    print("| target (share of fastest) | median s | max s | most sets planned | refused |")
    print("|---|---|---|---|---|")
    for f in FRACTIONS:
        most = max(planned[f]) if planned[f] else "-"
        print(
            f"| {f:.0%} | {statistics.median(times[f]):.2f} | {max(times[f]):.2f} "
            f"| {most} | {refused[f]} |"
        )


if __name__ == "__main__":
    main()
