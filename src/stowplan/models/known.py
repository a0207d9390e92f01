"""The known-model table: ``lookup("llama3.1:70b") -> ModelLayout``.

Sizes are computed from each model's real architecture (its Hugging Face
``config.json``), never typed in.  Names are short lower-case tags in the
style ``llama3.1:70b``; Hugging Face ids are accepted as aliases.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from stowplan.model import ModelLayout

__all__ = ["known_names", "lookup"]


@dataclass(frozen=True, slots=True)
class _Llama:
    """The parameters of a dense Llama-family decoder that determine its bytes."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    head_dim: int | None = None


def _dense_llama(name: str, arch: _Llama, dtype: str) -> ModelLayout:
    """Bytes of a Llama-style decoder in ``dtype`` (bf16: 2 bytes; q4_0: 18 bytes per 32)."""
    hd = arch.head_dim or arch.hidden // arch.heads
    h = arch.hidden
    matrices = h * arch.heads * hd * 2 + h * arch.kv_heads * hd * 2 + 3 * h * arch.intermediate
    norms = 2 * h

    def weights(n_params: int) -> int:
        if dtype == "bf16":
            return 2 * n_params
        if dtype == "q4_0":
            return n_params * 18 // 32
        raise ValueError(dtype)

    norm_bytes = 2 * norms if dtype == "bf16" else 4 * norms
    block = weights(matrices) + norm_bytes
    table = weights(arch.vocab * h)
    final_norm = 2 * h if dtype == "bf16" else 4 * h
    params = arch.layers * (matrices + norms) + arch.vocab * h * (1 if arch.tied else 2) + h
    return ModelLayout(
        name=name,
        num_blocks=arch.layers,
        hidden_dim=h,
        bytes_per_activation_elem=2,
        block_params_bytes=block,
        head_params_bytes=table + final_norm,
        embed_params_bytes=table,
        kv_bytes_per_token=(2 * arch.kv_heads * hd * 2,) * arch.layers,
        tied_embeddings=arch.tied,
        total_params=params,
        active_params=params,
        dtype=dtype,
        num_attention_heads=arch.heads,
        num_kv_heads=arch.kv_heads,
        family="llama",
    )


_L32_1B = _Llama(2048, 8192, 16, 32, 8, 128256, tied=True, head_dim=64)
_L32_3B = _Llama(3072, 8192, 28, 24, 8, 128256, tied=True, head_dim=128)
_L31_8B = _Llama(4096, 14336, 32, 32, 8, 128256, tied=False)
_L31_70B = _Llama(8192, 28672, 80, 64, 8, 128256, tied=False)
_L31_405B = _Llama(16384, 53248, 126, 128, 8, 128256, tied=False)

_TABLE: dict[str, Callable[[], ModelLayout]] = {
    "llama3.2:1b": lambda: _dense_llama("llama3.2:1b", _L32_1B, "bf16"),
    "llama3.2:3b": lambda: _dense_llama("llama3.2:3b", _L32_3B, "bf16"),
    "llama3.1:8b": lambda: _dense_llama("llama3.1:8b", _L31_8B, "bf16"),
    "llama3.1:70b": lambda: _dense_llama("llama3.1:70b", _L31_70B, "bf16"),
    "llama3.1:405b": lambda: _dense_llama("llama3.1:405b", _L31_405B, "bf16"),
    "llama3.1:8b-q4_0": lambda: _dense_llama("llama3.1:8b-q4_0", _L31_8B, "q4_0"),
    "llama3.1:70b-q4_0": lambda: _dense_llama("llama3.1:70b-q4_0", _L31_70B, "q4_0"),
    "llama3.1:405b-q4_0": lambda: _dense_llama("llama3.1:405b-q4_0", _L31_405B, "q4_0"),
}

_ALIASES: dict[str, str] = {
    "llama3.1:70b-q4": "llama3.1:70b-q4_0",
    "llama3.1:405b-q4": "llama3.1:405b-q4_0",
    "llama3.1:8b-q4": "llama3.1:8b-q4_0",
    "meta-llama/llama-3.2-1b": "llama3.2:1b",
    "meta-llama/llama-3.2-1b-instruct": "llama3.2:1b",
    "meta-llama/llama-3.2-3b": "llama3.2:3b",
    "meta-llama/llama-3.2-3b-instruct": "llama3.2:3b",
    "meta-llama/llama-3.1-8b": "llama3.1:8b",
    "meta-llama/llama-3.1-8b-instruct": "llama3.1:8b",
    "meta-llama/meta-llama-3.1-8b": "llama3.1:8b",
    "meta-llama/meta-llama-3.1-8b-instruct": "llama3.1:8b",
    "meta-llama/llama-3.1-70b": "llama3.1:70b",
    "meta-llama/llama-3.1-70b-instruct": "llama3.1:70b",
    "meta-llama/meta-llama-3.1-70b": "llama3.1:70b",
    "meta-llama/meta-llama-3.1-70b-instruct": "llama3.1:70b",
    "meta-llama/llama-3.1-405b": "llama3.1:405b",
    "meta-llama/llama-3.1-405b-instruct": "llama3.1:405b",
    "meta-llama/meta-llama-3.1-405b": "llama3.1:405b",
    "meta-llama/meta-llama-3.1-405b-instruct": "llama3.1:405b",
}


def known_names() -> list[str]:
    """The canonical names of every known model, sorted."""
    return sorted(_TABLE)


@cache
def lookup(name: str) -> ModelLayout | None:
    """The layout of a known model by short name or Hugging Face id; None when unknown."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    factory = _TABLE.get(key)
    return None if factory is None else factory()
