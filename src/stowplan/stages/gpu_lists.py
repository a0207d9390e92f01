"""How a stage's GPUs are written: ``gpu0-3`` for people, ``0,1,2,3`` for CUDA.

A stage runs on ``tensor_parallel`` GPUs of its node, listed in ``gpu_indices``;
an empty list is the whole node (how plans of single-GPU nodes spell it). The
exports, the worker contract and the reports all print a stage's GPUs through
these functions, so one stage reads the same everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence

from stowplan.plan import Plan, StageAssignment

__all__ = [
    "gpu_range_text",
    "node_stages",
    "stage_gpus_text",
    "stage_place_text",
    "uses_gpu_lists",
    "visible_devices",
]


def gpu_range_text(indices: Sequence[int]) -> str:
    """``gpu0-3``, ``gpu5``, ``gpu0-1,6-7``: runs of consecutive indices, in the given order."""
    runs: list[list[int]] = []
    for g in indices:
        if runs and g == runs[-1][-1] + 1:
            runs[-1].append(g)
        else:
            runs.append([g])
    return "gpu" + ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def visible_devices(indices: Sequence[int]) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value of these GPUs: ``0,1,2,3``."""
    return ",".join(str(g) for g in indices)


def stage_gpus_text(a: StageAssignment) -> str:
    """``gpu0-3 tp4`` for a stage on listed GPUs (``gpu5`` for one), ``tp4`` for a whole
    node split four ways, and ``""`` for a stage on a whole single-GPU node."""
    tp = f"tp{a.tensor_parallel}" if a.tensor_parallel > 1 else ""
    if a.gpu_indices:
        return f"{gpu_range_text(a.gpu_indices)} {tp}".rstrip()
    return tp


def stage_place_text(a: StageAssignment) -> str:
    """The node and GPUs of a stage: ``n0 gpu0-3 tp4``, or ``n0`` for a whole node."""
    gpus = stage_gpus_text(a)
    return f"{a.node_id} {gpus}" if gpus else a.node_id


def uses_gpu_lists(plan: Plan) -> bool:
    """Whether any stage names its GPUs or a tensor-parallel degree (a version-2 plan)."""
    return any(a.uses_tensor_parallel_fields for a in plan.assignments)


def node_stages(plan: Plan) -> dict[str, list[StageAssignment]]:
    """The stages of each node, nodes in order of their first stage."""
    out: dict[str, list[StageAssignment]] = {}
    for a in plan.assignments:
        out.setdefault(a.node_id, []).append(a)
    return out
