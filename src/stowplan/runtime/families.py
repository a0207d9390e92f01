"""What the reference stage worker can execute, checked before anything loads.

Pure: reads a plan and a checkpoint's ``config.json`` (already parsed), imports
no torch.  :func:`check_runnable` refuses, with
:class:`~stowplan.errors.UnsupportedByWorker` naming the reason and the remedy,
a model family the worker has no code for, a stage split over several GPUs
(tensor parallel) and experts placed away from their block (expert parallel);
a block-local plan (every expert on its block's stage) runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from stowplan.errors import InputError, UnsupportedByWorker
from stowplan.plan import Plan

__all__ = ["Family", "check_runnable", "family_of"]


class Family(StrEnum):
    """The ``model_type`` values of the checkpoints the worker runs with their own code."""

    LLAMA = "llama"
    MISTRAL = "mistral"
    QWEN2 = "qwen2"
    QWEN3 = "qwen3"
    MIXTRAL = "mixtral"
    """Mixture of experts; every block's experts on its own stage (block-local)."""


def family_of(config: Mapping[str, Any]) -> Family:
    """The family of a checkpoint's ``config.json``.

    Raises:
        UnsupportedByWorker: its ``model_type`` is not one of :class:`Family`.
    """
    model_type = str(config.get("model_type", ""))
    try:
        return Family(model_type)
    except ValueError:
        accepted = ", ".join(f.value for f in Family)
        raise UnsupportedByWorker(
            f"model_type {model_type!r} is not one of the families it runs ({accepted})",
            "export the plan for an engine that runs this model (`stowplan export`)",
        ) from None


def check_runnable(plan: Plan, config: Mapping[str, Any]) -> Family:
    """The checkpoint's family, when the worker can execute ``plan`` of it.

    Raises:
        UnsupportedByWorker: an unsupported family, a stage with
            ``tensor_parallel > 1``, or experts placed expert-parallel.
        InputError: the plan's blocks are not the checkpoint's layers.
    """
    family = family_of(config)
    layers = config.get("num_hidden_layers")
    covered = max(a.block_range[1] for a in plan.assignments)
    if (plan.num_blocks is not None and plan.num_blocks != layers) or covered != layers:
        raise InputError(
            "plan.num_blocks",
            plan.num_blocks if plan.num_blocks is not None else covered,
            f"must equal the checkpoint's num_hidden_layers={layers}: plan this checkpoint",
        )
    for a in plan.assignments:
        if a.tensor_parallel > 1:
            raise UnsupportedByWorker(
                f"stage {a.stage} splits its blocks over tensor_parallel={a.tensor_parallel} "
                "GPUs, and the worker runs one GPU (or the CPU) per stage",
                "plan with --tp 1 (Constraints(tensor_parallel=1))",
            )
    away = sum(
        not a.block_range[0] <= e.block < a.block_range[1]
        for a in plan.assignments
        for e in a.owned_experts
    )
    if away:
        raise UnsupportedByWorker(
            f"the plan places {away} experts expert-parallel (away from their block), and "
            "the worker runs every block with all its experts",
            "plan with block-local experts (--block-local; "
            "ExpertInputs(placement=ExpertPlacement.BLOCK_LOCAL))",
        )
    return family
