"""Stages arranged as an engine ranks them: vLLM's node order, SGLang's equal stage counts,
each node's stages together; the best split of the blocks over such an order."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from stowplan.errors import PlanError
from stowplan.model import Metric
from stowplan.planner.problem import Problem
from stowplan.planner.strategies.latency import latency_split
from stowplan.planner.strategies.throughput import Pipeline, min_bottleneck_split
from stowplan.planner.tensor.exact import degrees
from stowplan.planner.tensor.layouts import (
    EngineRule,
    cycle_of,
    expand,
    uniform_layout,
)

__all__ = [
    "consecutive",
    "engine_accepts",
    "engine_candidates",
    "engine_fit",
]


def _runs(vp: Problem, order: Sequence[int]) -> list[tuple[str, list[int]]]:
    """The pipeline's nodes in order, each with its consecutive stages' planning nodes."""
    out: list[tuple[str, list[int]]] = []
    for d in order:
        parent = vp.parent(vp.nodes[d].id)
        if out and out[-1][0] == parent:
            out[-1][1].append(d)
        else:
            out.append((parent, [d]))
    return out


def engine_accepts(vp: Problem, order: Sequence[int], engine: str) -> bool:
    """Whether the engine ranks these stages as the plan orders them."""
    runs = _runs(vp, order)
    if len({parent for parent, _ in runs}) != len(runs):
        return False  # a node's stages apart
    sizes = [len(ds) * vp.nodes[ds[0]].num_gpus for _, ds in runs]
    if engine == "vllm":  # after the first node, fewest GPUs first
        return all(a <= b for a, b in pairwise(sizes[1:]))
    if engine == "sglang":  # every node the same number of stages
        return len({len(ds) for _, ds in runs}) == 1
    return True


def _split(vp: Problem, order: list[int], objective: Metric) -> Pipeline | None:

    root = vp.cost_model()
    cm = root.for_stages(len(order))
    if len(order) > 1 and (objective == Metric.LATENCY or root.batch == 1):
        return latency_split(cm, order)
    return min_bottleneck_split(cm, order, vp.min_stages)


def engine_fit(
    vp: Problem, pipeline: Pipeline, objective: Metric, engine: str
) -> tuple[Pipeline, bool]:
    """``pipeline``, or the best rearrangement of its stages the engine runs: vLLM's nodes
    after the first by GPUs used, fewest first; SGLang's nodes with equally many stages
    (the surplus left out).  The flag says whether it changed."""
    order = list(pipeline[0])
    if engine_accepts(vp, order, engine):
        return pipeline, False
    best = _best_engine_split(vp, _engine_orders(vp, _runs(vp, order), engine), objective, engine)
    return (best, True) if best is not None else (pipeline, False)


def _engine_orders(vp: Problem, runs: list[tuple[str, list[int]]], engine: str) -> list[list[int]]:
    """Stage orders of these node runs the engine ranks as given."""
    if engine == "vllm":
        out = []
        for i, first in enumerate(runs):
            rest = sorted(
                runs[:i] + runs[i + 1 :], key=lambda r: len(r[1]) * vp.nodes[r[1][0]].num_gpus
            )
            out.append([d for _, ds in [first, *rest] for d in ds])
        return out
    if engine == "sglang":
        return [
            [d for _, ds in runs if len(ds) >= k for d in ds[:k]]
            for k in sorted({len(ds) for _, ds in runs})
        ]
    return [[d for _, ds in runs for d in ds]]


def _best_engine_split(
    vp: Problem, orders: list[list[int]], objective: Metric, engine: str
) -> Pipeline | None:
    cm = vp.cost_model()
    best: tuple[float, Pipeline] | None = None
    for o in orders:
        got = _split(vp, o, objective)
        if got is None or not engine_accepts(vp, got[0], engine) or not cm.fits_pipeline(*got):
            continue
        value = cycle_of(vp, got, objective)
        if best is None or value < best[0]:
            best = (value, got)
    return None if best is None else best[1]


def engine_candidates(
    problem: Problem, rule: EngineRule, objective: Metric, engine: str
) -> tuple[Problem, Pipeline] | None:
    """The best pipeline the engine runs over every uniform degree, its stages in the
    fleet's node order rearranged as :func:`engine_fit` does (None: none fits)."""
    best: tuple[float, Problem, Pipeline] | None = None
    for t in sorted({t for n in problem.nodes for t in degrees(problem, n, rule.degrees)}):
        layout = uniform_layout(problem, t)
        if not any(layout.values()):
            continue
        try:
            vp = expand(problem, layout)
        except PlanError:
            continue
        runs = _runs(vp, list(range(len(vp.nodes))))
        got = _best_engine_split(vp, _engine_orders(vp, runs, engine), objective, engine)
        if got is None:
            continue
        value = cycle_of(vp, got, objective)
        if best is None or value < best[0]:
            best = (value, vp, got)
    return None if best is None else (best[1], best[2])


def consecutive(vp: Problem, pipeline: Pipeline, objective: Metric) -> tuple[Problem, Pipeline]:
    """``pipeline`` with each node's stages brought together (in the order the nodes first
    appear) and its blocks split again for that order."""

    order, _ = pipeline
    parents = [vp.parent(vp.nodes[d].id) for d in order]
    rank = {p: i for i, p in reversed(list(enumerate(parents)))}
    regrouped = sorted(order, key=lambda d: rank[vp.parent(vp.nodes[d].id)])
    if regrouped == list(order):
        return vp, pipeline
    cm = vp.cost_model()
    split = (
        latency_split(cm, regrouped)
        if objective == Metric.LATENCY and len(regrouped) > 1
        else min_bottleneck_split(cm, regrouped, vp.min_stages)
    )
    return (vp, split) if split is not None else (vp, pipeline)
