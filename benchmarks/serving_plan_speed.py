"""CPU time of the plan_blocks() calls one serve() run makes: llama3.1:8b replicas of a
few offers of ``offer_search.offers(8, 1)`` at U concurrent sequences, constraints from
``serving_constraints`` (prompt 2,048, output 256 tokens).

python benchmarks/serving_plan_speed.py --repeats 3

Prints, per case, the median CPU time of ``--repeats`` calls after a warm-up, and a
digest of the plans' JSON (the same digest before and after a change: the same plans).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from offer_search import offers
from stowplan import Workload, lookup
from stowplan.cost.serving import serving_constraints
from stowplan.plan import plan_to_json
from stowplan.planner import plan_blocks

CASES = [((0, 3, 4), 219), ((0, 3, 4), 96), ((0, 6), 219), ((0, 1, 4), 158), ((2, 3, 4), 140)]
"""(offer indices, U): the slowest calls of ``serve("llama3.1:8b", offers(8, 1), …)``."""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    workload = Workload(prompt_tokens=2048, output_tokens=256, ttft_s=1.0, tpot_s=0.05)
    base = serving_constraints(workload)
    fleet = offers(8, 1)
    model = lookup("llama3.1:8b")
    assert model is not None
    digest = hashlib.sha256()
    print("| nodes | U | CPU ms (median) |")
    print("| --- | ---: | ---: |")
    for picked, users in CASES:
        nodes = [fleet[i] for i in picked]
        c = replace(base, batch=users)
        digest.update(plan_to_json(plan_blocks(model, nodes, c)).encode())  # warm-up
        runs = []
        for _ in range(args.repeats):
            t0 = time.process_time()
            plan_blocks(model, nodes, c)
            runs.append(time.process_time() - t0)
        kinds = " + ".join(f"{n.num_gpus} × {n.gpu_name}" for n in nodes)
        print(f"| {kinds} | {users} | {statistics.median(runs) * 1e3:.0f} |", flush=True)
    print(f"\nplans: sha256 {digest.hexdigest()[:12]}")


if __name__ == "__main__":
    main()
