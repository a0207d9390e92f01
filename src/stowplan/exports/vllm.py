"""vLLM and SGLang: an uneven pipeline split through the layer-partition variable.

Both engines read a comma-separated list of decoder-layer counts, one per
pipeline rank (``VLLM_PP_LAYER_PARTITION`` / ``SGLANG_PP_LAYER_PARTITION``),
and reject it unless it has exactly ``pipeline size`` entries summing to the
model's ``num_hidden_layers``. Rank 0 holds the token embedding and the last
rank the final norm and ``lm_head`` (with tied embeddings the last rank loads
the table too), which is exactly a stowplan plan's embed/head anchors.

What they cannot express, and this module refuses: experts kept on another
stage than their block, a tensor-parallel degree that differs between stages,
and anchors on other stages than the first and the last.

Node order: SGLang takes it explicitly (``--node-rank``). vLLM's Ray executor
orders its workers itself (the node running ``vllm serve`` first, then nodes
with fewer GPUs, then by IP address compared as text), so the export states the
order the nodes need.
"""

from __future__ import annotations

from collections.abc import Sequence

from stowplan.exports.common import (
    expert_owners,
    model_argument,
    nodes_by_id,
    stage_of_block,
)
from stowplan.exports.result import Engine, EngineExport, UnsupportedByEngine, shell_line
from stowplan.model import NodeDescriptor
from stowplan.plan import Plan

__all__ = ["PARTITION_VARIABLE", "export_sglang", "export_vllm", "partition_string"]

PARTITION_VARIABLE = {
    Engine.VLLM: "VLLM_PP_LAYER_PARTITION",
    Engine.SGLANG: "SGLANG_PP_LAYER_PARTITION",
}

SGLANG_PORT = 50000
"""Port of ``--dist-init-addr`` on stage 0's node."""


def partition_string(plan: Plan) -> str:
    """The plan's block counts in the engines' format: ``"27,26,27"``."""
    return ",".join(str(n) for n in plan.block_counts())


def _engines_that_accept(plan: Plan, nodes: Sequence[NodeDescriptor]) -> list[str]:
    """The one-host engines whose exporter accepts ``plan`` (for a refusal's suggestion)."""
    from stowplan.errors import InputError
    from stowplan.exports.accelerate import export_accelerate
    from stowplan.exports.common import resolve_layout
    from stowplan.exports.llamacpp import export_llamacpp

    layout = resolve_layout(plan, None)
    out = []
    for engine in (Engine.LLAMACPP, Engine.ACCELERATE):
        try:
            if engine is Engine.LLAMACPP:
                export_llamacpp(plan, nodes=nodes, layout=layout)
            else:
                export_accelerate(plan, nodes=nodes, layout=layout)
        except (UnsupportedByEngine, InputError):
            continue
        out.append(engine.value)
    return out


def _check_pipeline(plan: Plan, engine: Engine, nodes: dict[str, NodeDescriptor]) -> int:
    """Refuse what a plain pipeline cannot run; return the tensor-parallel degree."""
    last = plan.num_stages - 1
    for a in plan.assignments:
        if a.owns_embed != (a.stage == 0) or a.owns_head != (a.stage == last):
            raise UnsupportedByEngine(
                engine,
                f"stage {a.stage} on {a.node_id} owns embed={a.owns_embed}, head={a.owns_head}; "
                "the engine puts the embedding on the first stage and the head on the last only",
            )
    for block, per_stage in sorted(expert_owners(plan).items()):
        home = stage_of_block(plan, block).stage
        away = sorted(s for s in per_stage if s != home)
        if away:
            others = _engines_that_accept(plan, list(nodes.values()))
            also = f", or --to {' or --to '.join(others)}" if others else ""
            raise UnsupportedByEngine(
                engine,
                f"experts of block {block} are placed on stage {away[0]} but the block is on "
                f"stage {home}; a pipeline stage keeps every expert of its own layers "
                f"(use an expert-parallel plan for the engine's own EP{also})",
            )
    degrees = {nodes[a.node_id].num_gpus for a in plan.assignments if a.node_id in nodes}
    if len(degrees) > 1:
        detail = ", ".join(
            f"{a.node_id}={nodes[a.node_id].num_gpus}"
            for a in plan.assignments
            if a.node_id in nodes
        )
        raise UnsupportedByEngine(
            engine,
            f"stages have different GPU counts ({detail}); the engine runs one "
            "tensor-parallel degree on every pipeline stage",
        )
    return degrees.pop() if degrees else 1


