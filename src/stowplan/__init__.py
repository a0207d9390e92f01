"""stowplan: decide where every byte of a large language model lives, then make it so.

The public API::

    from stowplan import Constraints, plan, resolve_model
    layout = resolve_model("llama3.1:70b")    # unknown: InputError naming the near matches
    p = plan(layout, nodes, Constraints(min_stages=2))

``plan`` places a MoE model's experts too, as ``stowplan plan`` does; its
statistics and placement come in ``plan(..., experts=ExpertInputs(load=...,
placement=ExpertPlacement.BLOCK_LOCAL))``.

The newer parts are reachable from here too and are imported on first use, so
``import stowplan`` stays light (no Ray, no NVML, no numpy): MoE inputs
(``ExpertInputs``, ``ExpertLoad``, ``load_expert_load`` …; ``plan_with_experts``
is a deprecated alias of ``plan``), engine exports (``export_plan``), one-host
residency (``plan_employment``, ``probe_host``) and Ray clusters (``init_ray``,
``FleetSpec``, ``realise_with_replan``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from stowplan.calibration.profile import Calibration
from stowplan.errors import (
    ClusterError,
    DependencyError,
    HeadStartError,
    Infeasible,
    InputError,
    InsufficientResources,
    InsufficientVram,
    MalformedJson,
    NodeProbeError,
    NoNodeFitsHead,
    PassportUnreadable,
    PlacementError,
    PlacementInfeasible,
    PlacementTimeout,
    PlanError,
    ReplicaUnplaceable,
    StageFailure,
    StageStartError,
    StageUnplaceable,
    StowplanError,
    TargetUnreached,
    UnsupportedByEngine,
    UnsupportedByWorker,
)
from stowplan.files.fleets import load_nodes, load_offers
from stowplan.model import (
    Constraints,
    ExpertId,
    ExpertLayout,
    Metric,
    ModelLayout,
    NodeDescriptor,
    Objective,
    Strategy,
)
from stowplan.models import lookup, resolve_model
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
from stowplan.planner.context import (
    ContextFit,
    default_context_tokens,
    fit_context,
    plan_within_context,
)
from stowplan.stages.worker import WorkerStage, stage_env, stage_from_env

if TYPE_CHECKING:
    from stowplan.cluster import FleetRole, FleetSpec, init_ray
    from stowplan.cluster.realise import Realisation, realise, realise_with_replan
    from stowplan.exports import EngineExport, export_plan
    from stowplan.host import probe_host
    from stowplan.moe.stats import (
        CoActivation,
        ExpertLoad,
        load_coactivation,
        load_expert_load,
    )
    from stowplan.planner.experts import ExpertInputs, ExpertPlacement, plan_with_experts
    from stowplan.planner.residency import EmploymentPlan, plan_employment
    from stowplan.serve_plan import ReplicaPlan, ServeCertificate, ServeObjective, ServePlan
    from stowplan.serving import serve
    from stowplan.workload import Binding, Workload

__version__ = "0.1.0"

_LAZY = {
    "Binding": "stowplan.workload",
    "ReplicaPlan": "stowplan.serve_plan",
    "ServeCertificate": "stowplan.serve_plan",
    "ServeObjective": "stowplan.serve_plan",
    "ServePlan": "stowplan.serve_plan",
    "Workload": "stowplan.workload",
    "serve": "stowplan.serving",
    "CoActivation": "stowplan.moe.stats",
    "EmploymentPlan": "stowplan.planner.residency",
    "EngineExport": "stowplan.exports",
    "ExpertInputs": "stowplan.planner.experts",
    "ExpertLoad": "stowplan.moe.stats",
    "ExpertPlacement": "stowplan.planner.experts",
    "FleetRole": "stowplan.cluster",
    "FleetSpec": "stowplan.cluster",
    "Realisation": "stowplan.cluster.realise",
    "export_plan": "stowplan.exports",
    "init_ray": "stowplan.cluster",
    "load_coactivation": "stowplan.moe.stats",
    "load_expert_load": "stowplan.moe.stats",
    "plan_employment": "stowplan.planner.residency",
    "plan_with_experts": "stowplan.planner.experts",
    "probe_host": "stowplan.host",
    "realise": "stowplan.cluster.realise",
    "realise_with_replan": "stowplan.cluster.realise",
}
"""Public names imported from their module on first access (see the module docstring)."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'stowplan' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "SCHEMA_VERSION",
    "Binding",
    "Calibration",
    "Certificate",
    "ClusterError",
    "CoActivation",
    "Constraints",
    "ContextFit",
    "DependencyError",
    "EmploymentPlan",
    "EngineExport",
    "ExpertId",
    "ExpertInputs",
    "ExpertLayout",
    "ExpertLoad",
    "ExpertPlacement",
    "FleetRole",
    "FleetSpec",
    "HeadStartError",
    "Infeasible",
    "InputError",
    "InsufficientResources",
    "InsufficientVram",
    "MalformedJson",
    "Metric",
    "ModelLayout",
    "NoNodeFitsHead",
    "NodeDescriptor",
    "NodeProbeError",
    "Objective",
    "PassportUnreadable",
    "PlacementError",
    "PlacementInfeasible",
    "PlacementTimeout",
    "Plan",
    "PlanError",
    "PlanRationale",
    "Prediction",
    "Realisation",
    "ReplicaPlan",
    "ReplicaUnplaceable",
    "ServeCertificate",
    "ServeObjective",
    "ServePlan",
    "StageAssignment",
    "StageFailure",
    "StageStartError",
    "StageUnplaceable",
    "StowplanError",
    "Strategy",
    "TargetUnreached",
    "Topology",
    "TopologyKind",
    "UnsupportedByEngine",
    "UnsupportedByWorker",
    "WorkerStage",
    "Workload",
    "__version__",
    "default_context_tokens",
    "export_plan",
    "fit_context",
    "init_ray",
    "load_coactivation",
    "load_expert_load",
    "load_nodes",
    "load_offers",
    "lookup",
    "plan",
    "plan_employment",
    "plan_from_json",
    "plan_to_json",
    "plan_with_experts",
    "plan_within_context",
    "probe_host",
    "realise",
    "realise_with_replan",
    "resolve_model",
    "serve",
    "stage_env",
    "stage_from_env",
]
