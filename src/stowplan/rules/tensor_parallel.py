"""Which tensor-parallel degrees a model allows: one rule for the planner and the validator.

A degree ``tp`` splits every block over ``tp`` GPUs.  It must divide the attention
heads, and the KV heads must be partitioned (``tp`` divides them) or replicated
(``tp`` a multiple of them, as vLLM and SGLang do); a model with one latent KV
head (MLA) takes any ``tp`` that divides its heads.
"""

from __future__ import annotations

import math

from stowplan.model import ModelLayout
from stowplan.moved import renamed_keywords

__all__ = ["kv_heads_allow", "legal_tensor_parallel", "tensor_parallel_violation"]


@renamed_keywords(tp="tensor_parallel")
def kv_heads_allow(tensor_parallel: int, num_kv_heads: int) -> bool:
    """Whether ``tensor_parallel`` ranks can share ``num_kv_heads`` KV heads, as inference
    engines do.

    ``tensor_parallel <= num_kv_heads``: the heads are partitioned, so it must divide them;
    ``tensor_parallel > num_kv_heads``: every head is replicated on
    ``tensor_parallel / num_kv_heads`` ranks, so num_kv_heads must divide it (an MLA
    model's single latent KV head takes any degree).  The former keyword ``tp=`` still
    works, with a :class:`DeprecationWarning`.
    """
    if tensor_parallel <= num_kv_heads:
        return num_kv_heads % tensor_parallel == 0
    return tensor_parallel % num_kv_heads == 0


@renamed_keywords(tp="tensor_parallel")
def tensor_parallel_violation(tensor_parallel: int, layout: ModelLayout) -> str | None:
    """Why ``tensor_parallel`` cannot split ``layout``'s blocks (None when it can).

    The former keyword ``tp=`` still works, with a :class:`DeprecationWarning`."""
    tp = tensor_parallel
    heads = layout.num_attention_heads
    if heads is not None and heads > 0 and heads % tp:
        return (
            f"must divide num_attention_heads={heads} of {layout.name} "
            f"({heads} % {tp} = {heads % tp})"
        )
    kv = layout.num_kv_heads
    if kv is not None and kv > 0 and not kv_heads_allow(tp, kv):
        if tp < kv:
            return f"must divide num_kv_heads={kv} of {layout.name} ({kv} % {tp} = {kv % tp})"
        return (
            f"exceeds num_kv_heads={kv} of {layout.name}, so must be a multiple of it "
            f"(KV heads replicated; {tp} % {kv} = {tp % kv})"
        )
    return None


def legal_tensor_parallel(layout: ModelLayout, max_gpus: int) -> tuple[int, ...]:
    """The degrees up to ``max_gpus`` a planner tries for ``layout``, ascending.

    With the attention heads known, every divisor of them that passes
    :func:`tensor_parallel_violation`; otherwise the powers of two and ``max_gpus``
    itself (every engine's usual sizes).  Either way at most a few dozen values, however
    many GPUs a node has.
    """
    heads = layout.num_attention_heads
    if heads is not None and heads > 0:
        small = [d for d in range(1, math.isqrt(heads) + 1) if heads % d == 0]
        pool = {*small, *(heads // d for d in small)}
    else:
        pool = {1 << k for k in range(max_gpus.bit_length())} | {max_gpus}
    return tuple(
        t for t in sorted(pool) if t <= max_gpus and tensor_parallel_violation(t, layout) is None
    )
