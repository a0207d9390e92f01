"""Accelerate / transformers: a ``device_map`` keyed by the family's module names.

GPU stages get CUDA indices 0, 1, … in stage order; CPU stages get ``"cpu"``. A
plan that lists GPUs (one multi-GPU node) puts each stage on ``cuda:<its GPU>``;
a ``device_map`` puts every module on one device, so a stage on several GPUs
(tensor parallel) or GPUs of several nodes are refused, naming the ``stowplan
plan … --engine transformers`` line that plans one GPU per stage.
``max_memory`` gives each device the plan's usable bytes. Routed experts the
plan keeps on another stage than their block are mapped one module each, for
the families whose experts are separate modules (``nn.ModuleList`` of per-expert MLPs
in transformers 4.x: mixtral, qwen2/3_moe, deepseek_v3/kimi_k2); gpt_oss fuses a block's
experts into one module (``model.layers.N.mlp.experts``, 3-D weight tensors), so its
experts move only with their block.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from stowplan.errors import InputError
from stowplan.exports.common import (
    ONE_HOST,
    is_cpu_node,
    model_argument,
    nodes_by_id,
    replan_command,
    stage_of_block,
)
from stowplan.exports.result import Engine, EngineExport, UnsupportedByEngine
from stowplan.model import ModelLayout, NodeDescriptor
from stowplan.plan import Plan
from stowplan.stages.gpu_lists import stage_place_text, uses_gpu_lists

__all__ = ["FAMILIES", "ModuleNames", "export_accelerate"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModuleNames:
    """Module paths of one architecture family in its transformers implementation."""

    embed: str
    block: str
    """Format string with ``{i}``."""
    norm: str
    head: str
    extra_first: tuple[str, ...] = ()
    """Parameter-free modules kept with the embedding (e.g. ``model.rotary_emb``)."""
    expert: str | None = None
    """Format string with ``{i}`` and ``{e}`` when experts are separate modules."""
    fused_experts: str | None = None
    """Format string with ``{i}``: the one module holding all of a block's experts."""


_DECODER = ModuleNames(
    embed="model.embed_tokens",
    block="model.layers.{i}",
    norm="model.norm",
    head="lm_head",
    extra_first=("model.rotary_emb",),
)

FAMILIES: dict[str, ModuleNames] = {
    "llama": _DECODER,
    "mistral": _DECODER,
    "qwen2": _DECODER,
    "qwen3": _DECODER,
    "gemma": _DECODER,
    "gemma2": _DECODER,
    "phi3": _DECODER,
    "mixtral": replace(_DECODER, expert="model.layers.{i}.block_sparse_moe.experts.{e}"),
    "qwen2_moe": replace(_DECODER, expert="model.layers.{i}.mlp.experts.{e}"),
    "gpt2": ModuleNames(
        embed="transformer.wte",
        block="transformer.h.{i}",
        norm="transformer.ln_f",
        head="lm_head",
        extra_first=("transformer.wpe",),
    ),
    "gpt_neox": ModuleNames(
        embed="gpt_neox.embed_in",
        block="gpt_neox.layers.{i}",
        norm="gpt_neox.final_layer_norm",
        head="embed_out",
        extra_first=("gpt_neox.rotary_emb",),
    ),
}
FAMILIES["qwen3_moe"] = FAMILIES["qwen2_moe"]
# DeepseekV3ForCausalLM: DeepseekV3MoE keeps routed experts in ``mlp.experts`` (a ModuleList)
# beside ``mlp.shared_experts`` and ``mlp.gate``; the first dense layers have a plain ``mlp``.
FAMILIES["deepseek_v3"] = FAMILIES["qwen2_moe"]
FAMILIES["kimi_k2"] = FAMILIES["deepseek_v3"]
# GptOssForCausalLM: GptOssMLP = router + GptOssExperts, whose weights are 3-D parameters.
FAMILIES["gpt_oss"] = replace(_DECODER, fused_experts="model.layers.{i}.mlp.experts")
# Gemma3ForCausalLM (the text model; a gemma3 checkpoint with a vision tower loads its text
# part this way): global and sliding-window layers have a rotary embedding each.
FAMILIES["gemma3"] = replace(_DECODER, extra_first=("model.rotary_emb", "model.rotary_emb_local"))


