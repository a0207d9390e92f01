"""The replica of a composition: the pipeline the block planner places, and what it serves.

The replica of a node set is the pipeline the block planner
(:func:`~stowplan.planner.plan_blocks`, per-stage tensor parallel and engine rules
included) plans on those nodes for a batch of U requests with P + O tokens of KV
each, scored by :func:`~stowplan.cost.serving.pipeline_serving`; U is set from the
relaxation bound (:mod:`~stowplan.serving.bounds`), then refined towards the U* the
plans serve, and the best plan is kept.  A multi-GPU node may hold several replicas
side by side (:func:`split_of`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from stowplan.cost import CostModel
from stowplan.cost.serving import ReplicaServing, pipeline_serving, serving_constraints
from stowplan.errors import PlanError
from stowplan.model import Constraints, ModelLayout, NodeDescriptor, gpu_group_node, stage_node
from stowplan.plan import Plan
from stowplan.quantities.limits import MAX_BATCH
from stowplan.serving.bounds import FleetRates, rate_bound, users_bound
from stowplan.serving.exhaustive import best_pipeline
from stowplan.serving.node_groups import NodePipeline, NodeReplicas
from stowplan.workload import Binding, Workload

__all__ = [
    "REFINE_STEPS",
    "Candidate",
    "Split",
    "grouped_candidate",
    "replica_of",
    "scored",
    "settle",
    "split_of",
    "splits",
]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A replica on some nodes and what it serves."""

    plan: Plan
    serving: ReplicaServing
    node_ids: tuple[str, ...]
    """The physical nodes it uses, in stage order."""
    nodes: tuple[NodeDescriptor, ...] = ()
    """The planning nodes of ``plan``, in the same order: the physical nodes, or for a
    split the GPU group ``plan`` is on."""
    split: int = 1
    """Copies of the replica one node holds side by side (data parallel inside the
    node): ``plan`` is on GPUs ``[0, g/split)`` of node ``node_ids[0]``, the other
    copies on its next GPU ranges; ``serving`` is one copy's."""
    settled: bool = False
    """The plan for its own U* requests was tried (and kept only when it serves as
    many): :func:`settle` has nothing left to do."""
    reused: bool = False
    """``plan`` was planned on other nodes of the same types (alike but for their ids,
    prices and links) and renamed onto ``nodes``; ``serving`` is scored on ``nodes``,
    the plan's prediction still that of the first nodes until :func:`settle`."""

    @property
    def value_users(self) -> int:
        """Users of every copy the option holds."""
        return self.serving.users * self.split

    @property
    def value_rate(self) -> float:
        """Requests/s of every copy the option holds."""
        return self.serving.requests_per_s * self.split


def _score(
    model: ModelLayout, by_id: dict[str, NodeDescriptor], plan: Plan, c: Constraints, w: Workload
) -> ReplicaServing:
    units = [
        stage_node(by_id[a.node_id], a.gpu_indices, a.tensor_parallel) for a in plan.assignments
    ]
    parents = [a.node_id for a in plan.assignments]
    cm = CostModel(model, units, serving_constraints(w, c), parents=parents)
    bounds = [a.block_range[0] for a in plan.assignments] + [plan.assignments[-1].block_range[1]]
    return pipeline_serving(cm, list(range(len(units))), bounds, w)


def scored(
    model: ModelLayout, plan: Plan, nodes: Sequence[NodeDescriptor], w: Workload, c: Constraints
) -> ReplicaServing:
    """What ``plan``'s pipeline (its stages, blocks and GPUs) serves on ``nodes``, by
    :func:`~stowplan.cost.serving.pipeline_serving`."""
    return _score(model, {n.id: n for n in nodes}, plan, c, w)


