"""Plans on random fleets of 9–16 multi-GPU nodes: tokens/s and CPU ms per case.

python benchmarks/grouped_fleets.py --fleets 30

Each fleet draws 9–16 nodes of five kinds (8 × H100 SXM5, 4 or 8 × A100 80GB SXM,
2 × L40S, 4 × RTX 4090; links of 10–100 Gbit/s and 0.05–5 ms), one of four models and
1, 4, 16 or 64 sequences.  Run it on two checkouts and compare the columns: the same
tokens/s is the same plan quality (the GPU-layout search on such fleets is a local
search, so a change to it shows here first); the gap is the plan's certificate's (how
far below its bound; 0 where it is proven optimal).  ``--first`` starts at another seed;
``--context 8192`` reserves each sequence's KV cache for that many tokens, as the
command line does by default.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.common.gpu_fleets import gpu_nodes

from stowplan import Constraints, PlanError, lookup, plan

KINDS = [
    ("H100 SXM5", 80, 8, 100_000.0),
    ("A100 80GB SXM", 80, 4, 25_000.0),
    ("L40S", 48, 2, 10_000.0),
    ("A100 80GB SXM", 80, 8, 50_000.0),
    ("RTX 4090", 24, 4, 10_000.0),
]
MODELS = ["llama3.1:70b", "llama3.1:405b", "qwen3:30b-a3b", "llama3.1:8b"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fleets", type=int, default=30)
    ap.add_argument("--first", type=int, default=0, help="the first fleet's seed")
    ap.add_argument("--context", type=int, default=None, help="tokens of KV per sequence")
    args = ap.parse_args()
    print("| seed | model | sequences | nodes | tokens/s | gap | CPU ms |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for seed in range(args.first, args.first + args.fleets):
        rng = random.Random(seed)
        nodes = gpu_nodes(rng, 9, 16, KINDS)
        model = rng.choice(MODELS)
        batch = rng.choice([1, 4, 16, 64])
        start = time.process_time()
        try:
            got = plan(lookup(model), nodes, Constraints(batch=batch, context_tokens=args.context))
        except PlanError as e:
            shown, gap = f"refused ({type(e).__name__})", ""
        else:
            pred, cert = got.rationale.prediction, got.rationale.certificate
            assert pred is not None
            shown = f"{pred.tokens_per_s:.6g}"
            gap = "" if cert is None else f"{cert.gap:.2%}"
        ms = (time.process_time() - start) * 1e3
        print(
            f"| {seed} | {model} | {batch} | {len(nodes)} | {shown} | {gap} | {ms:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
