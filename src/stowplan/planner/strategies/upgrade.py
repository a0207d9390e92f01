"""A plan's nodes moved to idle nodes alike but for a better network.

The searches choose nodes by their speed and room, and of nodes alike in both (one kind
of GPU) not always the one of best network: on 1,024 single-GPU nodes of four kinds,
each with its own link, deepseek-v3's pipeline at 16 sequences held stages on nodes whose
idle twins had a faster link and a shorter hop.  A node that dominates another
(:func:`~.dominance.network_dominates`) runs the same stage no slower: the move never
lowers a plan, and where the network counts it raises it.
"""

from __future__ import annotations

from collections import defaultdict

from stowplan.cost import CostModel
from stowplan.planner.strategies.dominance import kind_of
from stowplan.planner.strategies.evaluated import evaluated
from stowplan.planner.strategies.memo import PerModel
from stowplan.planner.strategies.throughput import Pipeline

__all__ = ["upgraded"]


def _by_kind(cm: CostModel) -> list[list[int]]:
    """Per node, the nodes of its kind (:func:`~.dominance.kind_of`), itself among them
    (one list per kind), in the order of the fastest link, then the shortest hop."""
    kinds: dict[tuple[object, ...], list[int]] = defaultdict(list)
    of = []
    for i, n in enumerate(cm.nodes):
        members = kinds[kind_of(n)]
        members.append(i)
        of.append(members)
    for members in kinds.values():
        members.sort(key=lambda i: (-cm.nodes[i].link_mbps, cm.nodes[i].link_latency_ms, i))
    return of


_twins = PerModel(_by_kind)


def upgraded(cm: CostModel, p: Pipeline) -> Pipeline:
    """``p``, each stage's node in turn moved to the idle node that dominates it (a network
    no worse, alike otherwise) where that lowers the cycle most, on nodes each its own
    host.  Of the idle nodes that dominate a node, only those no other of them dominates
    are tried: each is at least as good as those it dominates."""
    order, bounds = p
    if not cm.own_hosts or len(cm.nodes) <= len(order):
        return p
    nodes = cm.nodes
    twins = _twins(cm)
    best = list(order)
    least = evaluated(cm, best, bounds).cycle_s
    used = set(best)
    for k in range(len(order)):
        here = nodes[best[k]]
        # The idle dominators no other idle one dominates: in the order of the fastest
        # link, each of a shorter hop than every one before it.
        shortest, tried = here.link_latency_ms, list[int]()
        for j in twins[best[k]]:
            n = nodes[j]
            if n.link_mbps < here.link_mbps:
                break
            if j in used or n.link_latency_ms > shortest:
                continue
            if n.link_latency_ms == shortest and (tried or n.link_mbps == here.link_mbps):
                continue  # dominated by one before it, or a network alike
            shortest = n.link_latency_ms
            tried.append(j)
        for j in tried:
            moved = [*best[:k], j, *best[k + 1 :]]
            cycle = evaluated(cm, moved, bounds).cycle_s
            if cycle < least * (1 - 1e-9):
                used.discard(best[k])
                used.add(j)
                best, least = moved, cycle
    return p if best == list(order) else (best, list(bounds))
