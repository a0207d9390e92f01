"""Tensor parallel inside nodes × pipeline across them: which GPUs of a node form a stage.

A node of ``G`` GPUs can run one stage on all of them (``tp = G``), or be split
into several stages on disjoint GPU groups (``G / tp`` groups of ``tp``), or be
left out.  Each group is planned as a node of its own (its share of the node's
VRAM, bandwidth and FLOPs, ``num_gpus = tp``; :class:`GpuGroup` remembers where
it came from), so every strategy plans over groups unchanged and the cost model
charges each group its all-reduces and the cheaper hop to a group of the same
node.

Steps of :func:`plan_with_groups`:

1. The engine rule says which layouts are runnable: ``generic`` any legal
   degree per node; vLLM, SGLang and TensorRT-LLM one degree for every stage;
   llama.cpp and an Accelerate ``device_map`` one GPU per stage (layer split);
   ``Constraints.tensor_parallel`` one given degree.
2. Every uniform layout (each node split into groups of the same degree) is
   planned by the strategy; the best by the workload's objective is kept.
3. Under the generic rule, nodes then change their degree one at a time while
   that improves the plan (bounded by :data:`LOCAL_SEARCH_NODES`).
4. The optimum over every grouping the rule allows and every pipeline of the
   groups (:mod:`stowplan.planner.tensor_exact`: exact on small fleets, a bound
   beyond) certifies the plan, and replaces it when its pipeline is faster.
5. Under an engine rule the unconstrained plan is found too, and the plan says
   how far the engine's layout is from it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise

from stowplan.cost import microbatches
from stowplan.errors import DependencyError, Infeasible, InputError, PlanError
from stowplan.model import NodeDescriptor, Strategy, gpu_group_node
from stowplan.parallel_rules import legal_tensor_parallel, tensor_parallel_violation
from stowplan.plan import Plan
from stowplan.planner import cycle
from stowplan.planner.certify import finish
from stowplan.planner.common import GpuGroup, Problem, prepare
from stowplan.planner.exact import Optimum
from stowplan.planner.tensor_exact import (
    GROUPED_NODE_LIMIT,
    GroupedOptimum,
    degrees,
    grouped_bound,
    grouped_work,
    node_signature,
    solve_grouped,
)
from stowplan.planner.throughput import Pipeline

__all__ = [
    "LOCAL_SEARCH_NODES",
    "EngineRule",
    "Layout",
    "describe_groups",
    "engine_rule",
    "expand",
    "plan_with_groups",
    "with_fixed_degree",
]

Layout = Mapping[str, tuple[int, ...]]
"""Per physical node id, the sizes of its GPU groups (their sum at most its GPUs)."""

LOCAL_SEARCH_NODES = 16
"""Step 3 runs on fleets of up to this many multi-GPU nodes (when the joint solve of
step 4 is not exact on them)."""
LOCAL_SEARCH_TRIALS = 24
"""Most plans step 3 tries."""
INLINE_GROUPED_WORK = 200_000_000
"""Every plan is certified by the exact joint solve while its work (element operations,
:func:`~stowplan.planner.tensor_exact.grouped_work`) stays within this; beyond, a bound."""

Runner = Callable[[Problem], Plan]


@dataclass(frozen=True, slots=True)
class EngineRule:
    """What layouts an engine runs: the degrees a stage may use, uniform or per node."""

    name: str
    degrees: tuple[int, ...] | None
    """Allowed degrees (None: every legal one)."""
    uniform: bool
    """One degree for every stage of the plan."""
    consecutive: bool = False
    """A node's stages follow each other in pipeline order (the engine ranks a node's GPUs
    together)."""

    def allows(self, tp: int) -> bool:
        return self.degrees is None or tp in self.degrees


_ENGINE_EXPORTS = {"vLLM": "vllm", "SGLang": "sglang"}
"""Engines whose exports need a node order of their own (see :func:`_engine_fit`)."""
_UNIFORM_ENGINES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
_LAYER_ENGINES = {"llamacpp": "llama.cpp (layer split)", "transformers": "Accelerate device_map"}


def engine_rule(problem: Problem) -> EngineRule:
    """The layouts ``problem``'s constraints allow (its engine, its fixed degree)."""
    c = problem.constraints
    if c.tensor_parallel is not None:
        return EngineRule(f"tensor_parallel={c.tensor_parallel}", (c.tensor_parallel,), True)
    engine = c.calibration.engine.value if c.calibration is not None else "generic"
    if engine in _UNIFORM_ENGINES:
        return EngineRule(_UNIFORM_ENGINES[engine], None, True, consecutive=True)
    if engine in _LAYER_ENGINES:
        return EngineRule(_LAYER_ENGINES[engine], (1,), True)
    return EngineRule("generic", None, False)


