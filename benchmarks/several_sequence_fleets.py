"""Plans of several sequences on random single-GPU fleets of 8–64 nodes, for comparing
two checkouts: tokens/s, the certificate's gap and CPU time of every plan.

PYTHONPATH=<checkout A>/src python benchmarks/several_sequence_fleets.py --seed 1 --out a.json
PYTHONPATH=<checkout B>/src python benchmarks/several_sequence_fleets.py --seed 1 --out b.json
python benchmarks/several_sequence_fleets.py --compare a.json b.json

Each case draws 8, 9, 10, 12, 16, 24, 32 or 64 nodes in turn (``_clusters.cluster``, LAN
or WAN links), one of four Llama models and 2 to 256 concurrent sequences, and plans it
with the defaults (CPU time of one ``plan()`` after a warm-up plan of another fleet).
``--compare`` counts the plans faster and slower (printing the slower), the gaps above
1 % and the largest, and per fleet size the median CPU ms and the largest gap, as a
markdown table.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _clusters import cluster
from _outcomes import loaded, run
from stowplan import Constraints, PlanError, plan
from stowplan.models import resolve_model

MODELS = ["llama3.1:8b", "llama3.1:70b-q4_0", "llama3.1:70b", "llama3.1:405b-q4_0"]
SIZES = [8, 9, 10, 12, 16, 24, 32, 64]
SEQUENCES = [2, 3, 4, 8, 16, 32, 64, 128, 256]


def cases(seed: int, count: int) -> list[dict[str, object]]:
    """Per case: its draw and outcome (tokens/s, gap and CPU seconds, or the refusal)."""
    rng = random.Random(seed)
    plan(
        resolve_model("llama3.1:8b"), cluster(random.Random(0), 8, wan=False), Constraints(batch=4)
    )
    out: list[dict[str, object]] = []
    for i in range(count):
        n = SIZES[i % len(SIZES)]
        name = rng.choice(MODELS)
        nodes = cluster(rng, n, wan=rng.random() < 0.5)
        u = rng.choice(SEQUENCES)
        row: dict[str, object] = {"case": i, "nodes": n, "model": name, "sequences": u}
        try:
            start = time.process_time()
            got = plan(resolve_model(name), nodes, Constraints(batch=u))
            cpu = time.process_time() - start
        except PlanError as e:
            out.append({**row, "refused": type(e).__name__})
            continue
        cert, pred = got.rationale.certificate, got.rationale.prediction
        assert cert is not None and pred is not None
        out.append({**row, "tokens_per_s": pred.tokens_per_s, "gap": cert.gap, "cpu_s": cpu})
    return out


def compare(a_path: str, b_path: str) -> None:
    a, b = loaded(a_path, b_path)
    faster: list[float] = []
    slower = 0
    sizes: dict[int, list[list[float]]] = {}
    gaps: tuple[list[float], list[float]] = ([], [])
    for x, y in zip(a, b, strict=True):
        if "refused" in x or "refused" in y:
            if x.get("refused") != y.get("refused"):
                print("outcome", x, "->", y)
            continue
        ratio = y["tokens_per_s"] / x["tokens_per_s"]
        if ratio > 1 + 1e-9:
            faster.append(ratio - 1)
        elif ratio < 1 - 1e-9:
            slower += 1
            print("slower", x, "->", y)
        gaps[0].append(x["gap"])
        gaps[1].append(y["gap"])
        got = sizes.setdefault(x["nodes"], [[], [], [], []])
        for column, value in zip(got, (x["cpu_s"], y["cpu_s"], x["gap"], y["gap"]), strict=True):
            column.append(value)
    best = f" (up to +{max(faster):.2%})" if faster else ""
    print(f"{len(gaps[0])} plans: {len(faster)} faster{best}, {slower} slower")
    above = [sum(g > 0.01 for g in side) for side in gaps]
    print(
        f"gaps above 1 %: {above[0]} -> {above[1]}; largest "
        f"{max(gaps[0]):.2%} -> {max(gaps[1]):.2%}"
    )
    print("| nodes | median CPU ms | gaps above 1 % | largest gap |")
    print("| ---: | ---: | ---: | ---: |")
    for n in sorted(sizes):
        ca, cb, ga, gb = sizes[n]
        print(
            f"| {n} | {statistics.median(ca) * 1e3:.1f} → {statistics.median(cb) * 1e3:.1f} "
            f"| {sum(g > 0.01 for g in ga)} → {sum(g > 0.01 for g in gb)} of {len(ga)} "
            f"| {max(ga):.2%} → {max(gb):.2%} |"
        )


def main() -> None:
    run(cases, compare, seed=1, count=160)


if __name__ == "__main__":
    main()
