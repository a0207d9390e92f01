"""The former entry point for MoE models, kept as a deprecated alias of :func:`stowplan.plan`."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from stowplan.model import Constraints, ModelLayout, NodeDescriptor
from stowplan.moe.stats import CoActivation, ExpertLoad
from stowplan.plan import Plan
from stowplan.planner.experts.inputs import LOCALITY_TOLERANCE, ExpertInputs, ExpertPlacement

__all__ = ["plan_with_experts"]


def plan_with_experts(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    constraints: Constraints | None = None,
    load: ExpertLoad | None = None,
    coactivation: CoActivation | None = None,
    *,
    redundant_per_block: int | None = None,
    locality_tolerance: float = LOCALITY_TOLERANCE,
    expert_parallel: bool | None = None,
) -> Plan:
    """Deprecated: ``stowplan.plan(model, nodes, constraints, experts=ExpertInputs(...))``.

    Returns the same plan; ``expert_parallel`` True, False or None is
    ``ExpertPlacement.EXPERT_PARALLEL``, ``BLOCK_LOCAL`` or ``AUTO``.
    """
    warnings.warn(
        "plan_with_experts is deprecated; use stowplan.plan(model, nodes, constraints, "
        "experts=ExpertInputs(load=..., coactivation=..., placement=...))",
        DeprecationWarning,
        stacklevel=2,
    )
    from stowplan.planner import plan

    experts = ExpertInputs(
        load=load,
        coactivation=coactivation,
        redundant_per_block=redundant_per_block,
        locality_tolerance=locality_tolerance,
        placement=ExpertPlacement.from_flag(expert_parallel),
    )
    return plan(model, nodes, constraints, experts=experts)
