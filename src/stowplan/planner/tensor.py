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
4. Under an engine rule the unconstrained plan is found too, and the plan says
   how far the engine's layout is from it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from stowplan.errors import PlanError
from stowplan.model import NodeDescriptor, gpu_group_id
from stowplan.parallel_rules import legal_tensor_parallel
from stowplan.plan import Plan, PlanRationale
from stowplan.planner.common import GpuGroup, Problem, prepare

__all__ = [
    "LOCAL_SEARCH_NODES",
    "EngineRule",
    "Layout",
    "describe_groups",
    "engine_rule",
    "expand",
    "plan_with_groups",
]

Layout = Mapping[str, tuple[int, ...]]
"""Per physical node id, the sizes of its GPU groups (their sum at most its GPUs)."""

LOCAL_SEARCH_NODES = 16
"""Step 3 runs on fleets of up to this many multi-GPU nodes."""

Runner = Callable[[Problem], Plan]


class EngineRule:
    """What layouts an engine runs: the degrees a stage may use, uniform or per node."""

    def __init__(self, name: str, degrees: tuple[int, ...] | None, uniform: bool) -> None:
        self.name = name
        self.degrees = degrees
        """Allowed degrees (None: every legal one)."""
        self.uniform = uniform
        """One degree for every stage of the plan."""

    def allows(self, tp: int) -> bool:
        return self.degrees is None or tp in self.degrees


_UNIFORM_ENGINES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
_LAYER_ENGINES = {"llamacpp": "llama.cpp (layer split)", "transformers": "Accelerate device_map"}


def engine_rule(problem: Problem) -> EngineRule:
    """The layouts ``problem``'s constraints allow (its engine, its fixed degree)."""
    c = problem.constraints
    if c.tensor_parallel is not None:
        return EngineRule(f"tensor_parallel={c.tensor_parallel}", (c.tensor_parallel,), True)
    engine = c.calibration.engine.value if c.calibration is not None else "generic"
    if engine in _UNIFORM_ENGINES:
        return EngineRule(_UNIFORM_ENGINES[engine], None, True)
    if engine in _LAYER_ENGINES:
        return EngineRule(_LAYER_ENGINES[engine], (1,), True)
    return EngineRule("generic", None, False)


def _group_node(node: NodeDescriptor, new_id: str, size: int) -> NodeDescriptor:
    g = node.num_gpus
    bw = node.mem_bandwidth_gbps
    return replace(
        node,
        id=new_id,
        num_gpus=size,
        vram_bytes=node.vram_bytes * size // g,
        flops_estimate=node.flops_estimate * size / g,
        mem_bandwidth_gbps=None if bw is None else bw * size / g,
    )


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
            whole = size == node.num_gpus
            gid = node.id if whole else gpu_group_id(node.id, start, size)
            nodes.append(node if whole else _group_node(node, gid, size))
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
    most = min(node.num_gpus // tp, problem.model.num_blocks, problem.max_stages)
    return (tp,) * most


def _uniform(problem: Problem, tp: int) -> dict[str, tuple[int, ...]]:
    """Every node split into groups of ``tp`` GPUs (a node with fewer is left out)."""
    return {n.id: _groups(problem, n, tp) for n in problem.nodes}


def _options(problem: Problem, rule: EngineRule, node: NodeDescriptor) -> list[tuple[int, ...]]:
    """The uniform splits of ``node`` the rule and the model allow, whole node first."""
    legal = [t for t in legal_tensor_parallel(problem.model, node.num_gpus) if rule.allows(t)]
    return [_groups(problem, node, t) for t in sorted(legal, reverse=True)]


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
    problem: Problem, runner: Runner, rule: EngineRule, objective: str
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
    if best is not None and not rule.uniform and len(multi) <= LOCAL_SEARCH_NODES:
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
    """Change one node's split at a time while that lowers the objective."""
    improved = True
    while improved:
        improved = False
        for node in multi:
            for option in _options(problem, rule, node):
                layout = {**best[2], node.id: option}
                key = tuple(sorted(layout.items()))
                if key in seen:
                    continue
                seen.add(key)
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
    for node_id, degrees in per_node.items():
        kinds = sorted(set(degrees), reverse=True)
        text = " + ".join(
            f"{degrees.count(t)}×tp{t}" if degrees.count(t) > 1 else f"tp{t}" for t in kinds
        )
        parts.append(f"{node_id} {text}")
    return ", ".join(parts)


def plan_with_groups(problem: Problem, runner: Runner, objective: str) -> Plan:
    """``runner``'s plan over the best GPU grouping of ``problem``'s multi-GPU nodes.

    ``problem`` holds physical nodes; a fleet of single-GPU nodes is planned as it is.
    Raises the strategy's :class:`PlanError` when no grouping has a plan.
    """
    if all(n.num_gpus == 1 for n in problem.nodes):
        return runner(problem)
    rule = engine_rule(problem)
    found, layout = _search(problem, runner, rule, objective)
    if found is None or layout is None:
        return runner(expand(problem, _uniform(problem, 1)) if rule.degrees == (1,) else problem)
    notes = [f"GPU groups ({rule.name} rule): {describe_groups(found)}"]
    if rule.name != "generic":
        free, _ = _search(problem, runner, EngineRule("generic", None, False), objective)
        if free is not None:
            mine, other = _value(found, objective), _value(free, objective)
            if objective == "latency" and other < mine:
                notes.append(
                    f"{rule.name}-expressible: {mine / other - 1:.0%} slower than the best "
                    "per-stage tensor-parallel plan"
                )
            elif objective != "latency" and other < mine:
                notes.append(
                    f"{rule.name}-expressible: {1 - mine / other:.0%} less throughput than the "
                    "best per-stage tensor-parallel plan"
                )
            else:
                notes.append(f"{rule.name}-expressible and as fast as any per-stage layout")
    r = found.rationale
    return replace(
        found,
        rationale=PlanRationale(
            strategy=r.strategy,
            notes=(*notes, *r.notes),
            prediction=r.prediction,
            certificate=r.certificate,
        ),
    )
