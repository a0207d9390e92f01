"""One stage's share of a Hugging Face model, built with the model's own code.

:class:`StageModel` builds the architecture (``transformers``'
``AutoModelForCausalLM``) on the meta device with only the stage's
``hi - lo`` decoder layers, numbered from 0 and configured as layers
``lo … hi-1`` of the checkpoint (their ``layer_types``: sliding window or full
attention), then materialises only those layers, and the embedding or the final
norm and head when the stage owns them, from the tensors it read
(:mod:`stowplan.runtime.checkpoint`).  Modules the stage does not own are never
built.  It runs on ``cuda:0`` (the first GPU of ``CUDA_VISIBLE_DEVICES``) when
torch sees a GPU, else on the CPU.

:meth:`StageModel.forward` runs the model's own ``forward`` over the stage's
layers for a microbatch of ``b`` sequences with that microbatch's KV cache
(:meth:`StageModel.new_cache`, one per microbatch): token ids ``[b, q]`` in when the
stage owns the embed, hidden states ``[b, q, hidden]`` otherwise; the last
position's logits ``[b, vocab]`` out when it owns the head, hidden states otherwise.
A prefill is ``q = prompt length``, a decode step ``q = 1``.
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stowplan.errors import InputError, UnsupportedByWorker
from stowplan.runtime.checkpoint import (
    EMBED,
    HEAD,
    NORM,
    open_checkpoint,
    read_config,
    read_stage_tensors,
    stage_tensor_names,
)
from stowplan.runtime.families import Family, family_of
from stowplan.stages.worker import WorkerStage

__all__ = ["LoadReport", "StageModel", "stage_device"]

_EXPERT = re.compile(r"^(.*)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight$")


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadReport:
    """What building one stage read and how long it took."""

    shards: tuple[str, ...]
    header_bytes: int
    tensor_bytes: int
    load_s: float
    """Seconds from opening the checkpoint to the stage being ready to run (reading the
    tensors and building the modules; importing torch is not counted)."""
    device: str

    @property
    def bytes_read(self) -> int:
        return self.header_bytes + self.tensor_bytes


def stage_device() -> str:
    """``cuda:0`` when torch sees a GPU (the first of ``CUDA_VISIBLE_DEVICES``), else ``cpu``."""
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def _stage_config(config: Any, lo: int, hi: int) -> Any:
    """The checkpoint's config for a model of layers ``lo … hi-1`` only."""
    out = copy.deepcopy(config)
    layer_types = getattr(config, "layer_types", None)
    out.num_hidden_layers = hi - lo
    if layer_types is not None:
        out.layer_types = list(layer_types[lo:hi])
    return out


def _local_names(
    tensors: Mapping[str, Any], family: Family, lo: int, num_experts: int
) -> dict[str, Any]:
    """Checkpoint names → the stage model's (layer ``lo + j`` is its layer ``j``; Mixtral's
    per-expert ``w1``/``w3``/``w2`` become its fused ``gate_up_proj`` and ``down_proj``)."""
    import torch

    out: dict[str, Any] = {}
    experts: dict[str, dict[str, dict[int, Any]]] = {}
    for name, t in tensors.items():
        if name.startswith("model.layers."):
            rest = name[len("model.layers.") :]
            index, tail = rest.split(".", 1)
            name = f"model.layers.{int(index) - lo}.{tail}"
        m = _EXPERT.match(name)
        if family is Family.MIXTRAL and m:
            experts.setdefault(m.group(1), {}).setdefault(m.group(3), {})[int(m.group(2))] = t
            continue
        out[name.replace(".block_sparse_moe.", ".mlp.")] = t
    for prefix, parts in experts.items():
        if any(sorted(parts.get(w, {})) != list(range(num_experts)) for w in ("w1", "w2", "w3")):
            raise InputError(
                "CHECKPOINT", prefix, f"must hold w1, w2 and w3 of all {num_experts} experts"
            )
        w1, w2, w3 = (
            torch.stack([parts[w][e] for e in range(num_experts)]) for w in ("w1", "w2", "w3")
        )
        out[f"{prefix}.mlp.experts.gate_up_proj"] = torch.cat([w1, w3], dim=1)
        out[f"{prefix}.mlp.experts.down_proj"] = w2
    return out


