"""Which node sets a serving fleet's replicas are tried on: classes and compositions.

Nodes alike in every figure but their id form one class; a *composition* is how many
nodes of each class a replica takes.  Small fleets try every composition; larger ones
every single-class count, the small compositions, and groups of nodes that together
hold the weights a few times over (:func:`grouped_compositions`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from itertools import product

from stowplan.model import NodeDescriptor
from stowplan.serving.bounds import FleetRates, users_bound
from stowplan.workload import Workload

__all__ = [
    "GROUP_ROOMS",
    "SMALL_CLASSES",
    "Composition",
    "best_links",
    "class_key",
    "compositions",
    "grouped_compositions",
    "node_classes",
    "node_types",
]

Composition = tuple[int, ...]


def class_key(n: NodeDescriptor) -> tuple[object, ...]:
    return (
        n.gpu_name,
        n.vram_bytes,
        n.flops_estimate,
        n.link_mbps,
        n.mem_bandwidth_gbps,
        n.link_latency_ms,
        n.price_per_hour,
        n.num_gpus,
        n.intra_link_gbps,
        n.intra_link_latency_us,
    )


def best_links(nodes: Sequence[NodeDescriptor]) -> list[tuple[NodeDescriptor, int]]:
    """The nodes grouped into types of nodes alike but for their id, price and network
    link, each as (a node of the type with the type's fastest link — an unknown one,
    which costs no transfer, if any — and its least hop latency, and how many there
    are), in first-seen order.  A replica's nodes swapped for these serve no fewer
    users: only the time of a prompt's or a token's way through the network changes,
    and it only shrinks."""
    types = []
    for t, members in enumerate(node_types(nodes)):
        links = [n.link_mbps for n in members]
        best = replace(
            members[0],
            id=f"type-{t}",
            link_mbps=0.0 if 0.0 in links else max(links),
            link_latency_ms=min(n.link_latency_ms for n in members),
            price_per_hour=None,
        )
        types.append((best, len(members)))
    return types


def node_types(nodes: Sequence[NodeDescriptor]) -> list[list[NodeDescriptor]]:
    """The nodes grouped into types of nodes alike but for their id, price and network
    link, in first-seen order (a type's nodes hold and run the same stages)."""
    out: dict[tuple[object, ...], list[NodeDescriptor]] = {}
    for n in nodes:
        key = class_key(replace(n, link_mbps=0.0, link_latency_ms=0.0, price_per_hour=None))
        out.setdefault(key, []).append(n)
    return list(out.values())


def node_classes(nodes: Sequence[NodeDescriptor]) -> list[list[NodeDescriptor]]:
    """The nodes grouped into classes of nodes alike but for their id, in first-seen order."""
    out: dict[tuple[object, ...], list[NodeDescriptor]] = {}
    for n in nodes:
        out.setdefault(class_key(n), []).append(n)
    return list(out.values())


def compositions(sizes: Sequence[int], limit: int) -> tuple[list[Composition], bool]:
    """Compositions (nodes taken per class) to try, fewest nodes first, and whether they
    are all of them.  All when there are at most ``limit``; otherwise every single-class
    count and, up to :data:`SMALL_CLASSES` classes, the compositions of two or three
    nodes, the first ``limit`` of them beyond the single-class ones (callers add groups
    of their own, see :func:`grouped_compositions`)."""
    total = math.prod(s + 1 for s in sizes) - 1
    if total <= limit:
        every = [c for c in product(*(range(s + 1) for s in sizes)) if any(c)]
        return sorted(every, key=lambda c: (sum(c), c)), True
    k = len(sizes)
    chosen: dict[Composition, None] = {}
    for i, s in enumerate(sizes):
        for count in range(1, s + 1):
            chosen[tuple(count if j == i else 0 for j in range(k))] = None
    small = [c for c in _small(sizes, 3) if c not in chosen] if k <= SMALL_CLASSES else []
    for c in sorted(small, key=lambda c: (sum(c), c))[:limit]:
        chosen[c] = None
    return list(chosen), False


SMALL_CLASSES = 24
"""Up to this many classes, every composition of two or three nodes is tried; beyond,
the groups of :func:`grouped_compositions` stand for them."""

GROUP_ROOMS = (1.2, 1.5, 2.0)
"""The memory, in copies of the weights, each of :func:`grouped_compositions`' groups
is filled up to."""


def grouped_compositions(
    rates: FleetRates,
    classes: Sequence[Sequence[NodeDescriptor]],
    index: dict[str, int],
    w: Workload,
) -> list[Composition]:
    """Replicas for a fleet too large to enumerate: the nodes in order of their own
    prefill and decode speed (and, for a target, of price per speed), cut into
    consecutive groups that each hold :data:`GROUP_ROOMS` copies of the weights —
    disjoint groups that packing can take side by side; the remainder joins the last
    group.  Nodes that serve a request alone are left to the single-class
    compositions."""
    flat = [(k, n) for k, cls in enumerate(classes) for n in cls]

    def speed(i: int) -> float:
        return 1.0 / max(rates.ttft0_floor([i]) + rates.cycle_floor([i]), 1e-30)

    small = [(k, n) for k, n in flat if users_bound(rates, [index[n.id]], w) < 1]
    orders = [sorted(small, key=lambda kn: -speed(index[kn[1].id]))]
    if w.has_target and all(n.price_per_hour for _, n in small):
        orders.append(
            sorted(small, key=lambda kn: (kn[1].price_per_hour or 0.0) / speed(index[kn[1].id]))
        )
    out: dict[Composition, None] = {}
    for order in orders:
        for room in GROUP_ROOMS:
            need = room * rates.weight_bytes
            groups: list[list[tuple[int, NodeDescriptor]]] = [[]]
            held = 0.0
            for k, n in order:
                groups[-1].append((k, n))
                held += rates.usable[index[n.id]]
                if held >= need:
                    groups.append([])
                    held = 0.0
            if len(groups) > 1 and held < need:
                rest = groups.pop()
                groups[-1] += rest
            for g in groups:
                if not g:
                    continue
                combo = [0] * len(classes)
                for k, _ in g:
                    combo[k] += 1
                out[tuple(combo)] = None
    return list(out)


def _small(sizes: Sequence[int], most: int) -> list[Composition]:
    """Every composition of 1..``most`` nodes."""
    out: list[Composition] = []

    def walk(i: int, left: int, acc: list[int]) -> None:
        if i == len(sizes):
            if any(acc):
                out.append(tuple(acc))
            return
        for c in range(min(sizes[i], left) + 1):
            acc.append(c)
            walk(i + 1, left - c, acc)
            acc.pop()

    walk(0, most, [])
    return out
