"""Layouts from a Hugging Face ``config.json``: the architecture, priced by dtype.

The config path builds the list of tensors the family's modelling code would
create (Hugging Face names and shapes, without any weight), prices each one
with the checkpoint's dtype and ``quantization_config`` (or a ``--dtype``
override) and groups them with :func:`stowplan.models.grouping.assemble`, the
same code the safetensors and GGUF readers use.  It is an estimate of the
stored bytes; a checkpoint's headers give the exact ones.

Supported ``model_type`` values are :data:`SUPPORTED`.  Multimodal configs are
read through their ``text_config``; only the text decoder is placed.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stowplan.errors import InputError
from stowplan.fileio import FileKind, read_json_file
from stowplan.limits import MAX_BLOCKS, MAX_CONFIG_INT, MAX_CONTEXT_TOKENS, MAX_EXPERTS
from stowplan.model import ModelLayout
from stowplan.models.dtypes import (
    is_file_type,
    parse_dtype,
    storage_format,
    tensor_bytes,
    type_bytes,
)
from stowplan.models.grouping import ArchInfo, ModelReport, TensorEntry, assemble, classify_hf
from stowplan.models.quant_mix import MixModel, role_of, tensor_type

__all__ = [
    "SUPPORTED",
    "arch_info",
    "from_hf_config",
    "hf_report",
    "load_config",
    "mix_model",
    "text_config",
]

_DENSE = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gemma3_text")
_MOE = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "kimi_k2", "gpt_oss")
SUPPORTED: tuple[str, ...] = tuple(sorted(_DENSE + _MOE))
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


def _model_type(cfg: Config) -> str:
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
"""Caps tighter than :data:`~stowplan.limits.MAX_CONFIG_INT` for some config integers."""


def _int(cfg: Config, key: str, default: int | None = None) -> int:
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


def _int_list(cfg: Config, key: str) -> list[int]:
    """An optional list of integers (``[]`` when absent)."""
    v = cfg.get(key)
    if v is None:
        return []
    if not isinstance(v, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in v
    ):
        raise InputError(f"config.{key}", v, "must be a list of integers")
    return v


def _str_list(cfg: Config, key: str, where: str = "config") -> list[str]:
    """An optional list of strings (``[]`` when absent)."""
    v = cfg.get(key)
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise InputError(f"{where}.{key}", v, "must be a list of strings")
    return v


def _first_int(cfg: Config, keys: tuple[str, ...], default: int | None = None) -> int:
    for key in keys:
        if cfg.get(key) is not None:
            return _int(cfg, key)
    if default is None:
        raise InputError(
            f"config.{keys[0]}", None, f"is required for model_type {cfg.get('model_type')!r}"
        )
    return default


# -- the architecture -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _T:
    """A tensor the modelling code creates: name, shape, role (for pricing)."""

    name: str
    shape: tuple[int, ...]
    role: str
    """``linear``, ``expert``, ``router``, ``small`` (norms, biases), ``table``, ``buffer``."""
    count: int = 1
    """Identical copies: the routed experts ``experts.*`` of one block."""


def _head_dim(cfg: Config) -> int:
    h, heads = _int(cfg, "hidden_size"), _int(cfg, "num_attention_heads")
    if cfg.get("head_dim") is not None:
        return _int(cfg, "head_dim")
    if heads == 0 or h % heads:
        raise InputError("config.head_dim", None, "is required when hidden_size % heads != 0")
    return h // heads


def _is_moe_layer(cfg: Config, mt: str, i: int) -> bool:
    if mt in ("mixtral", "gpt_oss"):
        return True
    if mt in ("qwen2_moe", "qwen3_moe"):
        step = _int(cfg, "decoder_sparse_step", 1) or 1
        only = _int_list(cfg, "mlp_only_layers")
        return _first_int(cfg, ("num_experts",), 0) > 0 and i not in only and (i + 1) % step == 0
    if mt in ("deepseek_v3", "kimi_k2"):
        freq = _int(cfg, "moe_layer_freq", 1) or 1
        return (
            _first_int(cfg, ("n_routed_experts",), 0) > 0
            and i >= _int(cfg, "first_k_dense_replace", 0)
            and i % freq == 0
        )
    return False


def _mlp(p: str, h: int, inter: int, bias: bool = False) -> Iterator[_T]:
    for proj, shape in (
        ("gate_proj", (inter, h)),
        ("up_proj", (inter, h)),
        ("down_proj", (h, inter)),
    ):
        yield _T(f"{p}.{proj}.weight", shape, "linear")
        if bias:
            yield _T(f"{p}.{proj}.bias", (shape[0],), "small")


def _gqa(cfg: Config, mt: str, p: str) -> Iterator[_T]:
    h, hd = _int(cfg, "hidden_size"), _head_dim(cfg)
    heads = _int(cfg, "num_attention_heads")
    kv = _int(cfg, "num_key_value_heads", heads)
    qkv_bias = mt == "qwen2" or bool(cfg.get("attention_bias", False))
    o_bias = bool(cfg.get("attention_bias", False)) and mt != "qwen2"
    for proj, out in (("q_proj", heads * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)):
        yield _T(f"{p}.{proj}.weight", (out, h), "linear")
        if qkv_bias:
            yield _T(f"{p}.{proj}.bias", (out,), "small")
    yield _T(f"{p}.o_proj.weight", (h, heads * hd), "linear")
    if o_bias:
        yield _T(f"{p}.o_proj.bias", (h,), "small")
    if mt in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text"):
        yield _T(f"{p}.q_norm.weight", (hd,), "small")
        yield _T(f"{p}.k_norm.weight", (hd,), "small")
    if mt == "gpt_oss":
        yield _T(f"{p}.sinks", (heads,), "small")


def _mla(cfg: Config, p: str) -> Iterator[_T]:
    h, heads = _int(cfg, "hidden_size"), _int(cfg, "num_attention_heads")
    nope, rope = _int(cfg, "qk_nope_head_dim"), _int(cfg, "qk_rope_head_dim")
    v, kv_rank = _int(cfg, "v_head_dim"), _int(cfg, "kv_lora_rank")
    q_rank = _int(cfg, "q_lora_rank", 0)
    if q_rank:
        yield _T(f"{p}.q_a_proj.weight", (q_rank, h), "linear")
        yield _T(f"{p}.q_a_layernorm.weight", (q_rank,), "small")
        yield _T(f"{p}.q_b_proj.weight", (heads * (nope + rope), q_rank), "linear")
    else:
        yield _T(f"{p}.q_proj.weight", (heads * (nope + rope), h), "linear")
    yield _T(f"{p}.kv_a_proj_with_mqa.weight", (kv_rank + rope, h), "linear")
    yield _T(f"{p}.kv_a_layernorm.weight", (kv_rank,), "small")
    yield _T(f"{p}.kv_b_proj.weight", (heads * (nope + v), kv_rank), "linear")
    yield _T(f"{p}.o_proj.weight", (h, heads * v), "linear")


def _moe(cfg: Config, mt: str, p: str) -> Iterator[_T]:
    h = _int(cfg, "hidden_size")
    if mt == "mixtral":
        e, inter = _int(cfg, "num_local_experts"), _int(cfg, "intermediate_size")
        yield _T(f"{p}.block_sparse_moe.gate.weight", (e, h), "router")
        q = f"{p}.block_sparse_moe.experts.*"
        yield _T(f"{q}.w1.weight", (inter, h), "expert", e)
        yield _T(f"{q}.w2.weight", (h, inter), "expert", e)
        yield _T(f"{q}.w3.weight", (inter, h), "expert", e)
        return
    if mt == "gpt_oss":
        e, inter = (
            _first_int(cfg, ("num_local_experts", "num_experts")),
            _int(cfg, "intermediate_size"),
        )
        yield _T(f"{p}.mlp.router.weight", (e, h), "router")
        yield _T(f"{p}.mlp.router.bias", (e,), "small")
        yield _T(f"{p}.mlp.experts.gate_up_proj", (e, h, 2 * inter), "expert")
        yield _T(f"{p}.mlp.experts.gate_up_proj_bias", (e, 2 * inter), "small")
        yield _T(f"{p}.mlp.experts.down_proj", (e, inter, h), "expert")
        yield _T(f"{p}.mlp.experts.down_proj_bias", (e, h), "small")
        return
    inter = _int(cfg, "moe_intermediate_size")
    if mt in ("deepseek_v3", "kimi_k2"):
        e = _int(cfg, "n_routed_experts")
        shared = _int(cfg, "n_shared_experts", 0)
    else:
        e = _int(cfg, "num_experts")
        shared = 0
    yield _T(f"{p}.mlp.gate.weight", (e, h), "router")
    if mt in ("deepseek_v3", "kimi_k2") and cfg.get("topk_method", "noaux_tc") == "noaux_tc":
        yield _T(f"{p}.mlp.gate.e_score_correction_bias", (e,), "buffer")
    for t in _mlp(f"{p}.mlp.experts.*", h, inter):
        yield _T(t.name, t.shape, "expert", e)
    if shared:
        yield from _mlp(f"{p}.mlp.shared_experts", h, inter * shared)
    if mt == "qwen2_moe":
        s_inter = _int(cfg, "shared_expert_intermediate_size", 0)
        if s_inter:
            yield from _mlp(f"{p}.mlp.shared_expert", h, s_inter)
            yield _T(f"{p}.mlp.shared_expert_gate.weight", (1, h), "router")


def _layer(cfg: Config, mt: str, i: int) -> Iterator[_T]:
    p = f"model.layers.{i}"
    h = _int(cfg, "hidden_size")
    if mt in ("deepseek_v3", "kimi_k2"):
        yield from _mla(cfg, f"{p}.self_attn")
    else:
        yield from _gqa(cfg, mt, f"{p}.self_attn")
    yield _T(f"{p}.input_layernorm.weight", (h,), "small")
    yield _T(f"{p}.post_attention_layernorm.weight", (h,), "small")
    if mt.startswith("gemma") and mt != "gemma":
        yield _T(f"{p}.pre_feedforward_layernorm.weight", (h,), "small")
        yield _T(f"{p}.post_feedforward_layernorm.weight", (h,), "small")
    if _is_moe_layer(cfg, mt, i):
        yield from _moe(cfg, mt, p)
    else:
        yield from _mlp(f"{p}.mlp", h, _int(cfg, "intermediate_size"), bool(cfg.get("mlp_bias")))


def _tied(cfg: Config, mt: str) -> bool:
    value = cfg.get("tie_word_embeddings")
    return bool(value) if value is not None else mt in _TIED_BY_DEFAULT


def _tensors(cfg: Config, mt: str, *, with_mtp: bool) -> Iterator[_T]:
    h, vocab, n = _int(cfg, "hidden_size"), _int(cfg, "vocab_size"), _int(cfg, "num_hidden_layers")
    yield _T("model.embed_tokens.weight", (vocab, h), "table")
    for i in range(n):
        yield from _layer(cfg, mt, i)
    yield _T("model.norm.weight", (h,), "small")
    if not _tied(cfg, mt):
        yield _T("lm_head.weight", (vocab, h), "table")
    if with_mtp and mt in ("deepseek_v3", "kimi_k2"):
        for i in range(n, n + _int(cfg, "num_nextn_predict_layers", 0)):
            p = f"model.layers.{i}"
            yield from _layer(cfg, mt, max(i, _int(cfg, "first_k_dense_replace", 0)))
            yield _T(f"{p}.enorm.weight", (h,), "small")
            yield _T(f"{p}.hnorm.weight", (h,), "small")
            yield _T(f"{p}.eh_proj.weight", (h, 2 * h), "linear")
            yield _T(f"{p}.embed_tokens.weight", (vocab, h), "table")
            yield _T(f"{p}.shared_head.norm.weight", (h,), "small")
            yield _T(f"{p}.shared_head.head.weight", (vocab, h), "table")


# -- pricing ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class _Scheme:
    """How each role is stored."""

    dense: str
    """The checkpoint's dense dtype (norms, biases, unquantised tensors)."""
    linear: str
    expert: str
    table: str
    small: str
    block_scale: tuple[int, int] | None = None
    """fp8 weights with one fp32 scale per block of this shape (``weight_scale_inv``)."""
    skip: tuple[str, ...] = ()
    """Module name patterns left unquantised (``modules_to_not_convert``)."""
    label: str
    mix: MixModel | None = None
    """A llama.cpp file type (``label``): each 2-D weight gets the type its mix assigns."""


