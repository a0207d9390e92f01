"""Partial loading: a stage opens only the shards holding its tensors and reads only those.

A Hugging Face checkpoint folder holds ``config.json`` and one
``model.safetensors`` or several shards listed in
``model.safetensors.index.json`` (tensor name → shard).  A stage with blocks
``[lo, hi)`` needs the tensors named ``model.layers.{i}.*`` for ``lo <= i < hi``,
``model.embed_tokens.weight`` when it owns the embed, and ``model.norm.weight``
plus ``lm_head.weight`` when it owns the head; with tied embeddings (or no
``lm_head.weight`` in the checkpoint) the head reads the embedding table.

:func:`stage_tensor_names` says which names (pure, from the index);
:func:`read_stage_tensors` reads them with ``safetensors.safe_open``, tensor by
tensor, and counts what it read: the header of each shard it opens
(``8 + header length`` bytes) and each tensor's bytes, nothing else.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stowplan.errors import InputError
from stowplan.files.fileio import FileKind, read_json_file
from stowplan.models.safetensors import read_header, shard_paths

__all__ = [
    "Checkpoint",
    "StageTensors",
    "open_checkpoint",
    "read_config",
    "read_stage_tensors",
    "stage_tensor_names",
]

EMBED = "model.embed_tokens.weight"
NORM = "model.norm.weight"
HEAD = "lm_head.weight"
_BLOCK = re.compile(r"^model\.layers\.(\d+)\.")
_SKIPPED = (".rotary_emb.inv_freq",)
"""Buffers some old checkpoints store that the model recomputes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """A checkpoint folder: its config and where each tensor lives (nothing of the weights)."""

    folder: Path
    config: Mapping[str, Any]
    """``config.json`` as parsed."""
    weight_map: Mapping[str, str]
    """Tensor name → shard file name (inside ``folder``)."""

    @property
    def tied(self) -> bool:
        """Whether the head reads the embedding table."""
        return bool(self.config.get("tie_word_embeddings", False)) or HEAD not in self.weight_map


def read_config(folder: str | Path) -> dict[str, Any]:
    """``config.json`` of the checkpoint folder, parsed (no weight file is opened)."""
    path = Path(folder)
    if not path.is_dir():
        raise InputError(
            "CHECKPOINT", str(path), "must be a checkpoint folder (config.json, *.safetensors)"
        )
    config = read_json_file(path / "config.json", field="CHECKPOINT", kind=FileKind.MODEL_CONFIG)
    if not isinstance(config, dict):
        raise InputError("CHECKPOINT", str(path / "config.json"), "must hold a JSON object")
    return config


def open_checkpoint(folder: str | Path) -> Checkpoint:
    """The checkpoint in ``folder``: ``config.json`` and the tensor → shard map.

    With an index the map is the index's (no shard is opened); a single
    ``*.safetensors`` file's names come from its header.

    Raises:
        InputError: no folder, no ``config.json``, no safetensors file, or an index
            naming a missing shard.
    """
    path = Path(folder)
    config = read_config(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shard_paths(index)  # checks every listed shard exists
        data = read_json_file(index, field="CHECKPOINT", kind=FileKind.MODEL_CONFIG)
        weight_map = {str(k): str(v) for k, v in data["weight_map"].items()}
    else:
        _, shards = shard_paths(path)
        if len(shards) != 1:
            raise InputError(
                "CHECKPOINT",
                str(path),
                f"holds {len(shards)} *.safetensors files and no model.safetensors.index.json; "
                "a checkpoint is one file or shards with their index",
            )
        weight_map = {name: shards[0].name for name in read_header(shards[0])}
    return Checkpoint(folder=path, config=config, weight_map=weight_map)


def stage_tensor_names(
    checkpoint: Checkpoint, block_range: tuple[int, int], owns_embed: bool, owns_head: bool
) -> list[str]:
    """The checkpoint's tensor names a stage reads, sorted."""
    lo, hi = block_range
    names: set[str] = set()
    for name in checkpoint.weight_map:
        m = _BLOCK.match(name)
        if m and lo <= int(m.group(1)) < hi and not name.endswith(_SKIPPED):
            names.add(name)
    if owns_embed:
        names.add(EMBED)
    if owns_head:
        names.update((NORM, EMBED if checkpoint.tied else HEAD))
    missing = sorted(n for n in names if n not in checkpoint.weight_map)
    if missing:
        raise InputError(
            "CHECKPOINT", str(checkpoint.folder), f"has no tensor {missing[0]!r} for this stage"
        )
    return sorted(names)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageTensors:
    """The tensors one stage read, and exactly what reading them cost."""

    tensors: Mapping[str, Any]
    """Name (as in the checkpoint) → ``torch.Tensor`` on the CPU."""
    shards: tuple[str, ...]
    """The shard files opened, sorted."""
    header_bytes: int
    """``8 + header length`` of every shard opened."""
    tensor_bytes: int
    """The bytes of every tensor read."""

    @property
    def bytes_read(self) -> int:
        return self.header_bytes + self.tensor_bytes


def _header_bytes(path: Path) -> int:
    with path.open("rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
    return 8 + int(length)


def read_stage_tensors(checkpoint: Checkpoint, names: Sequence[str]) -> StageTensors:
    """Read ``names`` (see :func:`stage_tensor_names`) from the shards that hold them.

    Each shard holding one of them is opened once with ``safetensors.safe_open``
    and only the named tensors are taken from it.
    """
    from safetensors import safe_open

    by_shard: dict[str, list[str]] = {}
    for name in names:
        by_shard.setdefault(checkpoint.weight_map[name], []).append(name)
    tensors: dict[str, Any] = {}
    header = data = 0
    for shard in sorted(by_shard):
        path = checkpoint.folder / shard
        header += _header_bytes(path)
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in by_shard[shard]:
                t = f.get_tensor(name)
                data += t.numel() * t.element_size()
                tensors[name] = t
    return StageTensors(
        tensors=tensors, shards=tuple(sorted(by_shard)), header_bytes=header, tensor_bytes=data
    )
