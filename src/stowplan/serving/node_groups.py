"""The exact best replicas of one multi-GPU node: every way its GPUs form groups (the
tensor-parallel degrees the model and the engine allow) and every pipeline of those
groups, each scored at its own U*; then replicas side by side on disjoint GPUs.

A pipeline of a node's groups is a sequence of group sizes (GPUs of one node are alike:
which GPUs a group takes changes nothing) with a block split; its stages pass
activations over the node's own link, as :func:`~stowplan.cost.serving.pipeline_serving`
scores a plan whose stages are GPU groups of one node.  The most a set of replicas on
the node serves is the best split of its GPUs into parts, each part holding the best
pipeline on at most that many GPUs.

The certificate (:mod:`stowplan.serving`) replaces the relaxation bound of a composition
that is one such node by this value, which makes the bound exact there; where it
serves more than the block planner's replicas there, the best pipeline (or copies of
one side by side on equal parts of the node) is offered as the composition's replica
(:func:`~stowplan.serving.candidates.grouped_candidate`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import combinations, permutations
from math import comb

from stowplan.cost import CostModel
from stowplan.cost.serving import ReplicaServing, pipeline_serving, serving_constraints
from stowplan.errors import PlanError
from stowplan.model import Constraints, ModelLayout, NodeDescriptor, gpu_group_node
from stowplan.planner.problem import prepare
from stowplan.planner.tensor.layouts import EngineRule, engine_rule
from stowplan.quantities.limits import MAX_BATCH
from stowplan.rules.tensor_parallel import legal_tensor_parallel
from stowplan.workload import Workload

__all__ = [
    "MIXED_SINGLES",
    "NODE_PIPELINES",
    "NodePipeline",
    "NodeReplicas",
    "best_node_replicas",
    "group_sequences",
    "one_node_and_singles",
]


NODE_PIPELINES = 2000
"""Node sets with at most this many pipelines of GPU groups are tried pipeline by
pipeline (a node of two GPUs alone makes 33 for a model of 32 blocks, with one single
node 1,551)."""

MIXED_SINGLES = 2
"""Single-GPU nodes a multi-GPU node's set may hold and still be tried."""


@dataclass(frozen=True, slots=True)
class NodePipeline:
    """One pipeline of a node's GPU groups (and single nodes) and what it serves."""

    sizes: tuple[int, ...]
    """GPUs of each stage's group, in stage order (``-1 - i``: single node ``i``)."""
    bounds: tuple[int, ...]
    """Block bounds: stage ``s`` holds blocks ``bounds[s]..bounds[s+1]``."""
    serving: ReplicaServing


@dataclass(frozen=True, slots=True)
class NodeReplicas:
    """The best replicas of one multi-GPU node."""

    value: float
    """The most users (requests/s by rate) replicas side by side on the nodes serve."""
    parts: tuple[int, ...]
    """GPUs of each replica of the best split of the multi-GPU node alone."""
    best: dict[int, NodePipeline]
    """Per GPU count m, the pipeline on at most m GPUs of the multi-GPU node (and any
    of the single nodes) serving the most."""


def group_sequences(
    model: ModelLayout, node: NodeDescriptor, c: Constraints
) -> list[tuple[int, ...]]:
    """Every sequence of group sizes a pipeline on ``node`` may take (their sum at most
    its GPUs, one size for every stage under a uniform engine rule, stage limits kept)."""
    g = node.num_gpus
    try:
        rule = engine_rule(prepare(model, [node], c))
    except PlanError:
        # The node cannot hold the model: every legal degree (none of them fits).
        rule = EngineRule("any", None, uniform=False)
    degrees = [t for t in legal_tensor_parallel(model, g) if rule.allows(t)]
    lo = max(1, c.min_stages or 1)
    hi = min(model.num_blocks, c.max_stages or model.num_blocks, g)
    out: list[tuple[int, ...]] = []

    def grow(prefix: tuple[int, ...], left: int) -> None:
        if lo <= len(prefix) <= hi:
            out.append(prefix)
        if len(prefix) >= hi:
            return
        for t in degrees:
            if t <= left and (not rule.uniform or not prefix or t == prefix[0]):
                grow((*prefix, t), left - t)

    grow((), g)
    return out


def one_node_and_singles(nodes: Sequence[NodeDescriptor]) -> bool:
    """Whether ``nodes`` are one multi-GPU node and at most :data:`MIXED_SINGLES`
    single-GPU nodes: the sets :func:`best_node_replicas` solves."""
    multi = sum(1 for n in nodes if n.num_gpus > 1)
    return multi == 1 and len(nodes) - multi <= MIXED_SINGLES


