"""``objective="cost"``: the cheapest node set whose optimal plan meets a target rate.

The target is the rate the workload gets: tokens/s of all U concurrent sequences,
U / cycle (at U = 1, 1 / time per token).

One node alone is checked outright.  Sets of two or more come from a MILP
(HiGHS via ``scipy.optimize.milp``, :mod:`stowplan.planner.exact.node_sets`) over
which nodes to buy, minimising their price subject to the cost model's own
stage-time, hop and memory terms: at one sequence and with blocks alike exact
(a set is allowed exactly when a pipeline of its nodes meets the target), a
relaxation otherwise (every set that can meet the target is allowed).

A target above what the nodes can reach at all is refused first, before any set is
planned, on fleets of single-GPU nodes: :func:`reach_bound` bounds the tokens/s of every
pipeline of them by the cycle's closed-form lower bound
(:func:`stowplan.planner.strategies.cycle.quick_bound`).

The planner is the oracle: the MILP's set is planned; if its plan meets the
target it is the answer (no cheaper set satisfies the MILP, so none can meet
the target); otherwise every set within it is cut off (the planner may leave
nodes of a set unused, so none of them does better) and the MILP is solved
again.  The plan's own price is reported.  Because the MILP is exact for
alike blocks, the first set it gives is almost always the answer.

Without scipy the sets are visited best-first by price instead, within a
budget.  :func:`reporting_progress` lets a caller watch the search.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from functools import cached_property

from stowplan.cost import CostModel, served_tokens_per_s
from stowplan.errors import DependencyError, Infeasible, InputError, PlanError, TargetUnreached
from stowplan.model import Constraints, NodeDescriptor, Objective, gpu_group_node
from stowplan.plan import Plan, PlanRationale
from stowplan.planner.exact.node_sets import SetMilp
from stowplan.planner.problem import Problem, prepare
from stowplan.planner.strategies.cycle import quick_bound, stage_counts
from stowplan.rules.tensor_parallel import legal_tensor_parallel

__all__ = [
    "MAX_PLANNED",
    "MAX_VISITED",
    "SearchProgress",
    "plan_cheapest",
    "reach_bound",
    "reporting_progress",
    "served_rate",
]

MAX_VISITED = 20000
"""Most node sets the best-first search (without scipy) visits."""
MAX_PLANNED = 200
"""Most node sets either search plans."""

Runner = Callable[[Problem], Plan]


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchProgress:
    """Where a cheapest-set search stands."""

    planned: int
    """Node sets planned so far."""
    budget: int
    """Most node sets the search plans (:data:`MAX_PLANNED`)."""
    bound: float | None
    """$/hour no set meeting the target can cost less than (None: not known yet)."""
    best: float | None
    """$/hour of the cheapest set found meeting the target (None: none yet)."""


_PROGRESS: ContextVar[Callable[[SearchProgress], None] | None] = ContextVar(
    "stowplan_search_progress", default=None
)


@contextmanager
def reporting_progress(callback: Callable[[SearchProgress], None]) -> Iterator[None]:
    """Within the block, cheapest-set searches call ``callback`` as they go."""
    token = _PROGRESS.set(callback)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


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
        self.bound: float | None = None

    def report(self, *, bound: float | None = None) -> None:
        """Tell the caller's progress callback (if any) where the search stands."""
        if bound is not None:
            self.bound = bound
        callback = _PROGRESS.get()
        if callback is not None:
            callback(
                SearchProgress(
                    planned=self.planned,
                    budget=MAX_PLANNED,
                    bound=self.bound,
                    best=None if self.found is None else _price(self.found),
                )
            )

    @cached_property
    def cm(self) -> CostModel:
        """The cost model of the offered nodes (by price), each node one stage on all its GPUs."""
        return CostModel(self.problem.model, self.nodes, self.speed)

    @cached_property
    def grouped(self) -> bool:
        """Some node has several GPUs, which the planner may split into stages of GPU groups."""
        return any(n.num_gpus > 1 for n in self.nodes)

    @cached_property
    def bound_cm(self) -> CostModel:
        """:attr:`cm`, or with GPU groups every node as fast as any grouping of its GPUs could
        be: what the one-node check and the MILP use, so neither rules out a set the planner
        could make meet the target."""
        if not self.grouped:
            return self.cm
        return CostModel(self.problem.model, self.nodes, self.speed).relax_groups()

    def try_set(self, members: Sequence[int]) -> Plan | None:
        """The plan of ``members`` when it meets the target (and is the cheapest so far)."""
        try:
            return self._try(members)
        finally:
            self.report()

    def _try(self, members: Sequence[int]) -> Plan | None:
        self.planned += 1
        try:
            plan = self.runner(
                prepare(self.problem.model, [self.nodes[i] for i in members], self.speed)
            )
        except PlanError:
            return None
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
    _beyond_reach(problem, nodes, target)
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


def reach_bound(problem: Problem, nodes: Sequence[NodeDescriptor]) -> float:
    """Tokens/s no plan of ``problem``'s model on any of ``nodes`` can serve beyond:
    ``U / c`` at ``U = problem.constraints.batch`` sequences, ``c`` the least over the
    stage counts allowed of :func:`~stowplan.planner.strategies.cycle.quick_bound` (a lower
    bound on the cycle of every pipeline of that many stages, on the cost model the
    planner scores them by).  With multi-GPU nodes the stage counts run to their GPUs and
    every node is as fast as any grouping of its GPUs
    (:meth:`~stowplan.cost.CostModel.relax_groups`), which holds while no split of a node
    reads or computes faster than the whole node (else inf: the search decides).
    0 when the nodes cannot hold the model; inf when no bound applies."""
    try:
        whole = prepare(problem.model, list(nodes), _speed(problem.constraints))
    except PlanError:
        return 0.0
    cm = whole.cost_model()
    counts: Sequence[int] = stage_counts(whole)
    layouts = any(n.num_gpus > 1 for n in nodes)
    if layouts:
        if not _splits_never_faster(whole, cm):
            return math.inf
        cm = cm.relax_groups()
        gpus = sum(n.num_gpus for n in nodes)
        top = min(whole.constraints.max_stages or gpus, gpus, whole.model.num_blocks)
        counts = range(whole.min_stages, top + 1)
    cycle = min((quick_bound(whole, cm, s, layouts=layouts) for s in counts), default=math.inf)
    return cm.batch / cycle if cycle > 0 else math.inf


