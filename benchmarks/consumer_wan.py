"""Consumer GPU offers over WAN serving one user: best plan, and cheapest at 20 tokens/s.

python benchmarks/consumer_wan.py --offers 24 --seed 0
"""

from __future__ import annotations

import argparse
import random

from stowplan import Constraints, Infeasible, NodeDescriptor, Objective, lookup, plan
from stowplan.planner.cheapest import served_rate

OFFERS = [("RTX 3090", 24576, 0.20), ("RTX 4090", 24564, 0.35), ("RTX 5090", 32607, 0.65)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--offers", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", type=float, default=20.0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    nodes = []
    for i in range(args.offers):
        gpu, mib, price = rng.choice(OFFERS)
        nodes.append(
            NodeDescriptor(
                id=f"offer-{i:02d}",
                gpu_name=gpu,
                vram_bytes=mib * 2**20,
                flops_estimate=0.0,
                link_mbps=rng.uniform(100, 1000),
                link_latency_ms=rng.uniform(10, 60),
                price_per_hour=round(price * rng.uniform(0.8, 1.2), 3),
            )
        )
    print(f"{args.offers} offers (RTX 3090/4090/5090), 100-1000 Mbit/s, 10-60 ms, one user")
    for name in ("llama3.1:70b-q4_0", "llama3.1:405b-q4_0"):
        model = lookup(name)
        assert model is not None
        best = plan(model, nodes)
        pred = best.rationale.prediction
        assert pred is not None
        print(
            f"{name}: best plan {best.num_stages} stages, {served_rate(best):.2f} tokens/s, "
            f"${pred.cost_per_hour:.2f}/h, ${pred.usd_per_million_tokens:.2f}/M tokens"
        )
        try:
            cheap = plan(
                model, nodes, Constraints(objective=Objective.COST, target_tokens_per_s=args.target)
            )
            cp = cheap.rationale.prediction
            assert cp is not None
            print(
                f"  cheapest at {args.target:g} tokens/s: {cheap.num_stages} stages, "
                f"{served_rate(cheap):.2f} tokens/s, ${cp.cost_per_hour:.2f}/h"
            )
        except Infeasible as exc:
            print(f"  none reaches {args.target:g} tokens/s: {exc.reason}")


if __name__ == "__main__":
    main()
