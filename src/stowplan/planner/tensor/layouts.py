"""GPU groups of a planning problem: the engine's rule for them, the layouts a node may take,
the problem whose planning nodes are a layout's groups, and a plan read back as one."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter, itemgetter

from stowplan.errors import Infeasible, InputError
from stowplan.model import Metric, NodeDescriptor, gpu_group_node, node_kinds
from stowplan.moved import renamed_keywords
from stowplan.plan import Plan
from stowplan.planner.problem import GpuGroup, Problem, prepare
from stowplan.planner.strategies.throughput import Pipeline
from stowplan.rules.tensor_parallel import legal_tensor_parallel, tensor_parallel_violation

__all__ = [
    "ENGINE_EXPORTS",
    "EngineRule",
    "Layout",
    "Runner",
    "as_pipeline",
    "check_degree",
    "cycle_of",
    "describe_groups",
    "engine_rule",
    "expand",
    "layout_options",
    "of_plan",
    "uniform_layout",
    "with_fixed_degree",
]


Layout = Mapping[str, tuple[int, ...]]
"""Per physical node id, the sizes of its GPU groups (their sum at most its GPUs)."""


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

    def allows(self, tensor_parallel: int) -> bool:
        """Whether a stage may split its blocks over ``tensor_parallel`` GPUs."""
        return self.degrees is None or tensor_parallel in self.degrees


ENGINE_EXPORTS = {"vLLM": "vllm", "SGLang": "sglang"}
"""Engines whose exports need a node order of their own (see :func:`engine_fit`)."""


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
    # A node's groups depend on its fields, its id and its sizes only: kept per node, so
    # a node split before (the searches split every node the same few ways) costs no
    # Python work, only lookups at C speed.
    ids = list(map(_ID, problem.nodes))
    kinds = node_kinds(problem.nodes)[0]
    keys = list(zip(kinds, ids, map(layout.get, ids), strict=True))
    try:
        split: list[_Split | None] = list(map(_split_kept.get, keys))
        keep = True
    except TypeError:  # sizes given as lists (unhashable): split afresh, kept nowhere
        split, keep = [None] * len(keys), False
    if None in split:
        if keep and len(_split_kept) + len(split) > _SPLITS_KEPT:
            _split_kept.clear()
        for i, got in enumerate(split):
            if got is None:
                split[i] = _split(problem.nodes[i], keys[i][2])
                if keep:
                    _split_kept[keys[i]] = split[i]  # type: ignore[assignment]
    nodes = list(chain.from_iterable(map(_GROUP_NODES, split)))  # type: ignore[arg-type]
    groups = dict(chain.from_iterable(map(_GPU_GROUPS, split)))  # type: ignore[arg-type]
    return prepare(problem.model, nodes, problem.constraints, groups)


_SPLITS_KEPT = 16384
"""Nodes whose splits :func:`expand` keeps (all are let go when more come)."""

_Split = tuple[tuple[NodeDescriptor, ...], tuple[tuple[str, GpuGroup], ...]]
"""A node's planning nodes and its GPU groups by planning id."""

_split_kept: dict[tuple[object, ...], _Split] = {}
"""Per (kind number, id, sizes), the node's :func:`_split`."""

_ID = attrgetter("id")
_GROUP_NODES = itemgetter(0)
_GPU_GROUPS = itemgetter(1)


def _split(node: NodeDescriptor, sizes: Sequence[int] | None) -> _Split:
    """The planning nodes of ``node`` split into groups of ``sizes`` GPUs (None: whole),
    and its GPU groups by planning id."""
    if sizes is None:
        return (node,), ()
    nodes: list[NodeDescriptor] = []
    groups: list[tuple[str, GpuGroup]] = []
    start = 0
    for size in sorted(sizes, reverse=True):
        group = gpu_group_node(node, start, size)
        nodes.append(group)
        if node.num_gpus > 1:
            groups.append(
                (
                    group.id,
                    GpuGroup(
                        node_id=node.id,
                        tensor_parallel=size,
                        gpu_indices=tuple(range(start, start + size)),
                    ),
                )
            )
        start += size
    return tuple(nodes), tuple(groups)


def _groups(problem: Problem, node: NodeDescriptor, tensor_parallel: int) -> tuple[int, ...]:
    """``node`` split into groups of ``tensor_parallel`` GPUs: as many as fit, but never
    more than there can be stages."""
    cap = problem.constraints.max_stages
    blocks = problem.model.num_blocks
    most = min(node.num_gpus // tensor_parallel, blocks, cap or blocks)
    return (tensor_parallel,) * most


@renamed_keywords(tp="tensor_parallel")
def uniform_layout(problem: Problem, tensor_parallel: int) -> dict[str, tuple[int, ...]]:
    """Every node split into groups of ``tensor_parallel`` GPUs (a node with fewer is left
    out).  The former keyword ``tp=`` still works, with a :class:`DeprecationWarning`."""
    return {n.id: _groups(problem, n, tensor_parallel) for n in problem.nodes}


def layout_options(
    problem: Problem, rule: EngineRule, node: NodeDescriptor
) -> list[tuple[int, ...]]:
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


def as_pipeline(
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


def of_plan(problem: Problem, plan: Plan) -> tuple[Problem, Pipeline]:
    return as_pipeline(
        problem,
        [(a.node_id, a.tensor_parallel, *a.block_range) for a in plan.assignments],
    )


def cycle_of(vp: Problem, p: Pipeline, objective: Metric) -> float:
    """The cycle of ``p`` (what both objectives rank by)."""
    return vp.cost_model().evaluate(*p).cycle_s


def check_degree(problem: Problem) -> None:
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
    check_degree(problem)
    tp = problem.constraints.tensor_parallel
    if tp is None or all(n.num_gpus == 1 for n in problem.nodes):
        return problem
    return expand(problem, uniform_layout(problem, tp))
