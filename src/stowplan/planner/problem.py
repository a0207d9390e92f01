"""Pieces every strategy shares: input checks, per-block memory, stage assembly."""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import accumulate, compress
from operator import attrgetter, not_

from stowplan.cost import CostModel
from stowplan.errors import Infeasible, InputError, InsufficientVram, NoNodeFitsHead
from stowplan.model import (
    Constraints,
    ModelLayout,
    NodeDescriptor,
    check_unique_ids,
    usable_bytes,
)
from stowplan.plan import StageAssignment

__all__ = [
    "CostModels",
    "GpuGroup",
    "Problem",
    "block_bytes",
    "build_assignments",
    "most_blocks",
    "prepare",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuGroup:
    """A planning node that is ``tensor_parallel`` GPUs of a physical node."""

    node_id: str
    """The physical node."""
    tensor_parallel: int
    gpu_indices: tuple[int, ...]
    """Which GPUs of the node (empty for a single-GPU node)."""


class CostModels:
    """Cost models shared by the problems of one planning call that differ only in their
    stage limits (a cost model does not depend on ``min_stages`` or ``max_stages``), so
    the figures the searches keep per cost model are built once.  Lives as long as the
    call that made it holds it; keeps at most :attr:`KEPT` models."""

    KEPT = 4

    def __init__(self) -> None:
        self._kept: list[tuple[tuple[object, ...], CostModel]] = []

    def get(self, problem: Problem) -> CostModel:
        """The cost model of ``problem``, the one of an earlier problem alike but for its
        stage limits when there is one."""
        c = problem.constraints
        parents = tuple(problem.parent(n.id) for n in problem.nodes)
        key = (
            problem.model,
            problem.nodes,
            replace(c, min_stages=None, max_stages=None),
            parents,
            problem.microbatch,
        )
        for k, cm in self._kept:
            if all(a is b or a == b for a, b in zip(k, key, strict=True)):
                return cm
        cm = CostModel(
            problem.model, problem.nodes, c, parents=parents, microbatch=problem.microbatch
        )
        self._kept = [*self._kept[-(self.KEPT - 1) :], (key, cm)]
        return cm


@dataclass(frozen=True, slots=True)
class Problem:
    """A validated planning problem with the numbers every strategy needs."""

    model: ModelLayout
    nodes: tuple[NodeDescriptor, ...]
    """The candidate nodes, sorted by id."""
    constraints: Constraints
    usable: dict[str, int]
    """Usable VRAM per node id (after headroom)."""
    block_mem: tuple[int, ...]
    """Bytes each block occupies: weights plus its KV reserve."""
    block_kv: tuple[int, ...]
    prefix: tuple[int, ...]
    """prefix[i] = sum(block_mem[:i])."""
    min_stages: int
    max_stages: int
    groups: Mapping[str, GpuGroup] = field(default_factory=dict)
    """Planning nodes that are GPU groups of a physical node, by their id (a node absent
    here is a whole physical node)."""
    microbatch: int | None = None
    """Sequences a stage steps at once in this problem's cost models (None: all of
    ``constraints.batch``; see :meth:`stowplan.cost.CostModel.at_microbatch`)."""
    shared: CostModels | None = field(default=None, repr=False, compare=False)
    """Where the cost model comes from when it is shared with other problems of one call
    (None: built for this problem alone)."""
    _cost_model: list[CostModel] = field(
        default_factory=list, init=False, repr=False, compare=False
    )
    """The cost model once built (a problem is frozen, and a cost model is never changed
    once handed out, so every caller may share it)."""

    def parent(self, node_id: str) -> str:
        """The physical node of planning node ``node_id``."""
        group = self.groups.get(node_id)
        return node_id if group is None else group.node_id

    def cost_model(self) -> CostModel:
        """The cost model of this problem's nodes (GPU groups of one node know each other),
        built on the first call."""
        if not self._cost_model and self.shared is not None:
            self._cost_model.append(self.shared.get(self))
        if not self._cost_model:
            self._cost_model.append(
                CostModel(
                    self.model,
                    self.nodes,
                    self.constraints,
                    parents=[self.parent(n.id) for n in self.nodes],
                    microbatch=self.microbatch,
                )
            )
        return self._cost_model[0]

    def at_microbatch(self, microbatch: int) -> Problem:
        """This problem with stages stepping ``microbatch`` sequences; its cost model is
        the view of this one's (:meth:`stowplan.cost.CostModel.at_microbatch`)."""
        out = replace(self, microbatch=microbatch)
        out._cost_model.append(self.cost_model().at_microbatch(microbatch))
        return out

    @property
    def total_bytes(self) -> int:
        return self.prefix[-1] + self.model.embed_params_bytes + self.model.head_params_bytes

    def range_bytes(self, lo: int, hi: int) -> int:
        return self.prefix[hi] - self.prefix[lo]

    def stage_capacity(self, node_id: str, first: bool, last: bool) -> int:
        """Bytes left for blocks on ``node_id`` after its anchors."""
        cap = self.usable[node_id]
        if first:
            cap -= self.model.embed_params_bytes
        if last:
            cap -= self.model.head_params_bytes
        return cap


def prepare(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    constraints: Constraints,
    groups: Mapping[str, GpuGroup] | None = None,
    shared: CostModels | None = None,
) -> Problem:
    """Validate inputs and compute the shared numbers; raise ``PlanError`` when hopeless.
    ``shared`` gives the problem's cost model when an earlier problem of the call has it."""
    if not isinstance(model, ModelLayout):
        raise InputError("model", type(model).__name__, "must be a ModelLayout")
    if not isinstance(constraints, Constraints):
        raise InputError("constraints", type(constraints).__name__, "must be a Constraints")
    nodes = tuple(nodes)
    if not nodes:
        raise Infeasible("no candidate nodes were given")
    check_unique_ids(nodes)
    # Node ids, not the order they were given in, break every tie: the same nodes in any
    # order give the same plan.
    nodes = tuple(sorted(nodes, key=_ID))
    min_n = constraints.min_stages or 1
    max_n = constraints.max_stages if constraints.max_stages is not None else len(nodes)
    # A multi-GPU node holds as many stages as its GPUs split into (its GPU groups are
    # planned from this problem); a group, or a node given whole, holds one.
    gpus = len(nodes) if groups is not None else sum(n.num_gpus for n in nodes)
    if min_n > gpus:
        on_gpus = "" if gpus == len(nodes) else f" ({gpus} GPUs, a stage on one at least)"
        raise Infeasible(f"min_stages={min_n} but only {len(nodes)} nodes are available{on_gpus}")
    if min_n > model.num_blocks:
        raise Infeasible(
            f"min_stages={min_n} but the model has only {model.num_blocks} blocks "
            "(every stage holds at least one)"
        )
    max_n = min(max_n, len(nodes), model.num_blocks)
    headroom = constraints.headroom
    # A node's usable bytes are a function of its VRAM: computed once per VRAM figure (GPU
    # groups of identical nodes share one), spread at C speed.
    vram = list(map(_VRAM, nodes))
    by_vram = dict(zip(vram, nodes, strict=True))
    per_vram = {v: usable_bytes(n, headroom) for v, n in by_vram.items()}
    usable = dict(zip(map(_ID, nodes), map(per_vram.__getitem__, vram), strict=True))
    kv, mem = _block_bytes(model, constraints.context_tokens or 0, constraints.batch)
    prefix = (0, *accumulate(mem))
    problem = Problem(
        model=model,
        nodes=nodes,
        constraints=constraints,
        usable=usable,
        block_mem=mem,
        block_kv=kv,
        prefix=prefix,
        min_stages=min_n,
        max_stages=max_n,
        groups=_whole_node_groups(nodes, groups or {}),
        shared=shared,
    )
    anchor = max(model.embed_params_bytes, model.head_params_bytes)
    if max(usable.values()) < anchor:
        raise NoNodeFitsHead(anchor)
    biggest = sorted(usable.values(), reverse=True)[:max_n]
    if sum(biggest) < problem.total_bytes:
        raise InsufficientVram(problem.total_bytes, sum(biggest))
    held = most_blocks(model, mem, usable.values(), max_n, anchors=False)
    if held < model.num_blocks:
        raise InsufficientVram(
            problem.total_bytes,
            sum(biggest),
            f"blocks are not split between nodes, and the {max_n} largest "
            f"node{'' if max_n == 1 else 's'} hold at most {held} of the {model.num_blocks} "
            "blocks whole (with their KV cache)",
        )
    return problem


def block_bytes(
    model: ModelLayout, context_tokens: int, batch: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per block, its KV reserve for ``batch`` sequences of ``context_tokens`` tokens, and
    the bytes it occupies (weights plus that reserve)."""
    kv = tuple(model.kv_bytes(b, context_tokens, batch) for b in range(model.num_blocks))
    return kv, tuple(s + k for s, k in zip(model.block_sizes(), kv, strict=True))


@lru_cache(maxsize=64)
def _block_bytes(
    model: ModelLayout, context_tokens: int, batch: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """:func:`block_bytes`, kept: the problems of one call (its layouts, its stage
    counts) share the model and its reserve."""
    return block_bytes(model, context_tokens, batch)


def most_blocks(
    model: ModelLayout,
    block_mem: Sequence[int],
    usable: Iterable[int],
    most: int,
    *,
    anchors: bool = True,
) -> int:
    """An upper bound on the blocks (of ``block_mem`` bytes each) a pipeline on at most
    ``most`` of the nodes with ``usable`` bytes holds, every block whole on one node.

    A node holds at most as many blocks as its smallest ones that fit (stages on GPU
    groups of one node share its bytes); together the ``most`` largest nodes hold at
    most the sum of theirs.  With ``anchors``, less what the embed and the head take
    where they cost the fewest blocks (one node may carry both; a node carrying one
    holds a block beside it, as every stage holds one); 0 when no node can.  A plan
    needs ``model.num_blocks``; the count stops there.
    """
    nb = model.num_blocks
    prefix = (0, *accumulate(sorted(block_mem)))
    counts: dict[int, int] = {}

    def fits(cap: int) -> int:
        """The most blocks ``cap`` bytes hold (-1: ``cap`` is below zero)."""
        if cap < 0:
            return -1
        n = counts.get(cap)
        if n is None:
            n = counts[cap] = bisect_right(prefix, cap) - 1
        return n

    caps = sorted(usable, reverse=True)
    # Nodes of one size hold alike (GPU groups of identical nodes): counted once per size.
    held = sum(fits(cap) * k for cap, k in Counter(caps[:most]).items())
    if held < nb:
        return held
    embed, head = model.embed_params_bytes, model.head_params_bytes
    if not anchors or (embed == 0 and head == 0):
        return nb

    def loss(cap: int, anchor: int) -> float:
        """Blocks a node of ``cap`` bytes gives up to carry ``anchor`` bytes (inf: it cannot
        hold them beside a block, and a stage holds at least one)."""
        left = fits(cap - anchor)
        return math.inf if left < 1 else fits(cap) - left

    both = min(loss(cap, embed + head) for cap in caps)
    # The embed and the head on two nodes: the two least losses of each, by node.
    firsts = heapq.nsmallest(2, ((loss(cap, embed), i) for i, cap in enumerate(caps)))
    lasts = heapq.nsmallest(2, ((loss(cap, head), i) for i, cap in enumerate(caps)))
    apart = min((e + h for e, i in firsts for h, j in lasts if i != j), default=math.inf)
    lost = min(both, apart)
    return 0 if math.isinf(lost) else min(nb, held - int(lost))


def _whole_node_groups(
    nodes: Sequence[NodeDescriptor], groups: Mapping[str, GpuGroup]
) -> dict[str, GpuGroup]:
    """``groups``, plus every multi-GPU node not in it as one group of all its GPUs."""
    out = dict(groups)
    # Only multi-GPU nodes not in ``groups`` are visited in Python.
    multi = list(compress(nodes, map(_MULTI_GPU, map(_NUM_GPUS, nodes))))
    for n in compress(multi, map(not_, map(out.__contains__, map(_ID, multi)))):
        out[n.id] = GpuGroup(
            node_id=n.id, tensor_parallel=n.num_gpus, gpu_indices=tuple(range(n.num_gpus))
        )
    return out


_ID = attrgetter("id")
_VRAM = attrgetter("vram_bytes")
_NUM_GPUS = attrgetter("num_gpus")
_MULTI_GPU = (1).__lt__


def build_assignments(
    problem: Problem, order: Sequence[str], bounds: Sequence[int]
) -> tuple[StageAssignment, ...]:
    """Stage assignments for nodes ``order`` with block boundaries ``bounds`` (len N+1)."""
    n = len(order)
    model = problem.model
    out = []
    for s, node_id in enumerate(order):
        lo, hi = bounds[s], bounds[s + 1]
        kv = sum(problem.block_kv[lo:hi])
        est = problem.range_bytes(lo, hi)
        if s == 0:
            est += model.embed_params_bytes
        if s == n - 1:
            est += model.head_params_bytes
        group = problem.groups.get(node_id)
        out.append(
            StageAssignment(
                stage=s,
                node_id=node_id if group is None else group.node_id,
                tensor_parallel=1 if group is None else group.tensor_parallel,
                gpu_indices=() if group is None else group.gpu_indices,
                block_range=(lo, hi),
                owns_embed=s == 0,
                owns_head=s == n - 1,
                estimated_vram_bytes=est,
                kv_reserve_bytes=kv,
                usable_vram_bytes=problem.usable[node_id],
            )
        )
    return tuple(out)
