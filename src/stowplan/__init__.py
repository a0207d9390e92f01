"""stowplan: decide where every byte of a large language model lives, then make it so.

The public API::

    from stowplan import Constraints, plan, lookup
    layout = lookup("llama3.1:70b")
    p = plan(layout, nodes, Constraints(min_stages=2))
"""

from __future__ import annotations

from stowplan.errors import (
    DependencyError,
    Infeasible,
    InputError,
    InsufficientVram,
    NoNodeFitsHead,
    PlanError,
    StowplanError,
)
from stowplan.model import (
    Constraints,
    ExpertId,
    ExpertLayout,
    ModelLayout,
    NodeDescriptor,
    Objective,
    Strategy,
)
from stowplan.models import lookup, resolve_model
from stowplan.nodefile import load_nodes, load_offers
from stowplan.plan import (
    SCHEMA_VERSION,
    Certificate,
    Plan,
    PlanRationale,
    Prediction,
    StageAssignment,
    Topology,
    TopologyKind,
    plan_from_json,
    plan_to_json,
)
from stowplan.planner import plan
from stowplan.worker import WorkerStage, stage_env, stage_from_env

__version__ = "0.1.0"

__all__ = [
    "SCHEMA_VERSION",
    "Certificate",
    "Constraints",
    "DependencyError",
    "ExpertId",
    "ExpertLayout",
    "Infeasible",
    "InputError",
    "InsufficientVram",
    "ModelLayout",
    "NoNodeFitsHead",
    "NodeDescriptor",
    "Objective",
    "Plan",
    "PlanError",
    "PlanRationale",
    "Prediction",
    "StageAssignment",
    "StowplanError",
    "Strategy",
    "Topology",
    "TopologyKind",
    "WorkerStage",
    "__version__",
    "load_nodes",
    "load_offers",
    "lookup",
    "plan",
    "plan_from_json",
    "plan_to_json",
    "resolve_model",
    "stage_env",
    "stage_from_env",
]
