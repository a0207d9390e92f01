"""``objective="cost"``: the cheapest node set whose optimal plan meets a target rate.

The target is the rate the workload gets: tokens/s of one stream at batch 1
(1 / time per token), pipelined tokens/s above.

One node alone is checked outright.  Sets of two or more come from a MILP
(HiGHS via ``scipy.optimize.milp``) over which nodes to buy: binary ``x_d``,
integer blocks ``k_d``, minimising Σ price·x subject to a relaxation of the
cost model that every pipeline meeting the target satisfies:

* the nodes bought hold every byte; one holds the embed, another the head, and
  each at most the blocks (taken as small as the smallest) that fit beside them;
* latency (batch 1): Σ k_d·(seconds per smallest block on d, its fixed block
  cost included) + Σ x_d·(hop latency + outbound transfer + the node's fixed
  stage cost) ≤ 1/target + the largest transfer − the least head time (a
  pipeline pays every hop and every transfer but the last);
* throughput: k_d·(seconds per smallest block on d) ≤ batch/target.

The planner is the oracle: the MILP's set is planned; if its plan meets the
target it is the answer (the MILP is a relaxation, so no cheaper set can meet
it); otherwise every set within it is cut off (the planner may leave nodes of
a set unused, so none of them does better) and the MILP is solved again.  The
plan's own price is reported.
Without scipy the sets are visited best-first by price instead, within a
budget.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import cached_property

from stowplan.cost import CostModel, served_tokens_per_s
from stowplan.errors import DependencyError, Infeasible, InputError, PlanError
from stowplan.model import Constraints, NodeDescriptor, Objective
from stowplan.plan import Plan, PlanRationale
from stowplan.planner.common import Problem, prepare

__all__ = ["MAX_PLANNED", "MAX_VISITED", "plan_cheapest", "served_rate"]

MAX_VISITED = 20000
"""Most node sets the best-first search (without scipy) visits."""
MAX_PLANNED = 200
"""Most node sets either search plans."""

Runner = Callable[[Problem], Plan]


def served_rate(plan: Plan) -> float:
    """Tokens/s the workload gets from ``plan`` (see the module docstring)."""
    pred = plan.rationale.prediction
    assert pred is not None
    return served_tokens_per_s(pred.batch, pred.time_per_token_s, pred.tokens_per_s)


def _price(plan: Plan) -> float:
    pred = plan.rationale.prediction
    assert pred is not None and pred.cost_per_hour is not None
    return pred.cost_per_hour


class _Search:
    """The oracle calls and the best plans seen, shared by both searches."""

    def __init__(self, problem: Problem, runner: Runner, nodes: Sequence[NodeDescriptor]) -> None:
        self.problem = problem
        self.runner = runner
        self.nodes = list(nodes)
        self.speed = _speed(problem.constraints)
        self.target = problem.constraints.target_tokens_per_s or 0.0
        self.planned = 0
        self.best_rate: float | None = None
        self.found: Plan | None = None

    @cached_property
    def cm(self) -> CostModel:
        """The cost model of the offered nodes (by price), for the one-node check and the MILP."""
        return CostModel(self.problem.model, self.nodes, self.speed)

    def try_set(self, members: Sequence[int]) -> Plan | None:
        """The plan of ``members`` when it meets the target (and is the cheapest so far)."""
        try:
            plan = self.runner(
                prepare(self.problem.model, [self.nodes[i] for i in members], self.speed)
            )
        except PlanError:
            return None
        finally:
            self.planned += 1
        rate = served_rate(plan)
        self.best_rate = rate if self.best_rate is None else max(self.best_rate, rate)
        if rate < self.target:
            return None
        if self.found is None or (_price(plan), rate) < (
            _price(self.found),
            served_rate(self.found),
        ):
            self.found = plan
        return plan


def plan_cheapest(problem: Problem, runner: Runner) -> Plan:
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
    search = _Search(problem, runner, nodes)
    _singles(search)
    try:
        how = _milp_search(search)
    except DependencyError:
        how = _best_first(search)
    if search.found is not None:
        rate = served_rate(search.found)
        return _with_note(
            search.found,
            f"cheapest node set meeting {target:g} tokens/s: ${_price(search.found):.2f}/h for "
            f"{rate:.2f} tokens/s ({how}, {search.planned} sets planned)",
        )
    try:
        fastest = runner(prepare(problem.model, list(problem.nodes), search.speed))
        reach: float | None = served_rate(fastest)
    except PlanError:
        reach = None
    if reach is None or reach < target:
        got = "no plan" if reach is None else f"{reach:.2f} tokens/s"
        raise Infeasible(
            f"no node set reaches {target:g} tokens/s: the fastest plan on all "
            f"{len(problem.nodes)} nodes gives {got}"
        )
    raise Infeasible(
        f"the search stopped after {search.planned} sets planned ({how}) without meeting "
        f"{target:g} tokens/s; all nodes together give {reach:.2f} tokens/s"
    )


def _singles(search: _Search) -> None:
    """The cheapest node that meets the target alone, planned."""
    if search.problem.min_stages > 1:
        return
    cm = search.cm
    nb = cm.num_blocks
    for d in range(len(search.nodes)):  # by price, then id
        if cm.fits(d, 0, nb, True, True):
            rate = cm.evaluate([d], [0, nb]).served_tokens_per_s
            if rate >= search.target and search.try_set([d]) is not None:
                return


def _milp_search(search: _Search) -> str:
    """Sets of two or more nodes from the MILP, cheapest first, each checked by the planner."""
    try:
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp
    except ImportError:
        raise DependencyError("scipy", "exact") from None
    problem = search.problem
    cm = search.cm
    n, nb = len(search.nodes), cm.num_blocks
    lo_n = max(2, problem.min_stages)
    hi_n = min(problem.max_stages, n)
    if hi_n < lo_n:
        return "no set of two or more nodes is allowed"
    rd, kvr, mem = cm.smallest_block()
    rate = [cm.block_seconds(d, rd + kvr, rd) for d in range(n)]
    cap = [min(w, nb) for w in cm.max_window()]
    latency = cm.batch == 1
    slack = 1 + 1e-9
    if not latency:
        most = cm.batch / search.target * slack  # the slowest stage may take this long
        cap = [
            c if r <= 0 else min(c, math.floor(most / r)) for c, r in zip(cap, rate, strict=True)
        ]
    total = (cm.mem_prefix[nb] + cm.embed + cm.head) * 1e-9
    gb = 1e-9
    # Variables: x_d (bought), k_d (blocks), f_d (holds the embed), l_d (holds the head).
    nv = 4 * n
    rows: list[Sequence[float]] = []
    lower: list[float] = []
    upper: list[float] = []

    def row(coeffs: dict[int, float], lo: float, hi: float) -> None:
        r = [0.0] * nv
        for col, v in coeffs.items():
            r[col] = v
        rows.append(r)
        lower.append(lo)
        upper.append(hi)

    row({n + d: 1.0 for d in range(n)}, nb, nb)
    row(dict.fromkeys(range(n), 1.0), lo_n, hi_n)
    row({d: cm.usable[d] * 1e-9 for d in range(n)}, total * (1 - 1e-12), math.inf)
    row({2 * n + d: 1.0 for d in range(n)}, 1, 1)
    row({3 * n + d: 1.0 for d in range(n)}, 1, 1)
    for d in range(n):
        row({n + d: 1.0, d: -float(cap[d])}, -math.inf, 0.0)
        row({2 * n + d: 1.0, 3 * n + d: 1.0, d: -1.0}, -math.inf, 0.0)
        # Every block at least as big as the smallest, plus the anchors the node holds.
        row(
            {n + d: mem * gb, 2 * n + d: cm.embed * gb, 3 * n + d: cm.head * gb},
            -math.inf,
            cm.usable[d] * gb * (1 + 1e-12),
        )
    if latency:
        head = min(min(cm.head * cm.inv_bw[d], cm.head * cm.flop_s_per_byte[d]) for d in range(n))
        budget = (1.0 / search.target + max(cm.xfer_s) - head) * slack
        coeffs = {d: cm.latency_s[d] + cm.xfer_s[d] + cm.stage_s[d] for d in range(n)}
        coeffs.update({n + d: rate[d] for d in range(n)})
        row(coeffs, -math.inf, budget)
    price = np.array([node.price_per_hour or 0.0 for node in search.nodes] + [0.0] * 3 * n)
    bounds = Bounds(np.zeros(nv), np.array([1.0] * n + [float(c) for c in cap] + [1.0] * 2 * n))
    cuts = 0
    while search.planned < MAX_PLANNED:
        res = milp(
            price,
            integrality=np.ones(nv),
            bounds=bounds,
            constraints=LinearConstraint(np.array(rows), np.array(lower), np.array(upper)),
            options={"time_limit": 10.0},
        )
        if res.status != 0 or res.x is None:
            break  # no further set can meet the target (or HiGHS ran out of time)
        if search.found is not None and res.fun >= _price(search.found) - 1e-9:
            break  # the cheapest remaining set costs at least what is found
        members = [d for d in range(n) if res.x[d] > 0.5]
        if search.try_set(members) is not None:
            break
        # The planner may leave nodes unused, so no set within this one does better:
        # cut them all off (at least one node from outside it).
        inside = set(members)
        row({d: 1.0 for d in range(n) if d not in inside}, 1.0, math.inf)
        cuts += 1
    return f"MILP over node sets, {cuts} cut off"


def _best_first(search: _Search) -> str:
    """Sets visited in order of price (a heap of subsets), within :data:`MAX_VISITED`."""
    problem = search.problem
    nodes = search.nodes
    need = problem.total_bytes
    usable = [problem.usable[n.id] for n in nodes]
    price = [n.price_per_hour or 0.0 for n in nodes]
    # Subsets as increasing index tuples: children extend by a later node or replace the
    # last with the next one; both cost at least as much as the parent.
    heap: list[tuple[float, tuple[int, ...]]] = [(price[0], (0,))]
    visited = 0
    while heap and visited < MAX_VISITED and search.planned < MAX_PLANNED:
        cost, members = heapq.heappop(heap)
        if search.found is not None and cost >= _price(search.found) - 1e-9:
            break
        visited += 1
        last = members[-1]
        if last + 1 < len(nodes):
            heapq.heappush(heap, (cost + price[last + 1], (*members, last + 1)))
            heapq.heappush(heap, (cost - price[last] + price[last + 1], (*members[:-1], last + 1)))
        if len(members) < 2 or len(members) > problem.max_stages:
            continue
        if sum(usable[i] for i in members) < need:
            continue
        if search.try_set(members) is not None:
            break
    return f"best-first over {visited} sets"


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