def expand(problem: Problem, layout: Layout) -> Problem:
    """The problem whose planning nodes are ``layout``'s GPU groups (nodes absent from
    ``layout`` stay whole; a node given no group is left out)."""
    nodes: list[NodeDescriptor] = []
    groups: dict[str, GpuGroup] = {}
    for node in problem.nodes:
        sizes = layout.get(node.id)
        if sizes is None:
            nodes.append(node)
            continue
        start = 0
        for size in sorted(sizes, reverse=True):
            group = gpu_group_node(node, start, size)
            gid = group.id
            nodes.append(group)
            if node.num_gpus > 1:
                groups[gid] = GpuGroup(
                    node_id=node.id,
                    tensor_parallel=size,
                    gpu_indices=tuple(range(start, start + size)),
                )
            start += size
    return prepare(problem.model, nodes, problem.constraints, groups)


def _groups(problem: Problem, node: NodeDescriptor, tp: int) -> tuple[int, ...]:
    """``node`` split into groups of ``tp`` GPUs: as many as fit, but never more than
    there can be stages."""
    cap = problem.constraints.max_stages
    most = min(node.num_gpus // tp, problem.model.num_blocks, cap or problem.model.num_blocks)
    return (tp,) * most


def _uniform(problem: Problem, tp: int) -> dict[str, tuple[int, ...]]:
    """Every node split into groups of ``tp`` GPUs (a node with fewer is left out)."""
    return {n.id: _groups(problem, n, tp) for n in problem.nodes}


def _options(problem: Problem, rule: EngineRule, node: NodeDescriptor) -> list[tuple[int, ...]]:
    """The splits of ``node`` the rule and the model allow, largest groups first: groups of
    one degree, and (without a uniform rule) the GPUs they leave over in the largest
    smaller groups (3 GPUs of a model that takes 1, 2, 4: groups of 2 and 1)."""
    legal = sorted(
        (t for t in legal_tensor_parallel(problem.model, node.num_gpus) if rule.allows(t)),
        reverse=True,
    )
    out = []
    for t in legal:
        sizes = list(_groups(problem, node, t))
        left = node.num_gpus - sum(sizes)
        if not rule.uniform and len(sizes) == node.num_gpus // t:
            for smaller in legal:
                while smaller < t and smaller <= left:
                    sizes.append(smaller)
                    left -= smaller
        out.append(tuple(sizes))
    return list(dict.fromkeys(out))


def _value(plan: Plan, objective: str) -> float:
    """Lower is better: seconds per token, or minus tokens/s."""
    pred = plan.rationale.prediction
    assert pred is not None
    return pred.time_per_token_s if objective == "latency" else -pred.tokens_per_s


def _try(problem: Problem, runner: Runner, layout: Layout) -> Plan | None:
    if not any(layout.values()):
        return None
    try:
        return runner(expand(problem, layout))
    except PlanError:
        return None


def _search(
    problem: Problem, runner: Runner, rule: EngineRule, objective: str, local: bool = True
) -> tuple[Plan | None, Layout | None]:
    multi = [n for n in problem.nodes if n.num_gpus > 1]
    degrees = sorted(
        {t for n in multi for opts in _options(problem, rule, n) for t in opts}, reverse=True
    )
    layouts: list[Layout] = []
    if not rule.uniform:
        layouts.append({n.id: opts[0] for n in multi if (opts := _options(problem, rule, n))})
    layouts += [_uniform(problem, t) for t in degrees]
    best: tuple[float, Plan, Layout] | None = None
    seen: set[tuple[tuple[str, tuple[int, ...]], ...]] = set()
    for layout in layouts:
        key = tuple(sorted(layout.items()))
        if key in seen:
            continue
        seen.add(key)
        got = _try(problem, runner, layout)
        if got is not None and (best is None or _value(got, objective) < best[0]):
            best = (_value(got, objective), got, layout)
    if best is not None and local and not rule.uniform and len(multi) <= LOCAL_SEARCH_NODES:
        best = _improve(problem, runner, rule, objective, best, multi, seen)
    return (None, None) if best is None else (best[1], best[2])


def _improve(
    problem: Problem,
    runner: Runner,
    rule: EngineRule,
    objective: str,
    best: tuple[float, Plan, Layout],
    multi: Sequence[NodeDescriptor],
    seen: set[tuple[tuple[str, tuple[int, ...]], ...]],
) -> tuple[float, Plan, Layout]:
    """Change one node's split at a time while that lowers the objective (at most
    :data:`LOCAL_SEARCH_TRIALS` plans; nodes alike are tried once per round)."""
    trials = 0
    improved = True
    while improved:
        improved = False
        kinds: set[tuple[object, ...]] = set()
        for node in multi:
            kind = (node_signature(node), best[2].get(node.id))
            if kind in kinds:
                continue
            kinds.add(kind)
            for option in _options(problem, rule, node):
                layout = {**best[2], node.id: option}
                key = tuple(sorted(layout.items()))
                if key in seen:
                    continue
                seen.add(key)
                trials += 1
                if trials > LOCAL_SEARCH_TRIALS:
                    return best
                got = _try(problem, runner, layout)
                if got is not None and _value(got, objective) < best[0] * (1 - 1e-9):
                    best = (_value(got, objective), got, layout)
                    improved = True
    return best


def describe_groups(plan: Plan) -> str:
    """The GPU groups ``plan`` runs on, node by node: ``n0 tp8, n1 2×tp4``."""
    per_node: dict[str, list[int]] = {}
    for a in plan.assignments:
        per_node.setdefault(a.node_id, []).append(a.tensor_parallel)
    parts = []
    for node_id, tps in per_node.items():
        kinds = sorted(set(tps), reverse=True)
        text = " + ".join(f"{tps.count(t)}×tp{t}" if tps.count(t) > 1 else f"tp{t}" for t in kinds)
        parts.append(f"{node_id} {text}")
    return ", ".join(parts)


def _exact_allowed(rule: EngineRule, problem: Problem) -> list[tuple[int, ...] | None]:
    """The degree sets the joint solve runs with: one per degree under a uniform rule."""
    if not rule.uniform:
        return [rule.degrees]
    if rule.degrees is not None:
        return [rule.degrees]
    return [(t,) for t in sorted({t for n in problem.nodes for t in degrees(problem, n, None)})]


def _joint_optimum(
    problem: Problem, rule: EngineRule, objective: str, runs: bool, lossless: bool
) -> tuple[float, bool, str, GroupedOptimum | None]:
    """The optimum over every grouping the rule allows (exact on small fleets), or a bound:
    (seconds, exact?, method, its pipeline).  ``runs``: :func:`_joint_runs`; ``lossless``:
    :func:`_adjacency_loses_nothing`."""
    sets = _exact_allowed(rule, problem)
    if runs:
        try:
            found = [solve_grouped(problem, objective, a, wrap=not rule.consecutive) for a in sets]
        except DependencyError:
            found = []
        else:
            got = [f for f in found if f is not None]
            best = min(got, key=lambda f: f.value) if got else None
            value = best.value if best is not None else math.inf
            if lossless:
                method = (
                    "joint dynamic programme over GPU groups and pipelines of "
                    f"{len(problem.nodes)} nodes"
                )
                return value, True, method, best
            # Blocks differ or a GPU link is dearer than the network: a pipeline that
            # interleaves nodes may be better, so the solve's value is no bound.
            bound = min(grouped_bound(problem, objective, a) for a in sets)
            method = "bound: fractional relaxation, every node at full bandwidth, no all-reduce"
            return min(bound, value), False, method, best
    bound = min(grouped_bound(problem, objective, a) for a in sets)
    return (
        bound,
        False,
        "bound: fractional relaxation, every node at full bandwidth, no all-reduce",
        None,
    )


def _joint_cycle(
    problem: Problem, rule: EngineRule, runs: bool, lossless: bool, plan_cycle: float
) -> tuple[float, bool, str, GroupedOptimum | None]:
    """:func:`_joint_optimum` for U > 1 concurrent sequences: a lower bound on the cycle,
    per stage count S the largest of its quick bound, m × the least slowest stage and the
    least time per token, both at S's microbatch over every grouping (any stage count:
    a bound for S); and the better by cycle of the two solves' pipelines."""
    cm = problem.cost_model()
    total = sum(n.num_gpus for n in problem.nodes)
    top = min(problem.constraints.max_stages or total, total, problem.model.num_blocks)
    solved: dict[int, tuple[float, float, list[GroupedOptimum], set[str]]] = {}
    lower = math.inf
    for s in range(problem.min_stages, top + 1):
        bound = cycle.quick_bound(problem, cm, s)
        if bound < plan_cycle and math.isfinite(bound):
            m, u = microbatches(cm.batch, s)
            if u not in solved:
                pu = replace(problem, microbatch=u)
                b = _joint_optimum(pu, rule, "throughput", runs, lossless)
                t = _joint_optimum(pu, rule, "latency", runs, lossless)
                found = [g for g in (b[3], t[3]) if g is not None and g.stages]
                solved[u] = (b[0], t[0], found, {b[2], t[2]})
            slowest, trip, _, _ = solved[u]
            bound = max(bound, m * slowest, trip)
        lower = min(lower, bound)
    candidates = [g for _, _, got, _ in solved.values() for g in got]
    best = min(
        candidates,
        key=lambda g: _seconds(*_as_pipeline(problem, g.stages), "throughput"),
        default=None,
    )
    kinds = "; ".join(sorted({k for *_, ks in solved.values() for k in ks})) or "closed form"
    method = f"per stage count, max(m × slowest-stage bound, time-per-token bound): {kinds}"
    return lower, False, method, best


def _joint_runs(problem: Problem, rule: EngineRule, exact_strategy: bool) -> bool:
    """Whether step 4 solves exactly (small fleet, free stage count, affordable work)."""
    c = problem.constraints
    if len(problem.nodes) > GROUPED_NODE_LIMIT or (c.min_stages or 1) > 1:
        return False
    if c.max_stages is not None:
        return False
    work = sum(grouped_work(problem, a) for a in _exact_allowed(rule, problem))
    return exact_strategy or work <= INLINE_GROUPED_WORK


def _adjacency_loses_nothing(problem: Problem) -> bool:
    """Whether some optimal pipeline keeps each node's stages together around the cycle.

    With blocks alike a stage's time and memory depend on its block count and role only,
    so the stages between the first and the last can be reordered node by node; each
    node then sends over the network once, which costs no more than before whenever its
    GPU link is no dearer than its network link (transfer and hop).
    """
    cm = problem.cost_model()
    if not cm.uniform:
        return False
    return all(
        ix <= x and il <= lat
        for ix, x, il, lat in zip(
            cm.intra_xfer_s, cm.xfer_s, cm.intra_latency_s, cm.latency_s, strict=True
        )
    )


def _as_pipeline(
    problem: Problem, stages: Sequence[tuple[str, int, int, int]]
) -> tuple[Problem, Pipeline]:
    """The planning problem of these stages' GPU groups and the pipeline over it."""
    layout: dict[str, tuple[int, ...]] = {}
    for node_id, t, _, _ in stages:
        layout[node_id] = (*layout.get(node_id, ()), t)
    vp = expand(problem, layout)
    free: dict[tuple[str, int], list[str]] = {}
    for n in vp.nodes:
        group = vp.groups.get(n.id)
        key = (n.id, n.num_gpus) if group is None else (group.node_id, group.tensor_parallel)
        free.setdefault(key, []).append(n.id)
    index = {n.id: i for i, n in enumerate(vp.nodes)}
    order = [index[free[(node_id, t)].pop(0)] for node_id, t, _, _ in stages]
    bounds = [stages[0][2], *(hi for _, _, _, hi in stages)]
    return vp, (order, bounds)


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


def _engine_accepts(vp: Problem, order: Sequence[int], engine: str) -> bool:
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


def _split(vp: Problem, order: list[int], objective: str) -> Pipeline | None:
    from stowplan.planner.latency import latency_split
    from stowplan.planner.throughput import min_bottleneck_split

    root = vp.cost_model()
    cm = root.for_stages(len(order))
    if len(order) > 1 and (objective == "latency" or root.batch == 1):
        return latency_split(cm, order)
    return min_bottleneck_split(cm, order, vp.min_stages)


def _engine_fit(
    vp: Problem, pipeline: Pipeline, objective: str, engine: str
) -> tuple[Pipeline, bool]:
    """``pipeline``, or the best rearrangement of its stages the engine runs: vLLM's nodes
    after the first by GPUs used, fewest first; SGLang's nodes with equally many stages
    (the surplus left out).  The flag says whether it changed."""
    order = list(pipeline[0])
    if _engine_accepts(vp, order, engine):
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
    vp: Problem, orders: list[list[int]], objective: str, engine: str
) -> Pipeline | None:
    cm = vp.cost_model()
    best: tuple[float, Pipeline] | None = None
    for o in orders:
        got = _split(vp, o, objective)
        if got is None or not _engine_accepts(vp, got[0], engine) or not cm.fits_pipeline(*got):
            continue
        value = _seconds(vp, got, objective)
        if best is None or value < best[0]:
            best = (value, got)
    return None if best is None else best[1]


