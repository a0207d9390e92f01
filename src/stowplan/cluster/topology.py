"""NVLink domains, topological ranks and segment selection.

Every node registers two custom Ray resources at ``ray start``:

* ``nvlink_domain_<key>: 1`` — its NVLink fabric (see :mod:`stowplan.host.fabric`),
  absent when the node is in no multi-node NVLink domain;
* ``topo_rank: N`` — its position in the network, ``N >= 1`` (Ray drops
  zero-valued resources), from ``SLURM_TOPOLOGY_ADDR``, else ``SLURM_PROCID``,
  else the digits of the host name.

:func:`get_ray_cluster_topology` reads them back from the live nodes;
:func:`select_segment_nodes` (pure) picks complete NVLink segments from them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from stowplan.errors import Infeasible, InputError
from stowplan.host.fabric import DOMAIN_RESOURCE_PREFIX, domain_resource, node_domain, parse_fabric
from stowplan.quantities.checks import check_int
from stowplan.quantities.limits import MAX_NODES
from stowplan.text.wording import plural

__all__ = [
    "TOPO_RANK_RESOURCE",
    "TOPO_RANK_UNKNOWN",
    "UNKNOWN_DOMAIN",
    "NodeResources",
    "SegmentSelection",
    "get_ray_cluster_topology",
    "local_node_resources",
    "node_resources",
    "select_segment_nodes",
    "topo_rank_from",
]

UNKNOWN_DOMAIN = "unknown"
"""The pseudo-domain of nodes that registered no NVLink domain; never selected."""
TOPO_RANK_RESOURCE = "topo_rank"
TOPO_RANK_UNKNOWN = -1
"""The rank NeMo-RL (and seed 001) give a node without topology: read as None (unknown)."""

Topology = Mapping[str, tuple[str, int | None]]
"""node id → (NVLink domain key or ``unknown``, topological rank or None)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SegmentSelection:
    """Nodes chosen by :func:`select_segment_nodes`."""

    segments: tuple[tuple[str, ...], ...]
    """The chosen segments, each ``segment_size`` node ids of one domain in topological order."""
    domains: tuple[str, ...]
    """The NVLink domain of each segment."""
    remainder: tuple[str, ...]
    """Every node not selected (unknown-domain nodes included)."""

    @property
    def selected(self) -> tuple[str, ...]:
        """The chosen node ids, segment after segment."""
        return tuple(n for seg in self.segments for n in seg)


MAX_RANK = 2**53
"""Largest topological rank: a Ray resource is a float, exact up to 2**53."""


def _check_topology(topology: object) -> None:
    """Each entry ``node id -> (domain or None, rank >= 0, -1 or None)``; else
    :class:`InputError`. ``-1`` is :data:`TOPO_RANK_UNKNOWN`."""
    if not isinstance(topology, Mapping):
        raise InputError("topology", topology, "must map node ids to (domain, rank)")
    for node, entry in topology.items():
        if not isinstance(node, str) or not isinstance(entry, tuple) or len(entry) != 2:
            raise InputError(f"topology[{node!r}]", entry, "must be a (domain, rank) pair")
        domain, rank = entry
        if domain is not None and not isinstance(domain, str):
            raise InputError(f"topology[{node!r}].domain", domain, "must be a string or None")
        if rank is not None and (
            isinstance(rank, bool)
            or not isinstance(rank, int)
            or not (0 <= rank <= MAX_RANK or rank == TOPO_RANK_UNKNOWN)
        ):
            raise InputError(
                f"topology[{node!r}].rank",
                rank,
                "must be an integer in [0, 2**53], -1 (unknown) or None",
            )


def _order(topology: Topology, node: str) -> tuple[bool, int, str]:
    """Known ranks first, in order; an unknown one (None or -1) after them, by id."""
    rank = topology[node][1]
    unknown = rank is None or rank == TOPO_RANK_UNKNOWN
    return (unknown, 0 if unknown else rank or 0, node)


