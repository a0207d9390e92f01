"""Rank order of a unified placement group: tensor-parallel peers sit together (pure).

A unified group spans nodes (a replica's ``tp × pp`` GPUs exceed one node).
Ray numbers its bundles in request order and places them wherever its
strategy likes (``SPREAD`` deals them round-robin over nodes), so bundle
order says nothing about locality.  Ranks are handed out in the order of
:func:`rank_order` instead, so that consecutive ranks (a tensor-parallel
group, then the next pipeline stage) share the fastest links available:

1. NVLink domain: bundles of one domain take consecutive ranks; domains are
   ordered by their lowest topological rank, then key; bundles of nodes in no
   known domain come last;
2. topological rank of the node (``topo_rank``: its position in the network;
   a node without one comes after those with one);
3. node id, so the GPUs of one node stay together;
4. the bundle's GPU id on its node, then its bundle index.

Without any domain or rank this is the plain ``(node, GPU)`` order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stowplan.errors import InputError
from stowplan.quantities.checks import check_int

__all__ = ["BundlePlace", "rank_order"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BundlePlace:
    """Where one bundle of a placed group landed."""

    node_id: str
    gpu_id: int = 0
    """The bundle's GPU on its node (its first, when it holds several)."""
    domain: str | None = None
    """The node's NVLink domain key; None (or ``unknown``) when it is in none."""
    topo_rank: int | None = None
    """The node's topological rank; None when it registered none."""

    def __post_init__(self) -> None:
        if not isinstance(self.node_id, str) or not self.node_id:
            raise InputError("node_id", self.node_id, "must be a non-empty string")
        check_int(f"{self.node_id}.gpu_id", self.gpu_id)
        if self.topo_rank is not None:
            check_int(f"{self.node_id}.topo_rank", self.topo_rank)


_UNKNOWN = (None, "", "unknown")


def rank_order(places: Sequence[BundlePlace]) -> tuple[int, ...]:
    """Bundle indices of ``places`` in rank order: rank ``r`` runs on bundle ``result[r]``.

    Step 1: each NVLink domain's position is its lowest topological rank (then
    its key); unknown domains go last.  Step 2: sort by (domain position,
    topological rank, node id, GPU id, bundle index).  Deterministic and
    stable: equal places keep their bundle order.
    """
    # Step 1: order the domains by their lowest topological rank.
    lowest: dict[str, tuple[bool, int]] = {}
    for p in places:
        if p.domain in _UNKNOWN:
            continue
        assert p.domain is not None
        here = (p.topo_rank is None, p.topo_rank or 0)
        lowest[p.domain] = min(lowest.get(p.domain, here), here)

    def domain_position(p: BundlePlace) -> tuple[bool, bool, int, str]:
        if p.domain in _UNKNOWN:
            return (True, False, 0, "")
        assert p.domain is not None
        return (False, *lowest[p.domain], p.domain)

    # Step 2: domain, topological rank, node, GPU, bundle.
    def position(i: int) -> tuple[tuple[bool, bool, int, str], bool, int, str, int, int]:
        p = places[i]
        return (
            domain_position(p),
            p.topo_rank is None,
            p.topo_rank or 0,
            p.node_id,
            p.gpu_id,
            i,
        )

    return tuple(sorted(range(len(places)), key=position))