def _scheme(cfg: Config, override: str | None) -> _Scheme:
    raw = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    if not isinstance(raw, str):
        raise InputError("config.torch_dtype", raw, "must be a dtype name such as 'bfloat16'")
    dense = parse_dtype(raw, field="config.torch_dtype")
    if storage_format(dense).quantised:
        dense = "bf16"
    if override is not None:
        fmt = storage_format(override)
        small = "fp32" if fmt.gguf else (override if not fmt.quantised else dense)
        table = override if (fmt.gguf or not fmt.quantised) else dense
        return _Scheme(
            dense=dense, linear=override, expert=override, table=table, small=small,
            label=override, mix=mix_model(cfg) if is_file_type(override) else None,
        )  # fmt: skip
    q = cfg.get("quantization_config")
    if not q:
        return _Scheme(
            dense=dense, linear=dense, expert=dense, table=dense, small=dense, label=dense
        )
    if not isinstance(q, Mapping):
        raise InputError("config.quantization_config", q, "must be an object")
    method = q.get("quant_method", "")
    if not isinstance(method, str):
        raise InputError("config.quantization_config.quant_method", method, "must be a string")
    method = method.lower()
    key = "modules_to_not_convert" if q.get("modules_to_not_convert") else "ignore"
    skip = tuple(_str_list(q, key, "config.quantization_config"))
    for pattern in skip:
        if pattern.startswith("re:"):
            try:
                re.compile(pattern[3:])
            except re.error as exc:
                raise InputError(
                    f"config.quantization_config.{key}",
                    pattern,
                    f"is not a valid regular expression ({exc})",
                ) from None
    if method == "fp8":
        bs = _block_size(q.get("weight_block_size"))
        return _Scheme(
            dense=dense, linear="fp8", expert="fp8", table=dense, small=dense,
            block_scale=bs, skip=skip, label="fp8",
        )  # fmt: skip
    if method == "mxfp4":
        return _Scheme(
            dense=dense, linear=dense, expert="mxfp4", table=dense, small=dense,
            skip=skip, label=f"{dense}+mxfp4",
        )  # fmt: skip
    if method in ("gptq", "awq", "compressed-tensors", "bitsandbytes"):
        bits = q.get("bits") or q.get("w_bit")
        if bits is None and method == "bitsandbytes":
            bits = 4 if q.get("load_in_4bit") else 8
        groups = q.get("config_groups")
        if bits is None and isinstance(groups, Mapping):
            for g in groups.values():
                if isinstance(g, Mapping) and isinstance(g.get("weights"), Mapping):
                    bits = g["weights"].get("num_bits")
                    break
        if bits not in (4, 8):
            raise InputError(
                "config.quantization_config.bits", bits, "must be 4 or 8 for " + method
            )
        wt = "int4" if bits == 4 else "int8"
        return _Scheme(
            dense=dense, linear=wt, expert=wt, table=dense, small=dense, skip=skip,
            label=f"{wt}({method})",
        )  # fmt: skip
    raise InputError(
        "config.quantization_config.quant_method",
        method,
        "is not supported; supported: awq, bitsandbytes, compressed-tensors, fp8, gptq, mxfp4",
    )


