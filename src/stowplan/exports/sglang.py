"""SGLang: ``--pp-size``, ``--tp-size`` and an uneven split through
``SGLANG_PP_LAYER_PARTITION`` (see :mod:`stowplan.exports.pipeline`), one
``sglang.launch_server`` line per node.

How SGLang places ranks (``_launch_scheduler_processes``): with ``--nnodes H``
and ``--pp-size P``, node rank ``r`` runs pipeline ranks ``[r·k, (r+1)·k)``
where ``k = P // H``, and pipeline rank ``p``, tensor-parallel rank ``t`` on GPU
``(p mod k)·tp + t`` of the node. So every node runs the same number of
consecutive stages, and ``CUDA_VISIBLE_DEVICES`` lists a node's GPUs in stage
order when they are not simply all of the node's GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence

from stowplan.exports.common import model_argument, node_devices, nodes_by_id, replan_command
from stowplan.exports.context import context_of, memory_fraction
from stowplan.exports.pipeline import (
    PARTITION_VARIABLE,
    check_pipeline,
    common_notes,
    node_runs,
    partition_string,
    stage_span,
)
from stowplan.exports.result import Engine, EngineExport, UnsupportedByEngine, shell_line
from stowplan.model import NodeDescriptor
from stowplan.plan import Plan, StageAssignment
from stowplan.stages.gpu_lists import uses_gpu_lists
from stowplan.text.shell import shell_comment

__all__ = ["SGLANG_PORT", "export_sglang"]

SGLANG_PORT = 50000
"""Port of ``--dist-init-addr`` on stage 0's node."""


def _equal_runs(plan: Plan, runs: dict[str, list[StageAssignment]], nodes_file: str | None) -> None:
    """Refuse nodes with different numbers of stages: SGLang gives each ``P // H``."""
    counts = {node_id: len(stages) for node_id, stages in runs.items()}
    if len(set(counts.values())) > 1:
        detail = ", ".join(f"{n}: {c}" for n, c in counts.items())
        raise UnsupportedByEngine(
            Engine.SGLANG,
            f"nodes run different numbers of stages ({detail}); SGLang gives every node "
            "--pp-size / --nnodes of them; replan for it: "
            + replan_command(plan, "sglang", nodes_file),
        )


def export_sglang(
    plan: Plan,
    *,
    nodes: Sequence[NodeDescriptor] | None = None,
    model: str | None = None,
    nodes_file: str | None = None,
) -> EngineExport:
    """One ``sglang.launch_server`` line per node, ``--node-rank`` in stage order, with
    ``--context-length`` the plan's context and ``--mem-fraction-static`` 1 − headroom.

    With ``--nnodes`` the number of nodes, SGLang gives node rank ``r`` the ``r``-th run
    of stages, so the plan's node order is kept exactly. Raises
    :class:`UnsupportedByEngine` like :func:`~stowplan.exports.vllm.export_vllm`, and for
    nodes that run different numbers of stages.
    """
    by_id = nodes_by_id(nodes)
    tp = check_pipeline(plan, Engine.SGLANG, by_id, nodes_file)
    runs: list[tuple[str, list[StageAssignment]]] = [(a.node_id, [a]) for a in plan.assignments]
    if uses_gpu_lists(plan):
        by_node = node_runs(plan, Engine.SGLANG, nodes_file)
        _equal_runs(plan, by_node, nodes_file)
        runs = list(by_node.items())
    model_arg, model_notes = model_argument(plan, model)
    part = ((PARTITION_VARIABLE[Engine.SGLANG], partition_string(plan)),)
    n = len(runs)
    args = ["--pp-size", str(plan.num_stages), "--tp-size", str(tp)]
    if (context := context_of(plan)) is not None:
        args += ["--context-length", str(context)]
    fraction, assumed = memory_fraction(plan, by_id)
    args += ["--mem-fraction-static", fraction]
    head = plan.assignments[0].node_id
    commands = []
    devices: dict[str, str] = {}
    for rank, (node_id, stages) in enumerate(runs):
        per_node = ["--nnodes", str(n), "--node-rank", str(rank)]
        if n > 1:
            per_node += ["--dist-init-addr", f"{head}:{SGLANG_PORT}"]
        env: tuple[tuple[str, str], ...] = part
        if (listed := node_devices(stages, by_id, ordered=True)) is not None:
            devices[node_id] = listed
            env = (("CUDA_VISIBLE_DEVICES", listed), *part)
        argv = ["python", "-m", "sglang.launch_server", "--model-path", model_arg]
        commands.append(shell_comment(f"on {node_id} ({stage_span(stages)})"))
        commands.append(shell_line(env, [*argv, *args, *per_node]))
    notes = [*model_notes, *common_notes(plan), *([assumed] if assumed else [])]
    if n > 1:
        notes.append(
            f"--dist-init-addr uses the node id {head!r} as stage 0's host name: replace it "
            "with that node's address if the name does not resolve"
        )
    if devices:
        notes.append(
            "CUDA_VISIBLE_DEVICES lists each node's GPUs in stage order: "
            + ", ".join(f"{node} ({d})" for node, d in devices.items())
        )
    return EngineExport(
        engine=Engine.SGLANG,
        block_counts=plan.block_counts(),
        env=part,
        args=tuple(args),
        commands=tuple(commands),
        notes=tuple(notes),
        data={"visible_devices": devices} if devices else {},
    )
