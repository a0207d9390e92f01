"""Plans held to a stage count beyond the fleet's whole multi-GPU nodes.

python benchmarks/held_counts.py --out a.json      # in one checkout, then in another:
python benchmarks/held_counts.py --out b.json
python benchmarks/held_counts.py --compare a.json b.json

Fleets of 4, 8 and 16 × 8 H100 and one mixed fleet (three 8 × H100, three 4 × A100,
two 2 × L40S), five models (dense and MoE), 16 and 64 sequences, each held
(``min_stages = max_stages``) to one or two stages more than the fleet's nodes, to one
and a half and twice as many, and two more than that: counts only split nodes can run.
Printed: the plans' tokens/s per fleet and the CPU time; ``--compare`` counts the cases
faster, slower and the same between two runs, with the slower ones listed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.common.gpu_fleets import nodes_of
from tests.common.h100 import h100_nodes

from stowplan import Constraints, NodeDescriptor, PlanError, lookup, plan

MODELS = ["llama3.1:70b", "qwen3:30b-a3b", "mixtral:8x7b", "qwen3:32b", "llama3.1:8b"]


def fleets() -> dict[str, list[NodeDescriptor]]:
    mixed = nodes_of(
        [("H100 SXM5", 80, 8, 100_000.0, 0.05)] * 3
        + [("A100 80GB SXM", 80, 4, 25_000.0, 0.5)] * 3
        + [("L40S", 48, 2, 10_000.0, 0.05)] * 2
    )
    return {"4 × H100": h100_nodes(4), "8 × H100": h100_nodes(8), "16 × H100": h100_nodes(16),
            "mixed": mixed}  # fmt: skip


def run() -> dict[str, tuple[float | None, float]]:
    """Per case ("fleet model sequences stages"): tokens/s (None: refused), CPU ms."""
    out: dict[str, tuple[float | None, float]] = {}
    for name, nodes in fleets().items():
        n = len(nodes)
        for model_name in MODELS:
            model = lookup(model_name)
            assert model is not None
            for batch in (16, 64):
                for stages in sorted({n + 1, n + 2, n + n // 2, 2 * n, 2 * n + 2}):
                    c = Constraints(batch=batch, min_stages=stages, max_stages=stages)
                    start = time.process_time()
                    try:
                        pred = plan(model, nodes, c).rationale.prediction
                        value = None if pred is None else pred.tokens_per_s
                    except PlanError:
                        value = None
                    ms = (time.process_time() - start) * 1e3
                    out[f"{name} {model_name} {batch} {stages}"] = (value, ms)
    return out


def compare(a: dict[str, list[float | None]], b: dict[str, list[float | None]]) -> None:
    faster = slower = same = 0
    gains: list[float] = []
    for key, (x, _) in a.items():
        y = b[key][0]
        if x == y or (x is not None and y is not None and abs(y - x) <= 1e-9 * x):
            same += 1
        elif y is not None and (x is None or y > x):
            faster += 1
            if x:
                gains.append(y / x - 1)
        else:
            slower += 1
            print(f"slower: {key}: {x} -> {y} tokens/s")
    ms_a = sum(float(v[1] or 0.0) for v in a.values()) / 1e3
    ms_b = sum(float(v[1] or 0.0) for v in b.values()) / 1e3
    median = f", median gain {statistics.median(gains):+.1%}" if gains else ""
    print(f"{faster} faster{median}, {slower} slower, {same} the same of {len(a)}")
    print(f"CPU in all: {ms_a:.1f} s -> {ms_b:.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="write each case's tokens/s and CPU ms here (JSON)")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two --out files")
    args = ap.parse_args()
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        compare(a, b)
        return
    got = run()
    planned = [v for v, _ in got.values() if v is not None]
    print(f"{len(planned)} plans ({len(got) - len(planned)} refused)")
    print(f"CPU ms: median {statistics.median(ms for _, ms in got.values()):.0f}, "
          f"max {max(ms for _, ms in got.values()):.0f}")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(got, indent=0) + "\n")


if __name__ == "__main__":
    main()
