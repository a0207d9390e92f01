"""Pricing the config's tensors: the storage scheme of each role and the bytes it takes.

The scheme comes from a ``--dtype`` override or the config's ``torch_dtype`` and
``quantization_config`` (fp8 with block scales, mxfp4, gptq/awq/compressed-tensors/
bitsandbytes, llama.cpp file types through their quantisation mix).
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from stowplan.errors import InputError
from stowplan.models.dtypes import (
    is_file_type,
    parse_dtype,
    storage_format,
    tensor_bytes,
    type_bytes,
)
from stowplan.models.grouping import TensorEntry
from stowplan.models.hf_config import (
    MOE_TYPES,
    Config,
    config_int,
    first_int,
    model_type,
    str_list,
    text_config,
    tied,
)
from stowplan.models.hf_tensors import ConfigTensor
from stowplan.models.quant_mix import MixModel, role_of, tensor_type
from stowplan.quantities.limits import MAX_CONFIG_INT

__all__ = ["Scheme", "mix_model", "price_tensor", "pricing_scheme"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Scheme:
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


def pricing_scheme(cfg: Config, override: str | None) -> Scheme:
    """How ``cfg`` stores each role: ``override`` (a ``--dtype``), else its dtype and
    ``quantization_config``."""
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
        return Scheme(
            dense=dense, linear=override, expert=override, table=table, small=small,
            label=override, mix=mix_model(cfg) if is_file_type(override) else None,
        )  # fmt: skip
    q = cfg.get("quantization_config")
    if not q:
        return Scheme(
            dense=dense, linear=dense, expert=dense, table=dense, small=dense, label=dense
        )
    if not isinstance(q, Mapping):
        raise InputError("config.quantization_config", q, "must be an object")
    method = q.get("quant_method", "")
    if not isinstance(method, str):
        raise InputError("config.quantization_config.quant_method", method, "must be a string")
    method = method.lower()
    key = "modules_to_not_convert" if q.get("modules_to_not_convert") else "ignore"
    skip = tuple(str_list(q, key, "config.quantization_config"))
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
        return Scheme(
            dense=dense, linear="fp8", expert="fp8", table=dense, small=dense,
            block_scale=bs, skip=skip, label="fp8",
        )  # fmt: skip
    if method == "mxfp4":
        return Scheme(
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
        return Scheme(
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
    mt = model_type(cfg)
    n, heads = config_int(cfg, "num_hidden_layers"), config_int(cfg, "num_attention_heads")
    kv = (
        heads if mt in ("deepseek_v3", "kimi_k2") else config_int(cfg, "num_key_value_heads", heads)
    )
    experts = 0
    if mt in MOE_TYPES:
        experts = first_int(cfg, ("num_local_experts", "num_experts", "n_routed_experts"), 0)
    return MixModel(
        num_blocks=n,
        heads_per_kv_head=heads // kv if kv else 1,
        num_experts=experts,
        seventy_b=mt in ("llama", "mistral", "qwen2") and n == 80 and kv < heads,
        tied_embeddings=tied(cfg, mt),
    )


_BLOCK_OF = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _mixed_type(t: ConfigTensor, s: Scheme) -> str:
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


def price_tensor(t: ConfigTensor, s: Scheme) -> Iterator[TensorEntry]:
    """The stored entries of ``t`` under ``s`` (an mxfp4 or fp8 weight adds its scales)."""
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
