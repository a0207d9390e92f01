"""Demo pipeline speed: the numpy demo model in one process vs across Ray stage actors.

Starts the default local fake cluster (four one-GPU nodes, 5/4/3.5/2 MiB VRAM
labels), realises a balance-by-vram plan, and alternates a single-process
decode (weights already built) with a distributed one, ``--rounds`` times, on the same CPU.
Prints the medians and their ratio, and each stage's compute rate.

    .venv/bin/python benchmarks/demo_pipeline.py --tokens 48 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from stowplan.cluster.local import start_local_cluster
from stowplan.cluster.nodes import ray_node_descriptors
from stowplan.cluster.realise import realise_with_replan
from stowplan.demo.model import DemoConfig, StageModel, demo_layout, generate_local
from stowplan.demo.pipeline import compare, config_args, run_pipeline, stage_worker_class
from stowplan.model import Constraints, Strategy


def _decode_s(whole: StageModel, prompt: list[int], num_tokens: int) -> float:
    """Seconds for the same steps in one process, weights already built (as the actors' are)."""
    whole.reset()
    t0 = time.perf_counter()
    for t in prompt[:-1]:
        whole.step(t)
    token = prompt[-1]
    for _ in range(num_tokens):
        token = int(np.argmax(whole.step(token)))
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    config = DemoConfig()
    prompt = [1, 2, 3]
    whole = StageModel.load(config, (0, config.num_blocks), True, True)
    reference = generate_local(config, prompt, args.tokens)
    local = start_local_cluster()
    try:
        nodes = ray_node_descriptors(timeout_s=60)
        constraints = Constraints(strategy=Strategy.BALANCE_BY_VRAM)
        with realise_with_replan(
            demo_layout(config),
            nodes,
            constraints,
            stage_worker_class(),
            actor_args=(config_args(config),),
            timeout_s=60,
        ) as realisation:
            run_pipeline(realisation.actors, config, prompt, 4, timeout_s=120)  # warm-up
            local_s, dist_s, runs, matches = [], [], [], []
            for _ in range(args.rounds):
                local_s.append(_decode_s(whole, prompt, args.tokens))
                run = run_pipeline(realisation.actors, config, prompt, args.tokens, timeout_s=120)
                dist_s.append(run.wall_s)
                runs.append(run)
                matches.append(compare(run.generation, reference).match)
    finally:
        local.shutdown()
    n = args.tokens
    loc, dist = statistics.median(local_s), statistics.median(dist_s)
    print(f"stages: {len(runs[0].stages)}; tokens per round: {n}; rounds: {args.rounds}")
    print("| run | median s | tokens/s | ratio to one process |")
    print("| --- | --- | --- | --- |")
    print(f"| one process | {loc:.3f} | {n / loc:.0f} | 1.00 |")
    print(f"| Ray pipeline | {dist:.3f} | {n / dist:.0f} | {dist / loc:.2f} |")
    for i in range(len(runs[0].stages)):
        rates = [r.stages[i].tokens_per_s for r in runs]
        s = runs[0].stages[i]
        print(
            f"stage {i}: blocks [{s.block_range[0]}, {s.block_range[1]}), "
            f"median compute rate {statistics.median(rates):.0f} positions/s"
        )
    print(f"tokens and logits match the single process in every round: {all(matches)}")


if __name__ == "__main__":
    main()
