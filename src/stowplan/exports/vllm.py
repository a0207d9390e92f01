"""vLLM: ``--pipeline-parallel-size``, ``--tensor-parallel-size`` and an uneven split
through ``VLLM_PP_LAYER_PARTITION`` (see :mod:`stowplan.exports.pipeline`).

Ranks: vLLM's rank ``r`` is pipeline rank ``r // tp``, tensor-parallel rank
``r % tp``. On one host (the default multiprocessing executor) rank ``r`` runs on
the ``r``-th GPU of ``CUDA_VISIBLE_DEVICES``. Across hosts (the Ray executor)
the workers are sorted before ranks are given: the node running ``vllm serve``
first, then nodes with fewer workers, then by IP address compared as text; on a
node, by GPU id. So a node's stages must be consecutive, the nodes after the
first must use no fewer GPUs than the node before them, and each node's Ray
must see exactly the GPUs the plan gives it (``CUDA_VISIBLE_DEVICES`` before
``ray start``). A node's GPUs are alike, so which of them runs which of its
stages does not change the plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from stowplan.exports.common import (
    model_argument,
    node_address,
    node_devices,
    nodes_by_id,
    replan_command,
)
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

__all__ = ["PARTITION_VARIABLE", "RAY_PORT", "export_vllm", "partition_string"]

RAY_PORT = 6379
"""Port of the Ray head on stage 0's node."""


def _gpu_order(
    plan: Plan,
    runs: dict[str, list[StageAssignment]],
    tensor_parallel: int,
    nodes_file: str | None,
) -> None:
    """Refuse node orders the Ray executor would change: after the first node, each node
    must use at least as many GPUs as the one before it."""
    counts = [(node_id, len(stages) * tensor_parallel) for node_id, stages in runs.items()]
    for (prev, more), (node_id, fewer) in pairwise(counts[1:]):
        if fewer < more:
            raise UnsupportedByEngine(
                Engine.VLLM,
                f"{prev} ({more} GPUs) comes before {node_id} ({fewer} GPUs) in the pipeline, "
                "but vLLM's Ray executor ranks the nodes after the first by the GPUs they use, "
                "fewest first; replan for it: " + replan_command(plan, "vllm", nodes_file),
            )


def _placement_note(plan: Plan, runs: dict[str, list[StageAssignment]]) -> str:
    """Where to start Ray and ``vllm serve``, and the node order to keep."""
    first = plan.assignments[0].node_id
    if not runs:
        order = " -> ".join(f"{a.node_id} (stage {a.stage})" for a in plan.assignments)
        what = "their number of GPUs"
        others = ", ".join(a.node_id for a in plan.assignments[1:])
    else:
        order = " -> ".join(f"{n} ({stage_span(s)})" for n, s in runs.items())
        what = "the GPUs they use (fewest first)"
        others = ", ".join(list(runs)[1:])
    return (
        f"Ray placement: stage order {order}. Start `ray start --head` and `vllm serve` on "
        f"{first}, which gets pipeline rank 0. vLLM ranks the other nodes by {what}, "
        f"then by IP address compared as text: give {others} addresses that sort in this "
        "order, or the uneven split lands on the wrong GPUs"
    )


