"""Plans of random requests on random single-GPU fleets, for comparing two checkouts.

PYTHONPATH=<checkout A>/src python benchmarks/random_constraints.py --seed 78 --cases 200 --out a.json
PYTHONPATH=<checkout B>/src python benchmarks/random_constraints.py --seed 78 --cases 200 --out b.json
python benchmarks/random_constraints.py --compare a.json b.json

Each case draws 4–40 nodes (``_clusters.cluster``, LAN or WAN links, GPU kinds of at
most 24, 48 or 200 GB), one of five models, U from 2 to 256 concurrent sequences, stage
limits (none, at least 2 or 5, at most 6 or 12) and a strategy (the default, throughput
or latency), and writes the plan's tokens/s and stage count (or the refusal's kind).
``--compare`` prints every case whose outcome differs and counts the faster, slower
and equal ones (the same draws: the same ``--seed`` and ``--cases``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _clusters import SPECS, cluster
from stowplan import Constraints, PlanError, plan
from stowplan.models import resolve_model

MODELS = [
    "llama3.1:8b",
    "llama3.1:70b-q4_0",
    "llama3.1:70b",
    "llama3.1:405b-q4_0",
    "mixtral:8x7b-q4_0",
]


def cases(seed: int, count: int) -> list[list[object]]:
    """Per case: its draw and outcome (tokens/s and stages, or the refusal's kind)."""
    rng = random.Random(seed)
    out: list[list[object]] = []
    for i in range(count):
        n = rng.choice([4, 8, 12, 20, 40])
        specs = [g for g in SPECS if g.memory_gb <= rng.choice([24, 48, 200])]
        nodes = cluster(rng, n, wan=rng.random() < 0.3, specs=specs)
        name = rng.choice(MODELS)
        u = rng.choice([2, 3, 7, 16, 33, 64, 256])
        lo, hi = rng.choice([None, None, 2, 5]), rng.choice([None, None, 6, 12])
        if lo and hi and lo > hi:
            lo, hi = hi, lo
        strategy = rng.choice([None, "throughput", "latency"])
        draw: list[object] = [i, name, n, u, lo, hi, strategy]
        try:
            c = Constraints(batch=u, min_stages=lo, max_stages=hi)
            if strategy is not None:
                c = Constraints(batch=u, min_stages=lo, max_stages=hi, strategy=strategy)
            got = plan(resolve_model(name), nodes, c)
        except PlanError as e:
            out.append([*draw, type(e).__name__, None])
            continue
        assert got.rationale.prediction is not None
        out.append([*draw, got.rationale.prediction.tokens_per_s, got.num_stages])
    return out


def compare(a_path: str, b_path: str) -> None:
    a, b = json.loads(Path(a_path).read_text()), json.loads(Path(b_path).read_text())
    if len(a) != len(b):
        raise SystemExit("the two files hold different draws (--seed and --cases)")
    faster = slower = same = 0
    for x, y in zip(a, b, strict=True):
        if x[7] == y[7]:
            same += 1
        elif isinstance(x[7], str) or isinstance(y[7], str):
            print("outcome", x, "->", y)
        elif y[7] < x[7] * (1 - 1e-9):
            slower += 1
            print("slower", x[1:7], f"{x[7]:.6g} -> {y[7]:.6g} tokens/s", x[8], "->", y[8])
        else:
            faster += 1
            print("faster", x[1:7], f"{x[7]:.6g} -> {y[7]:.6g} tokens/s", x[8], "->", y[8])
    print(f"{len(a)} cases: {faster} faster, {slower} slower, {same} the same")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=78)
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--out", help="write the outcomes here (JSON)")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two outputs")
    args = ap.parse_args()
    if args.compare:
        compare(*args.compare)
        return
    if not args.out:
        raise SystemExit("--out FILE or --compare A B")
    Path(args.out).write_text(json.dumps(cases(args.seed, args.cases)))


if __name__ == "__main__":
    main()
