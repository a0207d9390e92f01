"""The least cycle of every pipeline of exactly two GPU groups (:func:`two_stage_cycle`).

Two stages are a first group holding blocks ``[0, k)`` and the embed, and a last holding
``[k, nb)`` and the head; the first sends to the last over the GPUs' link where both are
groups of one node, else over its network link, and each hop is paid once around the
cycle.  The cycle is ``max(m · slowest, t₁ + t₂ + hops)`` with ``m`` the count's
microbatches.  Per kind of group the first stage's times over every ``k`` (sending over
either link) and the last stage's are one vector each; a pair of kinds is one vector
operation, so every pair the nodes allow (two nodes, or one node with GPUs for both) is
taken: the count's least cycle exactly, a bound the capacity relaxations only
approach.
"""

from __future__ import annotations

import math
from typing import Any

from stowplan.cost import microbatches
from stowplan.planner.problem import Problem
from stowplan.planner.strategies.split_arrays import stage_seconds
from stowplan.planner.tensor.nodes import GroupCosts, numpy_module

__all__ = ["two_stage_cycle"]


def two_stage_cycle(problem: Problem, groups: GroupCosts) -> float:
    """The least cycle (seconds) of a pipeline of two of ``groups`` (GPU groups of
    ``problem``'s nodes, on its cost model at the two-stage count's microbatch); inf where
    no two fit."""
    np = numpy_module()
    cm, nb = groups.cm, problem.model.num_blocks
    if nb < 2:
        return math.inf
    m, _ = microbatches(cm.batch, 2)
    k = np.arange(1, nb)
    # Per kind of group (its figures, its degree): where it is, and its vectors.
    kinds: dict[tuple[object, ...], tuple[int, list[int], Any, Any, Any]] = {}
    for d, per_node in enumerate(groups.kinds):
        for t, v in per_node.items():
            key = (
                t,
                cm.inv_bw[v],
                cm.flop_s_per_byte[v],
                cm.block_s[v],
                cm.stage_s[v],
                cm.xfer_s[v],
                cm.intra_xfer_s[v],
                cm.usable[v],
                cm.latency_s[v],
                cm.intra_latency_s[v],
            )
            if key in kinds:
                kinds[key][1].append(d)
                continue
            # The first stage, blocks [0, k) and the embed, before its send; the last,
            # blocks [k, nb) and the head.
            first = stage_seconds(np, cm, v, 0, k, first=True, last=False)
            last = stage_seconds(np, cm, v, k, nb, first=False, last=True)
            kinds[key] = (v, [d], first, last, t)
    best = math.inf
    listed = list(kinds.values())
    for va, nodes_a, first, _, ta in listed:
        for vb, nodes_b, _, last, tb in listed:
            # Groups of two nodes, or both of one node with GPUs for both.
            links = [False] if any(a != b for a in nodes_a for b in nodes_b) else []
            if any(d in nodes_b and ta + tb <= problem.nodes[d].num_gpus for d in nodes_a):
                links.append(True)
            for inside in links:
                if inside:
                    send = cm.intra_xfer_s[va]
                    hops = cm.intra_latency_s[va] + cm.intra_latency_s[vb]
                else:
                    send = cm.xfer_s[va]
                    hops = cm.latency_s[va] + cm.latency_s[vb]
                ta_s = first + send
                cycle = np.maximum(m * np.maximum(ta_s, last), ta_s + last + hops)
                best = min(best, float(cycle.min(initial=np.inf)))
    return best
