"""Fuzz the model readers: Hugging Face configs, safetensors headers, known names."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from stowplan.models import from_hf_config, lookup
from stowplan.models.safetensors import read_header
from stowplan.quantities.limits import MAX_BLOCKS
from tests.common.fuzz import dumps, fuzz, json_values, mutated, strings, typed
from tests.common.paths import FIXTURES

CONFIGS = [json.loads(p.read_text()) for p in sorted((FIXTURES / "hf-configs").glob("*.json"))]
QUANT = [
    {
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
        "modules_to_not_convert": ["re:.*gate"],
    },
    {"quant_method": "gptq", "bits": 4},
    {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]},
]

configs = st.one_of(
    st.sampled_from(CONFIGS).flatmap(mutated),
    st.builds(
        lambda c, q: {**c, "quantization_config": q},
        st.sampled_from(CONFIGS),
        st.sampled_from(QUANT).flatmap(mutated),
    ),
    st.dictionaries(strings, json_values, max_size=6),
)


@fuzz
@given(configs)
@example({**CONFIGS[0], "sliding_window": "4096", "model_type": "mistral"})
@example({**CONFIGS[0], "num_hidden_layers": 10**7})
@example(
    {**CONFIGS[0], "quantization_config": {"quant_method": "fp8", "weight_block_size": [0, 128]}}
)
def test_a_config_gives_a_bounded_layout_or_an_input_error(config: dict[str, object]) -> None:
    layout = typed(from_hf_config, config, name="fuzz")
    if layout is not None:
        assert 1 <= layout.num_blocks <= MAX_BLOCKS
        assert all(b >= 0 for b in layout.block_sizes())
        windows = layout.kv_window_tokens or ()
        assert all(w is None or isinstance(w, int) for w in windows)


@st.composite
def safetensors_bytes(draw: st.DrawFn) -> bytes:
    header = draw(
        st.one_of(
            st.dictionaries(strings, json_values, max_size=3).map(dumps),
            st.builds(
                lambda dtype, shape, offsets: dumps(
                    {"w": {"dtype": dtype, "shape": shape, "data_offsets": offsets}}
                ),
                st.one_of(st.sampled_from(["F16", "BF16", "I8"]), json_values),
                st.one_of(st.lists(st.integers(0, 64), max_size=3), json_values),
                st.one_of(st.lists(st.integers(0, 256), min_size=2, max_size=2), json_values),
            ),
            st.text(max_size=40),
        )
    ).encode()
    length = draw(st.one_of(st.just(len(header)), st.integers(0, 2**64 - 1)))
    data = draw(st.binary(max_size=256))
    return length.to_bytes(8, "little") + header + data


@fuzz
@given(st.one_of(safetensors_bytes(), st.binary(max_size=64)))
def test_a_safetensors_header_gives_tensors_or_an_input_error(blob: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        path.write_bytes(blob)
        tensors = typed(read_header, path)
    for info in (tensors or {}).values():
        begin, end = info["data_offsets"]
        assert 0 <= begin <= end <= len(blob)


@fuzz
@given(st.one_of(strings, st.text(min_size=250, max_size=400)))
def test_a_model_name_is_known_or_none(name: str) -> None:
    typed(lookup, name)
