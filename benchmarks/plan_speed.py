"""plan() wall time by cluster size and model, medians; the exact certificate separately.

python benchmarks/plan_speed.py --sizes 8 64 256 1024 --repeats 5

Models: llama3.1:8b (32 blocks), llama3.1:70b (80), llama3.1:405b-q4_0 (126).  Cluster
r of size n is seeded by (n, r), so every model and objective (and every version of
the planner) sees the same clusters; one too small for a model is redrawn.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _clusters import cluster
from stowplan import Constraints, PlanError, lookup, plan
from stowplan.cost import CostModel
from stowplan.planner.exact.pipelines import solve_exact
from stowplan.planner.problem import prepare


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[8, 64, 256, 1024])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--exact-up-to", type=int, default=32)
    ap.add_argument(
        "--models", nargs="+", default=["llama3.1:8b", "llama3.1:70b", "llama3.1:405b-q4_0"]
    )
    args = ap.parse_args()
    print("| nodes | model (blocks) | objective | plan() median ms | exact certificate ms |")
    print("|---|---|---|---|---|")
    for n in args.sizes:
        for name in args.models:
            model = lookup(name)
            assert model is not None
            for objective, batch in (("latency", 1), ("throughput", 16)):
                c = Constraints(batch=batch)
                times, exact_ms = [], "-"
                for r in range(args.repeats):
                    for attempt in itertools.count():  # redraw clusters too small for the model
                        rng = random.Random(f"{n}-{r}-{attempt}")
                        nodes = cluster(rng, n, wan=r % 2 == 1)
                        t0 = time.perf_counter()
                        try:
                            plan(model, nodes, c)
                        except PlanError:
                            continue
                        times.append((time.perf_counter() - t0) * 1e3)
                        break
                if n <= args.exact_up_to:
                    t0 = time.perf_counter()
                    solve_exact(
                        prepare(model, nodes, c),
                        CostModel(model, nodes, c),
                        objective,
                        time_limit_s=60,
                    )
                    exact_ms = f"{(time.perf_counter() - t0) * 1e3:.0f}"
                print(
                    f"| {n} | {name} ({model.num_blocks}) | {objective} | "
                    f"{statistics.median(times):.1f} | {exact_ms} |"
                )


if __name__ == "__main__":
    main()
