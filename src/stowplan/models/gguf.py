"""Exact layouts from a GGUF file, read with the ``gguf`` package (headers only).

Each tensor's bytes come from its GGML type and element count (the reader's
``n_bytes``); the architecture comes from the ``<arch>.*`` metadata keys.
The KV cache is priced at 2 bytes per element (llama.cpp's default f16
cache); MLA models (``<arch>.attention.kv_lora_rank``) cache the latent.
Sliding-window patterns are not recorded uniformly in GGUF metadata, so every
block is treated as full attention.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stowplan.errors import DependencyError, InputError
from stowplan.files.fileio import check_regular_file
from stowplan.models.grouping import ArchInfo, ModelReport, TensorEntry, assemble, classify_gguf
from stowplan.quantities.limits import MAX_BLOCKS, MAX_CONFIG_INT, MAX_CONTEXT_TOKENS, MAX_EXPERTS

__all__ = ["gguf_report"]


def _load(path: Path) -> Any:
    try:
        import gguf
    except ImportError:
        raise DependencyError("gguf", "formats") from None
    check_regular_file(path, field="MODEL")
    try:
        return gguf.GGUFReader(path)
    except OSError as exc:
        raise InputError("MODEL", str(path), f"cannot be read ({exc.strerror})") from None
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise InputError("MODEL", str(path), f"is not a readable GGUF file ({exc})") from None


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return None
    try:
        return f.contents()
    except (ValueError, IndexError, TypeError) as exc:  # e.g. a string that is not UTF-8
        raise InputError(key, None, f"is not readable GGUF metadata ({exc})") from None


def _whole(v: object) -> int | None:
    """``v`` as an int when it is an integer (numpy's included), else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - gguf depends on numpy
        return None
    return int(v) if isinstance(v, np.integer) else None


def _int_field(reader: Any, key: str, path: Path, *, required: bool = False) -> int | None:
    """An integer metadata value (a list: its largest) in [0, its cap], or None when absent."""
    v = _field(reader, key)
    if v is None or (isinstance(v, list) and not v):
        if required:
            raise InputError("MODEL", str(path), f"GGUF metadata lacks {key!r}")
        return None
    values = [_whole(x) for x in (v if isinstance(v, list) else [v])]
    upper = MAX_BLOCKS if key.endswith(".block_count") else MAX_CONFIG_INT
    if key.endswith((".expert_count", ".expert_used_count", ".expert_shared_count")):
        upper = MAX_EXPERTS
    if any(x is None or not 0 <= x <= upper for x in values):
        raise InputError(key, v, f"must be an integer in [0, {upper}] (GGUF file {path})")
    return max(x for x in values if x is not None)


def _file_type(reader: Any) -> str | None:
    import gguf

    v = _field(reader, "general.file_type")
    if v is None:
        return None
    try:
        name = gguf.LlamaFileType(int(v)).name
    except ValueError:
        return None
    return name.removeprefix("MOSTLY_").removeprefix("ALL_").lower()


def _dominant_type(entries: list[TensorEntry]) -> str:
    """The tensor type holding most of the bytes (at least half), else ``"mixed"``.

    Used when the file has no ``general.file_type``.
    """
    per_type: dict[str, int] = {}
    for e in entries:
        per_type[e.dtype] = per_type.get(e.dtype, 0) + e.nbytes
    total = sum(per_type.values())
    if not total:
        return "mixed"
    name, n_bytes = max(sorted(per_type.items()), key=lambda kv: kv[1])
    return name if 2 * n_bytes >= total else "mixed"


def _check_tensor_data(path: Path, reader: Any, tensors: list[Any]) -> None:
    """The tensors' data against the file's own length: each within the data section,
    none overlapping another, and no more than the alignment's padding after the last
    (a tensor count made smaller leaves the dropped tensors' bytes there)."""
    size = path.stat().st_size
    start, alignment = int(reader.data_offset), int(reader.alignment)
    end = start
    for t in sorted(tensors, key=lambda t: int(t.data_offset)):
        lo, hi = int(t.data_offset), int(t.data_offset) + int(t.n_bytes)
        if lo < end or hi > size:
            where = "past the end of the file" if hi > size else "over another tensor's data"
            raise InputError(
                "MODEL",
                str(path),
                f"GGUF tensor {t.name!r} has its data at bytes [{lo}, {hi}), {where} "
                f"({size} bytes, data from byte {start})",
            )
        end = hi
    if size - end >= alignment:
        raise InputError(
            "MODEL",
            str(path),
            f"holds {size - end} bytes after its last tensor's data (at most {alignment - 1} "
            f"of padding): the GGUF tensor count ({len(tensors)}) or offsets do not match "
            "the file",
        )


def gguf_report(path: Path, *, name: str | None = None) -> ModelReport:
    """The exact layout of a ``.gguf`` file; ``InputError`` when it is malformed."""
    reader = _load(path)
    arch = _field(reader, "general.architecture")
    if not isinstance(arch, str) or not arch:
        raise InputError("MODEL", str(path), "GGUF metadata lacks 'general.architecture'")
    n = _int_field(reader, f"{arch}.block_count", path, required=True)
    hidden = _int_field(reader, f"{arch}.embedding_length", path, required=True)
    assert n is not None and hidden is not None
    if n < 1:
        raise InputError(f"{arch}.block_count", n, f"must be >= 1 (GGUF file {path})")
    heads = _int_field(reader, f"{arch}.attention.head_count", path)
    kv_heads = _int_field(reader, f"{arch}.attention.head_count_kv", path) or heads
    key_len = _int_field(reader, f"{arch}.attention.key_length", path)
    value_len = _int_field(reader, f"{arch}.attention.value_length", path)
    kv_rank = _int_field(reader, f"{arch}.attention.kv_lora_rank", path)
    rope_dim = _int_field(reader, f"{arch}.rope.dimension_count", path)
    context = _int_field(reader, f"{arch}.context_length", path)
    per_token: int | None = None
    if kv_rank:
        per_token = 2 * (kv_rank + (rope_dim or 0))
    elif kv_heads and heads:
        hd = hidden // heads
        per_token = 2 * kv_heads * ((key_len or hd) + (value_len or hd))
    try:
        tensors = list(reader.tensors)
    except (ValueError, IndexError) as exc:
        raise InputError("MODEL", str(path), f"has unreadable GGUF tensor info ({exc})") from None
    _check_tensor_data(path, reader, tensors)
    entries = [
        TensorEntry(
            name=t.name, nbytes=int(t.n_bytes), params=int(t.n_elements),
            dtype=t.tensor_type.name.lower(),
        )
        for t in tensors
    ]  # fmt: skip
    names = {t.name for t in tensors}
    num_experts = _int_field(reader, f"{arch}.expert_count", path) or 0
    experts_used = _int_field(reader, f"{arch}.expert_used_count", path) or 0
    if num_experts and experts_used > num_experts:
        raise InputError(
            f"{arch}.expert_used_count",
            experts_used,
            f"must be <= {arch}.expert_count ({num_experts}) (GGUF file {path})",
        )
    info = ArchInfo(
        name=name or str(_field(reader, "general.name") or path.stem),
        family=arch,
        num_blocks=n,
        hidden_dim=hidden,
        num_attention_heads=heads,
        num_kv_heads=1 if kv_rank else kv_heads,
        head_dim=key_len or (hidden // heads if heads else None),
        kv_bytes_per_token=(per_token,) * n if per_token is not None else None,
        kv_window_tokens=None,
        num_experts=num_experts,
        experts_per_token=experts_used,
        num_shared_experts=_int_field(reader, f"{arch}.expert_shared_count", path) or 0,
        tied_embeddings="output.weight" not in names,
        dtype=_file_type(reader) or _dominant_type(entries),
        attention_kind="mla" if kv_rank else "gqa",
        max_context_tokens=min(context, MAX_CONTEXT_TOKENS) if context else None,
    )
    notes = (f"exact: GGUF tensor info of {len(entries)} tensors ({arch})",)
    return assemble(info, entries, classify_gguf, source="gguf", exact=True, notes=notes)
