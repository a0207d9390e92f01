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


def upgraded(cm: CostModel, p: Pipeline) -> Pipeline:
    """``p``, each stage's node in turn moved to the idle node that lowers the cycle most,
    of those at least as fast and large (at the pipeline's microbatch) whose network is
    not worse in both link and hop (of another kind only at several sequences: at one
    the latency search has weighed them), on nodes each its own host; once over the
    stages.  A move never makes the pipeline slower: it is kept only where the cycle
    falls."""
    order, bounds = p
    if not cm.own_hosts or len(cm.nodes) <= len(order):
        return p
    nodes = cm.nodes
    view = cm.for_stages(len(order))
    kind, members = _kinds(cm)
    best = list(order)
    least = evaluated(cm, best, bounds).cycle_s
    used = set(best)
    fronts: dict[int, list[int]] = {}

    def figures(i: int) -> tuple[float, ...]:
        return (view.inv_bw[i], view.flop_s_per_byte[i], view.block_s[i], view.stage_s[i])

    for k in range(len(order)):
        ev = evaluated(cm, best, bounds)
        slowest = ev.bottleneck_s
        if ev.num_microbatches * slowest > sum(ev.stage_time_s) + ev.hops_s and (
            ev.stage_time_s[k] < slowest
        ):
            continue  # the slowest stage decides the cycle, and this one is faster
        here = best[k]
        own, room = figures(here), view.usable[here]
        link, hop = nodes[here].link_mbps, nodes[here].link_latency_ms
        moved = None
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
                trial = [*best[:k], j, *best[k + 1 :]]
                if not cm.fits_pipeline(trial, bounds):
                    continue
                cycle = evaluated(cm, trial, bounds).cycle_s
                if cycle < least * (1 - 1e-9):
                    moved, least = trial, cycle
        if moved is not None:
            j = moved[k]
            used.discard(here)
            used.add(j)
            fronts.pop(kind[here], None)
            fronts.pop(kind[j], None)
            best = moved
    return p if best == list(order) else (best, list(bounds))