def replica_of(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    w: Workload,
    c: Constraints,
    start_users: int,
) -> Candidate | None:
    """The best replica the block planner finds on ``nodes`` (None: none serves a user).

    The plan for the bound's U requests (P + O tokens of KV each) first: when it serves
    some U* ≥ 1, the plan for U* itself (its KV reserve and microbatches then fit U*)
    is tried too and the better kept.  When no plan holds U requests, U is halved
    until one serves (straight to one request when the plan fits but misses the
    TTFT/TPOT limits even for one); that plan's U* is then refined the same way.
    The plan serving the most (then the lower TPOT) wins.
    """
    from stowplan.planner import plan_blocks

    tried_all, small = _tried_all(model, nodes, w, c)
    if tried_all:
        return small
    by_id = {n.id: n for n in nodes}
    tried: dict[int, Candidate | None] = {}

    def attempt(u: int) -> Candidate | None:
        if u in tried:
            return tried[u]
        try:
            found = plan_blocks(model, nodes, replace(serving_constraints(w, c), batch=u))
        except PlanError:
            tried[u] = None
            return None
        got = _score(model, by_id, found, c, w)
        ids = tuple(dict.fromkeys(a.node_id for a in found.assignments))
        cand = Candidate(plan=found, serving=got, node_ids=ids, nodes=tuple(by_id[i] for i in ids))
        tried[u] = cand
        return cand

    def served(cand: Candidate | None) -> bool:
        return cand is not None and cand.serving.users >= 1

    hi = max(1, min(start_users, MAX_BATCH))
    u = hi
    best = attempt(u)
    while not served(best) and u > 1:
        # No plan for ``u`` requests serves one: halve U until one does — or go straight
        # to one request when the plan fits but misses the TTFT/TPOT limits even for one
        # (the reserve for fewer requests is what halving would buy).
        hi = u - 1
        u = 1 if best is not None and best.serving.binding is not Binding.MEMORY else u // 2
        best = attempt(u)
    if best is None or not served(best):
        return None
    # Bisect between what is served and what was asked, a few steps: a plan for fewer
    # requests reserves less KV and may split the blocks so that it serves more.
    lo = best.serving.users
    for _ in range(REFINE_STEPS):
        if lo >= hi:
            break
        mid = (lo + hi + 1) // 2
        got = attempt(mid)
        if got is not None and not _better(got, best) and _shape(got) == _shape(best):
            break  # the plan for fewer requests is the same pipeline: it serves no more
        if got is not None and _better(got, best):
            best = got
        if got is not None and got.serving.users >= mid:
            lo = max(lo, got.serving.users)
        else:
            hi = mid - 1
        lo = max(lo, best.serving.users)
    again = attempt(min(best.serving.users, MAX_BATCH))
    if again is not None and _better(again, best):
        best = again
    return replace(best, settled=True)


REFINE_STEPS = 6
"""Bisection steps :func:`replica_of` takes between the users served and those asked."""


def _tried_all(
    model: ModelLayout, nodes: Sequence[NodeDescriptor], w: Workload, c: Constraints
) -> tuple[bool, Candidate | None]:
    """On single-GPU nodes with few pipelines (one or two nodes; more for a model of few
    blocks), (True, the replica of the pipeline serving the most of every one tried
    (:func:`~stowplan.serving.exhaustive.best_pipeline`), planned for its own U*; None when
    none serves a request); (False, None) for larger sets."""
    from stowplan.model import Strategy
    from stowplan.planner.certify import finish
    from stowplan.planner.problem import prepare

    if c.tensor_parallel not in (None, 1):
        return False, None
    found = best_pipeline(model, nodes, w, c, by_rate=False)
    if found is None:
        return False, None
    order, bounds, serving = found
    if serving is None:
        return True, None
    problem = prepare(model, nodes, replace(serving_constraints(w, c), batch=serving.users))
    cm = problem.cost_model()
    index = {n.id: i for i, n in enumerate(cm.nodes)}
    pipeline = ([index[nodes[d].id] for d in order], bounds)
    note = "replica: every pipeline of its nodes tried, this one serves the most users"
    plan = finish(problem, cm, Strategy.EXACT, pipeline, notes=(note,), break_ties=False)
    by_id = {n.id: n for n in nodes}
    ids = tuple(nodes[d].id for d in order)
    return True, Candidate(
        plan=plan,
        serving=serving,  # the plan's pipeline, scored by the search
        node_ids=ids,
        nodes=tuple(by_id[i] for i in ids),
        settled=True,
    )


