"""TTFT(U) and TPOT(U) of one replica for U = 1 … U*, from the cost model's formulas.

The serving model of :mod:`stowplan.cost.serving`::

    TTFT(U) = TTFT0 + cycle(U)        TPOT(U) = cycle(U) + U · TTFT0 / O

``TTFT0`` is one prompt's prefill through the replica's pipeline
(:func:`~stowplan.cost.serving.pipeline_prefill`) and ``cycle(U)`` the decode cycle of
U sequences in ``m = min(U, S)`` microbatches of ``⌈U/m⌉``
(:func:`~stowplan.cost.cycle_seconds`), each reading its KV at the mean context
``P + O/2``.  The pipeline is the replica's plan as ``serve()`` scored it: a stage on
part of a node's GPUs is that GPU group, and stages of one node pass activations over
the node's own link.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from stowplan.cost import CostModel
from stowplan.cost.cycle import cycle_seconds, microbatches
from stowplan.cost.serving import pipeline_prefill, serving_constraints
from stowplan.errors import InputError
from stowplan.model import Constraints, ModelLayout, NodeDescriptor, stage_node
from stowplan.serve_plan import ReplicaPlan
from stowplan.workload import Workload

__all__ = ["MAX_POINTS", "CurvePoint", "curve_users", "replica_curve"]

MAX_POINTS = 240
"""At most this many users are drawn per replica: every U up to it, evenly spaced U
(1 and U* always among them) above."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CurvePoint:
    """A replica's latencies with ``users`` requests in flight."""

    users: int
    ttft_s: float
    tpot_s: float


def curve_users(most: int, limit: int = MAX_POINTS) -> tuple[int, ...]:
    """The U drawn for a replica of U* = ``most``: 1 … U* when they are at most
    ``limit``, else ``limit`` evenly spaced values from 1 to U*."""
    top = max(1, most)
    if top <= limit:
        return tuple(range(1, top + 1))
    step = (top - 1) / (limit - 1)
    return tuple(sorted({1 + round(i * step) for i in range(limit)} | {top}))


def _pipeline(
    replica: ReplicaPlan, nodes: Sequence[NodeDescriptor]
) -> tuple[list[NodeDescriptor], list[str], list[int]]:
    by_id = {n.id: n for n in nodes}
    units: list[NodeDescriptor] = []
    for a in replica.plan.assignments:
        node = by_id.get(a.node_id)
        if node is None:
            raise InputError(
                "nodes", a.node_id, "must describe every node of the replica (its plan names it)"
            )
        units.append(stage_node(node, a.gpu_indices, a.tensor_parallel))
    stages = replica.plan.assignments
    bounds = [a.block_range[0] for a in stages] + [stages[-1].block_range[1]]
    return units, [a.node_id for a in stages], bounds


def replica_curve(
    model: ModelLayout,
    replica: ReplicaPlan,
    workload: Workload,
    constraints: Constraints | None = None,
    *,
    nodes: Sequence[NodeDescriptor] | None = None,
    users: Sequence[int] | None = None,
) -> tuple[CurvePoint, ...]:
    """TTFT(U) and TPOT(U) of ``replica`` under ``workload`` for each U of ``users``
    (default :func:`curve_users` of its U*).

    ``constraints`` must be those ``serve()`` was given (its calibration sets the rates);
    ``nodes`` describes the replica's nodes (default: the descriptors its plan recorded).

    Raises:
        InputError: a node of the replica is not described, or a U below 1.
    """
    described = list(nodes) if nodes is not None else list(replica.plan.nodes)
    units, parents, bounds = _pipeline(replica, described)
    wanted = curve_users(replica.users) if users is None else tuple(users)
    if any(u < 1 for u in wanted):
        raise InputError("users", list(wanted), "must all be >= 1")
    top = max(wanted, default=1)
    base = serving_constraints(workload, constraints)
    cm = CostModel(model, units, replace(base, batch=top + 1), parents=parents)
    order = list(range(len(units)))
    ttft0 = pipeline_prefill(cm, order, bounds, workload.prompt_tokens).ttft0_s
    o = workload.output_tokens
    points = []
    for u in wanted:
        m, b = microbatches(u, len(order))
        ev = cm.at_microbatch(min(b, cm.batch)).evaluate_here(order, bounds)
        cycle = cycle_seconds(ev.stage_time_s, ev.hops_s, m)
        points.append(CurvePoint(users=u, ttft_s=ttft0 + cycle, tpot_s=cycle + u * ttft0 / o))
    return tuple(points)
