"""An upper bound on the users any pipeline on a few single-GPU nodes serves, by a subset
dynamic programme over the nodes' stage costs.

With ``S`` stages, ``U`` requests (microbatches of ``b = ⌈U / min(U, S)⌉``) and
``r = U / O``, the serving formulas (:mod:`stowplan.cost.serving`) give for any
pipeline, since ``cycle(U) ≥ Σ_s t_s(b) + Σ_s latency_s``::

    TPOT(U) ≥ Σ_s [ t_s(b) + r · pre(s) + latency_s · (1 + r · [s < S−1]) ]
    TTFT(U) ≥ Σ_s [ t_s(b) +     pre(s) + latency_s · (1 +     [s < S−1]) ]

(``t_s`` the decode stage time with its transfer, ``pre(s)`` the stage's prefill of
one prompt with its own; ``latency_s`` the hop out of stage ``s``; no hop on one
stage.)  Both right-hand sides are sums of one term per stage, each a function of
the stage's node, blocks and role, so their least values over every pipeline of
``S`` stages on any of the nodes are found exactly by a dynamic programme over node
subsets and block ends, with the memory of ``U`` requests' KV deciding which stages
exist.  A ``U`` whose least TPOT or TTFT bound already breaks its limit is served by
no pipeline of ``S`` stages; both bounds grow with ``U``, so the largest ``U`` that
passes is found by bisection, and the most over ``S`` bounds every pipeline's ``U*``.

What is dropped is only the other side of the cycle, ``m · max_s t_s``: where the
trip decides the cycle (few requests, or a balanced split) the bound is the optimum.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from stowplan.cost import CostModel
from stowplan.cost.serving import group_all_reduce_s, serving_constraints
from stowplan.cost.touch import expert_touch_bytes
from stowplan.model import Constraints, ModelLayout, NodeDescriptor
from stowplan.planner.exact.pipelines import stage_matrix
from stowplan.workload import Workload

__all__ = ["PIPELINE_BOUND_NODES", "pipeline_users_bound"]

PIPELINE_BOUND_NODES = 6
"""Node sets of up to this many single-GPU nodes are bounded by the programme."""

SLACK = 1e-9
"""Relative slack on the limits: the programme sums prefixes where the formulas sum
block by block, so a pipeline exactly at a limit must not be ruled out by rounding."""


def pipeline_users_bound(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    w: Workload,
    c: Constraints,
    most: int,
) -> int | None:
    """At least the U* of every pipeline on ``nodes`` or a subset of them (see the
    module), and at most ``most``; None when the set is not a few single-GPU nodes (or
    numpy, of the ``exact`` extra, is missing)."""
    if not nodes or len(nodes) > PIPELINE_BOUND_NODES or any(n.num_gpus != 1 for n in nodes):
        return None
    if most < 1:
        return 0
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy ships with the exact extra
        return None

    base = serving_constraints(w, c)
    n, nb = len(nodes), model.num_blocks
    one = CostModel(model, nodes, replace(base, batch=1))
    pre = [
        (_prefill_matrix(np, one, d, w, False), _prefill_matrix(np, one, d, w, True))
        for d in range(n)
    ]
    models: dict[int, CostModel] = {}

    def feasible(users: int, stages: int) -> bool:
        cm = models.get(users)
        if cm is None:
            cm = models[users] = CostModel(model, nodes, replace(base, batch=users))
        view = cm.for_stages(stages)
        r = users / w.output_tokens
        if stages == 1:
            dec = [stage_matrix(view, d, True, True, 0.0)[0, nb] for d in range(n)]
            tpot = min(t + r * pre[d][1][0, nb] for d, t in enumerate(dec))
            ttft = min(t + pre[d][1][0, nb] for d, t in enumerate(dec))
        else:
            lat = view.latency_s
            first = [stage_matrix(view, d, True, False, 0.0)[0] for d in range(n)]
            mid = [stage_matrix(view, d, False, False, 0.0) for d in range(n)]
            last = [stage_matrix(view, d, False, True, 0.0)[:, nb] for d in range(n)]

            def costs(k: float) -> tuple[list[Any], list[Any], list[Any]]:
                return (
                    [first[d] + k * pre[d][0][0] + lat[d] * (1 + k) for d in range(n)],
                    [mid[d] + k * pre[d][0] + lat[d] * (1 + k) for d in range(n)],
                    [last[d] + k * pre[d][1][:, nb] + lat[d] for d in range(n)],
                )

            tpot = _least_sum(np, *costs(r), stages)
            if tpot > w.tpot_s * (1 + SLACK):
                return False
            ttft = _least_sum(np, *costs(1.0), stages)
        return bool(tpot <= w.tpot_s * (1 + SLACK) and ttft <= w.ttft_s * (1 + SLACK))

    lo_s = max(1, c.min_stages or 1)
    hi_s = min(n, nb, c.max_stages or n)
    best = 0
    for stages in range(lo_s, hi_s + 1):
        if best >= most or not feasible(best + 1, stages):
            continue
        lo, hi = best + 1, most
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if feasible(mid, stages):
                lo = mid
            else:
                hi = mid - 1
        best = lo
    return best


def _prefill_matrix(np: Any, cm: CostModel, d: int, w: Workload, last: bool) -> Any:
    """P[i, j]: pre(s) of blocks [i, j) on node ``d`` (the last stage's with the head,
    another's with its transfer out); inf where ``j <= i``."""
    model = cm.model
    p = w.prompt_tokens
    windows = model.kv_window_tokens or (None,) * model.num_blocks
    reads = np.concatenate([[0.0], np.cumsum(np.asarray(model.block_read_sizes(), dtype=float))])
    touch = np.concatenate(
        [[0.0], np.cumsum(np.asarray(expert_touch_bytes(model, p), dtype=float))]
    )
    att = np.concatenate(
        [[0.0], np.cumsum([float(p * (p if x is None else min(p, x))) for x in windows])]
    )
    weights = reads[None, :] - reads[:, None]
    read = weights + touch[None, :] - touch[:, None] + (cm.head if last else 0)
    flops = (
        2.0 * weights * cm.params_per_byte * p
        + 2.0 * (att[None, :] - att[:, None]) * model.attention_width
    )
    if last:
        flops = flops + 2.0 * cm.head * cm.params_per_byte
    blocks = np.arange(model.num_blocks + 1)
    count = blocks[None, :] - blocks[:, None]
    act = p * model.hidden_dim * model.bytes_per_activation_elem
    t = np.maximum(read * cm.inv_bw[d], flops * cm.inv_prefill_flops[d])
    t = t + count * 2 * group_all_reduce_s(cm, d, act)
    if not last:
        t = t + act / cm.rates[d].link_bytes_per_s
    return np.where(count > 0, t, math.inf)


def _least_sum(np: Any, first: list[Any], mid: list[Any], last: list[Any], stages: int) -> float:
    """The least sum of stage costs over pipelines of exactly ``stages`` (≥ 2) distinct
    nodes covering every block: ``first[d][j]`` for blocks [0, j) on d, ``mid[d][i, j]``,
    ``last[d][i]`` for blocks [i, end)."""
    n = len(first)
    level = {1 << d: row for d, row in enumerate(first) if np.isfinite(row).any()}
    for _ in range(stages - 2):
        grown: dict[int, Any] = {}
        for mask, row in level.items():
            for e in range(n):
                if mask >> e & 1:
                    continue
                cand = (row[:, None] + mid[e]).min(axis=0)
                key = mask | 1 << e
                old = grown.get(key)
                grown[key] = cand if old is None else np.minimum(old, cand)
        level = {k: v for k, v in grown.items() if np.isfinite(v).any()}
    best = math.inf
    for mask, row in level.items():
        for e in range(n):
            if not mask >> e & 1:
                best = min(best, float((row + last[e]).min()))
    return best
