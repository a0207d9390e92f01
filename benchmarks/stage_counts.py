"""Plans on random single-GPU fleets against the best plan held to a single stage count.

python benchmarks/stage_counts.py --fleets 20 --nodes 64 --seed 1 --batch 16
python benchmarks/stage_counts.py --fleets 20 --nodes 64 --seed 1 --batch 16 --most-gb 48

Each fleet draws ``--nodes`` nodes of four GPU kinds (``_clusters.cluster``, LAN or WAN
links; with ``--most-gb``, only kinds of at most that memory, so that models take more
stages) and one of four models, and is planned for ``--batch`` concurrent sequences; the
same fleet is then planned held to every stage count from 1 to the most it allows
(``Constraints(min_stages=s, max_stages=s)``).  The searches plan a few stage counts
(the ladder 1–8, 12, 16, 24, …, and the counts the bounds point at); this shows how
often a count they left out holds a faster plan.  Printed: per fleet the plan's stage
count and tokens/s over the best held plan's (1.000: no count beat it), and the
share within 0.99 and 0.999.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _clusters import SPECS, cluster
from stowplan import Constraints, PlanError, plan
from stowplan.models import resolve_model

MODELS = ["llama3.1:8b", "llama3.1:70b-q4_0", "llama3.1:70b", "llama3.1:405b-q4_0"]


def tokens_per_s(model_name: str, nodes: list, c: Constraints) -> tuple[float, int] | None:
    try:
        got = plan(resolve_model(model_name), nodes, c)
    except PlanError:
        return None
    assert got.rationale.prediction is not None
    return got.rationale.prediction.tokens_per_s, got.num_stages


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fleets", type=int, default=20)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument(
        "--most-gb", type=float, default=None, help="draw only GPU kinds of at most this memory"
    )
    args = ap.parse_args()
    rng = random.Random(args.seed)
    ratios: list[float] = []
    print(
        "| fleet | model | links | plan: stages | tokens/s | best held: stages | tokens/s | ratio |"
    )
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for i in range(args.fleets):
        name = rng.choice(MODELS)
        wan = rng.random() < 0.5
        specs = [g for g in SPECS if args.most_gb is None or g.memory_gb <= args.most_gb]
        nodes = cluster(rng, args.nodes, wan=wan, specs=specs)
        got = tokens_per_s(name, nodes, Constraints(batch=args.batch))
        if got is None:
            continue
        best = (0.0, 0)
        most = min(args.nodes, resolve_model(name).num_blocks)
        for s in range(1, most + 1):
            held = tokens_per_s(
                name, nodes, Constraints(batch=args.batch, min_stages=s, max_stages=s)
            )
            if held is not None and held[0] > best[0]:
                best = held
        ratio = got[0] / best[0]
        ratios.append(ratio)
        print(
            f"| {i} | {name} | {'WAN' if wan else 'LAN'} | {got[1]} | {got[0]:.6g} | {best[1]} "
            f"| {best[0]:.6g} | {ratio:.4f} |",
            flush=True,
        )
    print(
        f"\n{len(ratios)} plans on {args.nodes} nodes, seed {args.seed}, batch {args.batch}: "
        f"min ratio {min(ratios):.4f}; within 0.99: {sum(r >= 0.99 for r in ratios)}; "
        f"within 0.999: {sum(r >= 0.999 for r in ratios)}; "
        f"at least the best held: {sum(r >= 1 - 1e-9 for r in ratios)}"
    )


if __name__ == "__main__":
    main()