def grouped_candidate(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    w: Workload,
    c: Constraints,
    found: NodeReplicas,
    *,
    by_rate: bool,
) -> Candidate | None:
    """The replicas of :func:`~stowplan.serving.node_groups.best_node_replicas`'s value
    ``found`` on ``nodes`` (one multi-GPU node, perhaps single-GPU nodes) as a candidate:
    one pipeline of the node's GPU groups (and the single nodes), or copies of one
    pipeline side by side on equal parts of the node's GPUs; None when the value takes
    replicas of unlike shapes, or their plan does not serve what the search scored."""
    node = next(n for n in nodes if n.num_gpus > 1)
    g = node.num_gpus
    top = found.best.get(g)
    if top is not None and _node_value(top, by_rate) >= found.value:
        pipe, copies = top, 1
    else:
        parts = found.parts
        if not parts or len(set(parts)) != 1 or g % parts[0]:
            return None
        part = found.best.get(parts[0])
        if part is None or min(part.sizes) < 0:
            return None
        pipe, copies = part, len(parts)
        if _node_value(pipe, by_rate) * copies < found.value:
            return None
    return _grouped_plan(model, nodes, node, w, c, pipe, copies)


def _grouped_plan(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    node: NodeDescriptor,
    w: Workload,
    c: Constraints,
    pipe: NodePipeline,
    copies: int,
) -> Candidate | None:
    """The plan of ``pipe`` (stage ``s`` a group of ``pipe.sizes[s]`` of ``node``'s GPUs,
    or single node ``-1 - i`` of ``nodes``' single-GPU nodes), scored on its own GPUs."""
    from stowplan.model import Strategy
    from stowplan.planner.certify import finish
    from stowplan.planner.problem import prepare
    from stowplan.planner.tensor.layouts import as_pipeline

    singles = [n for n in nodes if n.num_gpus == 1]
    used = [node] + [singles[-1 - t] for t in pipe.sizes if t < 0]
    u = pipe.serving.users
    try:
        problem = prepare(model, used, replace(serving_constraints(w, c), batch=u))
        stages = [
            (node.id if t > 0 else singles[-1 - t].id, max(t, 1), lo, hi)
            for t, lo, hi in zip(pipe.sizes, pipe.bounds, pipe.bounds[1:], strict=False)
        ]
        vp, pipeline = as_pipeline(problem, stages)
        note = (
            "replica: every grouping of the node's GPUs and every pipeline of the groups "
            "tried, this one serves the most"
        )
        plan = finish(
            vp, vp.cost_model(), Strategy.EXACT, pipeline, notes=(note,), break_ties=False
        )
    except PlanError:
        return None
    by_id = {n.id: n for n in used}
    got = _score(model, by_id, plan, c, w)
    if (got.users, got.requests_per_s) < (u, pipe.serving.requests_per_s * (1 - 1e-9)):
        return None
    ids = tuple(dict.fromkeys(a.node_id for a in plan.assignments))
    return Candidate(
        plan=plan,
        serving=got,
        node_ids=ids,
        nodes=tuple(by_id[i] for i in ids),
        split=copies,
        settled=True,
    )


def _node_value(p: NodePipeline, by_rate: bool) -> float:
    return p.serving.requests_per_s if by_rate else float(p.serving.users)


def _shape(c: Candidate) -> tuple[tuple[object, ...], ...]:
    return tuple(
        (a.node_id, a.block_range, a.tensor_parallel, a.gpu_indices) for a in c.plan.assignments
    )


def _better(a: Candidate, b: Candidate) -> bool:
    return (a.serving.users, -a.serving.tpot_s) > (b.serving.users, -b.serving.tpot_s)


@dataclass(frozen=True, slots=True)
class Split:
    """g/d replicas of d GPUs side by side on one node of g GPUs."""

    group: NodeDescriptor
    """GPUs ``[0, d)`` of the node, as a planning node."""
    copies: int
    users_bound: int
    """The users bound of one copy."""
    bound: float
    """The bound of all copies together (users, or requests/s)."""


