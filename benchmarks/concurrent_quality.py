"""Plans of U concurrent sequences on 2-6 single-GPU nodes against the exact optimum.

python benchmarks/concurrent_quality.py --fleets 60 --seed 0

Each case draws 2-6 nodes of four GPU kinds (``_clusters.cluster``, LAN or WAN links),
a model and a number of concurrent sequences U from 2 to 256, and plans it with both
strategies (``throughput`` and ``latency``: both rank pipelines by the cycle) and with
``strategy="exact"``, whose plan on fleets this small is the least cycle over every
stage count (its certificate says so; a case whose exact certificate is not exact is
counted apart).  Printed: per strategy, the plan's tokens/s over the optimum's (1.000 =
optimal), how many cases fall below 0.99, and the certificates' gaps (every plan, and
the optimal plans); then each case below 0.99.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _clusters import cluster
from stowplan import Constraints, PlanError, Strategy, plan
from stowplan.models import resolve_model

MODELS = [
    "llama3.1:8b",
    "llama3.1:70b-q4_0",
    "llama3.1:405b-q4_0",
    "mixtral:8x7b-q4_0",
    "qwen3:30b-a3b",
]
SEQUENCES = [2, 4, 8, 16, 32, 62, 64, 128, 256]
STRATEGIES = [Strategy.THROUGHPUT, Strategy.LATENCY]


def _pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fleets", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    ratios: dict[Strategy, list[float]] = {s: [] for s in STRATEGIES}
    gaps: dict[Strategy, list[float]] = {s: [] for s in STRATEGIES}
    optimal_gaps: dict[Strategy, list[float]] = {s: [] for s in STRATEGIES}
    misses: list[str] = []
    not_exact = 0
    ms: list[float] = []
    for _ in range(args.fleets):
        n = rng.randint(2, 6)
        name = rng.choice(MODELS)
        u = rng.choice(SEQUENCES)
        nodes = cluster(rng, n, wan=rng.random() < 0.5)
        model = resolve_model(name)
        try:
            best = plan(model, nodes, Constraints(batch=u, strategy="exact"))
        except PlanError:
            continue
        cert = best.rationale.certificate
        assert cert is not None and best.rationale.prediction is not None
        if not cert.exact:
            not_exact += 1
            continue
        optimum = best.rationale.prediction.tokens_per_s
        for strategy in STRATEGIES:
            start = time.process_time()
            got = plan(model, nodes, Constraints(batch=u, strategy=strategy))
            ms.append((time.process_time() - start) * 1e3)
            pred, c = got.rationale.prediction, got.rationale.certificate
            assert pred is not None and c is not None
            ratio = pred.tokens_per_s / optimum
            ratios[strategy].append(ratio)
            gaps[strategy].append(c.gap)
            if ratio >= 1 - 1e-9:
                optimal_gaps[strategy].append(c.gap)
            if ratio < 0.99:
                fleet = ", ".join(
                    f"{x.gpu_name} ({x.link_mbps:.0f} Mbit/s, {x.link_latency_ms:.1f} ms)"
                    for x in nodes
                )
                misses.append(
                    f"{strategy.value}: {name}, U = {u}, {fleet}: {pred.tokens_per_s:.1f} vs "
                    f"{optimum:.1f} tokens/s ({ratio:.3f})"
                )
    print(
        f"{sum(len(r) for r in ratios.values()) // len(STRATEGIES)} cases of 2-6 nodes, "
        f"U 2-256, seed {args.seed}; {not_exact} without an exact optimum; "
        f"median CPU ms per plan {statistics.median(ms):.0f}"
    )
    print(
        "| strategy | plans / optimum: min | median | below 0.99 | gap: median | p90 | max "
        "| optimal plans with gap ≤ 1 % |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for s in STRATEGIES:
        r, g, og = ratios[s], gaps[s], optimal_gaps[s]
        print(
            f"| {s.value} | {min(r):.3f} | {statistics.median(r):.3f} | "
            f"{sum(x < 0.99 for x in r)}/{len(r)} | {_pct(g, 0.5):.2%} | {_pct(g, 0.9):.2%} | "
            f"{max(g):.2%} | {sum(x <= 0.01 for x in og)}/{len(og)} |"
        )
    for m in misses:
        print("below 0.99:", m)


if __name__ == "__main__":
    main()
