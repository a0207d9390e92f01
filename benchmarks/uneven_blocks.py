"""Plans of the models whose blocks differ, on random single-GPU fleets of 8–64 nodes.

python benchmarks/uneven_blocks.py --fleets 100 --seed 7 --out a.json
python benchmarks/uneven_blocks.py --fleets 60 --seed 7 --one-stream --out a.json
python benchmarks/uneven_blocks.py --compare a.json b.json

Each fleet draws 8, 12, 16, 24, 32, 48 or 64 nodes (``_clusters.cluster``, LAN or WAN
links), one of eight models whose blocks differ (deepseek-v3 and -r1, kimi-k2: dense
blocks before the MoE ones; gemma2 and gemma3, gpt-oss: alternating attention windows)
and 2, 4, 16, 64 or 256 sequences (``--one-stream``: one, on the same fleets).  ``--out``
keeps each plan's tokens/s, certificate gap and CPU ms; ``--compare`` lists the plans
that differ between two runs (faster or slower, by how much) and sums up the gaps and the
CPU time.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _clusters import cluster
from stowplan import Constraints, PlanError, plan
from stowplan.models import resolve_model

MODELS = [
    "deepseek-v3",
    "gemma2:27b",
    "gemma2:9b",
    "gemma3:27b",
    "gpt-oss:120b",
    "gpt-oss:20b",
    "kimi-k2",
    "deepseek-r1",
]
SIZES = [8, 12, 16, 24, 32, 48, 64]


def run(fleets: int, seed: int, one_stream: bool) -> list[dict[str, object]]:
    rng = random.Random(seed)
    out: list[dict[str, object]] = []
    for i in range(fleets):
        n, wan = rng.choice(SIZES), rng.random() < 0.5
        name, batch = rng.choice(MODELS), rng.choice([2, 4, 16, 64, 256])
        if one_stream:
            batch = 1
        nodes = cluster(random.Random(f"{seed}-{i}"), n, wan=wan)
        case: dict[str, object] = {"fleet": i, "nodes": n, "model": name, "batch": batch}
        start = time.process_time()
        try:
            got = plan(resolve_model(name), nodes, Constraints(batch=batch))
        except PlanError as e:
            out.append({**case, "refused": type(e).__name__})
            continue
        ms = (time.process_time() - start) * 1e3
        assert got.rationale.prediction is not None
        cert = got.rationale.certificate
        out.append(
            {
                **case,
                "tokens_per_s": got.rationale.prediction.tokens_per_s,
                "gap": None if cert is None else cert.gap,
                "exact": cert is not None and cert.exact,
                "ms": ms,
            }
        )
    return out


def compare(a: list[dict[str, object]], b: list[dict[str, object]]) -> None:
    counts = {"faster": 0, "slower": 0, "the same": 0}
    ms_a: list[float] = []
    ms_b: list[float] = []
    gaps: list[tuple[float, float]] = []
    for x, y in zip(a, b, strict=True):
        if "tokens_per_s" not in x or "tokens_per_s" not in y:
            continue
        ratio = float(y["tokens_per_s"]) / float(x["tokens_per_s"])  # type: ignore[arg-type]
        word = "faster" if ratio > 1 + 1e-9 else "slower" if ratio < 1 - 1e-9 else "the same"
        counts[word] += 1
        if word != "the same":
            print(
                f"fleet {x['fleet']} ({x['nodes']} nodes), {x['model']} at {x['batch']}: "
                f"{word}, × {ratio:.5f}"
            )
        ms_a.append(float(x["ms"]))  # type: ignore[arg-type]
        ms_b.append(float(y["ms"]))  # type: ignore[arg-type]
        gaps.append((float(x["gap"] or 0.0), float(y["gap"] or 0.0)))  # type: ignore[arg-type]
    print(", ".join(f"{v} {k}" for k, v in counts.items()))
    above = [sum(g[k] > 0.01 for g in gaps) for k in (0, 1)]
    print(
        f"gaps above 1 %: {above[0]} -> {above[1]}; largest "
        f"{max(g[0] for g in gaps):.2%} -> {max(g[1] for g in gaps):.2%}"
    )
    exact = [sum(1 for r in rs if r.get("exact")) for rs in (a, b)]
    print(f"proven optimal: {exact[0]} -> {exact[1]}")
    print(
        f"CPU ms per plan: median {statistics.median(ms_a):.1f} -> "
        f"{statistics.median(ms_b):.1f}, in all {sum(ms_a) / 1e3:.1f} -> {sum(ms_b) / 1e3:.1f} s"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fleets", type=int, default=100)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--one-stream", action="store_true", help="one sequence on every fleet")
    ap.add_argument("--out", type=Path, help="keep each case as JSON")
    ap.add_argument("--compare", nargs=2, type=Path, help="two --out files")
    args = ap.parse_args()
    if args.compare:
        a, b = (json.loads(p.read_text(encoding="utf-8")) for p in args.compare)
        compare(a, b)
        return
    cases = run(args.fleets, args.seed, args.one_stream)
    if args.out:
        args.out.write_text(json.dumps(cases), encoding="utf-8")
    planned = [c for c in cases if "tokens_per_s" in c]
    print(f"{len(planned)} of {len(cases)} fleets planned")


if __name__ == "__main__":
    main()
