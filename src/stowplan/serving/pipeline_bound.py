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
from stowplan.quantities.limits import MAX_BATCH
from stowplan.workload import Workload

__all__ = ["PIPELINE_BOUND_NODES", "pipeline_rate_bound", "pipeline_users_bound"]

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
    prog = _Programme.of(model, nodes, w, c)
    if prog is None:
        return None
    best = 0
    for stages in prog.stage_counts:
        best = prog.most_users(stages, best, most)
    return best


def pipeline_rate_bound(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    w: Workload,
    c: Constraints,
    most: float,
) -> float | None:
    """At least the requests/s ``U / (O · TPOT(U))`` of every pipeline on ``nodes`` or a
    subset of them at every U it serves, and at most ``most``; None as
    :func:`pipeline_users_bound`.

    Per stage count, the U the programme lets through are ``1 … U_S`` (its users
    bound); on each run ``[a, b]`` of them the requests/s are at most ``b / (O ·
    TPOT_lb(a))``, the least TPOT sum growing with U — every U alone up to
    :data:`RATE_EVERY`, runs growing by :data:`RATE_STEP` beyond."""
    prog = _Programme.of(model, nodes, w, c)
    if prog is None:
        return None
    o = w.output_tokens
    best = 0.0
    for stages in prog.stage_counts:
        top = prog.most_users(stages, 0, MAX_BATCH)
        a = 1
        while a <= top and best < most:
            b = a if a < RATE_EVERY else min(top, max(a, math.floor(a * RATE_STEP)))
            tpot = prog.least(a, stages, ttft=False)[0]
            best = max(best, math.inf if tpot <= 0 else b / (o * tpot))
            a = b + 1
    return min(best, most)


RATE_EVERY = 32
"""Up to this many requests the rate bound scores every U."""
RATE_STEP = 1.03
"""Beyond, a run of U spans 3 %: the bound is that much above the curve at most."""


class _Programme:
    """The stage costs of a node set for the programme: each node's prefill matrices
    (the same for every U) and a cost model per U."""

    def __init__(
        self,
        np: Any,
        model: ModelLayout,
        nodes: Sequence[NodeDescriptor],
        w: Workload,
        c: Constraints,
    ) -> None:
        self.np, self.model, self.nodes, self.w = np, model, list(nodes), w
        self.base = serving_constraints(w, c)
        one = CostModel(model, nodes, replace(self.base, batch=1))
        work = _PrefillWork(np, one, w)
        self.pre = [(work.matrix(d, False), work.matrix(d, True)) for d in range(len(nodes))]
        self.models: dict[int, CostModel] = {}
        n = len(nodes)
        self.stage_counts = range(
            max(1, c.min_stages or 1), min(n, model.num_blocks, c.max_stages or n) + 1
        )

    @classmethod
    def of(
        cls, model: ModelLayout, nodes: Sequence[NodeDescriptor], w: Workload, c: Constraints
    ) -> _Programme | None:
        if not nodes or len(nodes) > PIPELINE_BOUND_NODES or any(n.num_gpus != 1 for n in nodes):
            return None
        try:
            import numpy as np
        except ImportError:  # pragma: no cover - numpy ships with the exact extra
            return None
        return cls(np, model, nodes, w, c)

    def least(self, users: int, stages: int, *, ttft: bool = True) -> tuple[float, float]:
        """The least TPOT and TTFT sums of ``stages`` stages at ``users`` requests (the
        TTFT one left at inf when the TPOT one already breaks its limit, or without
        ``ttft``)."""
        np, w, nb, n = self.np, self.w, self.model.num_blocks, len(self.nodes)
        cm = self.models.get(users)
        if cm is None:
            cm = self.models[users] = CostModel(
                self.model, self.nodes, replace(self.base, batch=users)
            )
        view = cm.for_stages(stages)
        r = users / w.output_tokens
        pre = self.pre
        if stages == 1:
            dec = [stage_matrix(view, d, True, True, 0.0)[0, nb] for d in range(n)]
            tpot = min(t + r * pre[d][1][0, nb] for d, t in enumerate(dec))
            return tpot, min(t + pre[d][1][0, nb] for d, t in enumerate(dec))
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
        if not ttft or tpot > w.tpot_s * (1 + SLACK):
            return tpot, math.inf
        return tpot, _least_sum(np, *costs(1.0), stages)

    def meets(self, users: int, stages: int) -> bool:
        tpot, ttft = self.least(users, stages)
        w = self.w
        return bool(tpot <= w.tpot_s * (1 + SLACK) and ttft <= w.ttft_s * (1 + SLACK))

    def most_users(self, stages: int, above: int, most: int) -> int:
        """The largest U ≤ ``most`` that ``stages`` stages let through, when it is above
        ``above`` (else ``above``)."""
        if above >= most or not self.meets(above + 1, stages):
            return above
        lo, hi = above + 1, most
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.meets(mid, stages):
                lo = mid
            else:
                hi = mid - 1
        return lo


class _PrefillWork:
    """One prompt's prefill bytes and FLOPs of every block range [i, j), as the last stage
    (with the head) and as another, the same on every node: built once per node set."""

    def __init__(self, np: Any, cm: CostModel, w: Workload) -> None:
        model = cm.model
        p = w.prompt_tokens
        windows = model.kv_window_tokens or (None,) * model.num_blocks
        reads = np.concatenate(
            [[0.0], np.cumsum(np.asarray(model.block_read_sizes(), dtype=float))]
        )
        touch = np.concatenate(
            [[0.0], np.cumsum(np.asarray(expert_touch_bytes(model, p), dtype=float))]
        )
        att = np.concatenate(
            [[0.0], np.cumsum([float(p * (p if x is None else min(p, x))) for x in windows])]
        )
        weights = reads[None, :] - reads[:, None]
        read = weights + touch[None, :] - touch[:, None]
        flops = (
            2.0 * weights * cm.params_per_byte * p
            + 2.0 * (att[None, :] - att[:, None]) * model.attention_width
        )
        self.np, self.cm = np, cm
        self.read = (read + 0, read + cm.head)
        """Bytes as another stage, as the last."""
        self.flops = (flops, flops + 2.0 * cm.head * cm.params_per_byte)
        blocks = np.arange(model.num_blocks + 1)
        self.count = blocks[None, :] - blocks[:, None]
        self.act = p * model.hidden_dim * model.bytes_per_activation_elem

    def matrix(self, d: int, last: bool) -> Any:
        """P[i, j]: pre(s) of blocks [i, j) on node ``d`` (the last stage's with the head,
        another's with its transfer out); inf where ``j <= i``."""
        np, cm, act = self.np, self.cm, self.act
        t = np.maximum(self.read[last] * cm.inv_bw[d], self.flops[last] * cm.inv_prefill_flops[d])
        t = t + self.count * 2 * group_all_reduce_s(cm, d, act)
        if not last:
            t = t + act / cm.rates[d].link_bytes_per_s
        return np.where(self.count > 0, t, math.inf)


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
