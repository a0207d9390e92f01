"""Weight storage formats: how many bytes a tensor of ``n`` parameters takes.

Conventions (stated once, used everywhere):

* Dense formats (``fp32``, ``bf16``, ``fp16``, ``fp8``, ``int8``) cost a whole
  number of bytes per parameter.
* Block formats (GGUF ``q4_0``, ``q8_0``, the k-quants, ``mxfp4``) cost
  ``block_bytes`` per ``block_size`` parameters, scales included; a tensor
  whose size is not a multiple of the block is rounded up to whole blocks.
* ``int4`` is 4-bit weights with one bf16 scale per 128 (GPTQ/AWQ style).
* GGUF dtypes name llama.cpp file types (``q4_k_m``, ``q2_k``, ``q8_0``,
  ``iq4_xs`` …): priced from a config, each tensor gets the block type
  llama.cpp's mix assigns it (:mod:`stowplan.models.quant_mix`); a GGUF file
  gives the exact bytes.  ``q3_k``, ``q4_k`` and ``q5_k`` mean the ``_m``
  mixes, as ``llama-quantize`` reads them.
* 1-D tensors (norms, biases) stay in the checkpoint's dense dtype under
  ``fp8``/``int8``/``int4``/``mxfp4`` and in ``fp32`` under GGUF formats.
"""

from __future__ import annotations

from dataclasses import dataclass

from stowplan.errors import InputError
from stowplan.models.quant_mix import FILE_TYPES

__all__ = [
    "Format",
    "format_names",
    "is_file_type",
    "parse_dtype",
    "storage_format",
    "tensor_bytes",
    "type_bytes",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Format:
    """A storage format: ``block_bytes`` per ``block_size`` parameters."""

    name: str
    block_size: int
    block_bytes: int
    gguf: bool = False
    """A llama.cpp block type (its 1-D tensors are stored as fp32)."""
    quantised: bool = False
    """Applies to 2-D weights only; 1-D tensors keep the dense dtype."""

    @property
    def bits_per_param(self) -> float:
        """Average bits one parameter costs."""
        return 8 * self.block_bytes / self.block_size


def _f(name: str, size: int, nbytes: int, *, gguf: bool = False, q: bool = False) -> Format:
    return Format(name=name, block_size=size, block_bytes=nbytes, gguf=gguf, quantised=q)


_FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        _f("fp32", 1, 4),
        _f("bf16", 1, 2),
        _f("fp16", 1, 2),
        _f("fp8", 1, 1, q=True),
        _f("int8", 1, 1, q=True),
        _f("int4", 128, 66, q=True),
        _f("mxfp4", 32, 17, q=True),
        _f("q4_0", 32, 18, gguf=True, q=True),
        _f("q4_1", 32, 20, gguf=True, q=True),
        _f("q5_0", 32, 22, gguf=True, q=True),
        _f("q5_1", 32, 24, gguf=True, q=True),
        _f("q8_0", 32, 34, gguf=True, q=True),
        _f("q2_k", 256, 84, gguf=True, q=True),
        _f("q3_k", 256, 110, gguf=True, q=True),
        _f("q4_k", 256, 144, gguf=True, q=True),
        _f("q5_k", 256, 176, gguf=True, q=True),
        _f("q6_k", 256, 210, gguf=True, q=True),
        _f("iq1_s", 256, 50, gguf=True, q=True),
        _f("iq1_m", 256, 56, gguf=True, q=True),
        _f("iq2_xxs", 256, 66, gguf=True, q=True),
        _f("iq2_xs", 256, 74, gguf=True, q=True),
        _f("iq2_s", 256, 82, gguf=True, q=True),
        _f("iq3_xxs", 256, 98, gguf=True, q=True),
        _f("iq3_s", 256, 110, gguf=True, q=True),
        _f("iq4_nl", 32, 18, gguf=True, q=True),
        _f("iq4_xs", 256, 136, gguf=True, q=True),
    )
}
"""Storage formats by block type (ggml's block structures: Q4_K 4.5 bits, Q6_K 6.5625 …)."""

_RECIPES: dict[str, str] = {
    name: main for name, main in FILE_TYPES.items() if name != main or name not in _FORMATS
}
"""llama.cpp file types whose name is not their main block type → that type."""

_ALIASES: dict[str, str] = {
    "float32": "fp32",
    "f32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "f16": "fp16",
    "half": "fp16",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "f8_e4m3": "fp8",
    "e4m3": "fp8",
    "i8": "int8",
    "q8": "q8_0",
    "q4": "q4_0",
    "q3_k": "q3_k_m",
    "q4_k": "q4_k_m",
    "q5_k": "q5_k_m",
}


_NAMES = frozenset({n for n, f in _FORMATS.items() if not f.gguf} | set(FILE_TYPES))
"""Accepted dtype names: dense formats, ``int4``/``mxfp4`` and llama.cpp file types."""


def format_names() -> list[str]:
    """Every accepted dtype name (formats and llama.cpp file types), sorted."""
    return sorted(_NAMES)


def parse_dtype(text: str, *, field: str = "--dtype") -> str:
    """The canonical dtype name for ``text`` (``bfloat16`` → ``bf16``, ``Q4_K_M`` → ``q4_k_m``)."""
    key = str(text).strip().lower().replace("-", "_")
    key = _ALIASES.get(key, key)
    if key in _NAMES:
        return key
    raise InputError(field, text, f"is not a known dtype; use one of {', '.join(format_names())}")


def storage_format(dtype: str) -> Format:
    """The block format a canonical dtype (or recipe) stores its 2-D weights in."""
    name = parse_dtype(dtype)
    return _FORMATS[_RECIPES.get(name, name)]


def is_file_type(dtype: str) -> bool:
    """Whether canonical ``dtype`` is a llama.cpp file type (priced per tensor by its mix)."""
    return dtype in FILE_TYPES


def tensor_bytes(num_params: int, dtype: str) -> int:
    """Bytes of a tensor of ``num_params`` parameters stored as ``dtype`` (its main format)."""
    return _bytes(num_params, storage_format(dtype))


def type_bytes(num_params: int, block_type: str) -> int:
    """Bytes of a tensor stored as one block type (``q6_k``, ``iq2_s``, ``fp16`` …)."""
    fmt = _FORMATS.get(block_type)
    if fmt is None:
        raise InputError(
            "block_type", block_type, f"is not a block type; use one of {sorted(_FORMATS)}"
        )
    return _bytes(num_params, fmt)


def _bytes(num_params: int, fmt: Format) -> int:
    blocks = -(-num_params // fmt.block_size)
    return blocks * fmt.block_bytes
