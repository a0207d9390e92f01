"""llama.cpp's quantisation mixes: the block type each tensor of a GGUF file type gets.

``llama-quantize`` does not store every tensor of a ``Q4_K_M`` file as Q4_K.
It chooses a type per tensor from the tensor's role, its block and a few facts
about the model, so a file is larger than its name's type alone suggests.  The
rules below restate the ones llama.cpp applies (its per-tensor type choice in
``src/llama-quant.cpp``), for the roles a transformer decoder has:

* ``output.weight`` (and the token table of a model with tied embeddings) is
  Q6_K, Q8_0 under ``q8_0``, Q5_K under the 1- and 2-bit i-quant mixes, and
  Q8_0 when its rows do not split into the type's blocks.
* An untied ``token_embd`` keeps the file's type, but Q2_K or IQ3_S under the
  lowest i-quant mixes.
* ``attn_v`` (and MLA's ``attn_kv_b``) and ``ffn_down`` get more bits in the
  ``_M``/``_L`` mixes: Q6_K in the first and last eighth of the blocks and
  every third block between them under ``q4_k_m``/``q5_k_m``; Q4_K/Q5_K under
  ``q3_k_m``; Q4_K/Q3_K under ``q2_k`` (as the model groups ≥ 4 query heads
  per KV head or not) …
* In llama.cpp's 70B class (80 blocks of Llama or Qwen2 with grouped KV heads)
  an ``attn_v`` left at Q3_K or Q4_K is raised to Q5_K; with 8 experts
  ``attn_v`` and ``attn_k`` are Q8_0 and ``attn_output`` Q5_K in most mixes.
* A tensor whose rows do not split into its type's blocks falls back to a
  32-wide type (Q4_K → Q5_0, Q6_K → Q8_0, i-quants → IQ4_NL, …), or to F16.

The i-quant mixes are priced as made with an importance matrix (llama.cpp
requires one for the 1- to 3-bit i-quants, and published i-quant files use
one); the k-quant and legacy mixes without one (it changes no k-quant type).
1-D tensors and routers are not quantised (fp32 from the converter).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["FILE_TYPES", "MixModel", "Role", "assumes_imatrix", "role_of", "tensor_type"]

FILE_TYPES: dict[str, str] = {
    "q4_0": "q4_0",
    "q4_1": "q4_1",
    "q5_0": "q5_0",
    "q5_1": "q5_1",
    "q8_0": "q8_0",
    "q2_k_s": "q2_k",
    "q2_k": "q2_k",
    "q3_k_s": "q3_k",
    "q3_k_m": "q3_k",
    "q3_k_l": "q3_k",
    "q4_k_s": "q4_k",
    "q4_k_m": "q4_k",
    "q5_k_s": "q5_k",
    "q5_k_m": "q5_k",
    "q6_k": "q6_k",
    "iq1_s": "iq1_s",
    "iq1_m": "iq1_m",
    "iq2_xxs": "iq2_xxs",
    "iq2_xs": "iq2_xs",
    "iq2_s": "iq2_xs",
    "iq2_m": "iq2_s",
    "iq3_xxs": "iq3_xxs",
    "iq3_xs": "iq3_s",
    "iq3_s": "iq3_s",
    "iq3_m": "iq3_s",
    "iq4_nl": "iq4_nl",
    "iq4_xs": "iq4_xs",
}
"""llama.cpp file types (``llama-quantize`` names, lower case) → the block type of most tensors."""

_BLOCK_SIZE: dict[str, int] = {
    **dict.fromkeys(("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl"), 32),
    **dict.fromkeys(("q2_k", "q3_k", "q4_k", "q5_k", "q6_k"), 256),
    **dict.fromkeys(("iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s"), 256),
    "iq4_xs": 256,
}

_IQ_LOWEST = frozenset({"iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq2_m"})
"""The 1- and 2-bit i-quant mixes: their own rules for every role."""


class Role(StrEnum):
    """What a tensor does, in llama.cpp's terms (the part of its GGUF name that matters)."""

    TOKEN_EMBD = "token_embd"
    OUTPUT = "output"
    ATTN_Q = "attn_q"
    ATTN_K = "attn_k"
    ATTN_V = "attn_v"
    ATTN_KV_B = "attn_kv_b"
    ATTN_OUTPUT = "attn_output"
    FFN_GATE = "ffn_gate"
    FFN_UP = "ffn_up"
    FFN_DOWN = "ffn_down"
    OTHER = "other"


