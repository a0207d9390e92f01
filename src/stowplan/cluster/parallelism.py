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

from collections.abc import Iterable
from dataclasses import dataclass

from stowplan.checks import check_int
from stowplan.cluster.fleet import ENV_PG_STRATEGY, ENV_ROLE, FleetRole, FleetSpec
from stowplan.cluster.fleet import PlacementStrategy as _Strategy
from stowplan.errors import InputError
from stowplan.model import ModelLayout

__all__ = ["ParallelismCheck", "ParallelismSpec", "validate_parallelism"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelismSpec:
    """Parallel degrees of one job."""

    tensor: int = 1
    """Tensor-parallel size (tp): GPUs that split every layer."""
    pipeline: int = 1
    """Pipeline-parallel size (pp): stages of contiguous layers."""
    data: int = 1
    """Data-parallel size (dp): model replicas."""
    expert: int = 1
    """Expert-parallel size (ep): GPUs the routed experts are spread over."""

    def __post_init__(self) -> None:
        for name, value in (
            ("tp", self.tensor),
            ("pp", self.pipeline),
            ("dp", self.data),
            ("ep", self.expert),
        ):
            check_int(name, value, minimum=1)

    @property
    def replica_gpus(self) -> int:
        """GPUs of one model replica: tp × pp."""
        return self.tensor * self.pipeline

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


def _nearest(value: int, candidates: Iterable[int]) -> str:
    """The closest valid values below and above ``value``, e.g. ``'4, 8'``."""
    pool = sorted(set(candidates))
    below = [c for c in pool if c < value]
    above = [c for c in pool if c > value]
    picks = ([below[-1]] if below else []) + ([above[0]] if above else [])
    return ", ".join(str(p) for p in picks) if picks else "none"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _check_heads(tp: int, layout: ModelLayout) -> None:
    for name, heads in (
        ("num_attention_heads", layout.num_attention_heads),
        ("num_kv_heads", layout.num_kv_heads),
    ):
        if heads is not None and heads > 0 and heads % tp:
            raise InputError(
                "tp",
                tp,
                f"must divide {name}={heads} of {layout.name} ({heads} % {tp} = {heads % tp}); "
                f"nearest valid: {_nearest(tp, _divisors(heads))}",
            )


def _check_world(spec: ParallelismSpec, fleet: FleetSpec) -> None:
    tp, pp, dp = spec.tensor, spec.pipeline, spec.data
    total = fleet.total_gpus
    shape = f"{fleet.num_nodes} nodes × {fleet.gpus_per_node} GPUs"
    if spec.replica_gpus > total:
        raise InputError(
            "tp×pp",
            spec.replica_gpus,
            f"one replica ({tp}×{pp} = {spec.replica_gpus} GPUs) exceeds the fleet's "
            f"{total} GPUs ({shape})",
        )
    if spec.world_size > total:
        raise InputError(
            "tp×pp×dp",
            spec.world_size,
            f"{tp}×{pp}×{dp} = {spec.world_size} GPUs exceeds the fleet's {total} GPUs "
            f"({shape}); the largest dp that fits is {total // spec.replica_gpus}",
        )
    if spec.replica_gpus <= fleet.gpus_per_node:
        per_node = fleet.gpus_per_node // spec.replica_gpus
        fits = per_node * fleet.num_nodes
        if dp > fits:
            raise InputError(
                "dp",
                dp,
                f"replicas of {tp}×{pp} = {spec.replica_gpus} GPUs fit {per_node} per node "
                f"({fleet.gpus_per_node} // {spec.replica_gpus}), {fits} on {fleet.num_nodes} "
                f"nodes; the largest dp that fits is {fits}",
            )


def _check_expert(spec: ParallelismSpec, layout: ModelLayout | None) -> None:
    tp, ep, world = spec.tensor, spec.expert, spec.world_size
    if ep == 1:
        return  # experts are not split
    num_experts = None if layout is None or layout.experts is None else layout.experts.num_experts
    if layout is not None and num_experts is None and ep > 1:
        raise InputError("ep", ep, f"{layout.name} has no routed experts; use 1")

    def valid(e: int) -> bool:
        return e % tp == 0 and e <= world and (num_experts is None or num_experts % e == 0)

    candidates = [e for e in range(1, world + 1) if valid(e)]
    if ep % tp:
        raise InputError(
            "ep",
            ep,
            f"must be a multiple of tp={tp} ({ep} % {tp} = {ep % tp}); "
            f"nearest valid: {_nearest(ep, candidates)}",
        )
    if num_experts is not None and num_experts % ep:
        raise InputError(
            "ep",
            ep,
            f"must divide num_experts={num_experts} ({num_experts} % {ep} = {num_experts % ep}); "
            f"nearest valid: {_nearest(ep, candidates)}",
        )
    if ep > world:
        raise InputError(
            "ep",
            ep,
            f"exceeds the world size tp×pp×dp = {spec.tensor}×{spec.pipeline}×{spec.data} = "
            f"{world}; nearest valid: {_nearest(ep, candidates)}",
        )


def validate_parallelism(
    spec: ParallelismSpec, fleet: FleetSpec, layout: ModelLayout | None = None
) -> ParallelismCheck:
    """Check ``spec`` against ``fleet`` (and the model's heads and experts when given).

    Rules, in order: the fleet has GPUs; tp divides the attention and KV heads;
    the replica (tp × pp) and the world (tp × pp × dp) fit the fleet, per-node
    replicas a whole number per node; ep (when > 1) is a multiple of tp,
    divides the expert count and does not exceed the world; a replica spanning nodes is
    not asked to be ``STRICT_PACK``.

    Returns what the placement needs; raises :class:`InputError` naming the
    flag, the arithmetic and the nearest valid values.
    """
    if fleet.role is FleetRole.SANDBOX:
        raise InputError(
            ENV_ROLE,
            fleet.role.value,
            "has no GPUs; parallel degrees need the trainer or inference fleet",
        )
    if layout is not None:
        _check_heads(spec.tensor, layout)
    _check_world(spec, fleet)
    _check_expert(spec, layout)
    unified = spec.replica_gpus > fleet.gpus_per_node
    nodes_per_replica = -(-spec.replica_gpus // fleet.gpus_per_node)
    notes: list[str] = []
    if unified:
        if fleet.strategy is _Strategy.STRICT_PACK:
            raise InputError(
                ENV_PG_STRATEGY,
                fleet.strategy.value,
                f"cannot hold a replica of tp×pp = {spec.replica_gpus} GPUs on nodes of "
                f"{fleet.gpus_per_node} GPUs (STRICT_PACK keeps a group on one node); "
                "use PACK or SPREAD",
            )
        notes.append(
            f"replica tp×pp = {spec.replica_gpus} GPUs > {fleet.gpus_per_node} GPUs per node: "
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