def _splits_never_faster(problem: Problem, cm: CostModel) -> bool:
    """Whether every multi-GPU node reads and computes at least as fast whole as split
    into groups of any legal degree (their rates summed), as the cost model rates them:
    what makes the whole node's rates a bound on any grouping's."""
    seen: set[tuple[object, ...]] = set()
    for d, node in enumerate(problem.nodes):
        key = (node.gpu_name, node.num_gpus, node.mem_bandwidth_gbps, node.flops_estimate)
        if node.num_gpus == 1 or key in seen:
            continue
        seen.add(key)
        for t in legal_tensor_parallel(problem.model, node.num_gpus):
            part = CostModel(
                problem.model, [gpu_group_node(node, 0, t)], problem.constraints, parents=[node.id]
            )
            groups = node.num_gpus // t
            if groups * cm.inv_bw[d] > part.inv_bw[0] * (1 + 1e-12) or groups * cm.flop_s_per_byte[
                d
            ] > part.flop_s_per_byte[0] * (1 + 1e-12):
                return False
    return True


def _beyond_reach(problem: Problem, nodes: Sequence[NodeDescriptor], target: float) -> None:
    """Refuse ``target`` at once when it is above :func:`reach_bound`."""
    reach = reach_bound(problem, nodes)
    if reach <= 0 or target <= reach * (1 + _REACH_SLACK):
        return  # the search decides (and refuses a fleet that holds nothing)
    batch = problem.constraints.batch
    sequences = f"{batch:,} sequence{'' if batch == 1 else 's'}"
    fleet = "the one node" if len(nodes) == 1 else f"the {len(nodes):,} nodes"
    raise TargetUnreached(
        target,
        reach,
        f"no node set reaches {target:g} tokens/s (target_tokens_per_s): no pipeline of "
        f"{fleet} serves more than {reach:.2f} tokens/s to {sequences} "
        "(a bound: every step reads the weights and KV at the fastest nodes' bandwidth, "
        "and a token crosses the cheapest hops and sends)",
    )


_REACH_SLACK = 1e-9
"""A target within this relative margin of :func:`reach_bound` is searched, not refused
(the bound and a plan's rate are rounded differently)."""


def _singles(search: _Search) -> None:
    """The cheapest node that meets the target alone (on its GPU groups, if it has several),
    planned."""
    cm = search.bound_cm
    nb = cm.num_blocks
    for d in range(len(search.nodes)):  # by price, then id
        if search.problem.min_stages > search.nodes[d].num_gpus:
            continue  # it cannot run that many stages
        if cm.fits(d, 0, nb, True, True):
            rate = cm.evaluate([d], [0, nb]).served_tokens_per_s
            if rate >= search.target and search.try_set([d]) is not None:
                return


def _milp_search(search: _Search) -> str:
    """Sets of two or more nodes from the MILP, cheapest first, each checked by the planner."""
    problem = search.problem
    n = len(search.nodes)
    hi_n = min(problem.max_stages, n)
    if hi_n < 2:
        return "no set of two or more nodes is allowed"
    sets = SetMilp(
        search.bound_cm,
        [node.price_per_hour or 0.0 for node in search.nodes],
        search.target,
        min_stages=problem.min_stages,
        max_stages=hi_n,
        stages_per_node=[n.num_gpus if search.grouped else 1 for n in search.nodes],
        split_block_s=_group_block_bounds(search) if search.grouped else None,
        dominance=search.cm,
    )
    cuts, proven = 0, True
    while search.planned < MAX_PLANNED:
        search.report(bound=None)
        choice = sets.solve()
        if choice is None:
            break  # no further set can meet the target
        proven = proven and choice.proven
        search.report(bound=choice.bound)
        if search.found is not None and choice.price >= _price(search.found) - 1e-9:
            break  # the cheapest remaining set costs at least what is found
        if search.try_set(choice.members) is not None:
            break
        # The planner may leave nodes unused, so no set within this one does better:
        # cut them all off (at least one node from outside it).
        sets.cut(choice.members)
        cuts += 1
    unproven = "" if proven else "; HiGHS stopped at its time limit, cheapest not proven"
    return f"MILP over node sets, {cuts} cut off{unproven}"


def _group_block_bounds(search: _Search) -> list[float]:
    """Per node, the least seconds its smallest block takes on any GPU group of it, one
    sequence per step (what a trip through the pipeline pays at least)."""
    cm = search.cm.at_microbatch(1)
    nb = cm.num_blocks
    read = min(
        cm.read_prefix[i + 1] - cm.read_prefix[i] + cm.kv_prefix[i + 1] - cm.kv_prefix[i]
        for i in range(nb)
    )
    weight = min(cm.read_prefix[i + 1] - cm.read_prefix[i] for i in range(nb))
    out = []
    for node in search.nodes:
        best = math.inf
        for tp in legal_tensor_parallel(search.problem.model, node.num_gpus) or (1,):
            group = CostModel(search.problem.model, [gpu_group_node(node, 0, tp)], search.speed)
            best = min(best, group.at_microbatch(1).block_seconds(0, read, weight))
        out.append(best)
    return out


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
