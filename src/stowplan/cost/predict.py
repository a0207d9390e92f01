"""What the cost model predicts for a plan: :func:`predict`, dense or expert-parallel.

A plan whose experts are placed (``Topology.PipelineWithExperts``) is predicted by
:func:`stowplan.cost.experts.expert_prediction` (the backbone's stage times plus
the experts' term); any other by :class:`~stowplan.cost.model.CostModel`, a stage on
part of a node's GPUs as a planning node of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from stowplan.calibration.profile import Calibration
from stowplan.cost.experts import expert_prediction
from stowplan.cost.model import CostModel
from stowplan.errors import InputError
from stowplan.model import Constraints, ModelLayout, NodeDescriptor, stage_node
from stowplan.plan import Plan, Prediction, StageAssignment

__all__ = ["predict"]


def predict(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    constraints: Constraints,
    plan: Plan,
    calibration: Calibration | None = None,
) -> Prediction:
    """What the cost model predicts for ``plan`` of ``model`` on ``nodes``.

    ``calibration`` (default: ``constraints.calibration``) applies a profile's
    corrections; None there too gives the first-order model.
    """
    if plan.topology.experts_per_block is not None and model.experts is not None:
        return expert_prediction(model, nodes, constraints, plan, calibration=calibration)
    by_id = {n.id: n for n in nodes}
    if any(_on_part_of_node(a, by_id) for a in plan.assignments):
        # Stages on GPU groups: each group is a planning node of its own.
        units = [
            stage_node(by_id[a.node_id], a.gpu_indices, a.tensor_parallel) for a in plan.assignments
        ]
        parents = [a.node_id for a in plan.assignments]
        cm = CostModel(model, units, constraints, calibration, parents=parents)
    else:
        cm = CostModel(model, nodes, constraints, calibration)
    order, bounds = cm.plan_order_bounds(plan)
    return cm.prediction(order, bounds)


def _on_part_of_node(a: StageAssignment, by_id: dict[str, NodeDescriptor]) -> bool:
    node = by_id.get(a.node_id)
    if node is None:
        raise InputError("plan.assignments[].node_id", a.node_id, "is not one of the nodes given")
    return bool(a.gpu_indices) and a.tensor_parallel < node.num_gpus