def splits(
    model: ModelLayout, node: NodeDescriptor, w: Workload, c: Constraints, *, by_rate: bool
) -> list[Split]:
    """Per divisor d < g of ``node``'s GPUs, its :class:`Split` and what all copies serve at
    most (users, or requests/s with ``by_rate``)."""
    g = node.num_gpus
    out = []
    for d in (d for d in range(1, g) if g % d == 0):
        group = gpu_group_node(node, 0, d)
        rates = FleetRates.of(model, [group], replace(c, batch=1), w)
        ub = users_bound(rates, [0], w)
        copies = g // d
        bound = copies * (rate_bound(rates, [0], w) if by_rate else ub)
        out.append(Split(group=group, copies=copies, users_bound=ub, bound=bound))
    return out


def split_of(
    plan_replica: Callable[[Sequence[NodeDescriptor], int], Candidate | None],
    node: NodeDescriptor,
    options: Sequence[Split],
    *,
    by_rate: bool,
    beat: float,
) -> Candidate | None:
    """The best of ``options`` (:func:`splits` of multi-GPU ``node``) serving more than
    ``beat`` in all (users, or requests/s with ``by_rate``); None when none does.
    ``plan_replica(nodes, users)`` plans a replica (:func:`replica_of`, or a memo of
    it).  Splits whose bound cannot beat the best so far are not planned."""
    best: Candidate | None = None
    for sp in sorted(options, key=lambda sp: -sp.bound):
        if sp.users_bound < 1 or sp.bound <= beat:
            continue
        cand = plan_replica([sp.group], sp.users_bound)
        if cand is None:
            continue
        cand = replace(cand, node_ids=(node.id,), split=sp.copies)
        got = cand.value_rate if by_rate else float(cand.value_users)
        if got > beat:
            best, beat = cand, got
    return best


def settle(model: ModelLayout, cand: Candidate, w: Workload, c: Constraints) -> Candidate:
    """``cand`` planned again for its own U* requests on its own nodes (so the plan's KV
    reserve and prediction are those of U*), when that plan serves as many; else
    ``cand`` (a :attr:`~Candidate.reused` plan with its prediction made on its own
    nodes)."""
    from stowplan.planner import plan_blocks

    u = cand.serving.users
    pred = cand.plan.rationale.prediction
    if not cand.reused and (cand.settled or (pred is not None and pred.batch == u)):
        return cand
    nodes = list(cand.nodes)
    if not nodes:
        return cand
    try:
        found = plan_blocks(model, nodes, replace(serving_constraints(w, c), batch=u))
    except PlanError:
        return _predicted(model, cand, w, c)
    got = _score(model, {n.id: n for n in nodes}, found, c, w)
    if (got.users, -got.tpot_s) < (u, -cand.serving.tpot_s):
        return _predicted(model, cand, w, c)
    return replace(cand, plan=found, serving=got, reused=False)


def _predicted(model: ModelLayout, cand: Candidate, w: Workload, c: Constraints) -> Candidate:
    """``cand`` with its plan's prediction (and the note telling it) made on its own
    nodes, when the plan was planned on others (:attr:`Candidate.reused`)."""
    from stowplan.cost.predict import predict
    from stowplan.planner.certify import prediction_note

    plan = cand.plan
    pred = plan.rationale.prediction
    if not cand.reused or pred is None:
        return cand
    fresh = predict(
        model, list(cand.nodes), replace(serving_constraints(w, c), batch=pred.batch), plan
    )
    fresh = replace(fresh, calibration=pred.calibration)
    old_note = prediction_note(pred, len(plan.assignments))
    new_note = prediction_note(fresh, len(plan.assignments))
    notes = tuple(new_note if n == old_note else n for n in plan.rationale.notes)
    rationale = replace(plan.rationale, prediction=fresh, notes=notes)
    return replace(cand, plan=replace(plan, rationale=rationale), reused=False)
