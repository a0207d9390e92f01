"""Greedy generations and their comparison: the pipeline's against one process's.

:func:`generate_reference` runs the whole checkpoint in one process with
``transformers`` (``AutoModelForCausalLM.from_pretrained`` and greedy
``generate``), keeping the logits of the prefill and of every decode step.
:func:`compare` sets a pipeline's generation beside it: MATCH when every token
is equal and every logit within the tolerance, else the first position that
differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Comparison", "Generation", "compare", "generate_reference"]

LOGIT_TOLERANCE = 1e-5
"""Largest absolute logit difference of a MATCH (float32 checkpoints)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Generation:
    """One sequence's greedy tokens and the logits each was chosen from."""

    tokens: tuple[int, ...]
    logits: Any
    """``numpy`` float32 array ``[len(tokens), vocab]``: row 0 from the prefill."""


def generate_reference(
    folder: str | Path, prompt: Sequence[int], max_new_tokens: int
) -> Generation:
    """The whole model in one process: ``max_new_tokens`` greedy tokens after ``prompt``."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    ids = torch.tensor([list(prompt)], dtype=torch.long)
    # No end-of-sequence token: generation runs the full length and nothing is masked
    # (a minimum length would suppress the EOS logit, which the pipeline does not).
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    model.generation_config = config  # replaces the checkpoint's (its EOS would stop early)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids))
    tokens = tuple(int(t) for t in out.sequences[0, ids.shape[1] :])
    logits = torch.stack([step[0] for step in out.logits]).float().numpy()
    return Generation(tokens=tokens, logits=logits)


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """A generation against the single-process one."""

    first_difference: int | None
    """The first position whose token differs, or whose logits differ by more than the
    tolerance (None: every position agrees)."""
    max_abs_logit_diff: float
    tolerance: float

    @property
    def match(self) -> bool:
        return self.first_difference is None


def compare(got: Generation, want: Generation, *, tolerance: float = LOGIT_TOLERANCE) -> Comparison:
    """Token by token, logits row by row: where ``got`` first leaves ``want``."""
    import numpy as np

    first: int | None = None
    worst = 0.0
    for i in range(max(len(got.tokens), len(want.tokens))):
        if i >= len(got.tokens) or i >= len(want.tokens):
            first = i if first is None else first
            break
        diff = float(np.max(np.abs(got.logits[i] - want.logits[i])))
        worst = max(worst, diff)
        if first is None and (got.tokens[i] != want.tokens[i] or diff > tolerance):
            first = i
    return Comparison(first_difference=first, max_abs_logit_diff=worst, tolerance=tolerance)
