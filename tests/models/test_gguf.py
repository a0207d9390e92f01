"""Exact layouts from GGUF files written here with gguf.GGUFWriter."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from stowplan.errors import InputError
from stowplan.models import inspect_model


def _write(
    path: Path,
    tensors: dict[str, np.ndarray],
    *,
    experts: tuple[int, int] | None = None,
    file_type: bool = True,
    blocks: int = 2,
    context: int | None = None,
) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(blocks)
    if context is not None:
        w.add_context_length(context)
    w.add_embedding_length(32)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    if experts:
        w.add_expert_count(experts[0])
        w.add_expert_used_count(experts[1])
    if file_type:
        w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _llama(moe: bool = False) -> dict[str, np.ndarray]:
    t = {"token_embd.weight": np.zeros((64, 32), np.float16)}
    for b in range(2):
        t[f"blk.{b}.attn_norm.weight"] = np.zeros((32,), np.float32)
        t[f"blk.{b}.attn_q.weight"] = np.zeros((32, 32), np.float16)
        t[f"blk.{b}.attn_k.weight"] = np.zeros((16, 32), np.float16)
        if moe:
            t[f"blk.{b}.ffn_gate_inp.weight"] = np.zeros((4, 32), np.float32)
            t[f"blk.{b}.ffn_up_exps.weight"] = np.zeros((4, 48, 32), np.float16)
        else:
            t[f"blk.{b}.ffn_up.weight"] = np.zeros((48, 32), np.float16)
    t["output_norm.weight"] = np.zeros((32,), np.float32)
    return t


def test_gguf_bytes_are_exact_per_tensor(tmp_path: Path) -> None:
    tensors = _llama()
    path = tmp_path / "tiny.gguf"
    _write(path, tensors)
    report = inspect_model(str(path))
    m = report.layout
    assert report.exact and report.source == "gguf"
    assert report.stored_bytes == sum(a.nbytes for a in tensors.values())
    block = 32 * 4 + (32 * 32 + 16 * 32 + 48 * 32) * 2
    assert m.block_sizes() == (block, block)
    assert m.embed_params_bytes == 64 * 32 * 2
    # no output.weight: tied, so the head end holds a copy of the table
    assert m.tied_embeddings
    assert m.head_params_bytes == 32 * 4 + 64 * 32 * 2
    assert m.kv_bytes_per_token == (2 * 2 * 8 * 2,) * 2  # K and V, 2 heads of 8, f16
    assert m.dtype == "f16" and m.family == "llama"


def test_gguf_fused_experts_are_split_per_expert(tmp_path: Path) -> None:
    path = tmp_path / "moe.gguf"
    _write(path, _llama(moe=True), experts=(4, 1))
    m = inspect_model(str(path)).layout
    assert m.experts is not None
    assert m.experts.expert_params_bytes == 48 * 32 * 2
    assert m.experts.moe_blocks == (0, 1)
    base = 32 * 4 + (32 * 32 + 16 * 32) * 2 + 4 * 32 * 4
    assert m.block_read_sizes() == (base + 48 * 32 * 2,) * 2


def test_malformed_gguf_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.gguf"
    path.write_bytes(b"NOPE" + b"\0" * 60)
    with pytest.raises(InputError) as err:
        inspect_model(str(path))
    assert (
        str(err.value) == f"MODEL={str(path)!r}: is not a readable GGUF file (GGUF magic invalid)"
    )


def test_dtype_override_is_refused_for_stored_files(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    _write(path, _llama())
    with pytest.raises(InputError, match=r"^--dtype='q4_0': applies to known models and config"):
        inspect_model(str(path), dtype="q4_0")


def test_gguf_without_file_type_takes_the_dominant_tensor_type(tmp_path: Path) -> None:
    path = tmp_path / "no-type.gguf"
    _write(path, _llama(), file_type=False)
    assert inspect_model(str(path)).layout.dtype == "f16"
    mixed = _llama()
    for b in range(2):
        mixed[f"blk.{b}.ffn_up.weight"] = np.zeros((48, 32), np.float32)
        mixed[f"blk.{b}.attn_q.weight"] = np.zeros((32, 32), np.float32)
    mixed["token_embd.weight"] = np.zeros((64, 32), np.float16)
    path = tmp_path / "mixed.gguf"
    _write(path, mixed, file_type=False)
    # f32 holds 2 * 4 * (48*32 + 32*32 + 32) = 20736 bytes; f16 2 * (16*32*2 + 64*32) = 6144
    assert inspect_model(str(path)).layout.dtype == "f32"
    thirds = {"token_embd.weight": np.zeros((64, 32), np.float16)}
    for b in range(2):
        thirds[f"blk.{b}.attn_q.weight"] = np.zeros((16, 32), np.float32)
        thirds[f"blk.{b}.attn_k.weight"] = np.zeros((64, 32), np.int8)
    path = tmp_path / "thirds.gguf"
    _write(path, thirds, file_type=False)
    # f16, f32 and i8 hold 4096 bytes each: no type holds half of the file
    assert inspect_model(str(path)).layout.dtype == "mixed"


def test_gguf_with_no_blocks_or_more_experts_used_than_stored_is_refused(
    tmp_path: Path,
) -> None:
    path = tmp_path / "zero.gguf"
    _write(path, {"token_embd.weight": np.zeros((64, 32), np.float16)}, blocks=0)
    with pytest.raises(InputError) as info:
        inspect_model(str(path))
    assert str(info.value) == f"llama.block_count=0: must be >= 1 (GGUF file {path})"
    path = tmp_path / "k.gguf"
    _write(path, _llama(moe=True), experts=(4, 5))
    with pytest.raises(InputError) as info:
        inspect_model(str(path))
    assert str(info.value) == (
        f"llama.expert_used_count=5: must be <= llama.expert_count (4) (GGUF file {path})"
    )


def test_gguf_context_length_is_the_layouts_maximum_context(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    _write(path, _llama(), context=4096)
    assert inspect_model(str(path)).layout.max_context_tokens == 4096
    _write(path, _llama())
    assert inspect_model(str(path)).layout.max_context_tokens is None
