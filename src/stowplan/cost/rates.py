"""A node's numbers in SI units: bandwidth, FLOPs, links, usable memory and price.

Taken from the node descriptor when given, else from :mod:`stowplan.gpus` (the
spec table and the GPU database) and :mod:`stowplan.gpus.interconnect`; every value
taken from a table (or defaulted) is listed beside the rates as assumed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import repeat
from operator import attrgetter

from stowplan.gpus import resolve_gpu
from stowplan.gpus.interconnect import intra_link
from stowplan.model import NodeDescriptor, usable_bytes

__all__ = ["DEFAULT_BANDWIDTH_GBPS", "NodeRates", "node_rates", "nodes_rates"]

DEFAULT_BANDWIDTH_GBPS = 500.0
"""Bandwidth assumed for a GPU that is neither described nor in the spec table."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeRates:
    """A node's numbers in SI units, as the cost model uses them."""

    node_id: str
    bandwidth_bytes_per_s: float
    flops_per_s: float
    """``inf`` when unknown: the compute term is then not counted."""
    link_bytes_per_s: float
    """``inf`` when unknown (``link_mbps`` 0): the transfer time is then not counted."""
    latency_s: float
    usable_bytes: int
    price_per_hour: float | None
    intra_bytes_per_s: float = math.inf
    """Per direction, between two GPUs of the node."""
    intra_latency_s: float = 0.0
    """One collective step between GPUs of the node."""


def node_rates(node: NodeDescriptor, headroom: float) -> tuple[NodeRates, tuple[str, ...]]:
    """``node`` in SI units, and the list of inputs that were assumed rather than given."""
    return _node_rates(node, headroom)


_KEPT = 8192
"""Nodes whose rates :func:`nodes_rates` keeps (all are let go when more come)."""

_kept: dict[tuple[object, ...], tuple[NodeRates, tuple[str, ...]]] = {}
"""Per (kind number, id, headroom), a node's :func:`node_rates`."""

_ID = attrgetter("id")


def nodes_rates(
    nodes: Sequence[NodeDescriptor], kinds: Sequence[int], headroom: float
) -> list[tuple[NodeRates, tuple[str, ...]]]:
    """:func:`node_rates` of each of ``nodes`` (``kinds``: each one's kind number,
    :func:`~stowplan.model.node_kinds`), looked up at C speed per node: a node met before
    costs no Python work (its descriptor is not hashed field by field)."""
    keys = list(zip(kinds, map(_ID, nodes), repeat(headroom)))
    out = list(map(_kept.get, keys))
    if None in out:
        if len(_kept) + len(out) > _KEPT:
            _kept.clear()
        for i, got in enumerate(out):
            if got is None:
                got = out[i] = _kept[keys[i]] = _node_rates(nodes[i], headroom)
    return out  # type: ignore[return-value]


@lru_cache(maxsize=8192)
def _node_rates(node: NodeDescriptor, headroom: float) -> tuple[NodeRates, tuple[str, ...]]:
    assumed: list[str] = []
    match = resolve_gpu(node.gpu_name, node.vram_bytes // node.num_gpus or None)
    spec = match.spec if match is not None else None
    uses_spec = node.mem_bandwidth_gbps is None or node.flops_estimate <= 0
    if match is not None and match.assumption is not None and uses_spec:
        assumed.append(f"{node.id}.gpu_name: {match.assumption}")
    if node.mem_bandwidth_gbps is not None:
        bw = node.mem_bandwidth_gbps * 1e9
    elif spec is not None:
        bw = spec.mem_bandwidth_gbps * 1e9 * node.num_gpus
        assumed.append(
            f"{node.id}.mem_bandwidth_gbps={spec.mem_bandwidth_gbps * node.num_gpus:g} "
            f"({spec.origin.label}: {spec.name}, {spec.source})"
        )
    else:
        bw = DEFAULT_BANDWIDTH_GBPS * 1e9 * node.num_gpus
        assumed.append(
            f"{node.id}.mem_bandwidth_gbps={DEFAULT_BANDWIDTH_GBPS * node.num_gpus:g} "
            f"(default: {node.gpu_name!r} is in neither the spec table nor the GPU database)"
        )
    if node.flops_estimate > 0:
        flops = node.flops_estimate * 1e12
    elif spec is not None and spec.bf16_tflops is not None:
        flops = spec.bf16_tflops * 1e12 * node.num_gpus
        assumed.append(
            f"{node.id}.flops_estimate={spec.bf16_tflops * node.num_gpus:g} "
            f"({spec.origin.label}: {spec.name}, {spec.tflops_source})"
        )
    else:
        flops = math.inf
        assumed.append(f"{node.id}.flops_estimate unknown: compute time not counted")
    if node.link_mbps > 0:
        link = node.link_mbps * 1e6 / 8
    else:
        link = math.inf
        assumed.append(f"{node.id}.link_mbps unknown: transfer time not counted")
    # A one-GPU group of a bigger node reaches its siblings over this link too.
    link_in = intra_link(
        node.gpu_name,
        gbps=node.intra_link_gbps,
        latency_us=node.intra_link_latency_us,
        spec=spec,
    )
    if node.num_gpus > 1 and link_in.source != "given":
        assumed.append(
            f"{node.id}.intra_link_gbps={link_in.gbps:g}, intra_link_latency_us="
            f"{link_in.latency_us:g} ({link_in.kind} default: {link_in.source})"
        )
    rates = NodeRates(
        node_id=node.id,
        intra_bytes_per_s=link_in.gbps * 1e9,
        intra_latency_s=link_in.latency_us / 1e6,
        bandwidth_bytes_per_s=bw,
        flops_per_s=flops,
        link_bytes_per_s=link,
        latency_s=node.link_latency_ms / 1e3,
        usable_bytes=usable_bytes(node, headroom),
        price_per_hour=node.price_per_hour,
    )
    return rates, tuple(assumed)
