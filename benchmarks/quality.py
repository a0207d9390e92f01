"""Plan quality: ours / optimum and each peer rule / optimum, both objectives.

python benchmarks/quality.py --clusters 200 --max-nodes 8
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _clusters import cluster
from stowplan import Constraints, PlanError, lookup, plan
from stowplan.baselines import BASELINES
from stowplan.cost import CostModel
from stowplan.planner.common import prepare
from stowplan.planner.exact import solve_exact

MODELS = ["llama3.1:8b", "llama3.1:70b", "llama3.1:70b-q4_0", "llama3.1:405b-q4_0"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clusters", type=int, default=200)
    ap.add_argument("--max-nodes", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    ratios: dict[tuple[str, str], list[float]] = {}
    done = 0
    while done < args.clusters:
        model = lookup(rng.choice(MODELS))
        assert model is not None
        nodes = cluster(rng, rng.randint(2, args.max_nodes), wan=rng.random() < 0.5)
        for objective, batch in (("latency", 1), ("throughput", 16)):
            c = Constraints(batch=batch)
            try:
                problem = prepare(model, nodes, c)
                ours = plan(model, nodes, c)
            except PlanError:
                break
            cm = CostModel(model, nodes, c)
            opt = solve_exact(problem, cm, objective).value
            pred = ours.rationale.prediction
            assert pred is not None
            mine = pred.time_per_token_s if objective == "latency" else pred.tokens_per_s
            best = opt if objective == "latency" else batch / opt
            ratio = (best / mine) if objective == "latency" else (mine / best)
            ratios.setdefault((objective, "stowplan"), []).append(ratio)
            for name, rule in BASELINES.items():
                p = rule(problem, cm)
                if p is None:
                    r = 0.0
                else:
                    ev = cm.evaluate(*p)
                    r = (
                        best / ev.time_per_token_s
                        if objective == "latency"
                        else (ev.tokens_per_s / best)
                    )
                ratios.setdefault((objective, name), []).append(r)
        else:
            done += 1
    print(f"{done} clusters, 2-{args.max_nodes} nodes, models {', '.join(MODELS)}")
    print("| objective | planner | median / optimum | p10 / optimum | does not fit |")
    print("|---|---|---|---|---|")
    for (objective, name), rs in sorted(ratios.items()):
        p10 = statistics.quantiles(rs, n=10)[0]
        miss = sum(r == 0 for r in rs) / len(rs)
        print(f"| {objective} | {name} | {statistics.median(rs):.3f} | {p10:.3f} | {miss:.0%} |")


if __name__ == "__main__":
    main()
