"""Layouts from config.json: exact parameter counts, experts, KV cache, dtypes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stowplan.errors import InputError
from stowplan.models import SUPPORTED, from_hf_config
from stowplan.models.hf import hf_report
from tests.common.paths import FIXTURES

CONFIGS = FIXTURES / "hf-configs"


def _cfg(name: str) -> dict[str, object]:
    data: dict[str, object] = json.loads((CONFIGS / f"{name}.json").read_text())
    return data


# NOTES.md: counted from transformers on the meta device (tied counted once).
# model: total, embedding, layer 0, last layer, one routed expert, MoE layers, active
EXACT = {
    "Llama-3.2-1B": (1_235_814_400, 262_668_288, 60_821_504, 60_821_504, 0, 0, None),
    "Llama-3.1-8B": (8_030_261_248, 525_336_576, 218_112_000, 218_112_000, 0, 0, None),
    "Llama-3.1-70B": (70_553_706_496, 1_050_673_152, 855_654_400, 855_654_400, 0, 0, None),
    "Mistral-7B-v0.3": (7_248_023_552, 134_217_728, 218_112_000, 218_112_000, 0, 0, None),
    "Mixtral-8x7B-v0.1": (
        46_702_792_704, 131_072_000, 1_451_270_144, 1_451_270_144, 176_160_768, 32,
        12_879_925_248,
    ),
    "Qwen3-30B-A3B": (
        30_532_122_624, 311_164_928, 623_120_640, 623_120_640, 4_718_592, 48, 3_353_032_704
    ),
    "DeepSeek-V3": (
        671_026_404_352, 926_679_040, 583_483_392, 11_507_286_016, 44_040_192, 58,
        37_552_282_624,
    ),
    "gpt-oss-20b": (
        20_914_757_184, 579_133_440, 823_186_976, 823_186_976, 24_891_840, 24, 4_187_440_704
    ),
    "Gemma-2-9B": (9_241_705_984, 917_504_000, 198_195_200, 198_195_200, 0, 0, None),
}  # fmt: skip


@pytest.mark.parametrize("model", sorted(EXACT))
def test_config_counts_match_the_modelling_code_exactly(model: str) -> None:
    total, embed, first, last, expert, moe_layers, active = EXACT[model]
    # priced as fp32 every stored tensor is 4 bytes per parameter (buffers too)
    layout = from_hf_config(_cfg(model), dtype="fp32")
    assert layout.total_params == total
    assert layout.active_params == (active if active is not None else total)
    assert layout.embed_params_bytes == 4 * embed
    buffer = 4 * 256 if model == "DeepSeek-V3" else 0  # e_score_correction_bias, not a param
    sizes = layout.block_sizes()
    assert sizes[0] == 4 * first
    assert sizes[-1] == 4 * last + buffer
    if expert:
        assert layout.experts is not None
        assert layout.experts.expert_params_bytes == 4 * expert
        assert len(layout.experts.moe_blocks) == moe_layers
    else:
        assert layout.experts is None


# Published figures (model cards): total within 1 %, active within 3 %.
# Convention: totals include embedding and lm_head (a tied table once); active
# includes them too, except where the vendor excludes the input embedding
# (gpt-oss), which the test subtracts as the vendor does.
PUBLISHED = {
    "Llama-3.1-8B": (8.030261248e9, None),
    "Llama-3.1-70B": (70.553706496e9, None),
    "Llama-3.2-1B": (1.24e9, None),
    "Mistral-7B-v0.3": (7.25e9, None),
    "Mixtral-8x7B-v0.1": (46.7e9, 12.9e9),
    "Qwen3-30B-A3B": (30.5e9, 3.3e9),
    "DeepSeek-V3": (671e9, 37e9),
    "gpt-oss-20b": (21e9, 3.6e9),
    "Gemma-2-9B": (9.24e9, None),
}


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_config_counts_are_within_the_published_figures(model: str) -> None:
    total, active = PUBLISHED[model]
    layout = from_hf_config(_cfg(model))
    assert layout.total_params is not None and layout.active_params is not None
    assert abs(layout.total_params - total) <= 0.01 * total
    if active is not None:
        got = layout.active_params
        if model == "gpt-oss-20b":
            got -= layout.embed_params_bytes // 2
        assert abs(got - active) <= 0.03 * active


def test_llama_3_1_exact_counts_match_the_safetensors_index_total_size() -> None:
    # total_size / 2 of the published bf16 index
    assert from_hf_config(_cfg("Llama-3.1-8B")).total_params == 8_030_261_248
    assert from_hf_config(_cfg("Llama-3.1-70B")).total_params == 70_553_706_496


def test_deepseek_v3_stores_685b_with_its_mtp_layer() -> None:
    report = hf_report(_cfg("DeepSeek-V3"))
    assert report.layout.num_blocks == 61
    assert abs(report.stored_params - 685e9) <= 0.01 * 685e9
    assert abs(report.mtp_params - 14e9) <= 0.05 * 14e9


def test_deepseek_fp8_weights_carry_one_fp32_scale_per_128x128_block() -> None:
    cfg = {
        "model_type": "deepseek_v3", "hidden_size": 256, "intermediate_size": 384,
        "moe_intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "first_k_dense_replace": 1, "q_lora_rank": None, "kv_lora_rank": 128,
        "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64, "vocab_size": 1000,
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    }  # fmt: skip
    layout = from_hf_config(cfg)

    # layer 0: q_proj 192x256, kv_a 160x256, kv_b 256x128, o 256x128, mlp 3 of 384x256
    def fp8(r: int, c: int) -> int:
        return r * c + 4 * (-(-r // 128)) * (-(-c // 128))

    attn = fp8(192, 256) + fp8(160, 256) + fp8(256, 128) + fp8(256, 128) + 2 * 128
    dense = 2 * fp8(384, 256) + fp8(256, 384) + 2 * 2 * 256
    assert layout.block_sizes()[0] == attn + dense
    expert = 2 * fp8(128, 256) + fp8(256, 128)
    assert layout.experts is not None
    assert layout.experts.expert_params_bytes == expert
    router = 2 * 4 * 256 + 4 * 4  # bf16 gate weight + fp32 correction bias
    moe = attn + router + 4 * expert + expert + 2 * 2 * 256
    assert layout.block_sizes()[1] == moe
    assert layout.block_read_sizes()[1] == moe - 2 * expert
    assert layout.embed_params_bytes == 2 * 1000 * 256  # tables stay bf16
    assert layout.kv_bytes_per_token == (2 * (128 + 32),) * 2


def test_mla_caches_the_compressed_latent() -> None:
    layout = from_hf_config(_cfg("DeepSeek-V3"))
    assert layout.kv_bytes_per_token == ((512 + 64) * 2,) * 61
    assert layout.experts is not None
    assert layout.experts.moe_blocks == tuple(range(3, 61))
    assert layout.experts.num_shared_experts == 1


def test_gqa_kv_bytes_and_sliding_windows() -> None:
    assert from_hf_config(_cfg("Llama-3.1-8B")).kv_bytes_per_token == (2 * 8 * 128 * 2,) * 32
    oss = from_hf_config(_cfg("gpt-oss-20b"))
    assert oss.kv_window_tokens == (128, None) * 12
    assert oss.kv_bytes(0, 10_000) == 2 * 8 * 64 * 2 * 128
    assert oss.kv_bytes(1, 10_000) == 2 * 8 * 64 * 2 * 10_000
    gemma = from_hf_config(_cfg("Gemma-2-9B"))
    assert gemma.tied_embeddings
    assert gemma.kv_window_tokens == (4096, None) * 21
    assert from_hf_config(_cfg("Mistral-7B-v0.3")).kv_window_tokens is None


def test_gpt_oss_experts_are_mxfp4_and_the_rest_bf16() -> None:
    layout = from_hf_config(_cfg("gpt-oss-20b"))
    expert_weights = 2880 * 5760 + 2880 * 2880
    assert layout.experts is not None
    assert layout.experts.expert_params_bytes == expert_weights * 17 // 32 + 2 * (5760 + 2880)
    assert layout.embed_params_bytes == 2 * 201088 * 2880
    assert layout.dtype == "bf16+mxfp4"


def test_other_configs_of_the_same_families_work() -> None:
    # qwen2: q/k/v biases, tied table; counted by hand from the architecture
    qwen2 = {
        "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 100, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    }  # fmt: skip
    per_layer = 64 * 64 + 64 + 2 * (64 * 32 + 32) + 64 * 64 + 3 * 64 * 96 + 2 * 64
    layout = from_hf_config(qwen2)
    assert layout.total_params == 3 * per_layer + 100 * 64 + 64
    assert layout.head_params_bytes == 2 * (100 * 64 + 64)  # tied: the head end holds a copy
    # qwen3_moe with dense layers every other block and one forced dense layer
    moe = {
        "model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 96,
        "moe_intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2,
        "decoder_sparse_step": 2, "mlp_only_layers": [3], "vocab_size": 100,
    }  # fmt: skip
    m = from_hf_config(moe)
    assert m.experts is not None
    assert m.experts.moe_blocks == (1,)
    assert m.experts.expert_params_bytes == 2 * 3 * 64 * 32
    # gemma3 with a 1-in-3 global pattern
    g3 = {
        "model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 6, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 32, "vocab_size": 100, "sliding_window": 512, "sliding_window_pattern": 3,
    }  # fmt: skip
    assert from_hf_config(g3).kv_window_tokens == (512, 512, None, 512, 512, None)


def test_kimi_k2_nested_in_text_config_equals_the_flat_config() -> None:
    flat = {
        "model_type": "kimi_k2", "hidden_size": 128, "intermediate_size": 256,
        "moe_intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 2,
        "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "first_k_dense_replace": 1, "q_lora_rank": 64, "kv_lora_rank": 32,
        "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "vocab_size": 500,
    }  # fmt: skip
    nested = {"model_type": "kimi_k25", "vision_config": {"depth": 2}, "text_config": flat}
    a, b = from_hf_config(flat, name="k"), from_hf_config(nested, name="k")
    assert a == b
    assert a.family == "deepseek_v3"


def test_dtype_override_reprices_weights() -> None:
    cfg = _cfg("Llama-3.1-8B")
    bf16, q4 = from_hf_config(cfg), from_hf_config(cfg, dtype="Q4_0")
    matrices = 4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336
    assert q4.block_params_bytes == matrices * 18 // 32 + 4 * 2 * 4096
    assert bf16.block_params_bytes == 2 * (matrices + 2 * 4096)
    fp8 = from_hf_config(cfg, dtype="fp8")
    assert fp8.block_params_bytes == matrices + 2 * 2 * 4096
    assert fp8.embed_params_bytes == bf16.embed_params_bytes
    assert q4.kv_bytes_per_token == bf16.kv_bytes_per_token


def test_config_file_path_is_accepted() -> None:
    path: Path = CONFIGS / "Mixtral-8x7B-v0.1.json"
    assert from_hf_config(path, name="m") == from_hf_config(_cfg("Mixtral-8x7B-v0.1"), name="m")


def test_max_position_embeddings_is_the_maximum_context() -> None:
    cfg = json.loads((CONFIGS / "Llama-3.2-1B.json").read_text())
    assert from_hf_config(cfg).max_context_tokens == cfg["max_position_embeddings"] == 131072
    assert from_hf_config({**cfg, "max_position_embeddings": None}).max_context_tokens is None
    assert from_hf_config({**cfg, "max_position_embeddings": 0}).max_context_tokens is None
    # Beyond what a plan can budget, it bounds nothing: the cap stands in for it.
    big = {**cfg, "max_position_embeddings": 2**31 - 1}
    assert from_hf_config(big).max_context_tokens == 2**30
    gemma3 = {"model_type": "gemma3", "text_config": {**cfg, "model_type": "gemma3_text"}}
    gemma3["text_config"]["max_position_embeddings"] = 32768
    assert from_hf_config(gemma3).max_context_tokens == 32768


BAD = [
    (
        {"model_type": "bert", "hidden_size": 8},
        "config.model_type='bert': is not supported; supported: " + ", ".join(SUPPORTED),
    ),
    (
        {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4},
        "config.num_hidden_layers=None: is required for model_type 'llama'",
    ),
    (
        {**json.loads((CONFIGS / "Llama-3.2-1B.json").read_text()), "torch_dtype": "float7"},
        "config.torch_dtype='float7': is not a known dtype; use one of ",
    ),
    (
        {
            **json.loads((CONFIGS / "Llama-3.2-1B.json").read_text()),
            "quantization_config": {"quant_method": "hqq"},
        },
        "config.quantization_config.quant_method='hqq': is not supported; supported: "
        "awq, bitsandbytes, compressed-tensors, fp8, gptq, mxfp4",
    ),
    (
        {**json.loads((CONFIGS / "Llama-3.2-1B.json").read_text()), "max_position_embeddings": -1},
        "config.max_position_embeddings=-1: must be an integer in [0, ",
    ),
]


@pytest.mark.parametrize(("cfg", "message"), BAD)
def test_bad_configs_name_the_field_and_the_choices(cfg: dict[str, object], message: str) -> None:
    with pytest.raises(InputError) as err:
        from_hf_config(cfg)
    assert str(err.value).startswith(message)


def test_unknown_dtype_override_lists_the_formats() -> None:
    with pytest.raises(InputError, match=r"^--dtype='q9': is not a known dtype; use one of bf16"):
        from_hf_config(_cfg("Llama-3.2-1B"), dtype="q9")


def test_a_config_without_blocks_is_an_input_error():
    cfg = {**_cfg("Llama-3.1-8B"), "num_hidden_layers": 0}
    with pytest.raises(InputError) as info:
        from_hf_config(cfg)
    assert str(info.value) == "config.num_hidden_layers=0: must be >= 1 (a model has blocks)"


@pytest.mark.parametrize(
    ("name", "key", "experts"),
    [("Mixtral-8x7B-v0.1", "num_experts_per_tok", 8), ("DeepSeek-V3", "num_experts_per_tok", 256)],
)
def test_more_experts_per_token_than_experts_is_an_input_error(name, key, experts):
    cfg = {**_cfg(name), key: experts + 1}
    with pytest.raises(InputError) as info:
        from_hf_config(cfg)
    assert str(info.value) == (
        f"config.{key}={experts + 1}: must be <= the number of routed experts ({experts})"
    )