def _common_notes(plan: Plan) -> list[str]:
    notes = []
    empty = [a for a in plan.assignments if a.num_blocks == 0]
    for a in empty:
        notes.append(
            f"stage {a.stage} on {a.node_id} holds no decoder layer (only "
            f"{'the embedding' if a.owns_embed else 'the head'}); its rank only forwards"
        )
    if plan.context_tokens is None:
        notes.append("the plan has no context_tokens: the engine picks its own maximum length")
    return notes


def export_vllm(
    plan: Plan, *, nodes: Sequence[NodeDescriptor] | None = None, model: str | None = None
) -> EngineExport:
    """``vllm serve`` with ``--pipeline-parallel-size N`` and ``VLLM_PP_LAYER_PARTITION``.

    Raises :class:`UnsupportedByEngine` for experts away from their block, unequal GPU
    counts per stage, or anchors on inner stages.
    """
    by_id = nodes_by_id(nodes)
    tp = _check_pipeline(plan, Engine.VLLM, by_id)
    model_arg, model_notes = model_argument(plan, model)
    env = ((PARTITION_VARIABLE[Engine.VLLM], partition_string(plan)),)
    args = [
        "--pipeline-parallel-size",
        str(plan.num_stages),
        "--tensor-parallel-size",
        str(tp),
    ]
    if plan.num_stages > 1:
        args += ["--distributed-executor-backend", "ray"]
    if plan.context_tokens is not None:
        args += ["--max-model-len", str(plan.context_tokens)]
    order = " -> ".join(f"{a.node_id} (stage {a.stage})" for a in plan.assignments)
    notes = [*model_notes, *_common_notes(plan)]
    if plan.num_stages > 1:
        first = plan.assignments[0].node_id
        rest = ", ".join(a.node_id for a in plan.assignments[1:])
        notes.append(
            f"Ray placement: stage order {order}. Start `ray start --head` and `vllm serve` on "
            f"{first}, which gets pipeline rank 0. vLLM ranks the other nodes by their number of "
            f"GPUs, then by IP address compared as text: give {rest} addresses that sort in this "
            "order, or the uneven split lands on the wrong GPUs"
        )
    return EngineExport(
        engine=Engine.VLLM,
        block_counts=plan.block_counts(),
        env=env,
        args=tuple(args),
        commands=(shell_line(env, ["vllm", "serve", model_arg, *args]),),
        notes=tuple(notes),
    )


def export_sglang(
    plan: Plan, *, nodes: Sequence[NodeDescriptor] | None = None, model: str | None = None
) -> EngineExport:
    """One ``sglang.launch_server`` line per stage node, ``--node-rank`` in stage order.

    With ``--nnodes`` equal to ``--pp-size``, SGLang gives node rank ``r`` pipeline rank
    ``r``, so the plan's node order is kept exactly. Raises :class:`UnsupportedByEngine`
    like :func:`export_vllm`.
    """
    by_id = nodes_by_id(nodes)
    tp = _check_pipeline(plan, Engine.SGLANG, by_id)
    model_arg, model_notes = model_argument(plan, model)
    env = ((PARTITION_VARIABLE[Engine.SGLANG], partition_string(plan)),)
    n = plan.num_stages
    args = ["--pp-size", str(n), "--tp-size", str(tp)]
    if plan.context_tokens is not None:
        args += ["--context-length", str(plan.context_tokens)]
    head = plan.assignments[0].node_id
    commands = []
    for a in plan.assignments:
        per_node = ["--nnodes", str(n), "--node-rank", str(a.stage)]
        if n > 1:
            per_node += ["--dist-init-addr", f"{head}:{SGLANG_PORT}"]
        argv = ["python", "-m", "sglang.launch_server", "--model-path", model_arg]
        commands.append(f"# on {a.node_id} (stage {a.stage})")
        commands.append(shell_line(env, [*argv, *args, *per_node]))
    notes = [*model_notes, *_common_notes(plan)]
    if n > 1:
        notes.append(
            f"--dist-init-addr uses the node id {head!r} as stage 0's host name: replace it "
            "with that node's address if the name does not resolve"
        )
    return EngineExport(
        engine=Engine.SGLANG,
        block_counts=plan.block_counts(),
        env=env,
        args=tuple(args),
        commands=tuple(commands),
        notes=tuple(notes),
    )
