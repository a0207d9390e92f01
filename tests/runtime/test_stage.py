"""Stages built with the model's own code, chained in one process, equal the whole model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stowplan.runtime.generation import Generation, compare, generate_reference
from stowplan.runtime.run import tokenize
from stowplan.runtime.stage import StageModel
from stowplan.stages.worker import WorkerStage
from tests.common.checkpoints import FAMILIES, PROMPT, block_names, expected_reads

NEW_TOKENS = 5


def stages_of(folder, bounds):
    n = len(bounds)
    return [
        StageModel.load(
            folder,
            WorkerStage(
                stage=i,
                num_stages=n,
                block_range=b,
                owns_embed=i == 0,
                owns_head=i == n - 1,
                source="test",
            ),
        )
        for i, b in enumerate(bounds)
    ]


def chained(stages, prompts, new_tokens):
    """Greedy generation through ``stages`` in turn, one KV cache per stage."""
    caches = [s.new_cache() for s in stages]
    x = torch.tensor(prompts)
    tokens, logits = [], []
    for _ in range(new_tokens):
        for s, c in zip(stages, caches, strict=True):
            x = s.forward(x, c)
        logits.append(x.numpy())
        x = x.argmax(-1)[:, None]
        tokens.append(x[:, 0].tolist())
    return [
        Generation(
            tokens=tuple(t[row] for t in tokens), logits=np.stack([lg[row] for lg in logits])
        )
        for row in range(len(prompts))
    ]


@pytest.mark.parametrize("family", FAMILIES)
def test_uneven_stages_chained_equal_one_process_at_prefill_and_every_decode_step(
    checkpoints, family
) -> None:
    folder = checkpoints[family]
    prompt = tokenize(folder, PROMPT)
    want = generate_reference(folder, prompt, NEW_TOKENS)
    (got,) = chained(stages_of(folder, [(0, 1), (1, 3), (3, 4)]), [prompt], NEW_TOKENS)
    assert got.tokens == want.tokens and len(got.tokens) == NEW_TOKENS
    assert got.logits.shape == want.logits.shape
    assert float(np.max(np.abs(got.logits - want.logits))) <= 1e-5
    assert compare(got, want).match


def test_one_stage_owning_embed_and_head_with_tied_embeddings_equals_one_process(
    checkpoints,
) -> None:
    folder = checkpoints["qwen2-tied"]
    prompt = tokenize(folder, PROMPT)
    (stage,) = stages_of(folder, [(0, 3)])
    assert stage.model.lm_head.weight is stage.model.model.embed_tokens.weight
    (got,) = chained([stage], [prompt], NEW_TOKENS)
    assert compare(got, generate_reference(folder, prompt, NEW_TOKENS)).match


def test_a_microbatch_of_two_sequences_gives_each_its_own_generation(checkpoints) -> None:
    folder = checkpoints["mixtral"]
    a, b = tokenize(folder, "the worker runs prefill"), tokenize(folder, "a plan names the")
    assert len(a) == len(b)
    got = chained(stages_of(folder, [(0, 2), (2, 4)]), [a, b], 4)
    for prompt, gen in zip((a, b), got, strict=True):
        assert compare(gen, generate_reference(folder, prompt, 4)).match


def test_a_stage_holds_only_its_modules_and_reports_what_it_read(checkpoints) -> None:
    folder = checkpoints["llama"]
    middle, last = stages_of(folder, [(0, 1), (1, 3), (3, 4)])[1:]
    assert len(middle.model.model.layers) == 2
    assert isinstance(middle.model.model.embed_tokens, torch.nn.Identity)
    assert isinstance(middle.model.lm_head, torch.nn.Identity)
    shards, header, data = expected_reads(folder, block_names(folder, 1, 3))
    assert set(middle.report.shards) == shards
    assert (middle.report.header_bytes, middle.report.tensor_bytes) == (header, data)
    assert middle.weight_bytes == data
    assert last.report.device == "cpu" or last.report.device.startswith("cuda")


def test_the_first_difference_is_the_position_where_tokens_or_logits_part() -> None:
    want = Generation(tokens=(1, 2, 3), logits=np.zeros((3, 4), dtype=np.float32))
    off = want.logits.copy()
    off[1, 0] = 1e-3
    got = compare(Generation(tokens=(1, 2, 3), logits=off), want)
    assert (got.match, got.first_difference) == (False, 1)
    assert got.max_abs_logit_diff == pytest.approx(1e-3)
    other = compare(Generation(tokens=(1, 9, 3), logits=want.logits), want)
    assert other.first_difference == 1
    assert compare(want, want).match


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_stage_runs_on_cuda_and_still_equals_one_process(checkpoints) -> None:
    folder = checkpoints["llama"]
    prompt = tokenize(folder, PROMPT)
    stages = stages_of(folder, [(0, 2), (2, 4)])
    assert all(s.device == "cuda:0" for s in stages)
    caches = [s.new_cache() for s in stages]
    x = torch.tensor([prompt])
    for s, c in zip(stages, caches, strict=True):
        x = s.forward(x, c)
    want = generate_reference(folder, prompt, 1)
    assert float(np.max(np.abs(x.float().cpu().numpy()[0] - want.logits[0]))) <= 1e-4
