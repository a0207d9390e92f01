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
from stowplan.cost.model import plan_cost_model
from stowplan.model import Constraints, ModelLayout, NodeDescriptor
from stowplan.plan import Plan, Prediction

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
    cm = plan_cost_model(model, plan, nodes, constraints, calibration)
    order, bounds = cm.plan_order_bounds(plan)
    return cm.prediction(order, bounds)