def _family(plan: Plan, layout: ModelLayout | None, family: str | None) -> tuple[str, ModuleNames]:
    name = family or (layout.family if layout is not None else None)
    if name is None:
        raise InputError(
            "family",
            None,
            f"the module names of model {plan.model_name!r} are unknown; pass --model with the "
            "model's config.json, checkpoint folder or .gguf (its family is read from it), or "
            f"the family (one of {', '.join(sorted(FAMILIES))})",
        )
    key = name.strip().lower()
    if key not in FAMILIES:
        raise InputError("family", name, f"must be one of {', '.join(sorted(FAMILIES))}")
    return key, FAMILIES[key]


def _listed_devices(plan: Plan, cpu: list[bool], nodes_file: str | None) -> list[int | str]:
    """Each stage's device in a plan that lists GPUs: ``cuda:<its GPU>`` or ``"cpu"``."""
    hosts = list(
        dict.fromkeys(a.node_id for a, c in zip(plan.assignments, cpu, strict=True) if not c)
    )
    if len(hosts) > 1:
        raise UnsupportedByEngine(
            Engine.ACCELERATE,
            f"the plan uses GPUs of {len(hosts)} nodes ({', '.join(hosts)}) and a device_map "
            "runs on one host; plan for one node: "
            + replan_command(plan, "transformers", "ONE_NODE_FLEET"),
        )
    devices: list[int | str] = []
    for a, c in zip(plan.assignments, cpu, strict=True):
        if a.tensor_parallel > 1:
            raise UnsupportedByEngine(
                Engine.ACCELERATE,
                f"stage {a.stage} splits its blocks over {a.tensor_parallel} GPUs "
                f"({stage_place_text(a)}); a device_map puts each module on one device; "
                "replan with one GPU per stage: "
                + replan_command(plan, "transformers", nodes_file),
            )
        devices.append("cpu" if c else (a.gpu_indices[0] if a.gpu_indices else 0))
    return devices


def _load_arguments(model_arg: str) -> tuple[str, list[str]]:
    """``from_pretrained``'s leading arguments for ``model_arg`` (``'FOLDER',`` or
    ``'FOLDER', gguf_file='NAME',``), and the notes they need.

    A ``config.json`` or safetensors index loads from its folder; a ``.gguf`` file from
    its folder with ``gguf_file`` (transformers dequantises it to the torch dtype, so
    the weights take more memory than the file's bytes the plan priced).
    """
    path = Path(model_arg)
    if model_arg.lower().endswith(".gguf"):
        return f"{str(path.parent)!r}, gguf_file={path.name!r},", [
            "transformers loads a GGUF file dequantised (gguf_file=): its weights take the "
            "bytes of the torch dtype, more than the quantised file the plan priced; plan "
            "the model's safetensors checkpoint for Accelerate"
        ]
    if path.name == "config.json" or model_arg.endswith((".index.json", ".safetensors")):
        return f"{str(path.parent)!r},", []
    return f"{model_arg!r},", []