def _engine_candidates(
    problem: Problem, rule: EngineRule, objective: str, engine: str
) -> tuple[Problem, Pipeline] | None:
    """The best pipeline the engine runs over every uniform degree, its stages in the
    fleet's node order rearranged as :func:`_engine_fit` does (None: none fits)."""
    best: tuple[float, Problem, Pipeline] | None = None
    for t in sorted({t for n in problem.nodes for t in degrees(problem, n, rule.degrees)}):
        layout = _uniform(problem, t)
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
        value = _seconds(vp, got, objective)
        if best is None or value < best[0]:
            best = (value, vp, got)
    return None if best is None else (best[1], best[2])


def _consecutive(vp: Problem, pipeline: Pipeline, objective: str) -> tuple[Problem, Pipeline]:
    """``pipeline`` with each node's stages brought together (in the order the nodes first
    appear) and its blocks split again for that order."""
    from stowplan.planner.latency import latency_split
    from stowplan.planner.throughput import min_bottleneck_split

    order, _ = pipeline
    parents = [vp.parent(vp.nodes[d].id) for d in order]
    rank = {p: i for i, p in reversed(list(enumerate(parents)))}
    regrouped = sorted(order, key=lambda d: rank[vp.parent(vp.nodes[d].id)])
    if regrouped == list(order):
        return vp, pipeline
    cm = vp.cost_model()
    split = (
        latency_split(cm, regrouped)
        if objective == "latency" and len(regrouped) > 1
        else min_bottleneck_split(cm, regrouped, vp.min_stages)
    )
    return (vp, split) if split is not None else (vp, pipeline)


