"""The known-model table, read by :func:`stowplan.models.resolve_model` (the loader).

Every entry is a model's published ``config.json`` numbers (the keys that
determine its bytes, kept here as data with the repository they come from),
turned into a layout by :func:`stowplan.models.hf.from_hf_config`: the table
and the config path are one code path and cannot disagree.  Names are short
lower-case tags in the style ``llama3.1:70b``; Hugging Face ids are aliases.

A name is found by, in order: the name or an alias (case-insensitive); the
same with punctuation ignored (``gpt-oss-120b`` is ``gpt-oss:120b``) and an
``-instruct`` or ``:latest`` tag dropped, when that matches one model only.
:func:`known_with_dtype` also reads a trailing storage tag
(``qwen3:30b-a3b-q4`` is ``qwen3:30b-a3b`` stored as ``q4_0``), and
:func:`suggest` names the closest known names for a message.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from stowplan.model import ModelLayout
from stowplan.models.grouping import ModelReport

__all__ = [
    "KnownModel",
    "hf_id",
    "known_model",
    "known_names",
    "known_report",
    "known_with_dtype",
    "lookup",
    "suggest",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class KnownModel:
    """One row of the table."""

    name: str
    source: str
    """Hugging Face repository whose ``config.json`` the numbers are from."""
    config: dict[str, Any]
    dtype: str | None = None
    """Storage override (``q4_0`` …); None: the config's own dtype."""
    aliases: tuple[str, ...] = ()


def _llama(
    h: int, inter: int, n: int, heads: int, vocab: int, tied: bool, **kw: Any
) -> dict[str, Any]:
    return {
        "model_type": "llama", "hidden_size": h, "intermediate_size": inter,
        "num_hidden_layers": n, "num_attention_heads": heads, "num_key_value_heads": 8,
        "vocab_size": vocab, "tie_word_embeddings": tied, "torch_dtype": "bfloat16",
        "max_position_embeddings": 131072, **kw,
    }  # fmt: skip


_L32_1B = _llama(2048, 8192, 16, 32, 128256, True, head_dim=64)
_L32_3B = _llama(3072, 8192, 28, 24, 128256, True, head_dim=128)
_L31_8B = _llama(4096, 14336, 32, 32, 128256, False)
_L31_70B = _llama(8192, 28672, 80, 64, 128256, False)
_L31_405B = _llama(16384, 53248, 126, 128, 128256, False)

_MISTRAL_7B = {
    "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 32768, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "max_position_embeddings": 32768,
}  # fmt: skip


def _mixtral(h: int, inter: int, n: int, heads: int, vocab: int, ctx: int) -> dict[str, Any]:
    return {
        "model_type": "mixtral", "hidden_size": h, "intermediate_size": inter,
        "num_hidden_layers": n, "num_attention_heads": heads, "num_key_value_heads": 8,
        "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": vocab,
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "max_position_embeddings": ctx,
    }  # fmt: skip


def _qwen3(h: int, inter: int, n: int, heads: int, kv: int, **kw: Any) -> dict[str, Any]:
    return {
        "model_type": "qwen3", "hidden_size": h, "intermediate_size": inter,
        "num_hidden_layers": n, "num_attention_heads": heads, "num_key_value_heads": kv,
        "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "max_position_embeddings": 40960, **kw,
    }  # fmt: skip


def _qwen3_moe(h: int, moe_inter: int, n: int, heads: int, kv: int) -> dict[str, Any]:
    return _qwen3(
        h, 6144 if h == 2048 else 12288, n, heads, kv, model_type="qwen3_moe",
        moe_intermediate_size=moe_inter, num_experts=128, num_experts_per_tok=8,
        decoder_sparse_step=1, mlp_only_layers=[],
    )  # fmt: skip


