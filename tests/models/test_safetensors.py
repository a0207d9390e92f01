"""Exact layouts from safetensors headers of small checkpoints written here."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from stowplan.errors import InputError
from stowplan.models import from_hf_config, inspect_model, resolve_model
from stowplan.models.safetensors import read_header

LLAMA = {
    "model_type": "llama", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64,
    "tie_word_embeddings": False, "torch_dtype": "float16",
}  # fmt: skip


def _llama_tensors(dtype: type = np.float16) -> dict[str, np.ndarray]:
    h, i, kv, v = 32, 48, 16, 64
    t: dict[str, np.ndarray] = {"model.embed_tokens.weight": np.zeros((v, h), dtype)}
    for n in range(2):
        p = f"model.layers.{n}"
        for name, shape in (
            ("self_attn.q_proj.weight", (h, h)), ("self_attn.k_proj.weight", (kv, h)),
            ("self_attn.v_proj.weight", (kv, h)), ("self_attn.o_proj.weight", (h, h)),
            ("mlp.gate_proj.weight", (i, h)), ("mlp.up_proj.weight", (i, h)),
            ("mlp.down_proj.weight", (h, i)), ("input_layernorm.weight", (h,)),
            ("post_attention_layernorm.weight", (h,)),
        ):  # fmt: skip
            t[f"{p}.{name}"] = np.zeros(shape, dtype)
    t["model.norm.weight"] = np.zeros((h,), dtype)
    t["lm_head.weight"] = np.zeros((v, h), dtype)
    return t


def _write_sharded(folder: Path, tensors: dict[str, np.ndarray], config: dict[str, object]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half],
              "model-00002-of-00002.safetensors": names[half:]}  # fmt: skip
    weight_map = {}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(folder / shard))
        weight_map.update(dict.fromkeys(keys, shard))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def test_sharded_checkpoint_bytes_are_exact_and_equal_the_config_estimate(tmp_path: Path) -> None:
    tensors = _llama_tensors()
    _write_sharded(tmp_path / "ckpt", tensors, LLAMA)
    report = inspect_model(str(tmp_path / "ckpt"))
    m = report.layout
    assert report.exact and report.source == "safetensors"
    assert report.stored_bytes == sum(a.nbytes for a in tensors.values())
    assert m.embed_params_bytes == 64 * 32 * 2
    assert m.head_params_bytes == (64 * 32 + 32) * 2
    layer0 = sum(a.nbytes for k, a in tensors.items() if k.startswith("model.layers.0."))
    assert m.block_sizes() == (layer0, layer0)
    assert m.total_params == sum(a.size for a in tensors.values())
    assert report.other_tensors == ()
    # the config path prices the same architecture to the same bytes
    assert m == from_hf_config(LLAMA, name="ckpt")
    # the index JSON and a single shard folder resolve the same way
    assert inspect_model(str(tmp_path / "ckpt" / "model.safetensors.index.json")).layout == m


def test_moe_checkpoint_groups_routed_and_shared_experts(tmp_path: Path) -> None:
    cfg = {
        "model_type": "qwen3_moe", "hidden_size": 16, "intermediate_size": 32,
        "moe_intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2,
        "vocab_size": 10, "torch_dtype": "bfloat16",
    }  # fmt: skip
    f32 = np.float32
    t = {
        "model.embed_tokens.weight": np.zeros((10, 16), f32),
        "model.layers.0.self_attn.q_proj.weight": np.zeros((16, 16), f32),
        "model.layers.0.mlp.gate.weight": np.zeros((4, 16), f32),
        "model.norm.weight": np.zeros((16,), f32),
        "lm_head.weight": np.zeros((10, 16), f32),
        "visual.patch_embed.weight": np.zeros((3, 3), f32),
    }
    for j in range(4):
        t[f"model.layers.0.mlp.experts.{j}.up_proj.weight"] = np.zeros((8, 16), f32)
    folder = tmp_path / "moe"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(t, str(folder / "model.safetensors"))
    report = inspect_model(str(folder))
    m = report.layout
    assert m.experts is not None
    assert m.experts.expert_params_bytes == 8 * 16 * 4
    assert m.experts.moe_blocks == (0,)
    base = (16 * 16 + 4 * 16) * 4
    assert m.block_sizes() == (base + 4 * 8 * 16 * 4,)
    assert m.block_read_sizes() == (base + 2 * 8 * 16 * 4,)
    assert report.other_tensors == ("visual.patch_embed.weight",)
    assert report.other_bytes == 36
    assert m.active_params == m.total_params - 2 * 8 * 16  # type: ignore[operator]


def _raw(path: Path, header: bytes, data: bytes = b"", length: int | None = None) -> Path:
    n = len(header) if length is None else length
    path.write_bytes(struct.pack("<Q", n) + header + data)
    return path


def test_malformed_files_give_clear_errors(tmp_path: Path) -> None:
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x01\x02")
    cases = [
        (short, "is not a safetensors file: shorter than the 8-byte header size"),
        (
            _raw(tmp_path / "big.safetensors", b"{}", length=10**9),
            "is not a safetensors file: header length 1000000000 exceeds the file size (10 bytes)",
        ),
        (
            _raw(tmp_path / "bad.safetensors", b"{not json"),
            "has a safetensors header that is not valid JSON",
        ),
    ]  # fmt: skip
    for path, rule in cases:
        with pytest.raises(InputError) as err:
            read_header(path)
        assert str(err.value) == f"MODEL={str(path)!r}: {rule}"
    header = json.dumps({"w": {"dtype": "F12", "shape": [2], "data_offsets": [0, 3]}}).encode()
    odd = _raw(tmp_path / "odd.safetensors", header, b"\0" * 3)
    with pytest.raises(
        InputError, match=r"odd.safetensors:w.dtype='F12': is not a safetensors dtype"
    ):
        read_header(odd)
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    cut = _raw(tmp_path / "cut.safetensors", header, b"\0" * 8)
    with pytest.raises(InputError) as err:
        read_header(cut)
    assert str(err.value).endswith(
        "is truncated: tensor 'w' ends at byte 16 of the data, which holds 8"
    )


def test_checkpoint_without_config_is_refused(tmp_path: Path) -> None:
    save_file({"x": np.zeros((2,), np.float32)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(InputError) as err:
        resolve_model(str(tmp_path))
    assert str(err.value) == (
        f"MODEL={str(tmp_path)!r}: needs the checkpoint's config.json beside the safetensors files"
    )


def test_folder_with_only_a_config_uses_the_estimate(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    report = inspect_model(str(tmp_path))
    assert report.source == "config" and not report.exact
    assert report.layout.total_params == sum(a.size for a in _llama_tensors().values())
