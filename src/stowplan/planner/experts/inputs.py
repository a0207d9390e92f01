"""What the expert placement reads besides the plan: node speeds, free slots, tolerances."""

from __future__ import annotations

from collections.abc import Sequence

from stowplan.cost import node_rates
from stowplan.model import ModelLayout, NodeDescriptor, usable_bytes
from stowplan.plan import Plan

__all__ = ["LOCALITY_TOLERANCE", "expert_speeds", "free_slots"]

LOCALITY_TOLERANCE = 0.05
"""A co-activation-grouped block layout may be this much slower than the load-only one."""


def expert_speeds(nodes: Sequence[NodeDescriptor]) -> tuple[tuple[float, ...], str]:
    """Relative expert speed of every node (memory bandwidth / the fastest's) and its source.

    The cost model's bandwidth: the descriptor's, else the GPU spec table, else
    its default (see :func:`stowplan.cost.node_rates`).
    """
    speeds = []
    assumed = 0
    for n in nodes:
        rates, notes = node_rates(n, 0.0)
        speeds.append(rates.bandwidth_bytes_per_s)
        assumed += any("mem_bandwidth_gbps" in x for x in notes)
    source = "memory bandwidth"
    if assumed:
        source += f" ({assumed} of {len(speeds)} nodes from the spec table or default)"
    top = max(speeds)
    return tuple(x / top for x in speeds), source


def free_slots(
    plan: Plan, model: ModelLayout, nodes: Sequence[NodeDescriptor], headroom: float
) -> list[int]:
    """Whole routed experts each stage's node has room for beside what ``plan`` puts there.

    ``nodes`` are the stages' nodes in stage order.
    """
    ex = model.experts
    assert ex is not None
    out = []
    for a, node in zip(plan.assignments, nodes, strict=True):
        free = usable_bytes(node, headroom) - a.estimated_vram_bytes
        out.append(max(0, free) // ex.expert_params_bytes if ex.expert_params_bytes else 10**9)
    return out