def _deepseek(model_type: str, heads: int, experts: int, dense: int, vocab: int, mtp: int,
              ) -> dict[str, Any]:  # fmt: skip
    return {
        "model_type": model_type, "hidden_size": 7168, "intermediate_size": 18432,
        "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": heads,
        "num_key_value_heads": heads, "n_routed_experts": experts, "n_shared_experts": 1,
        "num_experts_per_tok": 8, "first_k_dense_replace": dense, "moe_layer_freq": 1,
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": vocab,
        "num_nextn_predict_layers": mtp, "topk_method": "noaux_tc",
        "max_position_embeddings": 163840 if model_type == "deepseek_v3" else 131072,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                "weight_block_size": [128, 128]},
    }  # fmt: skip


def _gpt_oss(n: int, experts: int) -> dict[str, Any]:
    return {
        "model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
        "num_hidden_layers": n, "num_attention_heads": 64, "num_key_value_heads": 8,
        "head_dim": 64, "num_local_experts": experts, "num_experts_per_tok": 4,
        "experts_per_token": 4, "attention_bias": True, "vocab_size": 201088,
        "sliding_window": 128, "tie_word_embeddings": False, "max_position_embeddings": 131072,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention"
                        for i in range(n)],
        "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router",
            "model.embed_tokens", "lm_head"]},
    }  # fmt: skip


def _gemma2(h: int, inter: int, n: int, heads: int, kv: int, hd: int) -> dict[str, Any]:
    return {
        "model_type": "gemma2", "hidden_size": h, "intermediate_size": inter,
        "num_hidden_layers": n, "num_attention_heads": heads, "num_key_value_heads": kv,
        "head_dim": hd, "vocab_size": 256000, "sliding_window": 4096,
        "torch_dtype": "bfloat16", "max_position_embeddings": 8192,
    }  # fmt: skip


_GEMMA3_27B = {
    "model_type": "gemma3", "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "gemma3_text", "hidden_size": 5376, "intermediate_size": 21504,
        "num_hidden_layers": 62, "num_attention_heads": 32, "num_key_value_heads": 16,
        "head_dim": 128, "vocab_size": 262208, "sliding_window": 1024,
        "sliding_window_pattern": 6, "max_position_embeddings": 131072,
    },
}  # fmt: skip

