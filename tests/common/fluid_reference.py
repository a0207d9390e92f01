"""The fractional relaxation of the planner's certificates written out node by node, as
:func:`stowplan.planner.exact.pipelines.fluid_bound` first computed it: the reference the
kept-figures version (:mod:`stowplan.planner.strategies.fractional`, lists and arrays)
must equal float for float."""

from __future__ import annotations

import math
from collections.abc import Sequence

from stowplan.cost import CostModel
from stowplan.model import Metric
from stowplan.planner.problem import Problem

__all__ = ["reference_fluid_bound"]


def _best_single_stage(problem: Problem, cm: CostModel) -> float:
    """The fastest node's stage time holding the whole model alone (inf when none does or
    the constraints ask for two stages or more)."""
    nb, best = cm.num_blocks, math.inf
    if problem.min_stages <= 1:
        for d in range(len(cm.nodes)):
            if cm.fits(d, 0, nb, True, True):
                best = min(best, cm.stage_time(d, 0, nb, True, True))
    return best


def _min_stages_by_room(room: Sequence[float], nb: int) -> int:
    """The fewest nodes whose fractional block room holds ``nb`` blocks (len+1 if none do)."""
    held = 0.0
    for k, r in enumerate(sorted(room, reverse=True), start=1):
        held += r
        if held >= nb - 1e-9:
            return k
    return len(room) + 1


def reference_fluid_bound(problem: Problem, cm: CostModel, objective: Metric) -> float:
    """A valid lower bound (seconds) on the objective, from a fractional relaxation.

    Every block is taken as small as the smallest; blocks flow to nodes
    fractionally up to their VRAM; the embed, head and the roles are dropped
    except for the hop terms every multi-stage pipeline pays.
    """
    nb = cm.num_blocks
    n = len(cm.nodes)
    rd, kvr, mem = cm.smallest_block()
    read = rd + kvr  # :meth:`CostModel.block_seconds` of each node, inlined
    rate = [
        max(read * ib, rd * fl) + bs
        for ib, fl, bs in zip(cm.inv_bw, cm.flop_s_per_byte, cm.block_s, strict=True)
    ]
    window = cm.max_window()
    room = [min(window[d], nb if mem <= 0 else cm.usable[d] / mem) for d in range(n)]
    single = _best_single_stage(problem, cm)
    if problem.max_stages < 2 or n < 2:
        return single
    if objective == Metric.LATENCY:
        left = float(nb)
        total = 0.0
        for d in sorted(range(n), key=lambda d: rate[d]):
            take = min(left, room[d])
            total += take * rate[d]
            left -= take
            if left <= 0:
                break
        # Every stage of a multi-stage pipeline pays its node's hop latency and all but the
        # last their transfer; the pipeline needs at least ``k`` stages to hold the blocks.
        k = max(2, problem.min_stages, _min_stages_by_room(room, nb))
        # ... and its node's fixed stage cost (in-host hops of a layer-split engine).
        fixed = sorted(lat + ss for lat, ss in zip(cm.latency_s, cm.stage_s, strict=True))
        hops = sum(fixed[:k]) + sum(sorted(cm.xfer_s)[: k - 1])
        head = min(cm.head * min(cm.inv_bw[d], cm.flop_s_per_byte[d]) for d in range(n))
        return min(single, total + hops + head)
    top = max(problem.max_stages, 2)
    # Per node: fractional blocks within tm as an interior stage (after its transfer) and
    # as the last stage (no transfer): min(max(tm - x, 0) / rate, room, nb).
    lim = [min(room[d], float(nb)) for d in range(n)]
    inv = [1.0 / rate[d] if rate[d] else math.inf for d in range(n)]
    xs = cm.xfer_s
    ss = cm.stage_s

    def capacity(tm: float) -> float:
        mid = [
            min(max(tm - x - s, 0.0) * v, c) if v != math.inf else c
            for x, s, v, c in zip(xs, ss, inv, lim, strict=True)
        ]
        end = [
            min(max(tm - s, 0.0) * v, c) if v != math.inf else c
            for s, v, c in zip(ss, inv, lim, strict=True)
        ]
        mid_sorted = sorted(mid, reverse=True)[:top]
        gain = max(e - m for e, m in zip(end, mid, strict=True))
        return sum(math.floor(x + 1e-9) for x in mid_sorted) + math.floor(gain + 1e-9) + 1

    lo, hi = 0.0, max(nb * r for r in rate) + max(cm.xfer_s) + max(ss) + 1.0
    for _ in range(60):
        if hi - lo <= 1e-9 * hi:
            break
        m = (lo + hi) / 2
        if capacity(m) >= nb:
            hi = m
        else:
            lo = m
    return min(single, lo)
