"""The known-model table: same code path as config.json, legacy llama bytes pinned."""

from __future__ import annotations

import json

import pytest

from stowplan.errors import InputError
from stowplan.models import from_hf_config, known_names, lookup, resolve_model
from tests.common.paths import FIXTURES

# Pinned bytes of the llama rows other modules depend on (bf16 and q4_0).
LEGACY = {
    "llama3.2:1b": (121_643_008, 525_340_672, 525_336_576, 2_996_965_376),
    "llama3.1:8b": (436_224_000, 1_050_681_344, 1_050_673_152, 16_060_522_496),
    "llama3.1:70b": (1_711_308_800, 2_101_362_688, 2_101_346_304, 141_107_412_992),
}


@pytest.mark.parametrize("name", sorted(LEGACY))
def test_legacy_llama_rows_keep_their_bytes(name: str) -> None:
    block, head, embed, total = LEGACY[name]
    m = lookup(name)
    assert m is not None
    assert (m.block_params_bytes, m.head_params_bytes, m.embed_params_bytes) == (block, head, embed)
    assert m.weight_bytes == total
    assert m.block_bytes is None and m.dtype == "bf16" and m.family == "llama"


def test_q4_rows_and_aliases_resolve() -> None:
    q4 = lookup("llama3.1:70b-q4")
    assert q4 is not None and q4.name == "llama3.1:70b-q4_0"
    assert (
        q4.block_params_bytes
        == (8192 * 8192 * 2 + 8192 * 1024 * 2 + 3 * 8192 * 28672) * 18 // 32 + 4 * 2 * 8192
    )
    hf = lookup("meta-llama/Meta-Llama-3.1-70B-Instruct")
    assert hf is not None and hf.name == "llama3.1:70b"


FIXTURE_ROWS = {
    "llama3.2:1b": "Llama-3.2-1B",
    "llama3.1:8b": "Llama-3.1-8B",
    "llama3.1:70b": "Llama-3.1-70B",
    "mistral:7b": "Mistral-7B-v0.3",
    "mixtral:8x7b": "Mixtral-8x7B-v0.1",
    "qwen3:30b-a3b": "Qwen3-30B-A3B",
    "deepseek-v3": "DeepSeek-V3",
    "gpt-oss:20b": "gpt-oss-20b",
    "gemma2:9b": "Gemma-2-9B",
}


@pytest.mark.parametrize("name", sorted(FIXTURE_ROWS))
def test_known_rows_equal_the_published_config(name: str) -> None:
    cfg = json.loads((FIXTURES / "hf-configs" / f"{FIXTURE_ROWS[name]}.json").read_text())
    assert lookup(name) == from_hf_config(cfg, name=name)


# (total, active) published by the vendors, in billions; active None: dense
PUBLISHED = {
    "llama3.2:3b": (3.21, None),
    "llama3.1:405b": (405.85, None),
    "mixtral:8x22b": (141, 39),
    "qwen3:8b": (8.19, None),
    "qwen3:32b": (32.8, None),
    "qwen2.5:7b": (7.61, None),
    "qwen3:235b-a22b": (235, 22),
    "kimi-k2": (1030, 32.9),
    "gpt-oss:120b": (117, 5.13 + 0.58),
    "gemma2:2b": (2.61, None),
    "gemma2:27b": (27.2, None),
    "gemma3:27b": (27.0, None),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_rows_without_a_fixture_match_their_published_size(name: str) -> None:
    total, active = PUBLISHED[name]
    m = lookup(name)
    assert m is not None and m.total_params is not None and m.active_params is not None
    assert abs(m.total_params / 1e9 - total) <= 0.01 * total
    if active is not None:
        assert abs(m.active_params / 1e9 - active) <= 0.03 * active


def test_every_known_name_builds_and_resolves() -> None:
    for name in known_names():
        assert resolve_model(name.upper()).name == name


def test_unknown_name_lists_the_choices() -> None:
    with pytest.raises(InputError) as err:
        resolve_model("zephyr:1t")
    assert str(err.value) == (
        f"MODEL='zephyr:1t': is not a known model; known: {', '.join(known_names())}; "
        "or give a config.json, a checkpoint folder or a .gguf file"
    )


def test_a_near_miss_names_the_closest_known_models_first() -> None:
    with pytest.raises(InputError) as err:
        resolve_model("lama3.1:70b")
    assert str(err.value).startswith(
        "MODEL='lama3.1:70b': is not a known model; did you mean llama3.1:70b or "
    )


@pytest.mark.parametrize(
    ("spelled", "name"),
    [
        ("gpt-oss-120b", "gpt-oss:120b"),
        ("GPT-OSS-20B", "gpt-oss:20b"),
        ("meta-llama/Llama-3.3-70B-Instruct", "llama3.3:70b"),
        ("llama3.1-70b", "llama3.1:70b"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama3.1:8b"),
        ("qwen3:30b-a3b-q4", "qwen3:30b-a3b@q4_0"),
        ("qwen3:30b-a3b-q4_K_M", "qwen3:30b-a3b@q4_k_m"),
        ("llama3.1:8b-q4", "llama3.1:8b-q4_0"),
    ],
)
def test_common_spellings_resolve_to_their_model(spelled: str, name: str) -> None:
    assert resolve_model(spelled).name == name


def test_a_tagged_name_is_priced_in_its_dtype() -> None:
    base, tagged = resolve_model("qwen3:30b-a3b"), resolve_model("qwen3:30b-a3b-q4")
    assert tagged.num_blocks == base.num_blocks and tagged.weight_bytes < base.weight_bytes / 3


def test_llama_3_3_70b_has_the_bytes_of_llama_3_1_70b() -> None:
    assert resolve_model("llama3.3:70b").weight_bytes == resolve_model("llama3.1:70b").weight_bytes


# max_position_embeddings of the published config.json of rows without a fixture
PUBLISHED_CONTEXT = {
    "llama3.2:3b": 131072,
    "llama3.1:405b": 131072,
    "mixtral:8x22b": 65536,
    "qwen3:8b": 40960,
    "qwen3:32b": 40960,
    "qwen2.5:7b": 131072,
    "qwen3:235b-a22b": 40960,
    "kimi-k2": 131072,
    "gpt-oss:120b": 131072,
    "gemma2:2b": 8192,
    "gemma2:27b": 8192,
    "gemma3:27b": 131072,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_CONTEXT))
def test_rows_without_a_fixture_carry_their_published_maximum_context(name: str) -> None:
    m = lookup(name)
    assert m is not None and m.max_context_tokens == PUBLISHED_CONTEXT[name]


def test_every_known_model_states_its_maximum_context() -> None:
    assert [n for n in known_names() if resolve_model(n).max_context_tokens is None] == []