_ROWS: tuple[KnownModel, ...] = (
    KnownModel(name="llama3.2:1b", source="meta-llama/Llama-3.2-1B", config=_L32_1B,
               aliases=("meta-llama/llama-3.2-1b-instruct",)),
    KnownModel(name="llama3.2:3b", source="meta-llama/Llama-3.2-3B", config=_L32_3B,
               aliases=("meta-llama/llama-3.2-3b-instruct",)),
    KnownModel(name="llama3.1:8b", source="meta-llama/Llama-3.1-8B", config=_L31_8B,
               aliases=("meta-llama/llama-3.1-8b-instruct", "meta-llama/meta-llama-3.1-8b",
                        "meta-llama/meta-llama-3.1-8b-instruct")),
    KnownModel(name="llama3.1:70b", source="meta-llama/Llama-3.1-70B", config=_L31_70B,
               aliases=("meta-llama/llama-3.1-70b-instruct", "meta-llama/meta-llama-3.1-70b",
                        "meta-llama/meta-llama-3.1-70b-instruct")),
    KnownModel(name="llama3.1:405b", source="meta-llama/Llama-3.1-405B", config=_L31_405B,
               aliases=("meta-llama/llama-3.1-405b-instruct", "meta-llama/meta-llama-3.1-405b",
                        "meta-llama/meta-llama-3.1-405b-instruct")),
    KnownModel(name="llama3.3:70b", source="meta-llama/Llama-3.3-70B-Instruct",
               config=_L31_70B, aliases=("llama3.3",)),
    KnownModel(name="llama3.1:8b-q4_0", source="meta-llama/Llama-3.1-8B", config=_L31_8B,
               dtype="q4_0", aliases=("llama3.1:8b-q4",)),
    KnownModel(name="llama3.1:70b-q4_0", source="meta-llama/Llama-3.1-70B", config=_L31_70B,
               dtype="q4_0", aliases=("llama3.1:70b-q4",)),
    KnownModel(name="llama3.1:405b-q4_0", source="meta-llama/Llama-3.1-405B", config=_L31_405B,
               dtype="q4_0", aliases=("llama3.1:405b-q4",)),
    KnownModel(name="mistral:7b", source="mistralai/Mistral-7B-v0.3", config=_MISTRAL_7B,
               aliases=("mistralai/mistral-7b-instruct-v0.3",)),
    KnownModel(name="mixtral:8x7b", source="mistralai/Mixtral-8x7B-v0.1",
               config=_mixtral(4096, 14336, 32, 32, 32000, 32768),
               aliases=("mistralai/mixtral-8x7b-instruct-v0.1",)),
    KnownModel(name="mixtral:8x22b", source="mistralai/Mixtral-8x22B-v0.1",
               config=_mixtral(6144, 16384, 56, 48, 32768, 65536),
               aliases=("mistralai/mixtral-8x22b-instruct-v0.1",)),
    KnownModel(name="qwen2.5:7b", source="Qwen/Qwen2.5-7B",
               config=_qwen3(3584, 18944, 28, 28, 4, model_type="qwen2", head_dim=None,
                             vocab_size=152064, max_position_embeddings=131072),
               aliases=("qwen/qwen2.5-7b-instruct",)),
    KnownModel(name="qwen3:8b", source="Qwen/Qwen3-8B", config=_qwen3(4096, 12288, 36, 32, 8)),
    KnownModel(name="qwen3:32b", source="Qwen/Qwen3-32B", config=_qwen3(5120, 25600, 64, 64, 8)),
    KnownModel(name="qwen3:30b-a3b", source="Qwen/Qwen3-30B-A3B",
               config=_qwen3_moe(2048, 768, 48, 32, 4)),
    KnownModel(name="qwen3:235b-a22b", source="Qwen/Qwen3-235B-A22B",
               config=_qwen3_moe(4096, 1536, 94, 64, 4)),
    KnownModel(name="deepseek-v3", source="deepseek-ai/DeepSeek-V3",
               config=_deepseek("deepseek_v3", 128, 256, 3, 129280, 1),
               aliases=("deepseek-ai/deepseek-v3-0324",)),
    KnownModel(name="deepseek-r1", source="deepseek-ai/DeepSeek-R1",
               config=_deepseek("deepseek_v3", 128, 256, 3, 129280, 1),
               aliases=("deepseek-ai/deepseek-r1-0528",)),
    KnownModel(name="kimi-k2", source="moonshotai/Kimi-K2-Instruct",
               config=_deepseek("kimi_k2", 64, 384, 1, 163840, 0),
               aliases=("moonshotai/kimi-k2-base",)),
    KnownModel(name="gpt-oss:20b", source="openai/gpt-oss-20b", config=_gpt_oss(24, 32)),
    KnownModel(name="gpt-oss:120b", source="openai/gpt-oss-120b", config=_gpt_oss(36, 128)),
    KnownModel(name="gemma2:2b", source="google/gemma-2-2b",
               config=_gemma2(2304, 9216, 26, 8, 4, 256), aliases=("google/gemma-2-2b-it",)),
    KnownModel(name="gemma2:9b", source="google/gemma-2-9b",
               config=_gemma2(3584, 14336, 42, 16, 8, 256), aliases=("google/gemma-2-9b-it",)),
    KnownModel(name="gemma2:27b", source="google/gemma-2-27b",
               config=_gemma2(4608, 36864, 46, 32, 16, 128), aliases=("google/gemma-2-27b-it",)),
    KnownModel(name="gemma3:27b", source="google/gemma-3-27b-it", config=_GEMMA3_27B),
)  # fmt: skip

_BY_NAME: dict[str, KnownModel] = {row.name: row for row in _ROWS}
_ALIASES: dict[str, str] = {
    alias: row.name
    for row in _ROWS
    for alias in (*([row.source.lower()] if row.dtype is None else []), *row.aliases)
}
"""Lower-case Hugging Face ids and short forms; a repository id names its own dtype."""


