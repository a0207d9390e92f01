"""Reading a Hugging Face ``config.json``: the file, the text decoder's keys, checked values.

Every value the config path takes from a config goes through these readers, so a
missing or out-of-range key is an ``InputError`` naming ``config.<key>``.
:mod:`stowplan.models.hf` re-exports the public names.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stowplan.errors import InputError
from stowplan.files.fileio import FileKind, read_json_file
from stowplan.quantities.limits import MAX_BLOCKS, MAX_CONFIG_INT, MAX_EXPERTS

__all__ = [
    "MOE_TYPES",
    "SUPPORTED",
    "Config",
    "config_int",
    "first_int",
    "head_dim",
    "int_list",
    "load_config",
    "model_type",
    "str_list",
    "text_config",
    "tied",
]

_DENSE = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gemma3_text")
MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "kimi_k2", "gpt_oss")
SUPPORTED: tuple[str, ...] = tuple(sorted(_DENSE + MOE_TYPES))
"""``model_type`` values this module understands."""

_TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3", "gemma3_text")

Config = Mapping[str, Any]


# -- reading and normalising ------------------------------------------------------------
def load_config(path: Path) -> dict[str, Any]:
    """Parse a ``config.json`` file; raise ``InputError`` when it is unreadable or not JSON."""
    data = read_json_file(path, field="MODEL", kind=FileKind.MODEL_CONFIG)
    if not isinstance(data, dict):
        raise InputError("MODEL", str(path), "must hold a JSON object (a config.json)")
    return data


def text_config(config: Config) -> dict[str, Any]:
    """The text decoder's config: ``text_config`` merged over the outer keys when nested."""
    if not isinstance(config, Mapping):
        raise InputError("config", type(config).__name__, "must be a mapping (a config.json)")
    inner = config.get("text_config")
    if isinstance(inner, Mapping):
        merged = {k: v for k, v in config.items() if k != "text_config"}
        merged.update(inner)
        if "quantization_config" in config and "quantization_config" not in inner:
            merged["quantization_config"] = config["quantization_config"]
        if "model_type" not in inner or inner["model_type"] not in SUPPORTED:
            outer = config.get("model_type", "")
            outer = outer if isinstance(outer, str) else ""
            merged["model_type"] = {"gemma3": "gemma3_text"}.get(outer, outer)
        if "tie_word_embeddings" not in inner and "tie_word_embeddings" in config:
            merged["tie_word_embeddings"] = config["tie_word_embeddings"]
        return merged
    return dict(config)


def model_type(cfg: Config) -> str:
    """The ``model_type`` of ``cfg``; ``InputError`` naming the supported ones otherwise."""
    mt = cfg.get("model_type")
    if mt not in SUPPORTED:
        raise InputError(
            "config.model_type", mt, f"is not supported; supported: {', '.join(SUPPORTED)}"
        )
    return str(mt)


_UPPER = {"num_hidden_layers": MAX_BLOCKS, "num_nextn_predict_layers": MAX_BLOCKS} | {
    key: MAX_EXPERTS
    for key in ("num_local_experts", "num_experts", "n_routed_experts", "n_shared_experts")
}
"""Caps tighter than :data:`~stowplan.quantities.limits.MAX_CONFIG_INT` for some config integers."""


def config_int(cfg: Config, key: str, default: int | None = None) -> int:
    """Integer ``key`` of ``cfg`` (``default`` when absent), in ``[0, its cap]``."""
    v = cfg.get(key, default)
    if v is None:
        v = default
    upper = _UPPER.get(key, MAX_CONFIG_INT)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= upper:
        if v is None:
            rule = f"is required for model_type {cfg.get('model_type')!r}"
        else:
            rule = f"must be an integer in [0, {upper}]"
        raise InputError(f"config.{key}", v, rule)
    return v


def int_list(cfg: Config, key: str) -> list[int]:
    """An optional list of integers (``[]`` when absent)."""
    v = cfg.get(key)
    if v is None:
        return []
    if not isinstance(v, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in v
    ):
        raise InputError(f"config.{key}", v, "must be a list of integers")
    return v


def str_list(cfg: Config, key: str, where: str = "config") -> list[str]:
    """An optional list of strings (``[]`` when absent)."""
    v = cfg.get(key)
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise InputError(f"{where}.{key}", v, "must be a list of strings")
    return v


def first_int(cfg: Config, keys: tuple[str, ...], default: int | None = None) -> int:
    """The first of ``keys`` that ``cfg`` sets, as :func:`config_int` reads it; else ``default``."""
    for key in keys:
        if cfg.get(key) is not None:
            return config_int(cfg, key)
    if default is None:
        raise InputError(
            f"config.{keys[0]}", None, f"is required for model_type {cfg.get('model_type')!r}"
        )
    return default


def head_dim(cfg: Config) -> int:
    """Width of one attention head: ``head_dim``, else ``hidden_size / heads``."""
    h, heads = config_int(cfg, "hidden_size"), config_int(cfg, "num_attention_heads")
    if cfg.get("head_dim") is not None:
        return config_int(cfg, "head_dim")
    if heads == 0 or h % heads:
        raise InputError("config.head_dim", None, "is required when hidden_size % heads != 0")
    return h // heads


def tied(cfg: Config, mt: str) -> bool:
    """Whether the head reuses the embedding table (``tie_word_embeddings``, else the
    family's default)."""
    value = cfg.get("tie_word_embeddings")
    return bool(value) if value is not None else mt in _TIED_BY_DEFAULT
