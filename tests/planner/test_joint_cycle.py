"""The GPU-group cycle bound of several sequences solves only the microbatches that can
lower it, from the smallest up: it equals the bound that solves every stage count's
microbatch, on fleets too large for the exact joint solve."""

from __future__ import annotations

import math
import random

import pytest

from stowplan import Constraints, NodeDescriptor
from stowplan.cost.cycle import microbatches
from stowplan.model import Metric
from stowplan.models import resolve_model
from stowplan.planner.problem import prepare
from stowplan.planner.strategies.cycle import quick_bound
from stowplan.planner.tensor.exact import GROUPED_NODE_LIMIT
from stowplan.planner.tensor.joint import adjacency_loses_nothing, joint_cycle, joint_optimum
from stowplan.planner.tensor.layouts import engine_rule

KINDS = (
    ("H100 SXM5", 80, 8, 100_000.0),
    ("A100 80GB SXM", 80, 4, 25_000.0),
    ("L40S", 48, 2, 10_000.0),
    ("RTX 4090", 24, 1, 1_000.0),
)


def _fleet(rng: random.Random) -> list[NodeDescriptor]:
    out = []
    for i in range(rng.randint(GROUPED_NODE_LIMIT + 1, GROUPED_NODE_LIMIT + 6)):
        name, gb, gpus, link = rng.choice(KINDS)
        out.append(
            NodeDescriptor(
                id=f"n{i:02d}",
                gpu_name=name,
                vram_bytes=gpus * gb * 10**9,
                num_gpus=gpus,
                link_mbps=link,
                link_latency_ms=rng.choice([0.05, 0.5, 5.0]),
            )
        )
    return out


def _every_count(problem, rule, lossless: bool) -> float:  # type: ignore[no-untyped-def]
    """The bound solving every stage count's microbatch: per count, the largest of its
    quick bound, m × the least slowest stage and the least time per token."""
    cm = problem.cost_model()
    total = sum(n.num_gpus for n in problem.nodes)
    top = min(problem.constraints.max_stages or total, total, problem.model.num_blocks)
    least = math.inf
    for s in range(problem.min_stages, top + 1):
        bound = quick_bound(problem, cm, s)
        if math.isfinite(bound):
            m, u = microbatches(cm.batch, s)
            pu = problem.at_microbatch(u)
            slowest = joint_optimum(pu, rule, Metric.THROUGHPUT, False, lossless)[0]
            trip = joint_optimum(pu, rule, Metric.LATENCY, False, lossless)[0]
            bound = max(bound, m * slowest, trip)
        least = min(least, bound)
    return least


@pytest.mark.parametrize("seed", range(16))
def test_the_bound_equals_solving_every_microbatch(seed: int) -> None:
    rng = random.Random(seed)
    model = resolve_model(rng.choice(["llama3.1:70b", "llama3.1:405b", "qwen3:30b-a3b"]))
    batch = rng.choice([4, 16, 64])
    problem = prepare(model, _fleet(rng), Constraints(batch=batch))
    rule = engine_rule(problem)
    lossless = adjacency_loses_nothing(problem)
    got = joint_cycle(problem, rule, False, lossless, math.inf)[0]
    assert got == _every_count(problem, rule, lossless)
    assert 0 < got < math.inf