def _squash(name: str) -> str:
    """``name`` without case, punctuation other than dots, or an instruct/latest tag."""
    key = re.sub(r"(?:[-_]instruct|:latest)$", "", name.strip().lower())
    return re.sub(r"[^a-z0-9.]", "", key)


def _squashed() -> dict[str, str]:
    """Squashed name or alias → canonical name, for keys that point at one model only."""
    targets: dict[str, set[str]] = {}
    for key, name in [*((n, n) for n in _BY_NAME), *_ALIASES.items()]:
        targets.setdefault(_squash(key), set()).add(name)
    return {k: next(iter(v)) for k, v in targets.items() if len(v) == 1 and k}


_SQUASHED = _squashed()
_DTYPE_TAG = re.compile(r"^(?P<base>.+?)[-_@](?P<dtype>q\d\w*|int[48]|fp8|fp16|bf16|fp32|mxfp4)$")


def known_names() -> list[str]:
    """The canonical names of every known model, sorted."""
    return sorted(_BY_NAME)


def known_model(name: str) -> KnownModel | None:
    """A query: the row ``name`` names (see the module docstring for how), or None."""
    if not isinstance(name, str):
        return None
    key = name.strip().lower()
    found = _BY_NAME.get(_ALIASES.get(key, key))
    if found is None:
        found = _BY_NAME.get(_SQUASHED.get(_squash(key), ""))
    return found


def known_with_dtype(name: str) -> tuple[KnownModel, str] | None:
    """``(row, dtype)`` for a known name with a trailing storage tag (``-q4``, ``-fp8`` …).

    None when ``name`` has no such tag, its stem is not known, or the tag is no dtype.
    """
    from stowplan.errors import InputError
    from stowplan.models.dtypes import parse_dtype

    m = _DTYPE_TAG.match(name.strip().lower()) if isinstance(name, str) else None
    if m is None:
        return None
    row = known_model(m.group("base"))
    if row is None:
        return None
    try:
        return row, parse_dtype(m.group("dtype"))
    except InputError:
        return None


def hf_id(name: str) -> str | None:
    """The Hugging Face repository of the known model ``name`` (a storage tag such as
    ``-q4_0`` or ``@bf16`` read off), or None when ``name`` names none."""
    if not isinstance(name, str):
        return None
    base = name.split("@", 1)[0]
    row = known_model(base)
    if row is None and (tagged := known_with_dtype(base)) is not None:
        row = tagged[0]
    return None if row is None else row.source


def suggest(name: str, limit: int = 3) -> list[str]:
    """Up to ``limit`` known names closest to ``name`` (by name or alias), closest first."""
    if not isinstance(name, str) or len(name) > 200:
        return []
    keys = {n: n for n in _BY_NAME} | dict(_ALIASES)
    close = difflib.get_close_matches(name.strip().lower(), list(keys), n=3 * limit, cutoff=0.6)
    out: list[str] = []
    for key in close:
        if keys[key] not in out:
            out.append(keys[key])
    return out[:limit]


@cache
def _row_report(name: str) -> ModelReport:
    from stowplan.models.hf import hf_report

    row = _BY_NAME[name]
    report = hf_report(row.config, name=row.name, dtype=row.dtype)
    notes = (f"known model; config numbers from {row.source}", *report.notes[1:])
    return replace(report, source="known", notes=notes)


def known_report(name: str) -> ModelReport | None:
    """The full report of a known model (None when unknown)."""
    row = known_model(name)
    return None if row is None else _row_report(row.name)


def lookup(name: str) -> ModelLayout | None:
    """A query: the layout of a known model by short name or Hugging Face id, or None
    when ``name`` is not one.

    To get a model, call :func:`stowplan.models.resolve_model`: it also reads files and
    raises :class:`~stowplan.errors.InputError` naming the closest known names.
    """
    report = known_report(name)
    return None if report is None else report.layout
