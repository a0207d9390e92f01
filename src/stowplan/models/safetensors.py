"""Exact layouts from a safetensors checkpoint: headers only, no weight is read.

A safetensors file starts with an 8-byte little-endian header length and a
JSON header mapping each tensor name to ``dtype``, ``shape`` and
``data_offsets``.  A sharded checkpoint lists its shards in
``model.safetensors.index.json``.  The bytes of each tensor are
``end - begin`` of its offsets (exact); the architecture facts the headers do
not hold (experts per token, KV heads, windows) come from the ``config.json``
beside the shards.
"""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path
from typing import Any

from stowplan.errors import InputError
from stowplan.files.fileio import open_regular_file
from stowplan.files.safeload import MalformedJson, parse_json
from stowplan.models.grouping import ModelReport, TensorEntry, assemble, classify_hf
from stowplan.models.hf import arch_info, load_config, text_config

__all__ = ["DTYPE_BITS", "read_header", "safetensors_report", "shard_paths"]

DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64, "F4": 4,
}  # fmt: skip
"""Bits per element of every safetensors dtype."""

_MAX_HEADER = 100 * 1024 * 1024


def read_header(path: Path) -> dict[str, dict[str, Any]]:
    """The tensors of one safetensors file: name → {dtype, shape, data_offsets}.

    Reads the first ``8 + header length`` bytes only.  Raises ``InputError``
    for a truncated file, a header that is not a JSON object, an unknown dtype
    or offsets that do not match the shape or run past the end of the file.
    """
    where = str(path)
    try:
        with open_regular_file(path, field="MODEL") as fh:
            size = os.fstat(fh.fileno()).st_size
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise InputError(
                    "MODEL", where, "is not a safetensors file: shorter than the 8-byte header size"
                )
            (length,) = struct.unpack("<Q", prefix)
            if length > min(_MAX_HEADER, size - 8):
                raise InputError(
                    "MODEL",
                    where,
                    f"is not a safetensors file: header length {length} exceeds the "
                    f"file size ({size} bytes)",
                )
            raw = fh.read(length)
    except OSError as exc:
        raise InputError("MODEL", where, f"cannot be read ({exc.strerror})") from None
    try:
        header = parse_json(raw, field="MODEL", source=where)
    except MalformedJson:
        raise InputError(
            "MODEL", where, "has a safetensors header that is not valid JSON"
        ) from None
    if not isinstance(header, dict):
        raise InputError("MODEL", where, "has a safetensors header that is not a JSON object")
    data_size = size - 8 - length
    tensors: dict[str, dict[str, Any]] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        _check_tensor(where, name, info, data_size)
        tensors[name] = info
    return tensors


def _check_tensor(where: str, name: str, info: Any, data_size: int) -> None:
    if not isinstance(info, dict):
        raise InputError(f"{where}:{name}", info, "must be an object with dtype/shape/offsets")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise InputError(
            f"{where}:{name}.dtype",
            dtype,
            f"is not a safetensors dtype; known: {', '.join(DTYPE_BITS)}",
        )
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise InputError(f"{where}:{name}.shape", shape, "must be a list of integers >= 0")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise InputError(
            f"{where}:{name}.data_offsets", offsets, "must be [begin, end] with begin <= end"
        )
    expected = -(-math.prod(shape) * DTYPE_BITS[dtype] // 8)
    if offsets[1] - offsets[0] != expected:
        raise InputError(
            f"{where}:{name}.data_offsets",
            offsets,
            f"span {offsets[1] - offsets[0]} bytes; shape {shape} of {dtype} needs {expected}",
        )
    if offsets[1] > data_size:
        raise InputError(
            "MODEL", where, f"is truncated: tensor {name!r} ends at byte {offsets[1]} of "
            f"the data, which holds {data_size}",
        )  # fmt: skip


def shard_paths(path: Path) -> tuple[Path, list[Path]]:
    """The checkpoint folder and its shard files, from a folder or an index JSON."""
    folder = path if path.is_dir() else path.parent
    index = path if path.is_file() and path.name.endswith(".index.json") else None
    if index is None and path.is_dir():
        found = sorted(folder.glob("*.safetensors.index.json"))
        index = found[0] if found else None
    if index is not None:
        data = load_config(index)
        weight_map = data.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise InputError("MODEL", str(index), "has no 'weight_map' object of tensor → shard")
        shards = sorted({str(v) for v in weight_map.values()})
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise InputError("MODEL", str(index), f"lists shard {missing[0]!r}, which is missing")
        return folder, [folder / s for s in shards]
    if path.is_file() and path.suffix == ".safetensors":
        return folder, [path]
    return folder, sorted(folder.glob("*.safetensors"))


def _params(name: str, dtype: str, numel: int) -> int:
    """Logical parameters of a stored tensor (packed 4-bit counts twice; scales none)."""
    if name.endswith(("_scales", "_scale_inv", "weight_scale", "e_score_correction_bias")):
        return 0
    if name.endswith("_blocks") and dtype == "U8":
        return 2 * numel
    return numel


def safetensors_report(
    path: Path, *, name: str | None = None, config: dict[str, Any] | None = None
) -> ModelReport:
    """The exact layout of a checkpoint folder, index JSON or single safetensors file.

    ``config.json`` must sit beside the shards (or be passed as ``config``).
    Tensors outside the text decoder or with unrecognised names are listed in
    the report's ``other_tensors``.
    """
    folder, shards = shard_paths(path)
    if not shards:
        raise InputError("MODEL", str(path), "holds no *.safetensors file")
    if config is None:
        cfg_path = folder / "config.json"
        if not cfg_path.is_file():
            raise InputError(
                "MODEL",
                str(path),
                "needs the checkpoint's config.json beside the safetensors files",
            )
        config = load_config(cfg_path)
    cfg = text_config(config)
    arch = arch_info(cfg, name=name or folder.name)
    entries: list[TensorEntry] = []
    dtypes: dict[str, int] = {}
    for shard in shards:
        for tname, info in read_header(shard).items():
            nbytes = info["data_offsets"][1] - info["data_offsets"][0]
            numel = math.prod(info["shape"])
            entries.append(
                TensorEntry(
                    name=tname, nbytes=nbytes, params=_params(tname, info["dtype"], numel),
                    dtype=info["dtype"],
                )
            )  # fmt: skip
            dtypes[info["dtype"]] = dtypes.get(info["dtype"], 0) + nbytes
    notes = (
        f"exact: headers of {len(shards)} safetensors file(s); dtypes by bytes: "
        + ", ".join(f"{k} {v}" for k, v in sorted(dtypes.items(), key=lambda kv: -kv[1])),
    )
    return assemble(arch, entries, classify_hf, source="safetensors", exact=True, notes=notes)
