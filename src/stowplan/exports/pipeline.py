"""What vLLM and SGLang share: the layer-partition variable and the pipelines they refuse.

Both engines read a comma-separated list of decoder-layer counts, one per
pipeline rank (``VLLM_PP_LAYER_PARTITION`` / ``SGLANG_PP_LAYER_PARTITION``),
and reject it unless it has exactly ``pipeline size`` entries summing to the
model's ``num_hidden_layers``. Rank 0 holds the token embedding and the last
rank the final norm and ``lm_head`` (with tied embeddings the last rank loads
the table too), which is exactly a stowplan plan's embed/head anchors.

What they cannot express, and :func:`check_pipeline` refuses: experts kept on
another stage than their block, a tensor-parallel degree that differs between
stages, anchors on other stages than the first and the last, and (for a plan
that lists GPUs) a node whose stages are not consecutive: both engines give a
node one run of pipeline ranks, tensor-parallel ranks innermost.  A refusal the
planner can avoid names the ``stowplan plan … --engine`` line that does.
"""

from __future__ import annotations

from collections.abc import Sequence

from stowplan.exports.common import (
    expert_owners,
    replan_command,
    stage_degree,
    stage_of_block,
)
from stowplan.exports.result import Engine, UnsupportedByEngine
from stowplan.model import NodeDescriptor
from stowplan.plan import Plan, StageAssignment
from stowplan.stages.gpu_lists import node_stages, uses_gpu_lists

__all__ = [
    "PARTITION_VARIABLE",
    "check_pipeline",
    "common_notes",
    "node_runs",
    "partition_string",
    "stage_span",
]

PARTITION_VARIABLE = {
    Engine.VLLM: "VLLM_PP_LAYER_PARTITION",
    Engine.SGLANG: "SGLANG_PP_LAYER_PARTITION",
}


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


def _refuse_unless_pipeline(
    plan: Plan, engine: Engine, nodes: dict[str, NodeDescriptor], nodes_file: str | None = None
) -> None:
    """Refuse anchors on inner stages and experts away from their block."""
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
                f"(use an expert-parallel plan for the engine's own EP{also}); replan with "
                "every expert beside its block: "
                + replan_command(plan, engine.value, nodes_file, "--block-local"),
            )


def check_pipeline(
    plan: Plan, engine: Engine, nodes: dict[str, NodeDescriptor], nodes_file: str | None
) -> int:
    """Refuse what a plain pipeline cannot run; return the tensor-parallel degree."""
    _refuse_unless_pipeline(plan, engine, nodes, nodes_file)
    if uses_gpu_lists(plan):
        return _one_degree(plan, engine, nodes, nodes_file)
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


def _one_degree(
    plan: Plan, engine: Engine, nodes: dict[str, NodeDescriptor], nodes_file: str | None
) -> int:
    """The one tensor-parallel degree of a plan that lists GPUs; refuse several."""
    degrees = [stage_degree(a, nodes) for a in plan.assignments]
    if len(set(degrees)) > 1:
        detail = ", ".join(
            f"stage {a.stage} tp{d}" for a, d in zip(plan.assignments, degrees, strict=True)
        )
        raise UnsupportedByEngine(
            engine,
            f"stages have different tensor-parallel degrees ({detail}); the engine runs one "
            "tensor-parallel degree on every pipeline stage; replan for it: "
            + replan_command(plan, engine.value, nodes_file),
        )
    return degrees[0]


def stage_span(stages: list[StageAssignment]) -> str:
    """``stage 3`` or ``stages 3-4``."""
    lo, hi = stages[0].stage, stages[-1].stage
    return f"stage {lo}" if lo == hi else f"stages {lo}-{hi}"


def node_runs(
    plan: Plan, engine: Engine, nodes_file: str | None
) -> dict[str, list[StageAssignment]]:
    """The stages of each node; refuse a node whose stages are not consecutive (both
    engines give a node one run of pipeline ranks)."""
    runs = node_stages(plan)
    for node_id, stages in runs.items():
        numbers = [a.stage for a in stages]
        if numbers != list(range(numbers[0], numbers[0] + len(numbers))):
            raise UnsupportedByEngine(
                engine,
                f"node {node_id} runs stages {', '.join(map(str, numbers))} with other nodes' "
                "stages between them; the engine gives each node one run of consecutive "
                "pipeline ranks; replan for it: " + replan_command(plan, engine.value, nodes_file),
            )
    return runs


def common_notes(plan: Plan) -> list[str]:
    notes = []
    empty = [a for a in plan.assignments if a.num_blocks == 0]
    for a in empty:
        notes.append(
            f"stage {a.stage} on {a.node_id} holds no decoder layer (only "
            f"{'the embedding' if a.owns_embed else 'the head'}); its rank only forwards"
        )
    if not plan.context_tokens:
        notes.append("the plan reserves no KV cache: the engine picks its own maximum length")
    return notes