def export_vllm(
    plan: Plan,
    *,
    nodes: Sequence[NodeDescriptor] | None = None,
    model: str | None = None,
    nodes_file: str | None = None,
) -> EngineExport:
    """``vllm serve`` with ``--pipeline-parallel-size N`` and ``VLLM_PP_LAYER_PARTITION``,
    ``--max-model-len`` the plan's context and ``--gpu-memory-utilization`` 1 − headroom
    (see :func:`~stowplan.exports.context.memory_fraction`).

    A plan that lists GPUs gets its tensor-parallel degree from its stages, and a
    ``CUDA_VISIBLE_DEVICES`` list for every node of which it uses not exactly all GPUs
    (``nodes`` say how many a node has; without them every listed node gets one): on the
    ``vllm serve`` line for one host, before ``ray start`` on each node for several.
    Raises :class:`UnsupportedByEngine` for experts away from their block, unequal GPU
    counts per stage, anchors on inner stages, or a node order vLLM would change; the
    refusals the planner can avoid name the ``stowplan plan`` line (fleet ``nodes_file``)
    that does.
    """
    by_id = nodes_by_id(nodes)
    tp = check_pipeline(plan, Engine.VLLM, by_id, nodes_file)
    lists = uses_gpu_lists(plan)
    runs = node_runs(plan, Engine.VLLM, nodes_file) if lists else {}
    if lists:
        _gpu_order(plan, runs, tp, nodes_file)
    devices = {n: d for n, s in runs.items() if (d := node_devices(s, by_id, ordered=False))}
    hosts = len(runs) if lists else plan.num_stages
    model_arg, model_notes = model_argument(plan, model)
    env: tuple[tuple[str, str], ...] = ((PARTITION_VARIABLE[Engine.VLLM], partition_string(plan)),)
    if hosts == 1 and devices:
        env = (("CUDA_VISIBLE_DEVICES", next(iter(devices.values()))), *env)
    args = ["--pipeline-parallel-size", str(plan.num_stages), "--tensor-parallel-size", str(tp)]
    if hosts > 1:
        args += ["--distributed-executor-backend", "ray"]
    if (context := context_of(plan)) is not None:
        args += ["--max-model-len", str(context)]
    fraction, assumed = memory_fraction(plan, by_id)
    args += ["--gpu-memory-utilization", fraction]
    serve = shell_line(env, ["vllm", "serve", model_arg, *args])
    commands = [serve]
    notes = [*model_notes, *common_notes(plan), *([assumed] if assumed else [])]
    if hosts > 1:
        notes.append(_placement_note(plan, runs))
    if hosts > 1:
        per_node = runs or _stages_by_node(plan)
        head = plan.assignments[0].node_id
        address = node_address(by_id.get(head))
        commands = [
            *_ray_start_lines(per_node, devices, address or head),
            shell_comment(f"on {head}"),
            serve,
        ]
        if address is None:
            notes.append(
                f"`ray start` uses the node id {head!r} as the head's host name: replace it "
                "with that node's address if the name does not resolve (or give the node a "
                "label address=IP in the fleet file)"
            )
    unused = [n for n in by_id if runs and n not in runs]
    if hosts > 1 and unused:
        notes.append(
            f"keep {', '.join(unused)} out of this Ray cluster: the plan does not use "
            f"{'it' if len(unused) == 1 else 'them'}, and vLLM places workers on any GPU Ray has"
        )
    if devices:
        notes.append(
            "CUDA_VISIBLE_DEVICES gives vLLM exactly the plan's GPUs of "
            + ", ".join(f"{n} ({d})" for n, d in devices.items())
        )
    return EngineExport(
        engine=Engine.VLLM,
        block_counts=plan.block_counts(),
        env=env,
        args=tuple(args),
        commands=tuple(commands),
        notes=tuple(notes),
        data={"visible_devices": devices} if devices else {},
    )


def _stages_by_node(plan: Plan) -> dict[str, list[StageAssignment]]:
    """The stages of each node, nodes in stage order (a plan of whole nodes)."""
    out: dict[str, list[StageAssignment]] = {}
    for a in plan.assignments:
        out.setdefault(a.node_id, []).append(a)
    return out


def _ray_start_lines(
    runs: dict[str, list[StageAssignment]], devices: dict[str, str], head_address: str
) -> list[str]:
    """``ray start`` on every node, the first (at ``head_address``) as the head, each
    seeing the plan's GPUs."""
    head = next(iter(runs))
    lines = []
    for node_id, stages in runs.items():
        env = (("CUDA_VISIBLE_DEVICES", devices[node_id]),) if node_id in devices else ()
        argv = ["ray", "start"]
        argv += ["--head", "--port", str(RAY_PORT)] if node_id == head else []
        argv += [] if node_id == head else ["--address", f"{head_address}:{RAY_PORT}"]
        lines.append(shell_comment(f"on {node_id} ({stage_span(stages)})"))
        lines.append(shell_line(env, argv))
    return lines
