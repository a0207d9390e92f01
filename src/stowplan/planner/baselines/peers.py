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


RECENT = 4
"""Node tuples (and problems) whose rule answers are kept: the cost models of one plan's
microbatches share their nodes (the certificate keeps the rules' plans as long)."""

_BY_VRAM: list[tuple[tuple[NodeDescriptor, ...], list[int]]] = []


def _largest_first(nodes: tuple[NodeDescriptor, ...]) -> list[int]:
    """Node indices by VRAM, largest first, ties to the least id (kept for the last few
    node tuples: every stage count of a plan asks again)."""
    for held, order in _BY_VRAM:
        if held is nodes:
            return order
    order = sorted(range(len(nodes)), key=lambda d: (-nodes[d].vram_bytes, nodes[d].id))
    _BY_VRAM.insert(0, (nodes, order))
    del _BY_VRAM[RECENT:]
    return order


def _exo(problem: Problem, cm: CostModel) -> Pipeline | None:
    nb = cm.num_blocks
    # The ``max_stages`` first of the nodes sorted by VRAM.
    order = _largest_first(cm.nodes)[: max(problem.max_stages, 0)]
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


class _Fewest:
    """The ``v1`` rule's answers on one problem and cost model, whatever the stage limit.

    The rule takes the fewest stage counts first, each on the largest nodes (the same
    first n whatever the limit), so its pipeline of n stages is its answer at every
    limit of n or more and there is none below; a limit with no answer rules out every
    count up to it."""

    def __init__(self, problem: Problem, cm: CostModel) -> None:
        self.problem, self.cm = problem, cm
        self.pipeline: Pipeline | None = None
        self.failed_upto = 0
        """The largest stage limit known to have no answer."""

    def serves(self, problem: Problem, cm: CostModel) -> bool:
        """Whether ``problem`` differs from this one at most in its stage limit."""
        held = self.problem
        return (
            cm.nodes is self.cm.nodes
            and cm.index is self.cm.index
            and problem.min_stages == held.min_stages
            and all(getattr(problem, f) is getattr(held, f) for f in _SAME)
        )

    def at(self, problem: Problem) -> Pipeline | None:
        limit = problem.max_stages
        if self.pipeline is None and limit > self.failed_upto:
            try:
                plan = plan_balance_by_vram(problem)
            except PlanError:
                self.failed_upto = limit
                return None
            self.pipeline = self.cm.plan_order_bounds(plan)
        if self.pipeline is None or len(self.pipeline[0]) > limit:
            return None
        order, bounds = self.pipeline
        return list(order), list(bounds)


_SAME = ("model", "nodes", "constraints", "usable", "prefix", "groups")
"""The problem's parts the ``v1`` rule reads beside its stage limits."""

_FEWEST: list[_Fewest] = []


def _v1(problem: Problem, cm: CostModel) -> Pipeline | None:
    for known in _FEWEST:
        if known.serves(problem, cm):
            return known.at(problem)
    known = _Fewest(problem, cm)
    _FEWEST.insert(0, known)
    del _FEWEST[RECENT:]
    return known.at(problem)


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
