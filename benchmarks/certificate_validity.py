"""Certificate bounds against plans on random small fleets of multi-GPU nodes.

python benchmarks/certificate_validity.py 0 100     # fleets of seeds 0 to 99

Each seed draws 2–3 nodes (8 × H100, 4 × A100, 2 × L40S or one RTX 4090, links of
0.05–5 ms), a model, 2 to 64 sequences and, half the time, the generic calibration; it
plans with the default strategy and with ``Strategy.EXACT``.  A certificate's bound on
tokens/s must be no lower than either plan's tokens/s: a line names every fleet where it
is (none is expected), and the last line counts the fleets planned and those.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.common.gpu_fleets import MIXED_KINDS, gpu_nodes

from stowplan import Constraints, PlanError, Strategy, plan
from stowplan.calibration import resolve_calibration
from stowplan.models import resolve_model

MODELS = ("llama3.1:8b", "llama3.1:70b-q4_0", "qwen3:30b-a3b-q4_0", "mixtral:8x7b-q4_0")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("first", type=int)
    ap.add_argument("end", type=int)
    args = ap.parse_args()
    planned = above = 0
    for seed in range(args.first, args.end):
        rng = random.Random(seed)
        nodes = gpu_nodes(rng, 2, 3, MIXED_KINDS)
        model = resolve_model(rng.choice(MODELS))
        batch = rng.choice([2, 4, 8, 16, 64])
        calibration = resolve_calibration("generic") if rng.random() < 0.5 else None
        try:
            got = plan(model, nodes, Constraints(batch=batch, calibration=calibration))
            exact = plan(
                model,
                nodes,
                Constraints(batch=batch, calibration=calibration, strategy=Strategy.EXACT),
            )
        except PlanError:
            continue
        cert, pred, other = got.rationale.certificate, got.rationale.prediction, exact.rationale
        assert cert is not None and pred is not None and other.prediction is not None
        planned += 1
        best = max(pred.tokens_per_s, other.prediction.tokens_per_s)
        if best > cert.bound * (1 + 1e-9):
            above += 1
            kinds = [n.gpu_name for n in nodes]
            print(f"seed {seed}: {model.name}, {batch} sequences, {kinds}: {best} > {cert.bound}")
    print(f"{planned} fleets planned, {above} with a plan above the certificate's bound")


if __name__ == "__main__":
    main()
