"""``objective="cost"``: the cheapest node set whose optimal plan meets a target rate.

The target is the rate the workload gets: tokens/s of one stream at batch 1
(1 / time per token), pipelined tokens/s above.  Node sets are visited in
order of price per hour (best first, a heap of subsets); sets whose usable
VRAM cannot hold the model are skipped without planning; the first set whose
plan meets the target is the cheapest.  Beyond a budget of visited sets the
search stops and says so.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import replace

from stowplan.cost import CostModel
from stowplan.errors import Infeasible, InputError, PlanError
from stowplan.model import Constraints, Objective
from stowplan.plan import Plan, PlanRationale
from stowplan.planner.common import Problem, prepare

__all__ = ["MAX_VISITED", "plan_cheapest", "served_rate"]

MAX_VISITED = 20000
"""Most node sets the search visits."""
MAX_PLANNED = 400
"""Most node sets the search plans."""


def served_rate(plan: Plan) -> float:
    """Tokens/s the workload gets from ``plan`` (see the module docstring)."""
    pred = plan.rationale.prediction
    assert pred is not None
    if pred.batch == 1:
        return 1.0 / pred.time_per_token_s if pred.time_per_token_s > 0 else float("inf")
    return pred.tokens_per_s


def plan_cheapest(problem: Problem, runner: Callable[[Problem], Plan]) -> Plan:
    """The plan of the cheapest node subset meeting ``target_tokens_per_s``."""
    c = problem.constraints
    target = c.target_tokens_per_s
    assert target is not None
    priced = [n for n in problem.nodes if n.price_per_hour is not None]
    if not priced:
        raise InputError(
            "nodes[].price_per_hour", None, "objective='cost' needs prices (price_per_hour)"
        )
    nodes = sorted(priced, key=lambda n: (n.price_per_hour or 0.0, n.id))
    need = problem.total_bytes
    usable = [problem.usable[n.id] for n in nodes]
    price = [n.price_per_hour or 0.0 for n in nodes]
    # Best-first over subsets as increasing index tuples: children extend by a later node
    # or replace the last with the next one; both cost at least as much as the parent.
    heap: list[tuple[float, tuple[int, ...]]] = [(price[0], (0,))]
    visited = planned = 0
    best_seen: tuple[float, Plan] | None = None
    while heap and visited < MAX_VISITED and planned < MAX_PLANNED:
        cost, members = heapq.heappop(heap)
        visited += 1
        last = members[-1]
        if last + 1 < len(nodes):
            heapq.heappush(heap, (cost + price[last + 1], (*members, last + 1)))
            heapq.heappush(heap, (cost - price[last] + price[last + 1], (*members[:-1], last + 1)))
        if len(members) > problem.max_stages or sum(usable[i] for i in members) < need:
            continue
        try:
            sub = prepare(problem.model, [nodes[i] for i in members], _speed(c))
            plan = runner(sub)
        except PlanError:
            continue
        planned += 1
        rate = served_rate(plan)
        if best_seen is None or rate > best_seen[0]:
            best_seen = (rate, plan)
        if rate >= target:
            return _with_note(
                plan,
                f"cheapest node set meeting {target:g} tokens/s: ${cost:.2f}/h for "
                f"{rate:.2f} tokens/s ({visited} sets visited, {planned} planned)",
            )
    fastest = runner(prepare(problem.model, list(problem.nodes), _speed(c)))
    reach = served_rate(fastest)
    why = (
        f"no node set reaches {target:g} tokens/s: the fastest plan on all "
        f"{len(problem.nodes)} nodes gives {reach:.2f} tokens/s"
    )
    if reach >= target:
        why = (
            f"the search stopped after {visited} sets ({planned} planned) without meeting "
            f"{target:g} tokens/s; all nodes together give {reach:.2f} tokens/s"
        )
    raise Infeasible(why)


def _speed(c: Constraints) -> Constraints:
    return replace(c, objective=Objective.SPEED, target_tokens_per_s=None)


def _with_note(plan: Plan, note: str) -> Plan:
    r = plan.rationale
    return replace(
        plan,
        rationale=PlanRationale(
            strategy=r.strategy,
            notes=(note, *r.notes),
            prediction=r.prediction,
            certificate=r.certificate,
        ),
    )


_ = CostModel  # the cost model defines the rates compared here
