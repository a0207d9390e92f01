"""The experts a MoE block reads for ``u`` tokens at once (the expert-touch rule).

One token reads ``k`` of a block's ``E`` routed experts.  ``u`` tokens routed
independently touch, in expectation,

* ``E × (1 − (1 − k/E)^u)`` experts under uniform routing, or
* ``Σ_e 1 − (1 − p_e)^u`` with load statistics (``p_e`` the share of tokens routed
  to expert ``e``, ``Σ_e p_e = k``);

so a microbatch of ``u`` tokens reads the block's dense part plus that many experts
(``k`` at ``u = 1``, at most ``E``), while its compute stays 2 × the active
parameters × ``u`` (each token still multiplies through only its own ``k`` experts).
"""

from __future__ import annotations

from collections.abc import Sequence

from stowplan.model import ModelLayout

__all__ = ["expert_touch_bytes", "experts_touched"]


def experts_touched(
    num_experts: int, experts_per_token: int, tokens: int, shares: Sequence[float] | None = None
) -> float:
    """Expected routed experts ``tokens`` tokens read in one block (see the module).

    ``shares`` are the ``p_e`` of the block's experts (summing to ``experts_per_token``);
    None is uniform routing.  ``tokens <= 0`` reads none.
    """
    if tokens <= 0:
        return 0.0
    if shares is not None:
        return float(sum(1.0 - (1.0 - min(max(p, 0.0), 1.0)) ** tokens for p in shares))
    e, k = num_experts, experts_per_token
    return e * (1.0 - (1.0 - k / e) ** tokens)


def expert_touch_bytes(model: ModelLayout, tokens: int) -> tuple[float, ...]:
    """Per block, the routed-expert bytes ``tokens`` tokens read beyond the ``k`` experts
    one token reads (which :meth:`~stowplan.model.ModelLayout.block_read_sizes` counts):
    ``(experts_touched − k) × expert_params_bytes`` for a MoE block, 0 otherwise, and
    never more than the block's bytes its per-token read leaves out (a layout whose
    per-token read already counts every expert reads no more)."""
    ex = model.experts
    out = [0.0] * model.num_blocks
    if ex is None or tokens <= 1:
        return tuple(out)
    extra = experts_touched(ex.num_experts, ex.experts_per_token, tokens) - ex.experts_per_token
    extra_bytes = max(extra, 0.0) * ex.expert_params_bytes
    sizes, reads = model.block_sizes(), model.block_read_sizes()
    for b in ex.moe_blocks:
        out[b] = min(extra_bytes, float(max(sizes[b] - reads[b], 0)))
    return tuple(out)