@dataclass(frozen=True, slots=True, kw_only=True)
class MixModel:
    """The model facts the rules read."""

    num_blocks: int
    heads_per_kv_head: int
    """Query heads sharing one KV head (llama.cpp's ``n_gqa``; 1 without grouping)."""
    num_experts: int = 0
    seventy_b: bool = False
    """llama.cpp classes the model as 70B (80 blocks of Llama or Qwen2, grouped KV heads)."""
    tied_embeddings: bool = False


def assumes_imatrix(file_type: str) -> bool:
    """Whether ``file_type`` is priced as quantised with an importance matrix (the i-quants)."""
    return file_type.startswith("iq")


_HF_ROLES: tuple[tuple[str, Role], ...] = (
    ("embed_tokens.weight", Role.TOKEN_EMBD),
    ("lm_head.weight", Role.OUTPUT),
    ("q_proj.weight", Role.ATTN_Q),
    ("k_proj.weight", Role.ATTN_K),
    ("v_proj.weight", Role.ATTN_V),
    ("kv_b_proj.weight", Role.ATTN_KV_B),
    ("o_proj.weight", Role.ATTN_OUTPUT),
    ("gate_proj.weight", Role.FFN_GATE),
    ("w1.weight", Role.FFN_GATE),
    ("up_proj.weight", Role.FFN_UP),
    ("w3.weight", Role.FFN_UP),
    ("gate_up_proj", Role.FFN_UP),
    ("down_proj.weight", Role.FFN_DOWN),
    ("w2.weight", Role.FFN_DOWN),
    ("down_proj", Role.FFN_DOWN),
)


def role_of(hf_name: str) -> Role:
    """The llama.cpp role of a Hugging Face tensor name (``model.layers.3.mlp.down_proj.weight``).

    MTP tables (``layers.N.embed_tokens``/``shared_head.head``) are not the model's own
    token table or output, so they are ``OTHER``.
    """
    if ".layers." in hf_name and hf_name.endswith(("embed_tokens.weight", "head.weight")):
        return Role.OTHER
    for suffix, role in _HF_ROLES:
        if hf_name.endswith(suffix):
            return role
    return Role.OTHER


