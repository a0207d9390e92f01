"""How the planner breaks ties: among plans within 0.1 % of the best, more KV room, then balance.

Pipelines whose cycle (per-sequence time per token; U / tokens/s) is within
:data:`TOLERANCE` of the best one found are equally fast for a user: the cost
model does not predict 0.1 % that finely.  Among them the planner takes the
one with the most KV room (tokens of KV cache the tightest stage holds beside
its weights), then the one whose fullest stage fills the least of its usable
VRAM, then the first by the searches' own order (least cycle, slowest stage,
fewer stages, node ids, block boundaries), so the choice stays deterministic.

* :func:`tie_key` is the rule, on plain numbers.
* :func:`choose` applies it to pipelines of one cost model.
* :func:`rebalance` moves block boundaries of one pipeline, its nodes and
  their order unchanged, towards more KV room and balanced memory while the
  cycle stays within a limit: the searches minimise the cycle and return
  whichever split of an equal cycle they meet first (two stages of equal GPUs
  are as fast with 49 / 77 blocks as with 63 / 63).
* :func:`settle` is the final choice every strategy's plan goes through
  (:func:`stowplan.planner.certify.finish`).

Pure: numbers in, numbers out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from stowplan.cost import CostModel, microbatches
from stowplan.planner.strategies.evaluated import evaluated, evaluated_here
from stowplan.planner.strategies.throughput import Pipeline

__all__ = [
    "TOLERANCE",
    "TieKey",
    "choose",
    "max_memory_fraction",
    "rebalance",
    "settle",
    "tie_key",
    "within",
]

TOLERANCE = 1e-3
"""Relative margin of the objective within which plans count as equally fast (0.1 %)."""

_REBALANCE_ROUNDS = 4096
"""Most boundary moves :func:`rebalance` makes (a pipeline of n stages and B blocks
needs at most about n · B; the cap bounds the work on extreme inputs)."""

_NO_KV = -1
"""KV room of a plan whose layout has no KV figure: every such plan ranks alike."""

TieKey = tuple[int, float, int, float, tuple[float | int, ...]]
"""(outside the margin, cycle outside it, −KV room, fullest stage's fraction, the rest)."""


def within(value: float, best: float) -> bool:
    """Whether objective ``value`` (seconds, lower is better) is within :data:`TOLERANCE`
    of ``best``."""
    if not math.isfinite(best):
        return value <= best
    return value <= best + abs(best) * TOLERANCE


def tie_key(
    value: float,
    best: float,
    kv_tokens: int | None,
    max_fraction: float,
    rest: Sequence[float | int] = (),
) -> TieKey:
    """The rank of a plan whose objective is ``value`` seconds (lower is better) when the
    best of its rivals is ``best``; the lowest key wins.

    Within :data:`TOLERANCE` of ``best``: more ``kv_tokens`` (None: unknown, ranks
    last), then a smaller ``max_fraction`` (the fullest stage's share of its usable VRAM),
    then ``rest`` (a deterministic order).  Outside it: by ``value``, then ``rest``.
    """
    if within(value, best):
        room = _NO_KV if kv_tokens is None else kv_tokens
        return (0, 0.0, -room, max_fraction, tuple(rest))
    return (1, value, 0, 0.0, tuple(rest))


def max_memory_fraction(cm: CostModel, p: Pipeline) -> float:
    """The largest share of its node's usable VRAM a stage of ``p`` fills (weights + KV
    reserve)."""
    order, bounds = p
    n = len(order)
    worst = 0.0
    for s, d in enumerate(order):
        used = cm.stage_bytes(bounds[s], bounds[s + 1], s == 0, s == n - 1)
        usable = cm.usable[d]
        worst = max(worst, used / usable if usable > 0 else math.inf)
    return worst


def _rest(cm: CostModel, p: Pipeline) -> tuple[float | int, ...]:
    """The searches' own order (least cycle, slowest stage, fewer stages, node ids), then
    the block boundaries: two pipelines never tie."""
    ev = evaluated(cm, *p)
    return (ev.cycle_s, ev.bottleneck_s, len(p[0]), *p[0], -1, *p[1])


def _key(cm: CostModel, p: Pipeline, best: float) -> TieKey:
    return tie_key(
        evaluated(cm, *p).cycle_s,
        best,
        cm.kv_capacity_tokens(*p),
        max_memory_fraction(cm, p),
        _rest(cm, p),
    )


def choose(cm: CostModel, pipelines: Iterable[Pipeline], best: float = math.inf) -> Pipeline:
    """The pipeline :func:`tie_key` ranks first among ``pipelines`` (at least one), against
    the least of their cycles and ``best`` (a cycle known from elsewhere, seconds)."""
    found = list(pipelines)
    if not found:
        raise ValueError("choose() needs at least one pipeline")
    least = min(best, *(evaluated(cm, *p).cycle_s for p in found))
    return min(found, key=lambda p: _key(cm, p, least))


def rebalance(cm: CostModel, p: Pipeline, limit: float) -> Pipeline:
    """``p`` with its block boundaries moved, one block at a time, while that gives the
    tightest stage more KV room (then the fullest stage a smaller share of its VRAM) and
    keeps every stage within its VRAM and the cycle at most ``limit`` seconds.

    The nodes and their order stay; so does every stage's at least one block.  Each
    round takes the move of best score (rooms from the tightest stage up, then memory
    shares from the fullest down), the first of equals, until no move improves it.
    """
    order, start = list(p[0]), list(p[1])
    n = len(order)
    if n < 2:
        return p
    m, b = microbatches(cm.batch, n)
    view = cm.at_microbatch(b)
    hops = evaluated_here(view, order, start).hops_s
    kv = cm.has_kv_figure

    # Each stage's figures by its block range, computed once: a move changes two stages,
    # and the other boundaries' moves meet the same ranges again next round.
    figures: dict[tuple[int, int, int], tuple[bool, float, float, float]] = {}

    def figure(s: int, lo: int, hi: int) -> tuple[bool, float, float, float]:
        """(fits, stage time, KV room, share of VRAM) of stage ``s`` on blocks [lo, hi)."""
        key = (s, lo, hi)
        got = figures.get(key)
        if got is None:
            d, first, last = order[s], s == 0, s == n - 1
            nxt = order[s + 1] if not last else None
            used = cm.stage_bytes(lo, hi, first, last)
            usable = cm.usable[d]
            per_token = cm.kv_token_prefix[hi] - cm.kv_token_prefix[lo]
            if not kv or per_token == 0:
                room = math.inf
            else:
                held = cm.kv_held_prefix[hi] - cm.kv_held_prefix[lo]
                room = float(max(usable - (used - held), 0) // per_token)
            got = (
                cm.fits(d, lo, hi, first, last),
                view.stage_time(d, lo, hi, first, last, nxt),
                room,
                used / usable if usable > 0 else math.inf,
            )
            figures[key] = got
        return got

    def full(rooms: list[float], shares: list[float]) -> tuple[tuple[float, ...], ...]:
        """The score's tail: every room from the tightest up, every share from the
        fullest down."""
        return tuple(sorted(rooms)), tuple(sorted(-x for x in shares))

    bounds = start
    times: list[float] = []
    rooms: list[float] = []
    shares: list[float] = []
    for s in range(n):
        _, t_s, r_s, f_s = figure(s, bounds[s], bounds[s + 1])
        times.append(t_s)
        rooms.append(r_s)
        shares.append(f_s)
    # The score a move raises is (least room, minus the largest share, then ``full``),
    # compared as one tuple; its tail is only worked out where the heads tie.
    head = (min(rooms), -max(shares))
    tail: tuple[tuple[float, ...], ...] | None = None
    for _ in range(_REBALANCE_ROUNDS):
        best: tuple[int, int, list[float], list[float], list[float]] | None = None
        best_head, best_tail = head, tail
        best_rooms, best_shares = rooms, shares
        for i in range(1, n):
            for step in (-1, 1):
                cut = bounds[i] + step
                if not bounds[i - 1] < cut < bounds[i + 1]:
                    continue
                a, c = i - 1, i
                fa, ta, ra, sa = figure(a, bounds[a], cut)
                if not fa:
                    continue
                fc, tc, rc, sc = figure(c, cut, bounds[c + 1])
                if not fc:
                    continue
                t = times.copy()
                t[a], t[c] = ta, tc
                if max(sum(t) + hops, m * max(t)) > limit:
                    continue
                r = rooms.copy()
                r[a], r[c] = ra, rc
                f = shares.copy()
                f[a], f[c] = sa, sc
                got = (min(r), -max(f))
                if got < best_head:
                    continue
                if got == best_head:
                    if best_tail is None:
                        best_tail = full(best_rooms, best_shares)
                    got_tail = full(r, f)
                    if not got_tail > best_tail:
                        continue
                    best_tail = got_tail
                else:
                    best_tail = None
                best_head, best_rooms, best_shares = got, r, f
                best = (i, cut, t, r, f)
        if best is None:
            break
        i, cut, times, rooms, shares = best
        bounds = [*bounds[:i], cut, *bounds[i + 1 :]]
        head, tail = best_head, best_tail
    if bounds == start:
        return p
    return order, bounds


def settle(cm: CostModel, candidates: Sequence[Pipeline], best: float = math.inf) -> Pipeline:
    """The final choice of a plan: ``candidates`` (the search's pipeline first) and each
    one rebalanced within :data:`TOLERANCE` of the best cycle (the least of theirs and
    ``best``, seconds, a cycle known to be reached), ranked by :func:`tie_key`."""
    least = min(best, *(evaluated(cm, *p).cycle_s for p in candidates))
    limit = least + abs(least) * TOLERANCE if math.isfinite(least) else least
    pool: list[Pipeline] = []
    for p in candidates:
        pool.append(p)
        q = rebalance(cm, p, limit)
        if q is not p:
            pool.append(q)
    return choose(cm, pool, least)