def select_segment_nodes(topology: Topology, segment_size: int, num_nodes: int) -> SegmentSelection:
    """Take complete ``segment_size``-node segments, domain by domain, until ``num_nodes``.

    Step 1: group the nodes by NVLink domain; ``unknown`` nodes (domain None or
    ``unknown``, as NeMo-RL marks a node without topology, usually with rank -1) are
    accepted and excluded (a pin to a resource no node registered could never schedule).
    Step 2: order each domain's nodes by topological rank (then id) and the
    domains by their lowest rank (then key).
    Step 3: greedily cut each domain into consecutive complete segments, never
    spilling a segment across domains, until ``num_nodes // segment_size`` are taken.

    Raises :class:`InputError` when ``segment_size`` does not divide
    ``num_nodes`` and :class:`Infeasible` when too few complete segments exist.
    """
    for name, value in (("segment_size", segment_size), ("num_nodes", num_nodes)):
        check_int(name, value, minimum=1, maximum=MAX_NODES)
    _check_topology(topology)
    if num_nodes % segment_size:
        raise InputError(
            "segment_size",
            segment_size,
            f"must divide num_nodes={num_nodes} ({num_nodes} % {segment_size} = "
            f"{num_nodes % segment_size})",
        )
    # Step 1: group by domain.
    by_domain: dict[str, list[str]] = {}
    for node, (domain, _rank) in topology.items():
        by_domain.setdefault(domain or UNKNOWN_DOMAIN, []).append(node)
    unknown = sorted(by_domain.pop(UNKNOWN_DOMAIN, []), key=lambda n: _order(topology, n))
    # Step 2: topological order inside and across domains.
    for nodes in by_domain.values():
        nodes.sort(key=lambda n: _order(topology, n))
    domains = sorted(by_domain, key=lambda d: (_order(topology, by_domain[d][0])[:2], d))
    # Step 3: complete segments, greedily.
    wanted = num_nodes // segment_size
    segments: list[tuple[str, ...]] = []
    seg_domains: list[str] = []
    remainder: list[str] = []
    for domain in domains:
        nodes = by_domain[domain]
        taken = 0
        for k in range(len(nodes) // segment_size):
            if len(segments) == wanted:
                break
            segments.append(tuple(nodes[k * segment_size : (k + 1) * segment_size]))
            seg_domains.append(domain)
            taken = (k + 1) * segment_size
        remainder.extend(nodes[taken:])
    if len(segments) < wanted:
        counts = ", ".join(
            f"{d}: {plural(len(by_domain[d]), 'node')} → {len(by_domain[d]) // segment_size}"
            for d in domains
        )
        raise Infeasible(
            f"{plural(num_nodes, 'node')} need {wanted} complete NVLink segments of "
            f"{segment_size}; "
            f"only {len(segments)} can be formed ({counts or 'no NVLink domain registered'}; "
            f"{plural(len(unknown), 'node')} without a known domain excluded)"
        )
    return SegmentSelection(
        segments=tuple(segments),
        domains=tuple(seg_domains),
        remainder=tuple(remainder + unknown),
    )


# -- what a node registers ---------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeResources:
    """The custom resources one node should pass to ``ray start --resources``."""

    domain: str | None
    """The node's NVLink domain key, None when it has none."""
    topo_rank: int
    """>= 1."""
    topo_rank_source: str
    """Where the rank came from: SLURM_TOPOLOGY_ADDR, SLURM_PROCID, hostname or default."""

    def as_resources(self) -> dict[str, float]:
        """``{"nvlink_domain_<key>": 1, "topo_rank": N}`` (the domain only when known)."""
        res: dict[str, float] = {TOPO_RANK_RESOURCE: float(self.topo_rank)}
        if self.domain is not None:
            res[domain_resource(self.domain)] = 1.0
        return res


def topo_rank_from(env: Mapping[str, str], hostname: str) -> tuple[int, str]:
    """A node's topological rank (>= 1) and its source.

    ``SLURM_TOPOLOGY_ADDR`` (``s1.s12.node3``): the numbers of its components,
    each padded to four digits and concatenated, so switch order comes first;
    else ``SLURM_PROCID``; else the last number in the host name (of at most
    15 digits); else 0. Ray drops zero-valued resources, so the result is that
    number plus one. Raises :class:`InputError` when a SLURM variable gives a
    rank above :data:`MAX_RANK`.
    """
    addr = env.get("SLURM_TOPOLOGY_ADDR", "").strip()
    if addr:
        parts = [re.findall(r"[0-9]+", p) for p in addr.split(".")]
        if any(parts):
            digits = "".join(f"{p[-1].lstrip('0') or '0':0>4}" if p else "0000" for p in parts)
            return _rank("SLURM_TOPOLOGY_ADDR", addr, digits), "SLURM_TOPOLOGY_ADDR"
    procid = env.get("SLURM_PROCID", "").strip()
    if re.fullmatch(r"[0-9]+", procid):
        return _rank("SLURM_PROCID", procid, procid), "SLURM_PROCID"
    found = re.findall(r"[0-9]+", hostname)
    if found and len(found[-1].lstrip("0")) <= 15:  # a longer number is no position
        return 1 + int(found[-1]), "hostname"
    return 1, "default"


def _rank(source: str, raw: str, digits: str) -> int:
    """``1 + int(digits)`` when that is at most :data:`MAX_RANK`; else :class:`InputError`."""
    digits = digits.lstrip("0") or "0"
    if len(digits) > 16 or int(digits) + 1 > MAX_RANK:
        raise InputError(source, raw, "gives a topological rank above 2**53; Ray cannot hold it")
    return 1 + int(digits)


def node_resources(
    nvidia_smi_q: str | None, env: Mapping[str, str], hostname: str
) -> NodeResources:
    """What a node registers, from its ``nvidia-smi -q`` text (None: no NVIDIA GPU)."""
    domain = None if nvidia_smi_q is None else node_domain(parse_fabric(nvidia_smi_q))
    rank, source = topo_rank_from(env, hostname)
    return NodeResources(domain=domain, topo_rank=rank, topo_rank_source=source)


def local_node_resources(env: Mapping[str, str], timeout_s: float = 20.0) -> NodeResources:
    """:func:`node_resources` of this machine (runs ``nvidia-smi -q`` when it exists)."""
    import socket  # the I/O edge of an otherwise pure module

    text: str | None = None
    exe = shutil.which("nvidia-smi")
    if exe is not None:
        try:
            done = subprocess.run(
                [exe, "-q"], capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            done = None
        if done is not None and done.returncode == 0:
            text = done.stdout
    return node_resources(text, env, socket.gethostname())


# -- live Ray ----------------------------------------------------------------------------


def _label_rank(node: dict[str, object]) -> int | None:
    """The ``topo_rank`` label of a ``ray.nodes()`` record (``ray start --labels``), if any."""
    labels = node.get("Labels") or {}
    raw = labels.get(TOPO_RANK_RESOURCE) if isinstance(labels, dict) else None
    if raw is None:
        return None
    text = str(raw).strip()
    if not re.fullmatch(r"[0-9]{1,16}", text) or int(text) > MAX_RANK:
        raise InputError(
            f"node {node.get('NodeID')}.labels.{TOPO_RANK_RESOURCE}",
            raw,
            "must be an integer in [0, 2**53]",
        )
    return int(text)


def topology_from_nodes(nodes: list[dict[str, object]]) -> dict[str, tuple[str, int | None]]:
    """node id → (domain, rank) from ``ray.nodes()`` records; dead nodes skipped.

    The rank is the ``topo_rank`` resource, else the ``topo_rank`` label.
    """
    topology: dict[str, tuple[str, int | None]] = {}
    for node in nodes:
        if not node.get("Alive"):
            continue
        resources = node.get("Resources") or {}
        assert isinstance(resources, dict)
        domains = sorted(k for k in resources if k.startswith(DOMAIN_RESOURCE_PREFIX))
        domain = domains[0][len(DOMAIN_RESOURCE_PREFIX) :] if len(domains) == 1 else UNKNOWN_DOMAIN
        rank = resources.get(TOPO_RANK_RESOURCE)
        found = _label_rank(node) if rank is None else int(rank)
        topology[str(node["NodeID"])] = (domain, found)
    return topology


def get_ray_cluster_topology() -> dict[str, tuple[str, int | None]]:
    """node id → (NVLink domain, topo_rank) of every live node of the connected cluster.

    A node without a domain resource (or with several) is in ``unknown``;
    without a ``topo_rank`` resource or label its rank is None (ordered last).
    """
    from stowplan.cluster.ray_runtime import require_ray

    ray = require_ray()
    return topology_from_nodes(ray.nodes())
