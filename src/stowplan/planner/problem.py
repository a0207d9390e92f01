"""Pieces every strategy shares: input checks, per-block memory, stage assembly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

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

__all__ = ["GpuGroup", "Problem", "build_assignments", "prepare"]


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuGroup:
    """A planning node that is ``tensor_parallel`` GPUs of a physical node."""

    node_id: str
    """The physical node."""
    tensor_parallel: int
    gpu_indices: tuple[int, ...]
    """Which GPUs of the node (empty for a single-GPU node)."""


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

    def parent(self, node_id: str) -> str:
        """The physical node of planning node ``node_id``."""
        group = self.groups.get(node_id)
        return node_id if group is None else group.node_id

    def cost_model(self) -> CostModel:
        """The cost model of this problem's nodes (GPU groups of one node know each other)."""
        return CostModel(
            self.model,
            self.nodes,
            self.constraints,
            parents=[self.parent(n.id) for n in self.nodes],
            microbatch=self.microbatch,
        )

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
) -> Problem:
    """Validate inputs and compute the shared numbers; raise ``PlanError`` when hopeless."""
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
    nodes = tuple(sorted(nodes, key=lambda n: n.id))
    min_n = constraints.min_stages or 1
    max_n = constraints.max_stages if constraints.max_stages is not None else len(nodes)
    if min_n > len(nodes):
        raise Infeasible(f"min_stages={min_n} but only {len(nodes)} nodes are available")
    if min_n > model.num_blocks:
        raise Infeasible(
            f"min_stages={min_n} but the model has only {model.num_blocks} blocks "
            "(every stage holds at least one)"
        )
    max_n = min(max_n, len(nodes), model.num_blocks)
    headroom = constraints.headroom
    usable = {n.id: usable_bytes(n, headroom) for n in nodes}
    ctx = constraints.context_tokens or 0
    kv = tuple(model.kv_bytes(b, ctx, constraints.batch) for b in range(model.num_blocks))
    mem = tuple(s + k for s, k in zip(model.block_sizes(), kv, strict=True))
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
    )
    anchor = max(model.embed_params_bytes, model.head_params_bytes)
    if max(usable.values()) < anchor:
        raise NoNodeFitsHead(anchor)
    biggest = sorted(usable.values(), reverse=True)[:max_n]
    if sum(biggest) < problem.total_bytes:
        raise InsufficientVram(problem.total_bytes, sum(biggest))
    return problem


def _whole_node_groups(
    nodes: Sequence[NodeDescriptor], groups: Mapping[str, GpuGroup]
) -> dict[str, GpuGroup]:
    """``groups``, plus every multi-GPU node not in it as one group of all its GPUs."""
    out = dict(groups)
    for n in nodes:
        if n.num_gpus > 1 and n.id not in out:
            out[n.id] = GpuGroup(
                node_id=n.id, tensor_parallel=n.num_gpus, gpu_indices=tuple(range(n.num_gpus))
            )
    return out


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
