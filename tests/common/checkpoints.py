"""Tiny random Hugging Face checkpoints, made locally by ``transformers`` (never downloaded)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from stowplan.models.safetensors import read_header

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "mixtral")
PROMPT = "each stage reads only its own blocks"


def tiny_checkpoint(
    folder: Path, family: str, *, tied: bool = False, layers: int = 4, seed: int = 0
) -> Path:
    """A float32 checkpoint of ``family`` (hidden 32, ``layers`` blocks) in ~50 kB shards,
    with a word-level tokenizer."""
    from stowplan.runtime.make_checkpoint import make_checkpoint, make_tokenizer, tiny_config

    folder.mkdir(parents=True, exist_ok=True)
    vocab = make_tokenizer(folder)
    config = tiny_config(family, vocab_size=vocab, tied=tied, layers=layers)
    return make_checkpoint(folder, family, config=config, seed=seed)


def expected_reads(folder: Path, names: set[str]) -> tuple[set[str], int, int]:
    """From the shards' own headers: the shards holding ``names``, their header bytes,
    and the bytes of those tensors."""
    shards: set[str] = set()
    header = data = 0
    for path in sorted(folder.glob("*.safetensors")):
        tensors = read_header(path)
        held = names & set(tensors)
        if held:
            shards.add(path.name)
            with path.open("rb") as fh:
                header += 8 + int.from_bytes(fh.read(8), "little")
            data += sum(tensors[n]["data_offsets"][1] - tensors[n]["data_offsets"][0] for n in held)
    return shards, header, data


def block_names(folder: Path, lo: int, hi: int) -> set[str]:
    """Every tensor of blocks ``[lo, hi)``, from the shards' headers."""
    pattern = re.compile(r"^model\.layers\.(\d+)\.")
    out = set()
    for path in folder.glob("*.safetensors"):
        for name in read_header(path):
            m = pattern.match(name)
            if m and lo <= int(m.group(1)) < hi:
                out.add(name)
    return out
