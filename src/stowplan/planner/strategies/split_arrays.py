"""The dynamic programme of :func:`~stowplan.planner.strategies.latency.latency_split` on
numpy arrays: one node's step over every block at once.

The plain programme visits each (node, first block, last block) in Python; on models of
~60 blocks and orders of ~30 nodes that is tens of thousands of additions per split, and
a MoE plan on a large fleet runs dozens of splits.  Here a node's stage times are one
matrix and a step is an addition and a column minimum.  Every sum is the plain one's
(``(g[j] + lat) + s`` and ``(g[j] + last) + lat``, in float64), and ties go to the first
block as the plain loop's strict ``<`` gives them, so both return the same split.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from stowplan.cost import CostModel

__all__ = ["SPLIT_ARRAY_BLOCKS", "StageArrays", "node_stage_arrays", "split_steps", "stage_seconds"]

SPLIT_ARRAY_BLOCKS = 16
"""Models of at least this many blocks are split on arrays (below, Python is as quick)."""

StageArrays = tuple[Any, Any]
"""A node's stage times as arrays: the last stage from each block ``j`` (length
``nb + 1``, inf where it does not fit or ``j`` is 0 or ``nb``), and an earlier stage
from ``j`` (rows, ``0 ≤ j < nb - 1``) to ``k`` (columns, ``0 ≤ k ≤ nb``; inf where it
does not fit or ``k ≤ j``)."""


def node_stage_arrays(
    np: Any, cm: CostModel, d: int, parts: dict[tuple[Any, ...], Any] | None = None
) -> StageArrays:
    """Node ``d``'s stage times as :data:`StageArrays`, with the plain tables' arithmetic
    (:meth:`CostModel.stage_time`'s): byte counts stay integers until they meet a float,
    as in Python, so every time is the same float.

    ``parts``, where given, keeps the arrays nodes share (one per cost model): the last
    stage and the times before the transfer per :attr:`CostModel.gpu_class`, the stages
    that fit per room; a node of its own transfer then adds it alone."""
    parts = {} if parts is None else parts
    nb = cm.num_blocks
    gpu, room = cm.gpu_class[d], cm.usable[d]
    if ("last", gpu) not in parts:
        parts["last", gpu] = _last_stage(np, cm, d)
    rows = max(nb - 1, 0)
    runs = np.full((rows, nb + 1), math.inf)
    if rows:
        if ("runs", gpu) not in parts:
            parts["runs", gpu] = _run_times(np, cm, d)
        if ("fits", room) not in parts:
            parts["fits", room] = _run_fits(np, cm, room)
        runs[:, 1:nb] = np.where(parts["fits", room], parts["runs", gpu] + cm.xfer_s[d], math.inf)
    return parts["last", gpu], runs


def _prefixes(np: Any, cm: CostModel) -> tuple[Any, Any, Any]:
    """The read and memory prefixes as int64, the KV prefix as float64."""
    return (
        np.array(cm.read_prefix, dtype=np.int64),
        np.array(cm.mem_prefix, dtype=np.int64),
        np.array(cm.kv_prefix, dtype=np.float64),
    )


def _last_stage(np: Any, cm: CostModel, d: int) -> Any:
    """:data:`StageArrays`' last stage of node ``d`` (the same for its GPU class)."""
    nb = cm.num_blocks
    rp, mp, kp = _prefixes(np, cm)
    ib, fl, bs, ss = cm.inv_bw[d], cm.flop_s_per_byte[d], cm.block_s[d], cm.stage_s[d]
    room = cm.usable[d]
    last = np.full(nb + 1, math.inf)
    j = np.arange(1, nb)
    weights = rp[nb] - rp[j] + cm.head
    t = np.maximum((weights + kp[nb] - kp[j]) * ib, weights * fl)
    t = t + ((nb - j) * bs + ss)
    last[1:nb] = np.where(mp[nb] - mp[j] + cm.head <= room, t, math.inf)
    return last


def _grid(np: Any, nb: int) -> tuple[Any, Any]:
    """An earlier stage's first blocks (a column) and ends (a row), ends 1 to ``nb - 1``."""
    return np.arange(nb - 1)[:, None], np.arange(1, nb)[None, :]


def _run_times(np: Any, cm: CostModel, d: int) -> Any:
    """An earlier stage's time before its transfer on node ``d`` (the same for its GPU
    class), per first block and end (:func:`_grid`; fitting or not)."""
    rp, _, kp = _prefixes(np, cm)
    ib, fl, bs, ss = cm.inv_bw[d], cm.flop_s_per_byte[d], cm.block_s[d], cm.stage_s[d]
    lo, hi = _grid(np, cm.num_blocks)
    weights = rp[hi] - rp[lo]
    t = np.maximum((weights + kp[hi] - kp[lo]) * ib, weights * fl)
    return t + ((hi - lo) * bs + ss)


def _run_fits(np: Any, cm: CostModel, room: int) -> Any:
    """Whether an earlier stage fits ``room``, per first block and end (:func:`_grid`):
    a stage ends at the first block it cannot hold (the plain loop breaks there)."""
    _, mp, _ = _prefixes(np, cm)
    lo, hi = _grid(np, cm.num_blocks)
    extra = np.where(lo == 0, cm.embed, 0)
    ok = (hi <= lo) | (mp[hi] - mp[lo] + extra <= room)
    return np.logical_and.accumulate(ok, axis=1) & (hi > lo)


def stage_seconds(
    np: Any, cm: CostModel, d: int, lo: Any, hi: Any, *, first: bool, last: bool
) -> Any:
    """Node ``d``'s time for a stage of blocks ``[lo, hi)`` (index arrays, broadcast
    together) before its transfer, the head read and computed on the last stage; inf
    where ``hi ≤ lo`` or the stage does not fit (weights and KV, the embed on the first
    stage, the head on the last).  :meth:`CostModel.stage_time`'s figures in float64
    (the searches' programmes, which must match it to the bit, use
    :func:`node_stage_arrays`)."""
    rp = np.array(cm.read_prefix, dtype=np.float64)
    kp = np.array(cm.kv_prefix, dtype=np.float64)
    mp = np.array(cm.mem_prefix, dtype=np.float64)
    weights = rp[hi] - rp[lo] + (cm.head if last else 0)
    t = np.maximum((weights + kp[hi] - kp[lo]) * cm.inv_bw[d], weights * cm.flop_s_per_byte[d])
    t = t + ((hi - lo) * cm.block_s[d] + cm.stage_s[d])
    held = mp[hi] - mp[lo] + (cm.embed if first else 0) + (cm.head if last else 0)
    return np.where((hi > lo) & (held <= cm.usable[d]), t, math.inf)


def split_steps(
    np: Any, nb: int, steps: Sequence[tuple[float, StageArrays]]
) -> tuple[float, tuple[int, int], list[Any]]:
    """The programme over the nodes of an order, given per node its hop (``lat``) and
    stage arrays: the least time, where it ends (position, first block of the last stage;
    ``(-1, -1)`` when none), and per position the block each ``k`` was reached from
    (-1 where the node does not end a stage at ``k``), as the plain loop gives them."""
    inf = math.inf
    g = np.full(nb + 1, inf)
    best, at = inf, (-1, -1)
    choices: list[Any] = []
    rows = max(nb - 1, 0)
    for p, (lat, (last_a, runs_a)) in enumerate(steps):
        ends = g + last_a + lat
        j = int(np.argmin(ends))
        if ends[j] < best:
            best, at = float(ends[j]), (p, j)
        base = g[:rows] + lat
        if rows:
            base[0] = lat
        grid = base[:, None] + runs_a
        pick = np.argmin(grid, axis=0)
        least = grid[pick, np.arange(nb + 1)]
        better = least < g
        choice = np.where(better, pick, -1)
        g = np.where(better, least, g)
        choices.append(choice)
    return best, at, choices
