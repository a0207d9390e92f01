"""Layouts from a Hugging Face ``config.json``: the architecture, priced by dtype.

The config path builds the list of tensors the family's modelling code would
create (Hugging Face names and shapes, without any weight), prices each one
with the checkpoint's dtype and ``quantization_config`` (or a ``--dtype``
override) and groups them with :func:`stowplan.models.grouping.assemble`, the
same code the safetensors and GGUF readers use.  It is an estimate of the
stored bytes; a checkpoint's headers give the exact ones.

Supported ``model_type`` values are :data:`SUPPORTED`.  Multimodal configs are
read through their ``text_config``; only the text decoder is placed.

The config is read in :mod:`~stowplan.models.hf_config`, its tensors listed in
:mod:`~stowplan.models.hf_tensors` and priced in :mod:`~stowplan.models.hf_pricing`;
this module puts them together (and re-exports the public names it uses).
"""

from __future__ import annotations

from pathlib import Path

from stowplan.errors import InputError
from stowplan.model import ModelLayout
from stowplan.models.dtypes import parse_dtype
from stowplan.models.grouping import ArchInfo, ModelReport, assemble, classify_hf
from stowplan.models.hf_config import (
    MOE_TYPES,
    SUPPORTED,
    Config,
    config_int,
    first_int,
    head_dim,
    load_config,
    model_type,
    str_list,
    text_config,
    tied,
)
from stowplan.models.hf_pricing import mix_model, price_tensor, pricing_scheme
from stowplan.models.hf_tensors import config_tensors
from stowplan.quantities.limits import MAX_CONFIG_INT, MAX_CONTEXT_TOKENS

__all__ = [
    "SUPPORTED",
    "arch_info",
    "from_hf_config",
    "hf_report",
    "load_config",
    "mix_model",
    "text_config",
]


# -- the layout ---------------------------------------------------------------------------
def _windows(cfg: Config, mt: str, n: int) -> tuple[int | None, ...]:
    window = cfg.get("sliding_window")
    if window is not None and (
        isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= MAX_CONFIG_INT
    ):
        raise InputError(
            "config.sliding_window", window, f"must be an integer in [1, {MAX_CONFIG_INT}] or null"
        )
    kinds = str_list(cfg, "layer_types")
    if len(kinds) == n:
        return tuple(window if k == "sliding_attention" else None for k in kinds)
    if window is None:
        return (None,) * n
    if mt == "gemma2":
        return tuple(window if i % 2 == 0 else None for i in range(n))
    if mt in ("gemma3", "gemma3_text"):
        pattern = config_int(cfg, "sliding_window_pattern", 6) or 1
        return tuple(window if (i + 1) % pattern else None for i in range(n))
    if mt in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        if not cfg.get("use_sliding_window"):
            return (None,) * n
        first = config_int(cfg, "max_window_layers", 0)
        return tuple(window if i >= first else None for i in range(n))
    if mt in ("mistral", "mixtral"):
        return (window,) * n
    return (None,) * n


def _max_context(cfg: Config) -> int | None:
    """``max_position_embeddings`` (None when absent or 0), at most ``MAX_CONTEXT_TOKENS``."""
    if cfg.get("max_position_embeddings") is None:
        return None
    return min(config_int(cfg, "max_position_embeddings"), MAX_CONTEXT_TOKENS) or None


def arch_info(config: Config, *, name: str | None = None, dtype: str | None = None) -> ArchInfo:
    """Everything but the tensor bytes: blocks, heads, experts, KV cache per token."""
    cfg = text_config(config)
    mt = model_type(cfg)
    n, h = config_int(cfg, "num_hidden_layers"), config_int(cfg, "hidden_size")
    if n < 1:
        raise InputError("config.num_hidden_layers", n, "must be >= 1 (a model has blocks)")
    heads = config_int(cfg, "num_attention_heads")
    scheme = pricing_scheme(cfg, parse_dtype(dtype) if dtype is not None else None)
    act = 4 if scheme.dense == "fp32" else 2
    mla = mt in ("deepseek_v3", "kimi_k2")
    if mla:
        per_token = act * (config_int(cfg, "kv_lora_rank") + config_int(cfg, "qk_rope_head_dim"))
        kv_heads = 1
        width = config_int(cfg, "qk_nope_head_dim") + config_int(cfg, "qk_rope_head_dim")
    else:
        kv_heads = config_int(cfg, "num_key_value_heads", heads)
        width = head_dim(cfg)
        per_token = 2 * kv_heads * width * act
    experts, k, shared = 0, 0, 0
    if mt in MOE_TYPES:
        experts = first_int(cfg, ("num_local_experts", "num_experts", "n_routed_experts"), 0)
        k_keys = ("num_experts_per_tok", "experts_per_token")
        k = first_int(cfg, k_keys, 1)
        if experts and k > experts:
            key = next((x for x in k_keys if cfg.get(x) is not None), k_keys[0])
            raise InputError(
                f"config.{key}", k, f"must be <= the number of routed experts ({experts})"
            )
        shared = config_int(cfg, "n_shared_experts", 0) if mla else 0
        if mt == "qwen2_moe" and config_int(cfg, "shared_expert_intermediate_size", 0):
            shared = 1
    given = cfg.get("_name_or_path")
    label = name or (given if isinstance(given, str) and given else mt)
    return ArchInfo(
        name=label,
        family={"kimi_k2": "deepseek_v3", "gemma3_text": "gemma3"}.get(mt, mt),
        num_blocks=n,
        hidden_dim=h,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=width,
        kv_bytes_per_token=(per_token,) * n,
        kv_window_tokens=_windows(cfg, mt, n),
        num_experts=experts,
        experts_per_token=k,
        num_shared_experts=shared,
        tied_embeddings=tied(cfg, mt),
        bytes_per_activation_elem=act,
        dtype=scheme.label,
        attention_kind="mla" if mla else "gqa",
        max_context_tokens=_max_context(cfg),
    )


def hf_report(
    config: Config | Path, *, name: str | None = None, dtype: str | None = None
) -> ModelReport:
    """The config estimate with its report (MTP layers and conventions included)."""
    raw = load_config(config) if isinstance(config, Path) else config
    cfg = text_config(raw)
    arch = arch_info(cfg, name=name, dtype=dtype)
    scheme = pricing_scheme(cfg, parse_dtype(dtype) if dtype is not None else None)
    mt = model_type(cfg)
    entries = (e for t in config_tensors(cfg, mt, with_mtp=True) for e in price_tensor(t, scheme))
    priced = (
        f"each tensor priced as llama.cpp's {scheme.label} mix assigns it"
        if scheme.mix is not None
        else f"weights priced as {scheme.label}"
    )
    notes = [f"estimated from config.json ({mt}); {priced}"]
    if "text_config" in raw:
        notes.append("text decoder only (read from text_config)")
    return assemble(arch, entries, classify_hf, source="config", exact=False, notes=tuple(notes))


def from_hf_config(
    config: Config | Path, *, name: str | None = None, dtype: str | None = None
) -> ModelLayout:
    """A :class:`ModelLayout` from a ``config.json`` (a path or the parsed dict).

    ``dtype`` overrides the stored format (``bf16``, ``fp8``, ``int4``, ``q4_k_m`` …);
    without it the config's ``torch_dtype`` and ``quantization_config`` decide.
    Raises ``InputError`` for an unsupported ``model_type`` (naming the supported
    ones), a missing required key or an unknown dtype.
    """
    return hf_report(config, name=name, dtype=dtype).layout
