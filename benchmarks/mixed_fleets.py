"""Certificates on random fleets of 3–24 nodes of 1–8 GPUs each, every objective.

python benchmarks/mixed_fleets.py --fleets 24 --seed 11
python benchmarks/mixed_fleets.py --fleets 24 --seed 11 --out a.json   # then, elsewhere:
python benchmarks/mixed_fleets.py --compare a.json b.json
python benchmarks/mixed_fleets.py --seed 11 --engine generic --context 8192  # as the CLI plans

Each fleet draws 3, 5, 8, 12, 16 or 24 nodes of four GPU kinds (``_clusters.cluster``:
LAN links, or WAN links for three fleets in ten), each node of 1, 2, 4 or 8 GPUs, and
one of eight models (dense and MoE), planned at one stream, 16 and 64 sequences.
Printed: the certificates' gaps (median, p90, max, how many above 1 %) and the CPU
time per plan, the cases above 1 % listed.  ``--out`` keeps each case's tokens/s, gap
and CPU ms; ``--compare`` lists the cases whose plan or gap differ between two runs.
``--engine NAME`` plans with that engine's calibration and ``--context N`` reserves each
sequence's KV for N tokens, as ``stowplan plan`` does by default (``generic``, 8,192).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _clusters import cluster
from stowplan import Constraints, PlanError, plan
from stowplan.calibration import resolve_calibration
from stowplan.models import resolve_model

MODELS = [
    "llama3.1:8b", "llama3.1:70b", "llama3.1:405b-q4_0", "qwen3:32b", "mixtral:8x7b",
    "qwen3:30b-a3b", "gpt-oss:120b", "llama3.1:405b",
]  # fmt: skip
SIZES = [3, 5, 8, 12, 16, 24]
BATCHES = [1, 16, 64]

Case = tuple[int, int, str, int, float | None, float, float]
"""Fleet, nodes, model, sequences, tokens/s (None: refused), gap, CPU ms."""


def run(fleets: int, seed: int, base: Constraints) -> list[Case]:
    rng = random.Random(seed)
    cases: list[Case] = []
    for i in range(fleets):
        n = SIZES[i % len(SIZES)]
        name = rng.choice(MODELS)
        drawn = cluster(rng, n, wan=rng.random() < 0.3)
        nodes = [
            replace(x, num_gpus=(g := rng.choice([1, 2, 4, 8])), vram_bytes=x.vram_bytes * g)
            for x in drawn
        ]
        for batch in BATCHES:
            start = time.process_time()
            try:
                got = plan(resolve_model(name), nodes, replace(base, batch=batch))
            except PlanError:
                cases.append((i, n, name, batch, None, 0.0, 0.0))
                continue
            ms = (time.process_time() - start) * 1e3
            cert, pred = got.rationale.certificate, got.rationale.prediction
            assert cert is not None and pred is not None
            cases.append((i, n, name, batch, pred.tokens_per_s, cert.gap, ms))
    return cases


def summary(cases: list[Case], seed: int) -> None:
    planned = [c for c in cases if c[4] is not None]
    gaps = sorted(c[5] for c in planned)
    over = [c for c in planned if c[5] > 0.01]
    p90 = gaps[min(len(gaps) - 1, int(0.9 * len(gaps)))]
    print(f"{len(planned)} plans ({len(cases) - len(planned)} refused), seed {seed}")
    print("| gap: median | p90 | max | above 1 % | CPU ms: median | max |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    ms = [c[6] for c in planned]
    print(
        f"| {statistics.median(gaps):.2%} | {p90:.2%} | {gaps[-1]:.2%} | {len(over)} "
        f"| {statistics.median(ms):.0f} | {max(ms):.0f} |"
    )
    for c in over:
        print(f"above 1 %: fleet {c[0]} ({c[1]} nodes), {c[2]} at {c[3]}: gap {c[5]:.2%}")


def compare(a: list[Case], b: list[Case]) -> None:
    for x, y in zip(a, b, strict=True):
        if x[4] is None or y[4] is None:
            if (x[4] is None) != (y[4] is None):
                print(f"fleet {x[0]} {x[2]} at {x[3]}: refused in one run only")
            continue
        if abs(x[4] - y[4]) > 1e-9 * x[4] or abs(x[5] - y[5]) > 1e-6:
            print(
                f"fleet {x[0]} ({x[1]} nodes) {x[2]} at {x[3]}: {x[4]:.2f} -> {y[4]:.2f} "
                f"tokens/s ({y[4] / x[4] - 1:+.3%}), gap {x[5]:.2%} -> {y[5]:.2%}, "
                f"{x[6]:.0f} -> {y[6]:.0f} ms"
            )
    cpu = [sum(c[6] for c in r) / 1e3 for r in (a, b)]
    print(f"CPU in all: {cpu[0]:.1f} s -> {cpu[1]:.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fleets", type=int, default=24)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--out", type=Path, help="keep the cases as JSON")
    ap.add_argument("--compare", nargs=2, type=Path, help="two --out files")
    ap.add_argument("--engine", help="plan with this engine's calibration (e.g. generic)")
    ap.add_argument("--context", type=int, help="tokens of KV reserved per sequence")
    args = ap.parse_args()
    if args.compare:
        a, b = ([tuple(c) for c in json.loads(p.read_text())] for p in args.compare)
        compare(a, b)
        return
    calibration = None if args.engine is None else resolve_calibration(args.engine)
    base = Constraints(context_tokens=args.context, calibration=calibration)
    cases = run(args.fleets, args.seed, base)
    summary(cases, args.seed)
    if args.out:
        args.out.write_text(json.dumps(cases))


if __name__ == "__main__":
    main()
