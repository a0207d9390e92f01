"""Pre-flight validation of parallel degrees against a fleet (pure: creates no Ray objects).

Run it before ``init_ray()``: an impossible configuration (an expert-parallel
size that is not a multiple of the tensor-parallel size, a replica that does
not fit, a tensor-parallel size that does not divide the heads) fails at
launch with the arithmetic and the nearest valid values, not mid-run.

A model replica uses ``tp × pp`` GPUs; the job uses ``tp × pp × dp``.  When a
replica exceeds one node's GPUs it needs one *unified* placement group that
spans nodes instead of per-node groups.

With a model and the GPUs' memory (:class:`GpuMemory`) the check also says
whether one replica fits: the fullest GPU holds its stage's share (``1 / tp``)
of the weights and of the KV cache of one sequence, with the blocks split over
the ``pp`` stages as evenly as bytes allow.  A tensor-parallel group larger
than a node passes with a warning: its all-reduces cross the network.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace

from stowplan.cluster.fleet import ENV_PG_STRATEGY, ENV_ROLE, FleetRole, FleetSpec
from stowplan.cluster.fleet import PlacementStrategy as _Strategy
from stowplan.constraints import DEFAULT_HEADROOM_FRAC
from stowplan.errors import InputError
from stowplan.model import ModelLayout
from stowplan.planner.context import default_context_tokens
from stowplan.quantities.checks import check_int
from stowplan.quantities.limits import MAX_GPUS_PER_NODE, MAX_NODES
from stowplan.quantities.units import format_bytes
from stowplan.rules.tensor_parallel import kv_heads_allow, tensor_parallel_violation
from stowplan.text.wording import plural

__all__ = [
    "GpuMemory",
    "ParallelismCheck",
    "ParallelismSpec",
    "kv_heads_allow",
    "nearest_valid",
    "replica_bytes_per_gpu",
    "validate_parallelism",
]


_DEGREES = ("tensor_parallel", "pipeline", "data", "expert")


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class ParallelismSpec:
    """Parallel degrees of one job.

    ``ParallelismSpec(tensor=...)`` still works, with a :class:`DeprecationWarning`:
    the degree is ``tensor_parallel``, as in :class:`~stowplan.model.Constraints`.
    """

    tensor_parallel: int = 1
    """Tensor-parallel size (tp): GPUs that split every layer."""
    pipeline: int = 1
    """Pipeline-parallel size (pp): stages of contiguous layers."""
    data: int = 1
    """Data-parallel size (dp): model replicas."""
    expert: int = 1
    """Expert-parallel size (ep): GPUs the routed experts are spread over."""

    def __init__(
        self,
        *,
        tensor_parallel: int | None = None,
        pipeline: int = 1,
        data: int = 1,
        expert: int = 1,
        tensor: int | None = None,
    ) -> None:
        if tensor is not None:
            warnings.warn(
                "ParallelismSpec(tensor=...) is deprecated; use tensor_parallel=",
                DeprecationWarning,
                stacklevel=2,
            )
            if tensor_parallel is not None:
                raise InputError(
                    "tensor", tensor, "is the former name of tensor_parallel; give one of them"
                )
            tensor_parallel = tensor
        degrees = (1 if tensor_parallel is None else tensor_parallel, pipeline, data, expert)
        for name, value in zip(_DEGREES, degrees, strict=True):
            object.__setattr__(self, name, value)
        self.__post_init__()

    def __post_init__(self) -> None:
        for name, value in (
            ("tensor_parallel", self.tensor_parallel),
            ("pp", self.pipeline),
            ("dp", self.data),
            ("ep", self.expert),
        ):
            check_int(name, value, minimum=1, maximum=MAX_NODES * MAX_GPUS_PER_NODE)

    @property
    def tensor(self) -> int:
        """Deprecated: :attr:`tensor_parallel`."""
        warnings.warn(
            "ParallelismSpec.tensor is deprecated; use ParallelismSpec.tensor_parallel",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.tensor_parallel

    @property
    def replica_gpus(self) -> int:
        """GPUs of one model replica: tp × pp."""
        return self.tensor_parallel * self.pipeline

    @property
    def world_size(self) -> int:
        """GPUs of the whole job: tp × pp × dp."""
        return self.replica_gpus * self.data


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuMemory:
    """The memory of each GPU a replica gets, for the check that one replica fits."""

    bytes_per_gpu: int
    """Memory of one GPU, bytes (the smallest when the fleet's GPUs differ)."""
    headroom: float = DEFAULT_HEADROOM_FRAC
    """Share of each GPU kept free (the planner's default: 20 %)."""
    context_tokens: int | None = None
    """Tokens of KV cache held for the one sequence (None: what ``stowplan plan``
    reserves, 8,192 or the model's maximum when smaller; 0: weights alone)."""

    def __post_init__(self) -> None:
        check_int("gpu_memory", self.bytes_per_gpu, minimum=1, maximum=2**62)
        if not (isinstance(self.headroom, int | float) and 0.0 <= self.headroom < 1.0):
            raise InputError("headroom", self.headroom, "must be a number in [0, 1)")
        if self.context_tokens is not None:
            check_int("context_tokens", self.context_tokens, minimum=0, maximum=2**40)

    @property
    def usable_per_gpu(self) -> int:
        """Bytes of one GPU a replica may fill: its memory less the headroom."""
        return math.floor(self.bytes_per_gpu * (1.0 - self.headroom))


def _stage_capacity_fits(
    sizes: Sequence[int], stages: int, cap: int, embed: int, head: int
) -> bool:
    """Whether ``sizes`` (per block) split into at most ``stages`` contiguous runs of at
    least one block each, the first also holding ``embed`` and the last ``head``, keep
    every run within ``cap`` bytes.  Filled greedily from the last block backwards: each
    run takes as many blocks as fit, which leaves the first run the fewest."""
    end, used, extra = len(sizes), 0, head
    while end > 0:
        if used == stages:
            return False
        total, start = extra, end
        while start > 0 and total + sizes[start - 1] + (embed if start == 1 else 0) <= cap:
            total += sizes[start - 1]
            start -= 1
        if start == end:
            return False  # not even one block fits
        used += 1
        end, extra = start, 0
    return True


def replica_bytes_per_gpu(
    layout: ModelLayout, tensor_parallel: int, pp: int, context_tokens: int, ep: int = 1
) -> int:
    """Bytes the fullest GPU of one replica holds at ``tensor_parallel × pp``: its stage's
    share of the
    weights and of the KV cache of one ``context_tokens``-token sequence, with the blocks
    split over ``min(pp, blocks)`` stages to make the fullest GPU as light as it can be.

    A stage's GPUs split its weights and KV ``tp`` ways; with ``ep > 1`` the routed
    experts of a block are split ``ep`` ways instead.
    """
    tp = tensor_parallel
    for name, value in (("tensor_parallel", tp), ("pp", pp), ("ep", ep)):
        check_int(name, value, minimum=1, maximum=MAX_NODES * MAX_GPUS_PER_NODE)
    ex = layout.experts
    routed = set(ex.moe_blocks) if ex is not None and ep > 1 else set()
    experts = ex.num_experts * ex.expert_params_bytes if ex is not None else 0
    sizes = []
    for i, w in enumerate(layout.block_sizes()):
        part = min(experts, w) if i in routed else 0
        sizes.append(-(-(w - part + layout.kv_bytes(i, context_tokens)) // tp) + -(-part // ep))
    embed, head = -(-layout.embed_params_bytes // tp), -(-layout.head_params_bytes // tp)
    stages = min(pp, len(sizes))
    hi = sum(sizes) + embed + head
    if not sizes:
        return hi
    lo = max(max(sizes), -(-hi // stages))
    while lo < hi:  # the least cap a split into `stages` runs meets
        mid = (lo + hi) // 2
        if _stage_capacity_fits(sizes, stages, mid, embed, head):
            hi = mid
        else:
            lo = mid + 1
    return lo


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelismCheck:
    """A configuration that passed validation, with what placement it needs."""

    spec: ParallelismSpec
    fleet: FleetSpec
    replica_gpus: int
    """tp × pp."""
    world_size: int
    """tp × pp × dp."""
    fleet_gpus: int
    """num_nodes × gpus_per_node."""
    unified_group: bool
    """A replica exceeds one node's GPUs: one cross-node placement group per replica."""
    nodes_per_replica: int
    """Nodes one replica touches (1 unless ``unified_group``)."""
    notes: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    """What passes but runs poorly: a tensor-parallel group larger than a node."""
    bytes_per_gpu: int | None = None
    """What the fullest GPU of a replica holds (None: not checked, for want of a model
    or of the GPUs' memory)."""
    usable_bytes_per_gpu: int | None = None
    """What one GPU may hold after the headroom (None: not checked)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Failure:
    """The first rule a configuration breaks; ``vary`` names the degree to suggest values for."""

    field: str
    value: object
    rule: str
    vary: str | None = None
    """``tensor_parallel``, ``data`` or ``expert``: the suggestions are the values of that degree
    for which the whole validation passes, the other degrees unchanged (see
    :func:`nearest_valid`)."""
    label: str = ""
    """What the suggestions are, when ``field`` does not say (``tp (pp=2)``)."""


def _heads_failure(tensor_parallel: int, layout: ModelLayout) -> _Failure | None:
    rule = tensor_parallel_violation(tensor_parallel, layout)
    if rule is None:
        return None
    return _Failure(
        field="tensor_parallel", value=tensor_parallel, rule=rule, vary="tensor_parallel"
    )


def _world_failure(spec: ParallelismSpec, fleet: FleetSpec) -> _Failure | None:
    tp, pp, dp = spec.tensor_parallel, spec.pipeline, spec.data
    total = fleet.total_gpus
    shape = f"{plural(fleet.num_nodes, 'node')} × {plural(fleet.gpus_per_node, 'GPU')}"
    if spec.replica_gpus > total:
        return _Failure(
            field="tp×pp",
            value=spec.replica_gpus,
            rule=f"one replica ({tp}×{pp} = {spec.replica_gpus} GPUs) exceeds the fleet's "
            f"{total} GPUs ({shape})",
        )
    if spec.world_size > total:
        return _Failure(
            field="tp×pp×dp",
            value=spec.world_size,
            rule=f"{tp}×{pp}×{dp} = {spec.world_size} GPUs exceeds the fleet's {total} GPUs "
            f"({shape})",
            vary="data",
        )
    if spec.replica_gpus <= fleet.gpus_per_node:
        per_node = fleet.gpus_per_node // spec.replica_gpus
        fits = per_node * fleet.num_nodes
        if dp > fits:
            return _Failure(
                field="dp",
                value=dp,
                rule=f"replicas of {tp}×{pp} = {spec.replica_gpus} GPUs fit {per_node} per node "
                f"({fleet.gpus_per_node} // {spec.replica_gpus}), {fits} on {fleet.num_nodes} "
                "nodes",
                vary="data",
            )
    return None


def _expert_failure(spec: ParallelismSpec, layout: ModelLayout | None) -> _Failure | None:
    tp, ep, world = spec.tensor_parallel, spec.expert, spec.world_size
    if ep == 1:
        return None  # experts are not split
    num_experts = None if layout is None or layout.experts is None else layout.experts.num_experts
    if layout is not None and num_experts is None:
        return _Failure(field="ep", value=ep, rule=f"{layout.name} has no routed experts; use 1")
    if ep % tp:
        return _Failure(
            field="ep",
            value=ep,
            rule=f"must be a multiple of tp={tp} ({ep} % {tp} = {ep % tp})",
            vary="expert",
        )
    if num_experts is not None and num_experts % ep:
        return _Failure(
            field="ep",
            value=ep,
            rule=f"must divide num_experts={num_experts} ({num_experts} % {ep} = "
            f"{num_experts % ep})",
            vary="expert",
        )
    if ep > world:
        return _Failure(
            field="ep",
            value=ep,
            rule=f"exceeds the world size tp×pp×dp = {spec.tensor_parallel}×{spec.pipeline}×"
            f"{spec.data} = {world}",
            vary="expert",
        )
    return None


def _memory_failure(
    spec: ParallelismSpec, layout: ModelLayout | None, memory: GpuMemory | None
) -> _Failure | None:
    if layout is None or memory is None:
        return None
    ctx = _context(layout, memory)
    need = replica_bytes_per_gpu(layout, spec.tensor_parallel, spec.pipeline, ctx, spec.expert)
    usable = memory.usable_per_gpu
    if need <= usable:
        return None
    total = replica_bytes_per_gpu(layout, 1, 1, ctx)
    kv = (
        f" and the KV cache of one {ctx:,}-token sequence"
        if ctx and layout.kv_bytes_per_token
        else ""
    )
    return _Failure(
        field="tp×pp",
        value=spec.replica_gpus,
        rule=f"one replica of {layout.name} at tp={spec.tensor_parallel}, pp={spec.pipeline} puts "
        f"{format_bytes(need)} on its fullest GPU (weights{kv}), more than the "
        f"{format_bytes(usable)} usable of a {format_bytes(memory.bytes_per_gpu)} GPU "
        f"({memory.headroom:.0%} kept free); accepted: tp×pp of at least "
        f"{-(-total // usable)} such GPUs",
        vary="tensor_parallel",
        label=f"tp (pp={spec.pipeline})",
    )


def _context(layout: ModelLayout, memory: GpuMemory) -> int:
    if memory.context_tokens is not None:
        return memory.context_tokens
    return default_context_tokens(layout)


def _strategy_failure(spec: ParallelismSpec, fleet: FleetSpec) -> _Failure | None:
    if spec.replica_gpus > fleet.gpus_per_node and fleet.strategy is _Strategy.STRICT_PACK:
        return _Failure(
            field=ENV_PG_STRATEGY,
            value=fleet.strategy.value,
            rule=f"cannot hold a replica of tp×pp = {spec.replica_gpus} GPUs on nodes of "
            f"{fleet.gpus_per_node} GPUs (STRICT_PACK keeps a group on one node); "
            "use PACK or SPREAD",
        )
    return None


def _first_failure(
    spec: ParallelismSpec,
    fleet: FleetSpec,
    layout: ModelLayout | None,
    memory: GpuMemory | None = None,
) -> _Failure | None:
    """The first rule ``spec`` breaks (in the order of :func:`validate_parallelism`), or None."""
    return (
        (None if layout is None else _heads_failure(spec.tensor_parallel, layout))
        or _world_failure(spec, fleet)
        or _memory_failure(spec, layout, memory)
        or _expert_failure(spec, layout)
        or _strategy_failure(spec, fleet)
    )


def _divisors(n: int) -> list[int]:
    """Every divisor of ``n`` (at most a few thousand for the degrees accepted)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def _edges(lo: int, hi: int, step: int, value: int) -> list[int]:
    """In ``[lo, hi]``, the multiples of ``step`` nearest below and above ``value``."""
    out: list[int] = []
    below = min(value - 1, hi) // step * step
    if below >= lo:
        out.append(below)
    above = -(-max(value + 1, lo) // step) * step
    if above <= hi:
        out.append(above)
    return out


def _candidates(
    spec: ParallelismSpec, fleet: FleetSpec, layout: ModelLayout | None, degree: str
) -> list[int]:
    """Values of ``degree`` among which the valid ones nearest to its current value lie.

    Closed form: the divisibility rules give a finite set (divisors of the heads, of
    ``ep`` or of the expert count), and the size rules give at most two ranges, in which
    only the multiples nearest the current value are taken.
    """
    tp, pp, dp, ep = spec.tensor_parallel, spec.pipeline, spec.data, spec.expert
    gpn, total = fleet.gpus_per_node, fleet.total_gpus
    value = int(getattr(spec, degree))
    if degree == "data":
        lo = 1 if ep == 1 else -(-ep // spec.replica_gpus)
        hi = total // spec.replica_gpus
        if spec.replica_gpus <= gpn:
            hi = min(hi, gpn // spec.replica_gpus * fleet.num_nodes)
        return _edges(lo, hi, 1, value)
    if degree == "expert":
        experts = None if layout is None or layout.experts is None else layout.experts.num_experts
        if experts is not None:
            return _divisors(experts)
        return [1, *_edges(2, spec.world_size, tp, value)]
    # degree == "tensor_parallel"
    heads = None if layout is None else layout.num_attention_heads
    if ep > 1:
        return _divisors(ep)
    if heads:
        return _divisors(heads)
    kv = None if layout is None else layout.num_kv_heads
    step = kv if kv else 1
    per_node = -(-dp // fleet.num_nodes)  # replicas each node must hold when one fits a node
    ranges = [(1, gpn // per_node // pp)]  # tp × pp <= gpn // per_node
    if fleet.strategy is not _Strategy.STRICT_PACK:
        ranges.append((gpn // pp + 1, total // (pp * dp)))  # a replica spans nodes
    out = _divisors(kv) if kv else []
    for lo, hi in ranges:
        out += _edges(lo, hi, step, value)
    return out


def nearest_valid(
    spec: ParallelismSpec,
    fleet: FleetSpec,
    layout: ModelLayout | None,
    degree: str,
    memory: GpuMemory | None = None,
) -> tuple[int | None, int | None]:
    """The values of ``degree`` (``tensor_parallel``, ``data`` or ``expert``) nearest below
    and above its value in ``spec`` that pass the whole validation with the other degrees
    unchanged (None where there is none).  ``degree="tensor"`` is the deprecated spelling of
    ``tensor_parallel`` (it warns).

    Computed in closed form from divisors and ranges, not by walking the fleet's GPUs, so it
    costs the same on 16 GPUs and on 16 million; every value returned is checked against
    every rule.
    """
    if degree == "tensor":
        warnings.warn(
            'nearest_valid(..., "tensor") is deprecated; use "tensor_parallel"',
            DeprecationWarning,
            stacklevel=2,
        )
        degree = "tensor_parallel"
    value = int(getattr(spec, degree))
    below: int | None = None
    above: int | None = None
    for v in _candidates(spec, fleet, layout, degree):
        if v == value or (below is not None and below >= v) or (above is not None and v >= above):
            continue
        if _first_failure(replace(spec, **{degree: v}), fleet, layout, memory) is not None:
            continue
        if v < value:
            below = v
        else:
            above = v
    return below, above


def _message(
    failure: _Failure,
    spec: ParallelismSpec,
    fleet: FleetSpec,
    layout: ModelLayout | None,
    memory: GpuMemory | None = None,
) -> str:
    if failure.vary is None:
        return failure.rule
    below, above = nearest_valid(spec, fleet, layout, failure.vary, memory)
    if failure.vary == "data":  # dp is too large: the largest that fits is below it
        if below is not None:
            return f"{failure.rule}; the largest dp that fits is {below}"
        return f"{failure.rule}; no dp fits with the other degrees unchanged"
    picks = [str(v) for v in (below, above) if v is not None]
    which = f" {failure.label}" if failure.label else ""
    return f"{failure.rule}; nearest valid{which}: {', '.join(picks) if picks else 'none'}"


def validate_parallelism(
    spec: ParallelismSpec,
    fleet: FleetSpec,
    layout: ModelLayout | None = None,
    memory: GpuMemory | None = None,
) -> ParallelismCheck:
    """Check ``spec`` against ``fleet`` (and the model's heads and experts when given).

    Rules, in order: the fleet has GPUs; tp divides the attention heads and suits
    the KV heads (:func:`kv_heads_allow`); the replica (tp × pp) and the world
    (tp × pp × dp) fit the fleet, per-node replicas a whole number per node; with
    a model and ``memory``, the fullest GPU of one replica holds its share of the
    weights and of one sequence's KV cache within the GPU's usable memory
    (:func:`replica_bytes_per_gpu`); ep (when > 1) is a multiple of tp, divides the
    expert count and does not exceed the world; a replica spanning nodes is not
    asked to be ``STRICT_PACK``.

    Returns what the placement needs, with a warning when tp exceeds a node's GPUs
    (the group's all-reduces cross the network); raises :class:`InputError` naming
    the flag, the arithmetic and the values that would pass (each suggested value
    passes every rule with the other degrees unchanged).
    """
    if fleet.role is FleetRole.SANDBOX:
        raise InputError(
            ENV_ROLE,
            fleet.role.value,
            "has no GPUs; parallel degrees need the trainer or inference fleet",
        )
    failure = _first_failure(spec, fleet, layout, memory)
    if failure is not None:
        raise InputError(
            failure.field, failure.value, _message(failure, spec, fleet, layout, memory)
        )
    unified = spec.replica_gpus > fleet.gpus_per_node
    nodes_per_replica = -(-spec.replica_gpus // fleet.gpus_per_node)
    notes: list[str] = []
    if unified:
        notes.append(
            f"replica tp×pp = {spec.replica_gpus} GPUs > {plural(fleet.gpus_per_node, 'GPU')} "
            "per node: "
            f"one unified {fleet.strategy.value} group per replica over {nodes_per_replica} nodes"
        )
        if fleet.segment_size is not None and nodes_per_replica > fleet.segment_size:
            notes.append(
                f"a replica spans {nodes_per_replica} nodes, more than one NVLink segment "
                f"of {fleet.segment_size}"
            )
    else:
        notes.append(
            f"replica tp×pp = {spec.replica_gpus} GPUs fits one node: per-node STRICT_PACK groups"
        )
    warnings: list[str] = []
    gpn = fleet.gpus_per_node
    tp = spec.tensor_parallel
    if tp > gpn:
        warnings.append(
            f"tp={tp} > {plural(gpn, 'GPU')} per node: each tensor-parallel group "
            f"spans {-(-tp // gpn)} nodes and its all-reduces (two per block) cross "
            f"the network; tp ≤ {gpn} with pp across nodes keeps them on the node's links"
        )
    need = usable = None
    if layout is not None and memory is not None:
        ctx = _context(layout, memory)
        need = replica_bytes_per_gpu(layout, spec.tensor_parallel, spec.pipeline, ctx, spec.expert)
        usable = memory.usable_per_gpu
        kv = f" and one {ctx:,}-token sequence's KV" if ctx and layout.kv_bytes_per_token else ""
        notes.append(
            f"replica fits: {format_bytes(need)} on the fullest GPU (weights{kv}) of "
            f"{format_bytes(usable)} usable"
        )
    return ParallelismCheck(
        spec=spec,
        fleet=fleet,
        replica_gpus=spec.replica_gpus,
        world_size=spec.world_size,
        fleet_gpus=fleet.total_gpus,
        unified_group=unified,
        nodes_per_replica=nodes_per_replica if unified else 1,
        notes=tuple(notes),
        warnings=tuple(warnings),
        bytes_per_gpu=need,
        usable_bytes_per_gpu=usable,
    )
