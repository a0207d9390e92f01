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

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _clusters import SPECS, cluster
from _outcomes import loaded, run
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
    a, b = loaded(a_path, b_path)
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
    run(cases, compare, seed=78, count=200)


if __name__ == "__main__":
    main()
