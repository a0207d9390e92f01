"""What a MoE plan reads: the user's :class:`ExpertInputs`, node speeds and free slots."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from stowplan.cost import node_rates
from stowplan.errors import InputError
from stowplan.model import ModelLayout, NodeDescriptor, usable_bytes
from stowplan.moe.stats import CoActivation, ExpertLoad
from stowplan.plan import Plan
from stowplan.quantities.checks import check_choice, check_int, check_number

__all__ = [
    "LOCALITY_TOLERANCE",
    "ExpertInputs",
    "ExpertPlacement",
    "expert_speeds",
    "free_slots",
]

LOCALITY_TOLERANCE = 0.05
"""A co-activation-grouped block layout may be this much slower than the load-only one."""


class ExpertPlacement(StrEnum):
    """Where a MoE model's routed experts live."""

    AUTO = "auto"
    """Block-local whenever it fits (the layout engines run), the expert-parallel
    alternative's prediction noted; expert-parallel when no block-local plan fits."""
    BLOCK_LOCAL = "block-local"
    """Every expert on the node of its block: a plain pipeline with no expert traffic
    (what engines without expert parallelism run)."""
    EXPERT_PARALLEL = "expert-parallel"
    """The backbone (blocks without their routed experts) planned first, the experts
    spread over its nodes, balanced for load and speed (pays the all-to-all per token)."""

    @classmethod
    def from_flag(cls, expert_parallel: bool | None) -> ExpertPlacement:
        """The placement ``--expert-parallel`` (True), ``--block-local`` (False) or
        neither (None) asks for."""
        if expert_parallel is None:
            return cls.AUTO
        return cls.EXPERT_PARALLEL if expert_parallel else cls.BLOCK_LOCAL


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertInputs:
    """What planning a MoE model reads besides the model, the nodes and the constraints.

    Every field has a default: ``ExpertInputs()`` is uniform routing, the default
    replicas and the automatic placement.  ``placement`` may be given as its text
    (``"block-local"``).  A dense model accepts only inputs without statistics.
    """

    load: ExpertLoad | None = None
    """Selection counts of every routed expert per MoE block (``--expert-load``);
    None: uniform routing."""
    coactivation: CoActivation | None = None
    """Counts of expert pairs selected for the same token (``--coactivation``); None:
    independent routing."""
    redundant_per_block: int | None = None
    """Most redundant replicas of hot experts per MoE block in an expert-parallel
    placement; None: ``num_experts // 8``; 0: none."""
    locality_tolerance: float = LOCALITY_TOLERANCE
    """How much slower (a fraction) a block's slowest node may get to keep co-activated
    experts on one node."""
    placement: ExpertPlacement = ExpertPlacement.AUTO
    """Block-local, expert-parallel, or whichever the cost model favours."""

    def __post_init__(self) -> None:
        if self.load is not None and not isinstance(self.load, ExpertLoad):
            raise InputError("load", type(self.load).__name__, "must be an ExpertLoad or None")
        if self.coactivation is not None and not isinstance(self.coactivation, CoActivation):
            raise InputError(
                "coactivation", type(self.coactivation).__name__, "must be a CoActivation or None"
            )
        if self.redundant_per_block is not None:
            check_int("redundant_per_block", self.redundant_per_block)
        check_number("locality_tolerance", self.locality_tolerance)
        placement = check_choice("placement", self.placement, ExpertPlacement)
        object.__setattr__(self, "placement", placement)

    @property
    def has_statistics(self) -> bool:
        """Whether a load or co-activation file was given (only MoE models take them)."""
        return self.load is not None or self.coactivation is not None


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
    """Whole routed experts each stage has room for beside what ``plan`` puts there: in
    its usable VRAM where the plan records it (a stage on a group of a node's GPUs has
    the group's share), else in its node's.

    ``nodes`` are the stages' nodes in stage order.
    """
    ex = model.experts
    assert ex is not None
    out = []
    for a, node in zip(plan.assignments, nodes, strict=True):
        usable = a.usable_vram_bytes
        free = (usable_bytes(node, headroom) if usable is None else usable) - a.estimated_vram_bytes
        out.append(max(0, free) // ex.expert_params_bytes if ex.expert_params_bytes else 10**9)
    return out
