"""The true optimum of small instances: every ordered subset of nodes, every contiguous
split of the blocks."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

from stowplan import Constraints, ModelLayout, NodeDescriptor
from stowplan.cost import CostModel


def pipelines(cm: CostModel, min_stages: int = 1) -> Iterator[tuple[list[int], list[int]]]:
    """Every pipeline of ``cm``'s nodes that fits: (node order, block bounds)."""
    nb = cm.num_blocks
    for n in range(min_stages, min(len(cm.nodes), nb) + 1):
        for order in itertools.permutations(range(len(cm.nodes)), n):
            for cuts in itertools.combinations(range(1, nb), n - 1):
                bounds = [0, *cuts, nb]
                if cm.fits_pipeline(order, bounds):
                    yield list(order), bounds


def pipelines_of(cm: CostModel, stages: int) -> Iterator[tuple[list[int], list[int]]]:
    """Every pipeline of exactly ``stages`` stages of ``cm``'s nodes that fits."""
    nb = cm.num_blocks
    for order in itertools.permutations(range(len(cm.nodes)), stages):
        for cuts in itertools.combinations(range(1, nb), stages - 1):
            bounds = [0, *cuts, nb]
            if cm.fits_pipeline(order, bounds):
                yield list(order), bounds


def slowest(cm: CostModel, p: tuple[Sequence[int], Sequence[int]]) -> float:
    """The slowest stage of pipeline ``p`` at ``cm``'s own microbatch."""
    return cm.evaluate_here(*p).bottleneck_s


def brute_force(
    model: ModelLayout, nodes: Sequence[NodeDescriptor], c: Constraints, objective: str
) -> float:
    """The least value of ``objective`` over every pipeline (``inf`` when none fits).

    ``latency`` and ``cycle``: the cycle (at one sequence, the time per token);
    ``throughput``: the slowest stage at the cost model's own microbatch (what the
    solvers minimise)."""
    cm = CostModel(model, nodes, c)
    values = (
        slowest(cm, p) if objective == "throughput" else cm.evaluate(*p).cycle_s
        for p in pipelines(cm, c.min_stages or 1)
    )
    return min(values, default=math.inf)
