"""A lower bound on the trip (time per token at one microbatch) of every pipeline of two
stages or more, by a knapsack over the nodes that ties each node's hop to the blocks it
holds.

A stage of ``k`` blocks on node ``d`` takes at least ``k · r_d`` (``r_d`` the smallest
block's seconds there, its block cost included) plus the node's fixed stage cost, its
hop out (the network's latency; the in-host one where another GPU group of the same
node may be next) and, unless it is the last stage, its transfer out; the last stage also reads the head, at least ``head ·
min(1/BW, s/FLOP)`` (``max(a + c, b + d) ≥ max(a, b) + min(c, d)``).  A node holds at
most the most consecutive blocks its memory fits.  So every pipeline's trip is at least
the least cost of choosing nodes — any number as interior stages, exactly one as the
last — and a whole number of blocks on each, covering every block: a knapsack solved
exactly over block counts, node by node.  The fractional relaxation
(:func:`~stowplan.planner.exact.pipelines.fluid_bound`) instead pays the cheapest hops
of any nodes beside the fastest nodes' blocks; this one pays the hops of the nodes that
hold the blocks, which is what the optimum pays on slow links.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from stowplan.cost import CostModel
from stowplan.planner.problem import Problem

__all__ = ["TRIP_BOUND_NODES", "trip_bound"]

TRIP_BOUND_NODES = 64
"""Up to this many nodes (``n · blocks²`` work) the knapsack is solved."""


def trip_bound(problem: Problem, cm: CostModel) -> float | None:
    """A lower bound on the trip (seconds) of every pipeline ``problem`` allows on
    ``cm``'s nodes at its microbatch: the least single stage's time, or the knapsack of
    the module for two stages or more, whichever is less (inf: no pipeline holds every
    block); None past :data:`TRIP_BOUND_NODES` nodes or without numpy."""
    n, nb = len(cm.nodes), cm.num_blocks
    if n > TRIP_BOUND_NODES:
        return None
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy ships with the exact extra
        return None
    single = math.inf
    if problem.min_stages <= 1:
        for d in range(n):
            if cm.fits(d, 0, nb, True, True):
                single = min(single, cm.stage_time(d, 0, nb, True, True))
    if n < 2 or problem.max_stages < 2:
        return single
    rd, kvr, _ = cm.smallest_block()
    window = cm.max_window()
    inf = math.inf
    mid = np.full(nb + 1, inf)
    mid[0] = 0.0
    last = np.full(nb + 1, inf)
    idx = np.arange(nb + 1)
    siblings = Counter(cm.parent)
    for d in range(n):
        cap = min(window[d], nb)
        if cap <= 0:
            continue
        rate = cm.block_seconds(d, rd + kvr, rd)
        hop, out = cm.latency_s[d], cm.xfer_s[d]
        if siblings[cm.parent[d]] > 1:  # the next stage may be a GPU group of the same node
            hop, out = min(hop, cm.intra_latency_s[d]), min(out, cm.intra_xfer_s[d])
        hop += cm.stage_s[d]
        head = cm.head * min(cm.inv_bw[d], cm.flop_s_per_byte[d])
        take_mid = _take(np, mid, cap, rate, idx)
        new_last = np.minimum(last, _take(np, last, cap, rate, idx) + hop + out)
        new_last = np.minimum(new_last, take_mid + hop + head)
        mid = np.minimum(mid, take_mid + hop + out)
        last = new_last
    return min(single, float(last[nb]))


def _take(np: Any, x: Any, cap: int, rate: float, idx: Any) -> Any:
    """y[j] = min over 1 ≤ k ≤ cap of x[j − k] + k · rate (inf where none)."""
    z = x - idx * rate
    i, j = idx[:, None], idx[None, :]
    m = np.where((i < j) & (i >= j - cap), z[:, None], math.inf)
    return m.min(axis=0) + idx * rate
