"""Group tensors into embed / blocks / experts / head and build a :class:`ModelLayout`.

All three readers (the ``config.json`` estimate, safetensors headers, GGUF)
produce a list of :class:`TensorEntry` and an :class:`ArchInfo`; this module
turns them into a layout the same way, so the paths never disagree on
conventions:

* ``total_params`` counts every stored parameter of the main model once
  (embedding and lm_head included; a tied table once; fp8/mxfp4 scale
  tensors and buffers are not parameters).  Multi-token-prediction layers
  stored beyond ``num_blocks`` are reported apart, not counted.
* ``active_params`` is ``total_params`` minus the routed experts a token does
  not read (``num_experts - experts_per_token`` per MoE block); embedding and
  head are included.
* ``head_params_bytes`` is final norm + lm_head; with tied embeddings the
  head's end still holds a copy of the table, so its bytes include it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from stowplan.model import ExpertLayout, ModelLayout

__all__ = [
    "ArchInfo",
    "ModelReport",
    "Part",
    "Placement",
    "TensorEntry",
    "assemble",
    "classify_gguf",
    "classify_hf",
]


class Part(StrEnum):
    """Where a tensor belongs."""

    EMBED = "embed"
    HEAD = "head"
    BLOCK = "block"
    """Attention, norms, router and dense MLP of one block."""
    SHARED_EXPERT = "shared-expert"
    ROUTED_EXPERT = "routed-expert"
    MTP = "mtp"
    """A multi-token-prediction layer stored after the last block."""
    OTHER = "other"
    """Not part of the text decoder (vision tower …) or not recognised."""


@dataclass(frozen=True, slots=True)
class Placement:
    """The part a tensor belongs to and its block (None outside blocks)."""

    part: Part
    block: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorEntry:
    """One stored tensor: its name, exact bytes and logical parameter count."""

    name: str
    nbytes: int
    params: int
    dtype: str
    count: int = 1
    """Identical copies (one per routed expert); bytes and params are per copy."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ArchInfo:
    """What the tensor list does not say: shapes of attention, routing, KV cache."""

    name: str
    family: str
    num_blocks: int
    hidden_dim: int
    num_attention_heads: int | None
    num_kv_heads: int | None
    kv_bytes_per_token: tuple[int, ...] | None
    kv_window_tokens: tuple[int | None, ...] | None
    num_experts: int = 0
    experts_per_token: int = 0
    num_shared_experts: int = 0
    tied_embeddings: bool = False
    head_dim: int | None = None
    """Width of one attention head's queries and keys; None: unknown."""
    bytes_per_activation_elem: int = 2
    dtype: str | None = None
    attention_kind: str = "gqa"
    """``gqa`` or ``mla`` (multi-head latent attention: the cache holds a compressed latent)."""
    max_context_tokens: int | None = None
    """The longest context per sequence the model takes (None: not stated)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelReport:
    """A layout and what was learnt building it (for ``stowplan model inspect``)."""

    layout: ModelLayout
    source: str
    """``known``, ``config``, ``safetensors`` or ``gguf``."""
    exact: bool
    """Bytes summed from stored tensor headers (True) or estimated from the config."""
    stored_bytes: int
    """Every byte the files hold (or would hold), MTP and other tensors included."""
    stored_params: int
    mtp_bytes: int = 0
    mtp_params: int = 0
    other_tensors: tuple[str, ...] = ()
    """Tensors outside the text decoder or not recognised (not placed)."""
    other_bytes: int = 0
    layer_kinds: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")
_ROUTED = re.compile(r"^(?:mlp|block_sparse_moe|feed_forward)\.experts\.")
_SHARED = re.compile(r"^(?:mlp|feed_forward)\.shared_experts?\.")
_FOREIGN = re.compile(r"vision|visual|multi_modal|mm_projector|audio|image_newline")
_NORM = re.compile(r"(?:^|\.)norm\.(?:weight|bias)$")


def classify_hf(name: str, num_blocks: int) -> Placement:
    """The part of a Hugging Face tensor name (``model.layers.3.mlp.experts.7.up_proj.weight``)."""
    if _FOREIGN.search(name):
        return Placement(Part.OTHER)
    m = _LAYER.search(name)
    if m:
        block, rest = int(m.group(1)), m.group(2)
        if block >= num_blocks:
            return Placement(Part.MTP, block)
        if _ROUTED.match(rest):
            return Placement(Part.ROUTED_EXPERT, block)
        if _SHARED.match(rest):
            return Placement(Part.SHARED_EXPERT, block)
        return Placement(Part.BLOCK, block)
    if name.endswith("embed_tokens.weight"):
        return Placement(Part.EMBED)
    if name.endswith("lm_head.weight") or _NORM.search(name):
        return Placement(Part.HEAD)
    return Placement(Part.OTHER)


_GGUF_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")


def classify_gguf(name: str, num_blocks: int) -> Placement:
    """The part of a GGUF tensor name (``blk.3.ffn_up_exps.weight``)."""
    m = _GGUF_BLOCK.match(name)
    if m:
        block, rest = int(m.group(1)), m.group(2)
        if block >= num_blocks:
            return Placement(Part.MTP, block)
        if "_exps." in rest:
            return Placement(Part.ROUTED_EXPERT, block)
        if "_shexp." in rest:
            return Placement(Part.SHARED_EXPERT, block)
        return Placement(Part.BLOCK, block)
    if name.startswith("token_embd."):
        return Placement(Part.EMBED)
    if name.startswith(("output.", "output_norm.", "rope_freqs.")):
        return Placement(Part.HEAD)
    return Placement(Part.OTHER)


def _layer_kind(arch: ArchInfo, block: int, moe: bool) -> str:
    mlp = "moe" if moe else "dense"
    window = arch.kv_window_tokens[block] if arch.kv_window_tokens else None
    attn = arch.attention_kind if window is None else f"{arch.attention_kind}/sliding-{window}"
    return f"{mlp}+{attn}"


def assemble(
    arch: ArchInfo,
    entries: Iterable[TensorEntry],
    classify: Callable[[str, int], Placement],
    *,
    source: str,
    exact: bool,
    notes: tuple[str, ...] = (),
) -> ModelReport:
    """Group ``entries`` with ``classify`` and build the layout and its report."""
    n = arch.num_blocks
    base_b, base_p = [0] * n, [0] * n
    routed_b, routed_p = [0] * n, [0] * n
    shared_b, shared_p = [0] * n, [0] * n
    embed_b = embed_p = head_b = head_p = mtp_b = mtp_p = other_b = other_p = 0
    others: list[str] = []
    has_head_table = False
    # Step 1: sum bytes and parameters per part.
    for e in entries:
        where = classify(e.name, n)
        nbytes, params = e.nbytes * e.count, e.params * e.count
        if where.part is Part.EMBED:
            embed_b, embed_p = embed_b + nbytes, embed_p + params
        elif where.part is Part.HEAD:
            head_b, head_p = head_b + nbytes, head_p + params
            has_head_table = has_head_table or e.name.endswith(("lm_head.weight", "output.weight"))
        elif where.part is Part.MTP:
            mtp_b, mtp_p = mtp_b + nbytes, mtp_p + params
        elif where.part is Part.OTHER:
            others.append(e.name)
            other_b, other_p = other_b + nbytes, other_p + params
        else:
            assert where.block is not None
            i = where.block
            if where.part is Part.ROUTED_EXPERT:
                routed_b[i] += nbytes
                routed_p[i] += params
            elif where.part is Part.SHARED_EXPERT:
                shared_b[i] += nbytes
                shared_p[i] += params
            else:
                base_b[i] += nbytes
                base_p[i] += params
    # Step 2: a tied head holds a copy of the embedding table.
    tied = arch.tied_embeddings or (not has_head_table and embed_b > 0)
    head_bytes = head_b + (embed_b if tied and not has_head_table else 0)
    # Step 3: blocks, experts and what a token reads.
    blocks = tuple(base_b[i] + routed_b[i] + shared_b[i] for i in range(n))
    moe_blocks = tuple(i for i in range(n) if routed_b[i] > 0)
    experts: ExpertLayout | None = None
    reads = blocks
    unused_params = 0
    if moe_blocks and arch.num_experts > 0:
        e_count, k = arch.num_experts, max(1, min(arch.experts_per_token, arch.num_experts))
        reads = tuple(base_b[i] + shared_b[i] + -(-routed_b[i] * k // e_count) for i in range(n))
        unused_params = sum(routed_p[i] * (e_count - k) // e_count for i in moe_blocks)
        experts = ExpertLayout(
            num_experts=e_count,
            experts_per_token=k,
            expert_params_bytes=max(-(-routed_b[i] // e_count) for i in moe_blocks),
            moe_blocks=moe_blocks,
            num_shared_experts=arch.num_shared_experts,
            shared_expert_params_bytes=max(shared_b[i] for i in moe_blocks),
        )
    total = sum(base_p) + sum(routed_p) + sum(shared_p) + embed_p + head_p
    uniform = len(set(blocks)) == 1
    layout = ModelLayout(
        name=arch.name,
        num_blocks=n,
        hidden_dim=arch.hidden_dim,
        bytes_per_activation_elem=arch.bytes_per_activation_elem,
        block_params_bytes=round(sum(blocks) / n),
        head_params_bytes=head_bytes,
        embed_params_bytes=embed_b,
        block_bytes=None if uniform else blocks,
        block_read_bytes=None if reads == blocks else reads,
        kv_bytes_per_token=arch.kv_bytes_per_token,
        kv_window_tokens=(
            arch.kv_window_tokens
            if arch.kv_window_tokens and any(w is not None for w in arch.kv_window_tokens)
            else None
        ),
        experts=experts,
        tied_embeddings=tied,
        total_params=total,
        active_params=total - unused_params,
        dtype=arch.dtype,
        num_attention_heads=arch.num_attention_heads,
        num_kv_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        family=arch.family,
        max_context_tokens=arch.max_context_tokens,
    )
    stored_b = sum(blocks) + embed_b + head_b + mtp_b + other_b
    return ModelReport(
        layout=layout,
        source=source,
        exact=exact,
        stored_bytes=stored_b,
        stored_params=total + mtp_p + other_p,
        mtp_bytes=mtp_b,
        mtp_params=mtp_p,
        other_tensors=tuple(others),
        other_bytes=other_b,
        layer_kinds=tuple(_layer_kind(arch, i, routed_b[i] > 0) for i in range(n)),
        notes=notes,
    )