def _of_plan(problem: Problem, plan: Plan) -> tuple[Problem, Pipeline]:
    return _as_pipeline(
        problem,
        [(a.node_id, a.tensor_parallel, *a.block_range) for a in plan.assignments],
    )


def _seconds(vp: Problem, p: Pipeline, objective: str) -> float:
    """The cycle of ``p`` (what both objectives rank by)."""
    return vp.cost_model().evaluate(*p).cycle_s


def _check_degree(problem: Problem) -> None:
    """A fixed ``tensor_parallel`` must be legal for the model and fit some node."""
    tp = problem.constraints.tensor_parallel
    if tp is None:
        return
    rule = tensor_parallel_violation(tp, problem.model)
    if rule is not None:
        most = max(n.num_gpus for n in problem.nodes)
        legal = ", ".join(map(str, legal_tensor_parallel(problem.model, max(most, tp))))
        raise InputError("tensor_parallel", tp, f"{rule}; use one of {legal}")
    most = max(n.num_gpus for n in problem.nodes)
    if tp > most:
        raise Infeasible(
            f"tensor_parallel={tp} but the largest node has {most} GPU(s); a stage's GPUs "
            "are on one node"
        )


def with_fixed_degree(problem: Problem) -> Problem:
    """``problem`` with its nodes split into groups of ``constraints.tensor_parallel`` GPUs
    (unchanged without one): for strategies that plan the nodes as given."""
    _check_degree(problem)
    tp = problem.constraints.tensor_parallel
    if tp is None or all(n.num_gpus == 1 for n in problem.nodes):
        return problem
    return expand(problem, _uniform(problem, tp))


