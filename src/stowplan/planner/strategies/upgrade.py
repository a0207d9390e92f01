"""A plan's stages moved to idle nodes at least as fast where that lowers the cycle.

The searches choose nodes by their speed and room, and of nodes alike in both (one kind
of GPU) not always the one of best network: on 1,024 single-GPU nodes of four kinds,
each with its own link and hop, deepseek-v3's pipeline at 16 sequences held stages on
nodes whose idle twins had a faster link and a shorter hop, and gpt-oss:120b's (whose
trip decides its cycle) on nodes whose idle twins had a shorter hop for a slower link.
Each stage's node in turn is tried against the idle nodes whose GPU figures are at
least as good (bandwidth, compute, fixed seconds, room: its twins, or a faster kind)
and whose network is not worse in both link and hop, of each kind only those no other
idle node of the kind beats in both (:func:`_front`); a move is kept where the whole
pipeline's cycle falls.  Where the slowest stage decides the cycle, only that stage's
node is tried (no other move lowers it).
"""

from __future__ import annotations

from stowplan.cost import CostModel
from stowplan.planner.strategies.dominance import kind_of
from stowplan.planner.strategies.evaluated import evaluated
from stowplan.planner.strategies.memo import PerModel
from stowplan.planner.strategies.throughput import Pipeline

__all__ = ["upgraded"]


def _by_kind(cm: CostModel) -> tuple[list[int], list[list[int]]]:
    """Per node, its kind's number (:func:`~.dominance.kind_of`), and per kind its nodes
    in the order of the fastest link, then the shortest hop."""
    numbers: dict[tuple[object, ...], int] = {}
    kind = [numbers.setdefault(kind_of(n), len(numbers)) for n in cm.nodes]
    members: list[list[int]] = [[] for _ in numbers]
    for i, k in enumerate(kind):
        members[k].append(i)
    nodes = cm.nodes
    for m in members:
        m.sort(key=lambda i: (-nodes[i].link_mbps, nodes[i].link_latency_ms, i))
    return kind, members


_kinds = PerModel(_by_kind)


def _front(cm: CostModel, members: list[int], used: set[int]) -> list[int]:
    """The idle nodes of one kind (``members``, best link first) no other idle one of it
    beats in both link and hop."""
    nodes = cm.nodes
    out, shortest = [], float("inf")
    for i in members:
        if i not in used and nodes[i].link_latency_ms < shortest:
            out.append(i)
            shortest = nodes[i].link_latency_ms
    return out


_ROUNDING = 1e-12
"""Far above the relative rounding between a move's cycle figured from its one stage and
the pipeline evaluated whole (sums of the same floats in another order)."""


def upgraded(cm: CostModel, p: Pipeline) -> Pipeline:
    """``p``, each stage's node in turn moved to the idle node that lowers the cycle most,
    of those at least as fast and large (at the pipeline's microbatch) whose network is
    not worse in both link and hop (of another kind only at several sequences: at one
    the latency search has weighed them), on nodes each its own host; once over the
    stages.  A move never makes the pipeline slower: it is kept only where the cycle
    falls.  A move's cycle is figured from the one stage it changes (the others' sum and
    slowest as they are): where that decides the comparison beyond rounding, the
    pipeline is not evaluated whole (the same moves; kimi-k2's 60 stages at one stream
    over 1,024 nodes, 12 → 1.2 ms)."""
    order, bounds = p
    if not cm.own_hosts or len(cm.nodes) <= len(order):
        return p
    nodes = cm.nodes
    n = len(order)
    view = cm.for_stages(n)
    kind, members = _kinds(cm)
    best = list(order)
    least = evaluated(cm, best, bounds).cycle_s
    used = set(best)
    fronts: dict[int, list[int]] = {}
    fit = [cm.fits(d, bounds[s], bounds[s + 1], s == 0, s == n - 1) for s, d in enumerate(best)]

    def figures(i: int) -> tuple[float, ...]:
        return (view.inv_bw[i], view.flop_s_per_byte[i], view.block_s[i], view.stage_s[i])

    for k in range(n):
        ev = evaluated(cm, best, bounds)
        slowest = ev.bottleneck_s
        times, m = ev.stage_time_s, ev.num_microbatches
        if m * slowest > sum(times) + ev.hops_s and times[k] < slowest:
            continue  # the slowest stage decides the cycle, and this one is faster
        here = best[k]
        own, room = figures(here), view.usable[here]
        link, hop = nodes[here].link_mbps, nodes[here].link_latency_ms
        lo, hi, first, last = bounds[k], bounds[k + 1], k == 0, k == n - 1
        others_fit = all(fit[:k]) and all(fit[k + 1 :])
        # A move's cycle from the stage it changes alone (the others' times and hops,
        # summed without the stage's own: no subtraction to lose the small to the large;
        # and their slowest): a move it shows cannot lower the cycle is not evaluated.
        others = [s for s in range(n) if s != k]
        rest = sum(times[s] for s in others)
        if n > 1:
            rest += sum(view.latency_s[best[s]] for s in others)
        rest_slowest = max((times[s] for s in others), default=0.0)
        moved: list[int] | None = None
        figured = False
        """Whether ``least`` is ``moved``'s cycle figured from its one stage."""
        # Nodes of other kinds (faster GPUs) where several sequences share the cycle; at
        # one stream the latency search has weighed them already.
        kinds = range(len(members)) if cm.batch > 1 else (kind[here],)
        for c in kinds:
            if c not in fronts:
                fronts[c] = _front(cm, members[c], used)
            for j in fronts[c]:
                if (
                    view.usable[j] < room
                    or (nodes[j].link_mbps < link and nodes[j].link_latency_ms > hop)
                    or not all(a <= b for a, b in zip(figures(j), own, strict=True))
                ):
                    continue
                if not (others_fit and cm.fits(j, lo, hi, first, last)):
                    continue
                t = view.stage_time(j, lo, hi, first, last)
                hops = view.latency_s[j] if n > 1 else 0.0
                near = max(rest + t + hops, m * max(rest_slowest, t))
                # Against the least so far (itself figured so where ``figured``): a move
                # surely no faster is passed over, one surely faster kept unevaluated,
                # and only one within the rounding of the bar is evaluated whole.
                slack = _ROUNDING if figured else 0.0
                if near * (1 - _ROUNDING) >= least * (1 + slack) * (1 - 1e-9):
                    continue
                trial = [*best[:k], j, *best[k + 1 :]]
                if near * (1 + _ROUNDING) < least * (1 - slack) * (1 - 1e-9):
                    moved, least, figured = trial, near, True
                    continue
                if figured:
                    assert moved is not None
                    least, figured = evaluated(cm, moved, bounds).cycle_s, False
                cycle = evaluated(cm, trial, bounds).cycle_s
                if cycle < least * (1 - 1e-9):
                    moved, least = trial, cycle
        if moved is not None:
            if figured:
                least = evaluated(cm, moved, bounds).cycle_s
            j = moved[k]
            fit[k] = True
            used.discard(here)
            used.add(j)
            fronts.pop(kind[here], None)
            fronts.pop(kind[j], None)
            best = moved
    return p if best == list(order) else (best, list(bounds))
