"""Nodes no plan needs: those that as many others as a pipeline has stages dominate.

A node *dominates* another when the two are alike in every field but the id, the
network and the price (same GPUs, memory, rates, labels) and its link is at least as
fast, its latency at most as long.  Every figure of the cost model is as good or better
on the dominating node: its stages take the same time, hold the same bytes, and its
transfers and hops take no longer.

A pipeline of at most ``S`` stages uses at most ``S`` nodes.  If at least ``S`` others
dominate a node, one of them is idle in any pipeline on that node, and moving the node's
stages to it gives a pipeline at least as good; moving so while any node of the
pipeline is dominated that often ends (each move goes to a node strictly higher in one
total order), on a pipeline of nodes that fewer dominate.  So the best plan over the
nodes left is a best plan over them all, and a bound on those bounds every pipeline:
dropping such nodes loses no optimum, only search.

Of a kind whose nodes some are dropped, at least ``S`` stay (the dominators of the
dropped node that fewest dominate are dominated by fewer still), so the ``S`` largest
memories, and every refusal that reads them, stay the same.
"""

from __future__ import annotations

import math
from bisect import bisect_right, insort
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import fields
from operator import attrgetter

from stowplan.model import NodeDescriptor

__all__ = ["kind_of", "undominated"]

_NETWORK = frozenset({"id", "link_mbps", "link_latency_ms", "price_per_hour"})
"""The fields dominance compares (the link and latency) or ignores (the id and price);
alike nodes agree on every other."""

_KIND_FIELDS = attrgetter(*(f.name for f in fields(NodeDescriptor) if f.name not in _NETWORK))


def kind_of(node: NodeDescriptor) -> tuple[object, ...]:
    """What nodes that may dominate one another share: every field but the id, the
    network and the price, and whether the link is known (an unknown link, 0, counts no
    transfer time: it is compared with unknown ones only)."""
    return (_KIND_FIELDS(node), node.link_mbps > 0)


def undominated(nodes: Sequence[NodeDescriptor], most: int) -> tuple[NodeDescriptor, ...]:
    """``nodes`` (in their order) less those at least ``most`` others dominate, ``most``
    being the most nodes a pipeline may use.  Nodes alike in every figure dominate in
    their order: the first is kept first."""
    nodes = tuple(nodes)
    if most < 1 or len(nodes) <= most:
        return nodes
    kinds: dict[tuple[object, ...], list[int]] = defaultdict(list)
    for i, n in enumerate(nodes):
        kinds[kind_of(n)].append(i)
    dropped: set[int] = set()
    for members in kinds.values():
        if len(members) > most:
            dropped.update(_dominated(nodes, members, most))
    if not dropped:
        return nodes
    return tuple(n for i, n in enumerate(nodes) if i not in dropped)


def _dominated(nodes: tuple[NodeDescriptor, ...], members: list[int], most: int) -> list[int]:
    """The members (nodes of one kind) that at least ``most`` of the others dominate.

    In the order of fastest link, then least latency, every node that dominates another
    comes before it, and a node before another with no more latency dominates it: each
    member's dominators are counted among those before (the latencies seen, sorted)."""

    def link(i: int) -> float:
        mbps = nodes[i].link_mbps
        return math.inf if mbps <= 0 else mbps

    ranked = sorted(members, key=lambda i: (-link(i), nodes[i].link_latency_ms, i))
    out: list[int] = []
    seen: list[float] = []
    for i in ranked:
        latency = nodes[i].link_latency_ms
        if bisect_right(seen, latency) >= most:
            out.append(i)
        insort(seen, latency)
    return out