def _more_bits(i: int, n: int) -> bool:
    """llama.cpp's "use more bits" blocks: the first and last eighth, every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(file_type: str, role: Role, *, block: int, ncols: int, model: MixModel) -> str:
    """The block type llama.cpp stores a tensor in under ``file_type``.

    ``block`` is the tensor's block (0 outside blocks), ``ncols`` its row length
    (the input dimension of a linear layer).
    """
    base = FILE_TYPES[file_type]
    chosen = _choose(file_type, base, role, block, ncols, model)
    return _fallback(chosen, ncols)


def _choose(ftype: str, base: str, role: Role, i: int, ncols: int, m: MixModel) -> str:
    # Step 1: the tables at both ends.
    if role is Role.OUTPUT or (role is Role.TOKEN_EMBD and m.tied_embeddings):
        if ncols % _BLOCK_SIZE[base]:
            return "q8_0"
        if ftype in _IQ_LOWEST or ftype == "iq3_xxs":
            return "q5_k"
        return base if base == "q8_0" else "q6_k"
    if role is Role.TOKEN_EMBD:
        if ftype in ("iq2_xxs", "iq2_xs", "iq1_s", "iq1_m"):
            return "q2_k"
        if ftype in ("iq2_s", "iq2_m", "iq3_xxs"):
            return "iq3_s"
        return base
    # Step 2: the 1- and 2-bit i-quants have their own rules for the block tensors.
    if ftype in _IQ_LOWEST:
        return _lowest_iq(ftype, base, role, i, m)
    # Step 3: the other mixes, by role.
    n = m.num_blocks
    if role in (Role.ATTN_V, Role.ATTN_KV_B):
        return _attn_v(ftype, base, i, n, m)
    if role is Role.ATTN_K:
        if m.num_experts == 8:
            return "q8_0"
        return {"iq3_xs": "iq3_xxs", "iq3_xxs": "iq2_s"}.get(ftype, base)
    if role is Role.ATTN_Q:
        return {"iq3_xs": "iq3_xxs", "iq3_xxs": "iq2_s"}.get(ftype, base)
    if role is Role.FFN_DOWN:
        return _ffn_down(ftype, base, i, n, m)
    if role is Role.ATTN_OUTPUT:
        return _attn_output(ftype, base, m)
    if role in (Role.FFN_GATE, Role.FFN_UP) and ftype == "iq3_xs" and n // 8 <= i < 7 * n // 8:
        return "iq3_xxs"
    return base


def _lowest_iq(ftype: str, base: str, role: Role, i: int, m: MixModel) -> str:
    wide = "iq3_s" if ftype in ("iq2_s", "iq2_m") else "q2_k"
    if role in (Role.ATTN_V, Role.ATTN_KV_B):
        return "q4_k" if m.heads_per_kv_head >= 4 or m.num_experts >= 4 else wide
    if role is Role.ATTN_K and m.num_experts == 8:
        return "q4_k"
    if role is Role.FFN_DOWN:
        return wide if i < m.num_blocks // 8 else base
    if role is Role.ATTN_OUTPUT:
        if m.num_experts == 8:
            return "q5_k"
        if ftype in ("iq1_s", "iq1_m"):
            return "iq2_xxs"
        if ftype in ("iq2_s", "iq2_m"):
            return "iq3_s"
    return base


def _attn_v(ftype: str, base: str, i: int, n: int, m: MixModel) -> str:
    t = _attn_v_by_type(ftype, base, i, n, m.heads_per_kv_head >= 4)
    if m.seventy_b and t in ("q3_k", "q4_k"):
        t = "q5_k"
    return "q8_0" if m.num_experts == 8 else t


_ATTN_V_GROUPED = {"q2_k_s": "q4_k", "iq3_xs": "q4_k", "iq3_s": "q4_k"} | dict.fromkeys(
    ("iq4_nl", "iq4_xs"), "q5_k"
)
"""attn_v under these mixes when ≥ 4 query heads share a KV head."""


def _attn_v_by_type(ftype: str, base: str, i: int, n: int, gqa4: bool) -> str:
    if ftype in ("q2_k", "iq3_xxs"):
        return "q4_k" if gqa4 else ("q3_k" if ftype == "q2_k" else base)
    if ftype == "q3_k_m":
        return "q5_k" if i < 2 else "q4_k"
    if ftype in ("q4_k_m", "q5_k_m"):
        return "q6_k" if _more_bits(i, n) else base
    if ftype == "q4_k_s":
        return "q5_k" if i < 4 else base
    if gqa4 and ftype in _ATTN_V_GROUPED:
        return _ATTN_V_GROUPED[ftype]
    return {"iq3_m": "q4_k", "q3_k_l": "q5_k"}.get(ftype, base)


def _ffn_down(ftype: str, base: str, i: int, n: int, m: MixModel) -> str:
    first_eighth = i < n // 8
    if ftype == "q2_k":
        return "q3_k"
    if ftype == "q2_k_s":
        return "q4_k" if first_eighth else base
    if ftype == "q3_k_m":
        return "q5_k" if i < n // 16 else "q4_k"
    if ftype == "iq3_m" and (first_eighth or (m.num_experts == 8 and _more_bits(i, n))):
        return "q4_k"
    if ftype == "q3_k_l":
        return "q5_k"
    if ftype in ("q4_k_m", "q5_k_m") and _more_bits(i, n):
        return "q6_k"
    if ftype == "q4_k_s" and first_eighth:
        return "q5_k"
    return base


_MOE8_ATTN_OUTPUT = frozenset(
    {"q2_k", "iq3_xs", "iq3_xxs", "q3_k_s", "q3_k_m", "iq4_nl", "q4_k_s", "q4_k_m", "iq3_s"}
    | {"iq3_m", "iq4_xs"}
)


def _attn_output(ftype: str, base: str, m: MixModel) -> str:
    if m.num_experts == 8:
        return "q5_k" if ftype in _MOE8_ATTN_OUTPUT else base
    return {
        "q2_k": "q3_k",
        "iq3_xxs": "iq3_s",
        "q3_k_m": "q4_k",
        "q3_k_l": "q5_k",
        "iq3_m": "q4_k",
    }.get(ftype, base)


_FALLBACK: dict[str, str] = {
    **dict.fromkeys(
        ("iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq4_xs"), "iq4_nl"
    ),
    "q2_k": "q4_0",
    "q3_k": "q4_0",
    "q4_k": "q5_0",
    "q5_k": "q5_1",
    "q6_k": "q8_0",
}


def _fallback(t: str, ncols: int) -> str:
    """A 256-wide type whose blocks do not fit the rows falls back to a 32-wide one (or F16)."""
    if ncols % _BLOCK_SIZE.get(t, 1) == 0:
        return t
    t = _FALLBACK.get(t, t)
    return t if ncols % _BLOCK_SIZE.get(t, 1) == 0 else "fp16"
