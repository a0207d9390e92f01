"""llama.cpp's quantisation mixes: per-tensor types, block sizes, published file sizes."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from stowplan.errors import InputError
from stowplan.models import inspect_model, parse_dtype
from stowplan.models.dtypes import storage_format, type_bytes
from stowplan.models.hf import mix_model
from stowplan.models.known import known_model
from stowplan.models.quant_mix import FILE_TYPES, MixModel, Role, role_of, tensor_type

PUBLISHED = Path(__file__).resolve().parents[2] / "benchmarks" / "published_gguf_sizes.json"

# Bits per weight of each block type, from ggml's block structures.
BITS = {
    "q4_0": 4.5, "q4_1": 5.0, "q5_0": 5.5, "q5_1": 6.0, "q8_0": 8.5, "q2_k": 2.625,
    "q3_k": 3.4375, "q4_k": 4.5, "q5_k": 5.5, "q6_k": 6.5625, "iq1_s": 1.5625, "iq1_m": 1.75,
    "iq2_xxs": 2.0625, "iq2_xs": 2.3125, "iq2_s": 2.5625, "iq3_xxs": 3.0625, "iq3_s": 3.4375,
    "iq4_nl": 4.5, "iq4_xs": 4.25,
}  # fmt: skip


@pytest.mark.parametrize("block_type", sorted(BITS))
def test_block_types_cost_their_ggml_bits_per_weight(block_type: str) -> None:
    assert type_bytes(256 * 1000, block_type) * 8 / (256 * 1000) == BITS[block_type]


def test_an_unknown_block_type_is_an_input_error() -> None:
    with pytest.raises(InputError, match=r"^block_type='q4_z': is not a block type"):
        type_bytes(256, "q4_z")


def _mix(name: str) -> tuple[MixModel, dict[str, object]]:
    row = known_model(name)
    assert row is not None
    return mix_model(row.config), row.config


def test_q4_k_m_on_llama_8b_raises_attn_v_and_ffn_down_in_sixteen_of_32_blocks() -> None:
    m, _ = _mix("llama3.1:8b")
    assert (m.num_blocks, m.heads_per_kv_head, m.seventy_b) == (32, 4, False)
    for role in (Role.ATTN_V, Role.FFN_DOWN):
        got = Counter(tensor_type("q4_k_m", role, block=i, ncols=4096, model=m) for i in range(32))
        assert got == {"q6_k": 16, "q4_k": 16}
    more = [i for i in range(32) if tensor_type("q4_k_m", Role.ATTN_V, block=i, ncols=4096, model=m)
            == "q6_k"]  # fmt: skip
    assert more == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert tensor_type("q4_k_m", Role.ATTN_Q, block=0, ncols=4096, model=m) == "q4_k"
    assert tensor_type("q4_k_m", Role.OUTPUT, block=0, ncols=4096, model=m) == "q6_k"
    assert tensor_type("q4_k_m", Role.TOKEN_EMBD, block=0, ncols=4096, model=m) == "q4_k"


def test_the_70b_class_raises_every_other_attn_v_to_q5_k() -> None:
    m, _ = _mix("llama3.1:70b")
    assert m.seventy_b
    got = Counter(
        tensor_type("q4_k_m", Role.ATTN_V, block=i, ncols=8192, model=m) for i in range(80)
    )
    assert got == {"q6_k": 40, "q5_k": 40}
    assert tensor_type("q3_k_s", Role.ATTN_V, block=40, ncols=8192, model=m) == "q5_k"


def test_eight_experts_keep_attention_k_and_v_in_q8_0() -> None:
    m, _ = _mix("mixtral:8x7b")
    assert m.num_experts == 8
    for ftype in ("q2_k", "q4_k_m", "q6_k"):
        assert tensor_type(ftype, Role.ATTN_V, block=5, ncols=4096, model=m) == "q8_0"
        assert tensor_type(ftype, Role.ATTN_K, block=5, ncols=4096, model=m) == "q8_0"
    assert tensor_type("q4_k_m", Role.ATTN_OUTPUT, block=5, ncols=4096, model=m) == "q5_k"


def test_q2_k_and_q3_k_m_raise_the_sensitive_tensors() -> None:
    m, _ = _mix("llama3.1:8b")
    assert tensor_type("q2_k", Role.ATTN_V, block=9, ncols=4096, model=m) == "q4_k"  # gqa 4
    assert tensor_type("q2_k", Role.FFN_DOWN, block=9, ncols=14336, model=m) == "q3_k"
    assert tensor_type("q2_k", Role.ATTN_OUTPUT, block=9, ncols=4096, model=m) == "q3_k"
    assert tensor_type("q2_k", Role.FFN_UP, block=9, ncols=4096, model=m) == "q2_k"
    assert tensor_type("q3_k_m", Role.ATTN_V, block=1, ncols=4096, model=m) == "q5_k"
    assert tensor_type("q3_k_m", Role.ATTN_V, block=2, ncols=4096, model=m) == "q4_k"
    assert tensor_type("q3_k_m", Role.FFN_DOWN, block=1, ncols=14336, model=m) == "q5_k"
    assert tensor_type("q3_k_m", Role.FFN_DOWN, block=2, ncols=14336, model=m) == "q4_k"
    few = MixModel(num_blocks=32, heads_per_kv_head=1)
    assert tensor_type("q2_k", Role.ATTN_V, block=9, ncols=4096, model=few) == "q3_k"


def test_tied_tables_and_q8_0_take_the_output_type() -> None:
    tied = MixModel(num_blocks=16, heads_per_kv_head=4, tied_embeddings=True)
    assert tensor_type("q4_k_m", Role.TOKEN_EMBD, block=0, ncols=2048, model=tied) == "q6_k"
    assert tensor_type("q8_0", Role.TOKEN_EMBD, block=0, ncols=2048, model=tied) == "q8_0"
    assert tensor_type("q4_0", Role.OUTPUT, block=0, ncols=2048, model=tied) == "q6_k"
    assert tensor_type("iq2_xxs", Role.OUTPUT, block=0, ncols=2048, model=tied) == "q5_k"


def test_rows_that_do_not_split_into_blocks_fall_back() -> None:
    m = MixModel(num_blocks=24, heads_per_kv_head=8)
    # gpt-oss rows of 2880 are 90 blocks of 32 but not whole blocks of 256
    assert tensor_type("q4_k_m", Role.FFN_UP, block=3, ncols=2880, model=m) == "q5_0"
    assert tensor_type("q6_k", Role.FFN_UP, block=3, ncols=2880, model=m) == "q8_0"
    assert tensor_type("iq4_xs", Role.FFN_UP, block=3, ncols=2880, model=m) == "iq4_nl"
    assert tensor_type("q4_k_m", Role.OUTPUT, block=0, ncols=2880, model=m) == "q8_0"
    assert tensor_type("q8_0", Role.FFN_UP, block=3, ncols=2890, model=m) == "fp16"


@pytest.mark.parametrize(
    ("name", "role"),
    [
        ("model.embed_tokens.weight", Role.TOKEN_EMBD),
        ("lm_head.weight", Role.OUTPUT),
        ("model.layers.3.self_attn.v_proj.weight", Role.ATTN_V),
        ("model.layers.3.self_attn.kv_b_proj.weight", Role.ATTN_KV_B),
        ("model.layers.3.self_attn.q_a_proj.weight", Role.OTHER),
        ("model.layers.3.self_attn.kv_a_proj_with_mqa.weight", Role.OTHER),
        ("model.layers.3.block_sparse_moe.experts.*.w2.weight", Role.FFN_DOWN),
        ("model.layers.3.mlp.experts.gate_up_proj", Role.FFN_UP),
        ("model.layers.3.mlp.shared_experts.down_proj.weight", Role.FFN_DOWN),
        ("model.layers.61.embed_tokens.weight", Role.OTHER),
        ("model.layers.61.shared_head.head.weight", Role.OTHER),
    ],
)
def test_hugging_face_names_map_to_llama_cpp_roles(name: str, role: Role) -> None:
    assert role_of(name) == role


def test_k_quant_names_without_a_size_mean_the_m_mix() -> None:
    assert parse_dtype("Q4_K") == "q4_k_m" and parse_dtype("q3_k") == "q3_k_m"
    assert storage_format("iq2_m").name == "iq2_s"  # llama.cpp's IQ2_M is mostly IQ2_S
    assert set(FILE_TYPES) <= {parse_dtype(n) for n in FILE_TYPES}


def test_k_quants_are_no_longer_priced_as_their_base_type() -> None:
    q4km = inspect_model("llama3.1:70b", dtype="q4_k_m").stored_bytes
    q4_0 = inspect_model("llama3.1:70b", dtype="q4_0").stored_bytes
    assert q4km / 1e9 == pytest.approx(42.5, rel=0.01)
    assert q4km > q4_0 * 1.06
    report = inspect_model("llama3.1:8b", dtype="q4_k_m")
    assert "llama.cpp's q4_k_m mix" in report.notes[0]


def _published() -> list[tuple[str, str, float, str]]:
    data = json.loads(PUBLISHED.read_text())
    return [
        (m["model"], ftype, float(gb), m["repo"])
        for m in data["models"]
        for ftype, gb in m["sizes_gb"].items()
    ]


@pytest.mark.parametrize(("model", "ftype", "gb", "repo"), _published())
def test_config_sizes_are_within_3_percent_of_published_gguf_files(
    model: str, ftype: str, gb: float, repo: str
) -> None:
    computed = inspect_model(model, dtype=ftype).stored_bytes / 1e9
    assert abs(computed - gb) / gb <= 0.03, (model, ftype, computed, gb, repo)


def test_the_published_figures_cover_every_required_mix() -> None:
    covered = {(m, f) for m, f, _, _ in _published()}
    for ftype in ("q2_k", "q3_k_m", "q4_k_m", "q5_k_m", "q6_k", "q8_0"):
        assert sum(f == ftype for _, f in covered) >= 3, ftype
