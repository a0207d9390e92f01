"""Nodes no plan needs: those that as many others as a pipeline has stages dominate.

A node *dominates* another when the two are alike in every field but the id and the
network (same GPUs, memory, rates, labels) and its link is at least as fast, its latency
at most as long (and, where price is weighed, its price at most as high).  Every figure
of the cost model is as good or better on the dominating node: its stages take the same
time, hold the same bytes, and its transfers and hops take no longer.

A pipeline of at most ``S`` stages uses at most ``S`` nodes.  If at least ``S`` others
dominate a node, one of them is idle in any pipeline on that node, and moving the node's
stages to it gives a pipeline at least as good (and no dearer, where price is weighed);
moving so while any node of the pipeline is dominated that often ends (each move goes to
a node strictly higher in one total order), on a pipeline of nodes that fewer dominate.
So the best plan over the nodes left is a best plan over them all, and a bound on those
bounds every pipeline: dropping such nodes loses no optimum, only search.

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

__all__ = ["kind_of", "network_dominates", "undominated"]

_NETWORK = frozenset({"id", "link_mbps", "link_latency_ms", "price_per_hour"})
"""The fields dominance compares (or, the id, ignores); alike nodes agree on every other."""

_KIND_FIELDS = attrgetter(*(f.name for f in fields(NodeDescriptor) if f.name not in _NETWORK))


def kind_of(node: NodeDescriptor) -> tuple[object, ...]:
    """What nodes that may dominate one another share: every field but the id, the
    network and the price, and whether the link is known (an unknown link, 0, counts no
    transfer time: it is compared with unknown ones only)."""
    return (_KIND_FIELDS(node), node.link_mbps > 0)


def network_dominates(d: NodeDescriptor, e: NodeDescriptor) -> bool:
    """Whether ``d``'s network is as good as ``e``'s, for nodes of one :func:`kind_of` (it
    does not compare kinds): a link at least as fast and a latency at most as long; price
    aside."""
    return d.link_mbps >= e.link_mbps and d.link_latency_ms <= e.link_latency_ms


def undominated(
    nodes: Sequence[NodeDescriptor], most: int, *, priced: bool
) -> tuple[NodeDescriptor, ...]:
    """``nodes`` (in their order) less those at least ``most`` others dominate, ``most``
    being the most nodes a pipeline may use; with ``priced``, a dominating node is also no
    dearer (an unknown price only dominates, and is only dominated by, an unknown one).
    Nodes alike in every figure dominate in their order: the first is kept first."""
    nodes = tuple(nodes)
    if most < 1 or len(nodes) <= most:
        return nodes
    kinds: dict[tuple[object, ...], list[int]] = defaultdict(list)
    for i, n in enumerate(nodes):
        # An unknown price is compared with unknown ones only.
        kinds[(kind_of(n), priced and n.price_per_hour is None)].append(i)
    dropped: set[int] = set()
    for members in kinds.values():
        if len(members) > most:
            dropped.update(_dominated(nodes, members, most, priced))
    if not dropped:
        return nodes
    return tuple(n for i, n in enumerate(nodes) if i not in dropped)


def _dominated(
    nodes: tuple[NodeDescriptor, ...], members: list[int], most: int, priced: bool
) -> list[int]:
    """The members (nodes of one kind) that at least ``most`` of the others dominate.

    In the order of fastest link, then least latency and price, every node that
    dominates another comes before it, and a node before another with no more latency
    (nor price) dominates it: each member's dominators are counted among those before."""

    def price(i: int) -> float:
        p = nodes[i].price_per_hour
        return 0.0 if not priced or p is None else p

    def link(i: int) -> float:
        mbps = nodes[i].link_mbps
        return math.inf if mbps <= 0 else mbps

    ranked = sorted(members, key=lambda i: (-link(i), nodes[i].link_latency_ms, price(i), i))
    out: list[int] = []
    if not priced:
        seen: list[float] = []
        """The latencies of the members before, sorted."""
        for i in ranked:
            latency = nodes[i].link_latency_ms
            if bisect_right(seen, latency) >= most:
                out.append(i)
            insort(seen, latency)
        return out
    before: list[tuple[float, float]] = []
    for i in ranked:
        latency, cost = nodes[i].link_latency_ms, price(i)
        count = 0
        for a, b in before:
            if a <= latency and b <= cost:
                count += 1
                if count >= most:
                    out.append(i)
                    break
        before.append((latency, cost))
    return out