def _block_size(block: object) -> tuple[int, int] | None:
    """``weight_block_size`` as (rows, columns) of at least 1 each, or None when absent."""
    if block is None:
        return None
    if (
        not isinstance(block, list)
        or len(block) != 2
        or not all(
            isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= MAX_CONFIG_INT
            for b in block
        )
    ):
        raise InputError(
            "config.quantization_config.weight_block_size",
            block,
            "must be [rows, columns] of integers >= 1, e.g. [128, 128]",
        )
    return block[0], block[1]


def mix_model(config: Config) -> MixModel:
    """The facts llama.cpp's quantisation mixes read from a model's config."""
    cfg = text_config(config)
    mt = _model_type(cfg)
    n, heads = _int(cfg, "num_hidden_layers"), _int(cfg, "num_attention_heads")
    kv = heads if mt in ("deepseek_v3", "kimi_k2") else _int(cfg, "num_key_value_heads", heads)
    experts = 0
    if mt in _MOE:
        experts = _first_int(cfg, ("num_local_experts", "num_experts", "n_routed_experts"), 0)
    return MixModel(
        num_blocks=n,
        heads_per_kv_head=heads // kv if kv else 1,
        num_experts=experts,
        seventy_b=mt in ("llama", "mistral", "qwen2") and n == 80 and kv < heads,
        tied_embeddings=_tied(cfg, mt),
    )


