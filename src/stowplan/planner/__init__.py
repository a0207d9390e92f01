"""The pure planning core: ``plan(model, nodes, constraints) -> Plan``.

Imports no Ray, NVML, torch or network module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from stowplan.errors import InputError, StowplanError
from stowplan.model import Constraints, ModelLayout, NodeDescriptor, Strategy
from stowplan.plan import Plan
from stowplan.planner.common import Problem, prepare
from stowplan.planner.vram import plan_balance_by_vram

__all__ = ["plan"]

_STRATEGIES: dict[Strategy, Callable[[Problem], Plan]] = {
    Strategy.BALANCE_BY_VRAM: plan_balance_by_vram,
}


def plan(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    constraints: Constraints | None = None,
) -> Plan:
    """Place ``model`` on a pipeline of ``nodes``.

    Chooses the number of stages N, which nodes and their order, and the
    contiguous half-open block range of every stage; stage 0 owns the embed,
    stage N-1 owns the head.  Every stage's ``estimated_vram_bytes`` (weights +
    KV reserve) is at most its node's ``vram_bytes * (1 - headroom)``.  The
    same input always gives the same plan.

    Raises:
        InsufficientVram: the usable VRAM of the largest ``max_stages`` nodes
            is below the model's bytes.
        NoNodeFitsHead: no node can hold the embed or the head.
        Infeasible: the constraints cannot be met (the reason says why).
        InputError: malformed arguments.
    """
    constraints = Constraints() if constraints is None else constraints
    problem = prepare(model, nodes, constraints)
    strategy = constraints.resolved_strategy()
    runner = _STRATEGIES.get(strategy, plan_balance_by_vram)
    try:
        return runner(problem)
    except StowplanError:
        raise
    except (ArithmeticError, ValueError) as exc:  # numbers beyond what a plan can express
        raise InputError("nodes", "<extreme values>", f"cannot be planned ({exc})") from exc