class StageModel:
    """The stage's layers (and embed/head when owned), ready to run; see the module notes."""

    def __init__(self, *, model: Any, config: Any, stage: WorkerStage, report: LoadReport) -> None:
        self.model = model
        self.config = config
        self.stage = stage
        self.report = report
        self.device = report.device

    @classmethod
    def load(
        cls, folder: str | Path, stage: WorkerStage, *, device: str | None = None
    ) -> StageModel:
        """Read the stage's tensors from the checkpoint in ``folder`` and build its modules.

        Raises:
            UnsupportedByWorker: an unsupported family or ``tensor_parallel > 1``
                (before any weight is read).
            InputError: the checkpoint lacks a tensor of the stage, or its blocks are
                not the stage's.
        """
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        start = time.perf_counter()  # reading and building, not importing torch

        family = family_of(read_config(folder))
        if stage.tensor_parallel > 1:
            raise UnsupportedByWorker(
                f"stage {stage.stage} has tensor_parallel={stage.tensor_parallel}, and the "
                "worker runs one GPU (or the CPU) per stage",
                "plan with --tp 1 (Constraints(tensor_parallel=1))",
            )
        checkpoint = open_checkpoint(folder)
        lo, hi = stage.block_range
        layers = int(checkpoint.config.get("num_hidden_layers", 0))
        if not 0 <= lo < hi <= layers:
            raise InputError(
                "block_range", stage.block_range, f"must lie in [0, {layers}) of the checkpoint"
            )
        names = stage_tensor_names(checkpoint, stage.block_range, stage.owns_embed, stage.owns_head)
        read = read_stage_tensors(checkpoint, names)
        config = AutoConfig.from_pretrained(str(checkpoint.folder))
        sub = _stage_config(config, lo, hi)
        dtype = next(iter(read.tensors.values())).dtype
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(sub, dtype=dtype)
        inner = model.model
        state = _local_names(read.tensors, family, lo, int(getattr(config, "num_local_experts", 0)))
        embed = state.pop(EMBED, None)
        norm = state.pop(NORM, None)
        head = state.pop(HEAD, None)
        model.load_state_dict(state, strict=False, assign=True)
        if stage.owns_embed:
            inner.embed_tokens.weight = torch.nn.Parameter(embed, requires_grad=False)
        else:
            inner.embed_tokens = torch.nn.Identity()
        if stage.owns_head:
            inner.norm.weight = torch.nn.Parameter(norm, requires_grad=False)
            table = head if head is not None else read.tensors[EMBED]
            if stage.owns_embed and head is None:
                model.lm_head.weight = inner.embed_tokens.weight  # one table, read once
            else:
                model.lm_head.weight = torch.nn.Parameter(table, requires_grad=False)
        else:
            inner.norm = torch.nn.Identity()
            model.lm_head = torch.nn.Identity()
        inner.rotary_emb = type(inner.rotary_emb)(config=sub)
        left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
        if left:
            raise InputError("CHECKPOINT", str(checkpoint.folder), f"has no tensor for {left[0]!r}")
        where = device or stage_device()
        model.to(where).eval()
        model.requires_grad_(False)
        report = LoadReport(
            shards=read.shards,
            header_bytes=read.header_bytes,
            tensor_bytes=read.tensor_bytes,
            load_s=time.perf_counter() - start,
            device=where,
        )
        return cls(model=model, config=sub, stage=stage, report=report)

    @property
    def weight_bytes(self) -> int:
        """Bytes of the stage's parameters in memory (a tied table counted once)."""
        seen = {id(p): p.numel() * p.element_size() for p in self.model.parameters()}
        return sum(seen.values())

    def new_cache(self) -> Any:
        """An empty KV cache for one microbatch of this stage's layers."""
        from transformers import DynamicCache

        return DynamicCache(config=self.config)

    def forward(self, x: Any, cache: Any) -> Any:
        """One prefill or decode step of one microbatch (see the module notes)."""
        import torch

        with torch.inference_mode():
            x = x.to(self.device)
            if self.stage.owns_embed:
                out = self.model.model(input_ids=x, cache=cache, use_cache=True)
            else:
                out = self.model.model(inputs_embeds=x, cache=cache, use_cache=True)
            hidden = out.last_hidden_state
            if self.stage.owns_head:
                return self.model.lm_head(hidden[:, -1, :])
            return hidden
