"""A plan checked against the model and the nodes it names, as strictly as a planner
builds one.

:func:`~stowplan.plan.plan_from_json` checks what a plan says on its own (contiguous
ranges, limits, ids). A hand-edited plan can still name what its model or fleet does not
have: :func:`check_plan_fits` refuses a block range past the model's blocks, a
tensor-parallel degree the model's heads do not allow, a stage on a node missing from the
fleet and a GPU index or degree beyond the node's GPUs.  (A context beyond what the stages
hold is the KV check's: :func:`stowplan.exports.context.check_kv_fits`.)
"""

from __future__ import annotations

from collections.abc import Sequence

from stowplan.errors import InputError
from stowplan.model import ModelLayout, NodeDescriptor
from stowplan.plan import Plan
from stowplan.rules.tensor_parallel import tensor_parallel_violation

__all__ = ["check_plan_fits"]


def check_plan_fits(
    plan: Plan,
    *,
    layout: ModelLayout | None = None,
    nodes: Sequence[NodeDescriptor] | None = None,
) -> None:
    """Raise :class:`~stowplan.errors.InputError` (naming the plan's field) when ``plan``
    does not fit ``layout`` or ``nodes``; either may be None (not checked)."""
    if layout is not None:
        _check_model(plan, layout)
    if nodes is not None:
        _check_nodes(plan, nodes)


def _check_model(plan: Plan, layout: ModelLayout) -> None:
    blocks = layout.num_blocks
    last = plan.assignments[-1]
    if last.block_range[1] > blocks:
        raise InputError(
            f"assignments[{last.stage}].block_range",
            last.block_range,
            f"must lie within {layout.name}'s {blocks} blocks [0, {blocks})",
        )
    for a in plan.assignments:
        if a.tensor_parallel > 1:
            why = tensor_parallel_violation(a.tensor_parallel, layout)
            if why is not None:
                raise InputError(f"assignments[{a.stage}].tensor_parallel", a.tensor_parallel, why)


def _check_nodes(plan: Plan, nodes: Sequence[NodeDescriptor]) -> None:
    by_id = {n.id: n for n in nodes}
    for a in plan.assignments:
        where = f"assignments[{a.stage}]"
        node = by_id.get(a.node_id)
        if node is None:
            shown = ", ".join(sorted(by_id)[:5]) + (" …" if len(by_id) > 5 else "")
            raise InputError(
                f"{where}.node_id", a.node_id, f"must be a node of --nodes ({shown or 'none'})"
            )
        if a.tensor_parallel > node.num_gpus:
            raise InputError(
                f"{where}.tensor_parallel",
                a.tensor_parallel,
                f"must be at most the {node.num_gpus} GPUs of node {node.id}",
            )
        bad = [g for g in a.gpu_indices if g >= node.num_gpus]
        if bad:
            raise InputError(
                f"{where}.gpu_indices",
                a.gpu_indices,
                f"must be GPU indices of node {node.id}, in [0, {node.num_gpus})",
            )