def plan_with_groups(problem: Problem, runner: Runner, objective: str, strategy: Strategy) -> Plan:
    """``runner``'s plan over the best GPU grouping of ``problem``'s multi-GPU nodes.

    ``problem`` holds physical nodes; a fleet of single-GPU nodes is planned as it is.
    The plan's certificate is against the optimum over every grouping the engine rule
    allows (exact on small fleets, a bound beyond), and that optimum's pipeline is the
    plan when it is better than the search's.
    Raises the strategy's :class:`PlanError` when no grouping has a plan.
    """
    _check_degree(problem)
    if all(n.num_gpus == 1 for n in problem.nodes):
        return runner(problem)
    rule = engine_rule(problem)
    exact_strategy = strategy is Strategy.EXACT
    runs = _joint_runs(problem, rule, exact_strategy)
    lossless = _adjacency_loses_nothing(problem)
    # The local search is needed where the joint solve is not the optimum.
    found, _ = _search(problem, runner, rule, objective, local=not (runs and lossless))
    if problem.constraints.batch == 1:
        value, exact, method, best = _joint_optimum(problem, rule, "latency", runs, lossless)
    else:
        plan_cycle = (
            found.rationale.prediction.time_per_token_s
            if found and found.rationale.prediction
            else math.inf
        )
        value, exact, method, best = _joint_cycle(problem, rule, runs, lossless, plan_cycle)
    if found is None and (best is None or not best.stages):
        raise Infeasible(
            "no split of the nodes' GPUs into stages of tensor-parallel degrees the model "
            f"allows ({rule.name} rule) fits the model within the stage limits"
        )
    notes: list[str] = []
    if found is None:
        assert best is not None
        vp, pipeline = _as_pipeline(problem, best.stages)
    else:
        vp, pipeline = _of_plan(problem, found)
        if rule.consecutive:
            vp, pipeline = _consecutive(vp, pipeline, objective)
    if found is not None and best is not None and best.stages:
        bp, bpipe = _as_pipeline(problem, best.stages)
        mine, theirs = _seconds(vp, pipeline, objective), _seconds(bp, bpipe, objective)
        if theirs < mine * (1 - 1e-12):
            notes.append(
                f"the joint solve over GPU groups found a better pipeline than the "
                f"{strategy.value} search ({theirs:.6g} vs {mine:.6g} "
                "s per token per sequence): it is the plan"
            )
            vp, pipeline = bp, bpipe
    engine = _ENGINE_EXPORTS.get(rule.name)
    if engine is not None:
        pipeline, changed = _engine_fit(vp, pipeline, objective, engine)
        if not _engine_accepts(vp, pipeline[0], engine):
            other = _engine_candidates(problem, rule, objective, engine)
            if other is None:
                raise Infeasible(
                    f"no plan {rule.name} can run fits: one tensor-parallel degree for every "
                    "stage, each node's stages together"
                    + (", and every node with as many stages" if engine == "sglang" else "")
                )
            (vp, pipeline), changed = other, True
        if changed:
            exact = False  # the solve's space is wider than the engine's: a bound
            notes.append(f"stages arranged as {rule.name} ranks its nodes")
    cm = vp.cost_model()
    mine = _seconds(vp, pipeline, objective)
    exact = exact or value >= mine * (1 - 1e-12)  # a bound the plan meets is the optimum
    value = min(value, mine)
    optimum = Optimum(objective=objective, value=value, exact=exact, method=method)
    plan = finish(vp, cm, strategy, pipeline, optimum=optimum)
    notes.insert(0, f"GPU groups ({rule.name} rule): {describe_groups(plan)}")
    if rule.name != "generic":
        notes += _engine_gap(problem, runner, objective, plan)
    r = plan.rationale
    return replace(plan, rationale=replace(r, notes=(*notes, *r.notes)))


def _engine_gap(problem: Problem, runner: Runner, objective: str, plan: Plan) -> list[str]:
    """How far the engine's plan is from the best per-stage layout."""
    free, _ = _search(problem, runner, EngineRule("generic", None, False), objective)
    if free is None:
        return []
    mine, other = _value(plan, objective), _value(free, objective)
    name = engine_rule(problem).name
    if other >= mine:
        return [f"{name}-expressible and as fast as any per-stage layout found"]
    if objective == "latency":
        return [f"{name}-expressible: {mine / other - 1:.1%} slower than the best per-stage plan"]
    return [
        f"{name}-expressible: {1 - mine / other:.1%} less throughput than the best per-stage plan"
    ]
