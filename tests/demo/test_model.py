"""The numpy demo model: real byte sizes, stage-by-stage equals one process."""

from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stowplan.demo.model import (
    DemoConfig,
    StageModel,
    block_weights,
    check_request,
    demo_layout,
    generate_local,
)
from stowplan.errors import InputError
from stowplan.model import Constraints, NodeDescriptor
from stowplan.planner import plan

SMALL = DemoConfig(num_blocks=5, hidden_dim=32, num_heads=4, mlp_dim=64, vocab_size=50,
                   max_seq_len=24)  # fmt: skip


def _chained(config: DemoConfig, cuts: list[int], prompt: list[int], n: int):
    bounds = [0, *cuts, config.num_blocks]
    last = len(bounds) - 2
    stages = [
        StageModel.load(config, (lo, hi), i == 0, i == last)
        for i, (lo, hi) in enumerate(itertools.pairwise(bounds))
    ]

    def through(x):
        for s in stages:
            x = s.step(x)
        return x

    for t in prompt[:-1]:
        through(t)
    token, tokens, rows = prompt[-1], [], []
    for _ in range(n):
        logits = through(token)
        token = int(np.argmax(logits))
        tokens.append(token)
        rows.append(logits)
    return tuple(tokens), np.stack(rows), stages


def test_layout_bytes_are_the_real_weight_bytes() -> None:
    config = DemoConfig()
    layout = demo_layout(config)
    whole = StageModel.load(config, (0, config.num_blocks), True, True)
    assert layout.weight_bytes == whole.weight_bytes == 6_824_448
    assert block_weights(config, 3).nbytes == layout.block_params_bytes == 787_456
    assert StageModel.load(config, (0, 0), True, False).weight_bytes == layout.embed_params_bytes
    assert StageModel.load(config, (8, 8), False, True).weight_bytes == layout.head_params_bytes


def test_a_stage_builds_only_its_blocks_and_they_equal_the_whole_models() -> None:
    part = StageModel.load(SMALL, (2, 4), False, False)
    whole = StageModel.load(SMALL, (0, SMALL.num_blocks), True, True)
    assert part.embed is None and part.head is None and len(part.blocks) == 2
    for mine, theirs in zip(part.blocks, whole.blocks[2:4], strict=True):
        assert np.array_equal(mine.wq, theirs.wq) and np.array_equal(mine.w_down, theirs.w_down)


@settings(max_examples=15, deadline=None)
@given(
    cuts=st.sets(st.integers(1, SMALL.num_blocks - 1), max_size=3).map(sorted),
    prompt=st.lists(st.integers(0, SMALL.vocab_size - 1), min_size=1, max_size=4),
    n=st.integers(1, 6),
)
def test_any_stage_split_generates_what_one_process_generates(cuts, prompt, n) -> None:
    reference = generate_local(SMALL, prompt, n)
    tokens, logits, _ = _chained(SMALL, cuts, prompt, n)
    assert tokens == reference.tokens
    np.testing.assert_allclose(logits, reference.logits, rtol=0, atol=1e-5)


def test_generation_is_reproducible_and_depends_on_the_seed() -> None:
    a = generate_local(SMALL, [1, 2], 6)
    b = generate_local(SMALL, [1, 2], 6)
    c = generate_local(DemoConfig(**{**_fields(SMALL), "seed": 1}), [1, 2], 6)
    assert a.tokens == b.tokens and np.array_equal(a.logits, b.logits)
    assert not np.array_equal(a.logits, c.logits)
    assert a.logits.shape == (6, SMALL.vocab_size)


def _fields(config: DemoConfig) -> dict[str, int]:
    return {f: getattr(config, f) for f in config.__dataclass_fields__}


def test_the_kv_cache_makes_later_positions_depend_on_earlier_tokens() -> None:
    one = StageModel.load(SMALL, (0, SMALL.num_blocks), True, True)
    two = StageModel.load(SMALL, (0, SMALL.num_blocks), True, True)
    one.step(1)
    two.step(2)
    assert not np.allclose(one.step(7), two.step(7))
    one.reset()
    two.reset()
    assert np.array_equal(one.step(3), two.step(3))


def test_the_planner_splits_the_demo_model_by_vram() -> None:
    mib = 1 << 20
    nodes = [
        NodeDescriptor(id=f"n{i}", gpu_name="g", vram_bytes=v * mib, flops_estimate=0, link_mbps=0)
        for i, v in enumerate((4, 3, 3, 2))
    ]
    p = plan(demo_layout(), nodes, Constraints())
    assert p.num_stages == 3
    assert sum(p.block_counts()) == 8


@pytest.mark.parametrize(
    ("prompt", "n", "message"),
    [
        ([], 1, "prompt=[]: must hold at least one token id"),
        ([50], 1, "prompt[]=50: must be a token id in [0, 50)"),
        ([1], 0, "num_tokens=0: must be an integer >= 1"),
        (
            [1] * 20,
            6,
            "num_tokens=6: prompt (20) + num_tokens - 1 must be <= max_seq_len=24",
        ),
    ],
)
def test_bad_requests_name_the_field(prompt, n, message) -> None:
    with pytest.raises(InputError) as info:
        check_request(SMALL, prompt, n)
    assert str(info.value) == message


def test_bad_config_names_the_field() -> None:
    with pytest.raises(InputError) as info:
        DemoConfig(hidden_dim=30, num_heads=4)
    assert str(info.value) == "num_heads=4: must divide hidden_dim=30"


def test_the_model_module_is_pure() -> None:
    code = (
        "import sys, stowplan.demo.model; "
        "bad = [m for m in ('ray', 'pynvml', 'torch') if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
