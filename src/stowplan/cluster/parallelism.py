"""Pre-flight validation of parallel degrees against a fleet (pure: creates no Ray objects).

Run it before ``init_ray()``: an impossible configuration (an expert-parallel
size that is not a multiple of the tensor-parallel size, a replica that does
not fit, a tensor-parallel size that does not divide the heads) fails at
launch with the arithmetic and the nearest valid values, not mid-run.

A model replica uses ``tp × pp`` GPUs; the job uses ``tp × pp × dp``.  When a
replica exceeds one node's GPUs it needs one *unified* placement group that
spans nodes instead of per-node groups.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace

from stowplan.cluster.fleet import ENV_PG_STRATEGY, ENV_ROLE, FleetRole, FleetSpec
from stowplan.cluster.fleet import PlacementStrategy as _Strategy
from stowplan.errors import InputError
from stowplan.model import ModelLayout
from stowplan.quantities.checks import check_int
from stowplan.quantities.limits import MAX_GPUS_PER_NODE, MAX_NODES
from stowplan.rules.tensor_parallel import kv_heads_allow, tensor_parallel_violation
from stowplan.text.wording import plural

__all__ = [
    "ParallelismCheck",
    "ParallelismSpec",
    "kv_heads_allow",
    "nearest_valid",
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
    spec: ParallelismSpec, fleet: FleetSpec, layout: ModelLayout | None
) -> _Failure | None:
    """The first rule ``spec`` breaks (in the order of :func:`validate_parallelism`), or None."""
    return (
        (None if layout is None else _heads_failure(spec.tensor_parallel, layout))
        or _world_failure(spec, fleet)
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
    spec: ParallelismSpec, fleet: FleetSpec, layout: ModelLayout | None, degree: str
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
        if _first_failure(replace(spec, **{degree: v}), fleet, layout) is not None:
            continue
        if v < value:
            below = v
        else:
            above = v
    return below, above


def _message(
    failure: _Failure, spec: ParallelismSpec, fleet: FleetSpec, layout: ModelLayout | None
) -> str:
    if failure.vary is None:
        return failure.rule
    below, above = nearest_valid(spec, fleet, layout, failure.vary)
    if failure.vary == "data":  # dp is too large: the largest that fits is below it
        if below is not None:
            return f"{failure.rule}; the largest dp that fits is {below}"
        return f"{failure.rule}; no dp fits with the other degrees unchanged"
    picks = [str(v) for v in (below, above) if v is not None]
    return f"{failure.rule}; nearest valid: {', '.join(picks) if picks else 'none'}"


def validate_parallelism(
    spec: ParallelismSpec, fleet: FleetSpec, layout: ModelLayout | None = None
) -> ParallelismCheck:
    """Check ``spec`` against ``fleet`` (and the model's heads and experts when given).

    Rules, in order: the fleet has GPUs; tp divides the attention heads and suits
    the KV heads (:func:`kv_heads_allow`); the replica (tp × pp) and the world
    (tp × pp × dp) fit the fleet, per-node replicas a whole number per node; ep
    (when > 1) is a multiple of tp, divides the expert count and does not exceed
    the world; a replica spanning nodes is not asked to be ``STRICT_PACK``.

    Returns what the placement needs; raises :class:`InputError` naming the
    flag, the arithmetic and the values that would pass (each suggested value
    passes every rule with the other degrees unchanged).
    """
    if fleet.role is FleetRole.SANDBOX:
        raise InputError(
            ENV_ROLE,
            fleet.role.value,
            "has no GPUs; parallel degrees need the trainer or inference fleet",
        )
    failure = _first_failure(spec, fleet, layout)
    if failure is not None:
        raise InputError(failure.field, failure.value, _message(failure, spec, fleet, layout))
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
    return ParallelismCheck(
        spec=spec,
        fleet=fleet,
        replica_gpus=spec.replica_gpus,
        world_size=spec.world_size,
        fleet_gpus=fleet.total_gpus,
        unified_group=unified,
        nodes_per_replica=nodes_per_replica if unified else 1,
        notes=tuple(notes),
    )
