"""Peer placement rules, re-implemented from their documented behaviour.

Each takes a prepared problem and the cost model and returns a pipeline (node
indices in stage order, block bounds) or None when its rule does not fit the
model in the nodes' usable VRAM.  They are evaluated with the same cost model
as stowplan's own strategies (:func:`compare`).

* ``exo`` — memory-weighted ring: nodes by memory, largest first; each takes a
  share of the layers proportional to its memory (rounded at the cumulative
  fraction).
* ``vllm`` — even split over all nodes (``get_pp_indices``: ``L // P`` layers
  each, the ``L % P`` extra layers to the stages just before the last).
* ``accelerate`` — sequential fill (``infer_auto_device_map``): nodes in id
  order (the planner gives the input order no meaning), each filled up to its
  memory before the next.
* ``v1`` — the seed's balance-by-vram (fewest stages, split by VRAM).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from stowplan.cost import CostModel
from stowplan.errors import PlanError
from stowplan.model import Constraints, ModelLayout, NodeDescriptor, Objective
from stowplan.planner.problem import Problem, prepare
from stowplan.planner.strategies.throughput import Pipeline, greedy_split
from stowplan.planner.strategies.vram import plan_balance_by_vram

__all__ = ["BASELINES", "BaselineResult", "compare", "compare_plans", "run_baseline"]


def _fits(cm: CostModel, p: Pipeline) -> bool:
    """Every stage holds at least one block and fits its node."""
    order, bounds = p
    return all(lo < hi for lo, hi in pairwise(bounds)) and cm.fits_pipeline(order, bounds)


def _exo(problem: Problem, cm: CostModel) -> Pipeline | None:
    nb = cm.num_blocks
    # The ``max_stages`` first of the nodes sorted by VRAM (``nsmallest`` is that prefix).
    order = heapq.nsmallest(
        max(problem.max_stages, 0),
        range(len(cm.nodes)),
        key=lambda d: (-cm.nodes[d].vram_bytes, cm.nodes[d].id),
    )
    total = sum(cm.nodes[d].vram_bytes for d in order)
    if total <= 0:
        return None
    bounds = [0]
    acc = 0
    for d in order:
        acc += cm.nodes[d].vram_bytes
        bounds.append(min(nb, round(nb * acc / total)))
    bounds[-1] = nb
    keep = [s for s in range(len(order)) if bounds[s + 1] > bounds[s]]
    p = ([order[s] for s in keep], [0, *(bounds[s + 1] for s in keep)])
    return p if _fits(cm, p) else None


def _vllm(problem: Problem, cm: CostModel) -> Pipeline | None:
    nb = cm.num_blocks
    pp = min(len(cm.nodes), problem.max_stages, nb)
    parts = [nb // pp] * pp
    for i in range(2, nb % pp + 2):
        parts[-i] += 1
    bounds = [0]
    for c in parts:
        bounds.append(bounds[-1] + c)
    p = (list(range(pp)), bounds)
    return p if _fits(cm, p) else None


def _accelerate(problem: Problem, cm: CostModel) -> Pipeline | None:
    order = list(range(len(cm.nodes)))[: problem.max_stages]
    p = greedy_split(cm, order, float("inf"), problem.min_stages)
    return p if p is not None and _fits(cm, p) else None


def _v1(problem: Problem, cm: CostModel) -> Pipeline | None:

    try:
        plan = plan_balance_by_vram(problem)
    except PlanError:
        return None
    order, bounds = cm.plan_order_bounds(plan)
    return order, bounds


BASELINES: dict[str, Callable[[Problem, CostModel], Pipeline | None]] = {
    "exo": _exo,
    "vllm": _vllm,
    "accelerate": _accelerate,
    "v1": _v1,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class BaselineResult:
    """One rule's plan, as the cost model sees it."""

    name: str
    pipeline: Pipeline | None
    """None: the rule does not fit the model."""
    tokens_per_s: float | None
    time_per_token_s: float | None
    num_stages: int | None


def run_baseline(name: str, problem: Problem, cm: CostModel) -> Pipeline | None:
    """The pipeline rule ``name`` gives (see :data:`BASELINES`), or None."""
    return BASELINES[name](problem, cm)


def compare(problem: Problem, cm: CostModel) -> tuple[BaselineResult, ...]:
    """Every baseline's pipeline and predicted speed, in :data:`BASELINES` order."""
    out = []
    for name, rule in BASELINES.items():
        p = rule(problem, cm)
        if p is None:
            out.append(
                BaselineResult(
                    name=name,
                    pipeline=None,
                    tokens_per_s=None,
                    time_per_token_s=None,
                    num_stages=None,
                )
            )
            continue
        ev = cm.evaluate(*p)
        out.append(
            BaselineResult(
                name=name,
                pipeline=p,
                tokens_per_s=ev.tokens_per_s,
                time_per_token_s=ev.time_per_token_s,
                num_stages=len(p[0]),
            )
        )
    return tuple(out)


def compare_plans(
    model: ModelLayout, nodes: Sequence[NodeDescriptor], constraints: Constraints
) -> tuple[BaselineResult, ...]:
    """:func:`compare` on all ``nodes`` (the cost objective's node selection is not applied)."""
    from dataclasses import replace

    c = replace(constraints, objective=Objective.SPEED, target_tokens_per_s=None)
    problem = prepare(model, nodes, c)
    return compare(problem, CostModel(model, nodes, c))
