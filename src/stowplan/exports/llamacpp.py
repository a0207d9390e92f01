"""llama.cpp: ``-ngl``, ``--tensor-split``, ``-ot`` and ``-c`` for a plan of one host.

How llama.cpp places layers (``llama_model::load_tensors``): with ``-ngl k`` on an
``n``-block model, blocks below ``i_gpu_start`` stay on the CPU — ``max(n + 1 - k, 0)``
in some builds, ``max(n - k, 0)`` in others; the others and the output layer (index
``n``) go to GPU ``d`` where ``d`` is the first cumulative, normalised
``--tensor-split`` point above ``(il - i_gpu_start) / min(k, n + 1)``. The token
embedding always stays on the CPU. ``-ot REGEX=CPU`` then keeps matching tensors in
host memory.

The export therefore places blocks identically under both rules:

* ``-ngl n+1``, so ``i_gpu_start`` is 0 whichever rule the build follows;
* gives each GPU stage a ``--tensor-split`` proportion equal to its block count
  (the last GPU also counts the output layer; blocks of a CPU stage are counted on
  the GPU before it, or the first GPU for CPU stages ahead of all GPUs), so the
  split points fall exactly on the plan's boundaries;
* keeps every CPU-stage block (and the head when the last stage is the CPU) in
  host memory with ``-ot``, and a GPU block's routed experts with
  ``blk\\.N\\.ffn_.*_exps\\.=CPU`` when the plan puts them on a CPU stage.

Refused: routed experts of one block split between stages, or placed on a GPU
other than their block's (llama.cpp stores a block's experts as one tensor).
"""

from __future__ import annotations

from collections.abc import Sequence

from stowplan.exports.common import (
    ONE_HOST,
    expert_owners,
    is_cpu_node,
    model_argument,
    nodes_by_id,
    stage_of_block,
)
from stowplan.exports.result import Engine, EngineExport, UnsupportedByEngine, shell_line
from stowplan.model import ModelLayout, NodeDescriptor
from stowplan.plan import Plan

__all__ = ["EXPERT_TENSORS", "block_regex", "export_llamacpp"]

EXPERT_TENSORS = "ffn_.*_exps\\."
"""Regex tail of a block's routed-expert tensors (``ffn_up_exps``, ``ffn_down_exps`` …)."""


def block_regex(blocks: Sequence[int], suffix: str = "") -> str:
    """``blk\\.(3|4|5)\\.`` (+ ``suffix``): matches the tensors of those blocks only."""
    alternatives = "|".join(str(b) for b in blocks)
    group = alternatives if len(blocks) == 1 else f"({alternatives})"
    return f"blk\\.{group}\\.{suffix}"


def _experts_to_cpu(plan: Plan, cpu: list[bool], experts_per_block: int | None) -> list[int]:
    """GPU blocks whose routed experts the plan keeps on a CPU stage; refuse the rest."""
    out = []
    for block, per_stage in sorted(expert_owners(plan).items()):
        home = stage_of_block(plan, block).stage
        owners = sorted(per_stage)
        if owners == [home]:
            continue
        total = sum(per_stage.values())
        if len(owners) > 1 or (experts_per_block is not None and total < experts_per_block):
            raise UnsupportedByEngine(
                Engine.LLAMACPP,
                f"the routed experts of block {block} are split between stages "
                f"{sorted({home, *owners})}; llama.cpp stores a block's experts as one tensor, "
                "so they can only move together",
            )
        owner = owners[0]
        if not cpu[owner] or cpu[home]:
            raise UnsupportedByEngine(
                Engine.LLAMACPP,
                f"the routed experts of block {block} are on stage {owner} and the block on "
                f"stage {home}; the export moves experts only from a GPU block to the CPU",
            )
        out.append(block)
    return out


def export_llamacpp(
    plan: Plan,
    *,
    nodes: Sequence[NodeDescriptor] | None = None,
    model: str | None = None,
    layout: ModelLayout | None = None,
) -> EngineExport:
    """``llama-server`` arguments reproducing the plan's blocks per device of one host.

    CPU stages are recognised by :func:`~stowplan.exports.common.is_cpu_node`.
    Raises :class:`UnsupportedByEngine` for expert placements llama.cpp cannot express.
    """
    by_id = nodes_by_id(nodes)
    n = plan.num_blocks if plan.num_blocks is not None else plan.assignments[-1].block_range[1]
    cpu = [is_cpu_node(a.node_id, by_id) for a in plan.assignments]
    experts_per_block = plan.topology.experts_per_layer or (
        layout.experts.num_experts if layout is not None and layout.experts is not None else None
    )
    exps_on_cpu = _experts_to_cpu(plan, cpu, experts_per_block)
    model_arg, _ = model_argument(plan, model)
    notes = [] if model else [f"replace {model_arg!r} after -m with the model's GGUF file"]
    gpu_stages = [a for a, c in zip(plan.assignments, cpu, strict=True) if not c]
    args: list[str] = ["-m", model_arg]

    if not gpu_stages:
        args += ["-ngl", "0"]
    else:
        # Step 1: -ngl n+1 puts every block and the output layer in the GPU range under
        # either rule llama.cpp builds use for i_gpu_start (n + 1 - ngl, or n - ngl): both
        # give 0, and the split is taken over all n + 1 layers.
        args += ["-ngl", str(n + 1)]
        # Step 2: one proportion per GPU; CPU blocks count on the GPU before them (the
        # first GPU for CPU stages ahead of every GPU), so split points fall on the plan's
        # stage boundaries.
        shares = {a.stage: a.num_blocks for a in gpu_stages}
        owner = None
        cpu_blocks: list[int] = []
        for a, c in zip(plan.assignments, cpu, strict=True):
            if not c:
                owner = a.stage
            else:
                shares[gpu_stages[0].stage if owner is None else owner] += a.num_blocks
                cpu_blocks += range(*a.block_range)
        shares[gpu_stages[-1].stage] += 1  # the output layer
        if len(gpu_stages) > 1:
            args += ["--tensor-split", ",".join(str(shares[a.stage]) for a in gpu_stages)]
            order = ", ".join(f"{a.node_id} (stage {a.stage})" for a in gpu_stages)
            notes.append(
                f"--tensor-split follows llama.cpp's GPU order: make it list exactly {order} "
                "in this order (CUDA_VISIBLE_DEVICES or --device)"
            )
        # Step 3: -ot keeps every CPU-stage tensor (and the output on a CPU tail) in host memory.
        if cpu_blocks:
            args += ["-ot", f"{block_regex(cpu_blocks)}=CPU"]
            notes.append(
                "blocks kept on the CPU with -ot keep their KV cache on the GPU their split "
                "share belongs to"
            )
        if cpu[-1]:
            args += ["-ot", "^output(_norm)?\\.=CPU"]
    if exps_on_cpu:
        args += ["-ot", block_regex(exps_on_cpu, EXPERT_TENSORS) + "=CPU"]
    if plan.context_tokens is not None:
        args += ["-c", str(plan.context_tokens)]
    else:
        notes.append("the plan has no context_tokens: llama.cpp uses the model's trained context")
    if plan.num_stages > 1:
        notes.append(ONE_HOST)
    if plan.assignments[0].owns_embed and not cpu[0]:
        notes.append("llama.cpp keeps the token embedding table in host memory, not on stage 0")
    return EngineExport(
        engine=Engine.LLAMACPP,
        block_counts=plan.block_counts(),
        args=tuple(args),
        commands=(shell_line((), ["llama-server", *args]),),
        notes=tuple(notes),
    )