def best_node_replicas(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    w: Workload,
    c: Constraints,
    *,
    by_rate: bool,
    limit: int = NODE_PIPELINES,
) -> NodeReplicas | None:
    """The best replicas on ``nodes``, one multi-GPU node and at most
    :data:`MIXED_SINGLES` single-GPU nodes (see the module): every pipeline of the
    node's GPU groups and the single nodes tried; None when there are more than
    ``limit`` pipelines, or the set is not of that shape."""
    if not one_node_and_singles(nodes):
        return None
    node = next(n for n in nodes if n.num_gpus > 1)
    singles = [n for n in nodes if n.num_gpus == 1]
    g = node.num_gpus
    if c.tensor_parallel is not None and c.tensor_parallel != 1 and singles:
        return None
    if c.tensor_parallel is not None and g % c.tensor_parallel:
        return None
    seqs = group_sequences(model, node, replace(c, min_stages=None, max_stages=None))
    nb = model.num_blocks
    lo = max(1, c.min_stages or 1)
    hi = min(nb, c.max_stages or nb)
    # A stage is a single node (its index, negative) or a group of the node (its size).
    shapes = [s for s in _stage_sequences(seqs, len(singles), hi) if lo <= len(s) <= hi]
    if sum(comb(nb - 1, len(s) - 1) for s in shapes) > limit:
        return None
    # One planning node per GPU group a sequence may use, then the single nodes.
    units: list[NodeDescriptor] = []
    slots: dict[int, list[int]] = {}
    for t in sorted({t for s in seqs for t in s}):
        for j in range(g // t):
            slots.setdefault(t, []).append(len(units))
            units.append(gpu_group_node(node, j * t, t))
    parents = [node.id] * len(units) + [n.id for n in singles]
    first_single = len(units)
    units += singles
    base = serving_constraints(w, c)
    fits = CostModel(model, units, replace(base, batch=1), parents=parents)
    score = CostModel(model, units, replace(base, batch=MAX_BATCH), parents=parents)
    best: dict[int, tuple[tuple[float, float, int], NodePipeline]] = {}
    """Per GPUs of the node used, the pipeline serving the most."""
    node_best: dict[int, tuple[tuple[float, float, int], NodePipeline]] = {}
    """The same, of pipelines on the node alone."""
    for shape in shapes:
        order = list(_indices(shape, slots, first_single))
        used = sum(t for t in shape if t > 0)
        for cut in combinations(range(1, nb), len(shape) - 1):
            bounds = [0, *cut, nb]
            if not fits.fits_pipeline(order, bounds):
                continue
            got = pipeline_serving(score, order, bounds, w)
            if got.users < 1:
                continue
            key = (_value(got, by_rate), -got.tpot_s, -len(shape))
            pipe = NodePipeline(shape, tuple(bounds), got)
            for table in (best, node_best) if min(shape) > 0 else (best,):
                old = table.get(used)
                if old is None or key > old[0]:
                    table[used] = (key, pipe)
    within = _within(best, g)
    alone = _within(node_best, g)
    # The best split of the node's GPUs into replicas of the node alone: parts of m
    # GPUs, each its best pipeline there.
    most: list[tuple[float, tuple[int, ...]]] = [(0.0, ())]
    for m in range(1, g + 1):
        top = most[m - 1]
        for part in range(1, m + 1):
            if part in alone:
                v = most[m - part][0] + _value(alone[part].serving, by_rate)
                if v > top[0]:
                    top = (v, (*most[m - part][1], part))
        most.append(top)
    value, parts = most[g]
    if singles:
        # A replica with the single nodes on m of the node's GPUs, the other GPUs
        # holding replicas of their own.
        for m, pipe in within.items():
            value = max(value, _value(pipe.serving, by_rate) + most[g - m][0])
    return NodeReplicas(value=value, parts=tuple(sorted(parts, reverse=True)), best=within)


def _stage_sequences(seqs: list[tuple[int, ...]], singles: int, most: int) -> list[tuple[int, ...]]:
    """Every group-size sequence (``seqs``, the empty one too) interleaved with every
    ordered subset of the ``singles`` single nodes (stage ``-1 - i``: single ``i``)."""
    out: list[tuple[int, ...]] = []
    picks = [p for k in range(singles + 1) for p in permutations(range(singles), k)]
    for groups in [(), *seqs]:
        for pick in picks:
            n = len(groups) + len(pick)
            if n == 0 or n > most:
                continue
            for where in combinations(range(n), len(pick)):
                shape, gi, si = [], 0, 0
                for k in range(n):
                    if si < len(pick) and where[si] == k:
                        shape.append(-1 - pick[si])
                        si += 1
                    else:
                        shape.append(groups[gi])
                        gi += 1
                out.append(tuple(shape))
    return out


def _within(
    best: dict[int, tuple[tuple[float, float, int], NodePipeline]], g: int
) -> dict[int, NodePipeline]:
    """Per GPU count m (0..g), the best of ``best`` on at most m GPUs of the node."""
    out: dict[int, NodePipeline] = {}
    for m in range(g + 1):
        pick = max((best[k] for k in range(m + 1) if k in best), key=lambda kb: kb[0], default=None)
        if pick is not None:
            out[m] = pick[1]
    return out


def _indices(
    sizes: tuple[int, ...], slots: dict[int, list[int]], first_single: int
) -> Iterator[int]:
    """Planning-node indices of a stage sequence: groups take the next free slot of their
    size, single node ``-1 - i`` is ``first_single + i``."""
    taken: dict[int, int] = {}
    for t in sizes:
        if t < 0:
            yield first_single - 1 - t
            continue
        k = taken.get(t, 0)
        taken[t] = k + 1
        yield slots[t][k]


def _value(s: ReplicaServing, by_rate: bool) -> float:
    return s.requests_per_s if by_rate else float(s.users)