def export_accelerate(
    plan: Plan,
    *,
    nodes: Sequence[NodeDescriptor] | None = None,
    model: str | None = None,
    layout: ModelLayout | None = None,
    family: str | None = None,
    nodes_file: str | None = None,
) -> EngineExport:
    """``device_map`` + ``max_memory`` for ``from_pretrained`` on one host.

    Raises :class:`InputError` when the family is unknown and :class:`UnsupportedByEngine`
    for experts away from their block in a family whose experts are fused, and for a
    stage on several GPUs or GPUs of several nodes (naming the ``stowplan plan`` line,
    fleet ``nodes_file``, that plans one GPU per stage).
    """
    key, names = _family(plan, layout, family)
    by_id = nodes_by_id(nodes)
    cpu = [is_cpu_node(a.node_id, by_id) for a in plan.assignments]
    lists = uses_gpu_lists(plan)
    devices: list[int | str] = []
    if lists:
        devices = _listed_devices(plan, cpu, nodes_file)
    else:
        next_gpu = 0
        for c in cpu:
            devices.append("cpu" if c else next_gpu)
            next_gpu += 0 if c else 1
    device_map: dict[str, int | str] = {}
    first, last = plan.assignments[0], plan.assignments[-1]
    device_map[names.embed] = devices[first.stage]
    for extra in names.extra_first:
        device_map[extra] = devices[first.stage]
    for a in plan.assignments:
        for i in range(*a.block_range):
            device_map[names.block.format(i=i)] = devices[a.stage]
    for a in plan.assignments:
        for e in a.owned_experts:
            home = stage_of_block(plan, e.block).stage
            if home == a.stage:
                continue
            if names.expert is None:
                fused = names.fused_experts
                how = (
                    f"fuses a block's experts into one module ({fused.format(i=e.block)})"
                    if fused is not None
                    else "has no per-expert modules to map"
                )
                raise UnsupportedByEngine(
                    Engine.ACCELERATE,
                    f"expert {e.expert} of block {e.block} is on stage {a.stage}, away from its "
                    f"block; family {key!r} {how}",
                )
            device_map[names.expert.format(i=e.block, e=e.expert)] = devices[a.stage]
    device_map[names.norm] = devices[last.stage]
    device_map[names.head] = devices[last.stage]
    max_memory: dict[str, int] = {}
    for a, d in zip(plan.assignments, devices, strict=True):
        budget = a.usable_vram_bytes if a.usable_vram_bytes is not None else a.estimated_vram_bytes
        max_memory[str(d)] = max_memory.get(str(d), 0) + budget
    model_arg, model_notes = model_argument(plan, model)
    load_args, load_notes = _load_arguments(model_arg)
    notes = [*model_notes, *load_notes]
    gpu_nodes = [a.node_id for a, d in zip(plan.assignments, devices, strict=True) if d != "cpu"]
    if lists and gpu_nodes:
        notes.append(
            "CUDA indices are the plan's GPUs (with CUDA_VISIBLE_DEVICES unset): "
            + ", ".join(
                f"cuda:{d} = {stage_place_text(a)} (stage {a.stage})"
                for a, d in zip(plan.assignments, devices, strict=True)
                if d != "cpu"
            )
        )
    elif gpu_nodes:
        notes.append(
            "CUDA indices follow the stage order: "
            + ", ".join(f"cuda:{i} = {n}" for i, n in enumerate(gpu_nodes))
        )
    if layout is not None and layout.tied_embeddings and devices[first.stage] != devices[-1]:
        notes.append(
            "tied embeddings: transformers keeps one table for embed and head; expect it on "
            "the embedding's device and a copy of the activations to the head's"
        )
    if plan.num_stages > 1 and not lists:
        notes.append(ONE_HOST)
    if plan.context_tokens is not None:
        notes.append(
            f"KV budgeted for {plan.context_tokens} tokens: keep generate()'s length within it"
        )
    device_map_json = json.dumps(device_map, indent=2) + "\n"
    max_memory_json = json.dumps(max_memory, indent=2) + "\n"
    snippet = (
        "python - <<'EOF'\n"
        "import json\n"
        "from transformers import AutoModelForCausalLM\n"
        "device_map = json.load(open('device_map.json'))\n"
        "max_memory = {(int(k) if k.isdigit() else k): v\n"
        "              for k, v in json.load(open('max_memory.json')).items()}\n"
        f"model = AutoModelForCausalLM.from_pretrained({load_args} device_map=device_map,\n"
        "                                             max_memory=max_memory)\n"
        "EOF"
    )
    return EngineExport(
        engine=Engine.ACCELERATE,
        block_counts=plan.block_counts(),
        commands=(snippet,),
        files=(("device_map.json", device_map_json), ("max_memory.json", max_memory_json)),
        notes=tuple(notes),
        data={"device_map": device_map, "max_memory": max_memory, "family": key},
    )
