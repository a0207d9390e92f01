"""The known-model table against published parameter counts."""

from __future__ import annotations

import pytest

from stowplan import lookup


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("llama3.2:1b", 1_235_814_400),
        ("llama3.1:8b", 8_030_261_248),
        ("llama3.1:70b", 70_553_706_496),
    ],
)
def test_parameter_counts_match_the_checkpoints(name: str, params: int) -> None:
    m = lookup(name)
    assert m is not None and m.total_params == params


def test_hugging_face_ids_are_aliases() -> None:
    assert lookup("meta-llama/Llama-3.1-70B") == lookup("llama3.1:70b")
    assert lookup("META-LLAMA/Meta-Llama-3.1-8B-Instruct") == lookup("llama3.1:8b")
    assert lookup("no-such-model") is None


def test_bf16_llama_70b_bytes_follow_the_architecture() -> None:
    m = lookup("llama3.1:70b")
    assert m is not None
    assert m.block_params_bytes == 2 * 855_654_400
    assert m.embed_params_bytes == 2 * 128256 * 8192
    assert m.head_params_bytes == 2 * (128256 * 8192 + 8192)
    assert m.num_blocks == 80


def test_four_bit_variant_is_about_a_quarter_of_bf16() -> None:
    bf16, q4 = lookup("llama3.1:70b"), lookup("llama3.1:70b-q4")
    assert bf16 is not None and q4 is not None
    assert 0.27 < q4.weight_bytes / bf16.weight_bytes < 0.30  # 4.5 bits per weight of 16