_BLOCK_OF = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _mixed_type(t: _T, s: _Scheme) -> str:
    """The block type llama.cpp's mix ``s.label`` gives tensor ``t`` (a 2-D or expert weight)."""
    assert s.mix is not None
    m = _BLOCK_OF.search(t.name)
    ncols = t.shape[1] if len(t.shape) == 3 else t.shape[-1]
    return tensor_type(
        s.label, role_of(t.name), block=int(m.group(1)) if m else 0, ncols=ncols, model=s.mix
    )


def _skipped(name: str, patterns: tuple[str, ...]) -> bool:
    module = name.rsplit(".", 1)[0]
    for pat in patterns:
        if pat.startswith("re:"):
            if re.match(pat[3:], module):
                return True
        elif (
            fnmatch.fnmatchcase(module, pat)
            or fnmatch.fnmatchcase(module, pat + ".*")
            or module.endswith("." + pat)
        ):
            return True
    return False


def _price(t: _T, s: _Scheme) -> Iterator[TensorEntry]:
    n = math.prod(t.shape)
    if t.role == "buffer":
        yield TensorEntry(name=t.name, nbytes=4 * n, params=0, dtype="fp32", count=t.count)
        return
    dtype = {"linear": s.linear, "expert": s.expert, "table": s.table}.get(t.role, s.small)
    if t.role == "router":
        dtype = s.small
    if dtype != s.small and s.skip and _skipped(t.name, s.skip):
        dtype = s.dense
    if dtype == "mxfp4":
        # stored as <name>_blocks (4-bit pairs) and <name>_scales (one byte per 32)
        yield TensorEntry(
            name=f"{t.name}_blocks", nbytes=n // 2, params=n, dtype="mxfp4", count=t.count
        )
        yield TensorEntry(
            name=f"{t.name}_scales", nbytes=-(-n // 32), params=0, dtype="u8", count=t.count
        )
        return
    if s.mix is not None and dtype == s.label and len(t.shape) >= 2:
        block_type = _mixed_type(t, s)
        yield TensorEntry(
            name=t.name, nbytes=type_bytes(n, block_type), params=n, dtype=block_type,
            count=t.count,
        )  # fmt: skip
        return
    yield TensorEntry(
        name=t.name, nbytes=tensor_bytes(n, dtype), params=n, dtype=dtype, count=t.count
    )
    if dtype == "fp8" and s.block_scale is not None and len(t.shape) == 2:
        r, c = t.shape
        blocks = -(-r // s.block_scale[0]) * -(-c // s.block_scale[1])
        yield TensorEntry(
            name=f"{t.name}_scale_inv", nbytes=4 * blocks, params=0, dtype="fp32", count=t.count
        )


# -- the layout ---------------------------------------------------------------------------
def _windows(cfg: Config, mt: str, n: int) -> tuple[int | None, ...]:
    window = cfg.get("sliding_window")
    if window is not None and (
        isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= MAX_CONFIG_INT
    ):
        raise InputError(
            "config.sliding_window", window, f"must be an integer in [1, {MAX_CONFIG_INT}] or null"
        )
    kinds = _str_list(cfg, "layer_types")
    if len(kinds) == n:
        return tuple(window if k == "sliding_attention" else None for k in kinds)
    if window is None:
        return (None,) * n
    if mt == "gemma2":
        return tuple(window if i % 2 == 0 else None for i in range(n))
    if mt in ("gemma3", "gemma3_text"):
        pattern = _int(cfg, "sliding_window_pattern", 6) or 1
        return tuple(window if (i + 1) % pattern else None for i in range(n))
    if mt in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        if not cfg.get("use_sliding_window"):
            return (None,) * n
        first = _int(cfg, "max_window_layers", 0)
        return tuple(window if i >= first else None for i in range(n))
    if mt in ("mistral", "mixtral"):
        return (window,) * n
    return (None,) * n


def _max_context(cfg: Config) -> int | None:
    """``max_position_embeddings`` (None when absent or 0), at most ``MAX_CONTEXT_TOKENS``."""
    if cfg.get("max_position_embeddings") is None:
        return None
    return min(_int(cfg, "max_position_embeddings"), MAX_CONTEXT_TOKENS) or None


def arch_info(config: Config, *, name: str | None = None, dtype: str | None = None) -> ArchInfo:
    """Everything but the tensor bytes: blocks, heads, experts, KV cache per token."""
    cfg = text_config(config)
    mt = _model_type(cfg)
    n, h = _int(cfg, "num_hidden_layers"), _int(cfg, "hidden_size")
    if n < 1:
        raise InputError("config.num_hidden_layers", n, "must be >= 1 (a model has blocks)")
    heads = _int(cfg, "num_attention_heads")
    scheme = _scheme(cfg, parse_dtype(dtype) if dtype is not None else None)
    act = 4 if scheme.dense == "fp32" else 2
    mla = mt in ("deepseek_v3", "kimi_k2")
    if mla:
        per_token = act * (_int(cfg, "kv_lora_rank") + _int(cfg, "qk_rope_head_dim"))
        kv_heads = 1
    else:
        kv_heads = _int(cfg, "num_key_value_heads", heads)
        per_token = 2 * kv_heads * _head_dim(cfg) * act
    experts, k, shared = 0, 0, 0
    if mt in _MOE:
        experts = _first_int(cfg, ("num_local_experts", "num_experts", "n_routed_experts"), 0)
        k_keys = ("num_experts_per_tok", "experts_per_token")
        k = _first_int(cfg, k_keys, 1)
        if experts and k > experts:
            key = next((x for x in k_keys if cfg.get(x) is not None), k_keys[0])
            raise InputError(
                f"config.{key}", k, f"must be <= the number of routed experts ({experts})"
            )
        shared = _int(cfg, "n_shared_experts", 0) if mla else 0
        if mt == "qwen2_moe" and _int(cfg, "shared_expert_intermediate_size", 0):
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
        kv_bytes_per_token=(per_token,) * n,
        kv_window_tokens=_windows(cfg, mt, n),
        num_experts=experts,
        experts_per_token=k,
        num_shared_experts=shared,
        tied_embeddings=_tied(cfg, mt),
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
    scheme = _scheme(cfg, parse_dtype(dtype) if dtype is not None else None)
    mt = _model_type(cfg)
    entries = (e for t in _tensors(cfg, mt, with_mtp=True) for e in _price(t, scheme))
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
