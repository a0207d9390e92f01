"""The virtual cluster: the placement groups a fleet's worker groups are built on.

One ``STRICT_PACK`` group per logical node keeps every bundle of that node on
one physical node (NVLink locality), whatever the fleet-level strategy.  When
a model replica (tp × pp) exceeds one node's GPUs, the replica gets one
*unified* group spanning nodes, with the fleet's strategy instead; once it is
placed, each bundle's node, GPU, NVLink domain and topological rank are read
back (:func:`bundle_places`) and ranks are handed out in
:func:`~stowplan.cluster.ranks.rank_order` (:meth:`RayVirtualCluster.rank_orders`),
so tensor-parallel peers sit on one domain and one node wherever Ray put the
bundles.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stowplan.cluster.errors import PlacementTimeout
from stowplan.cluster.fleet import FleetRole, FleetSpec, PlacementStrategy
from stowplan.cluster.groups import (
    check_available,
    create_placement_group,
    remove_groups,
)
from stowplan.cluster.nodes import NODE_ID_LABEL
from stowplan.cluster.parallelism import ParallelismSpec, validate_parallelism
from stowplan.cluster.ranks import BundlePlace, rank_order
from stowplan.cluster.ray_runtime import require_ray
from stowplan.cluster.topology import (
    Topology,
    get_ray_cluster_topology,
    select_segment_nodes,
    topology_from_nodes,
)
from stowplan.errors import InputError
from stowplan.host.fabric import domain_resource

__all__ = [
    "DOMAIN_PIN_AMOUNT",
    "GroupRequest",
    "RayVirtualCluster",
    "build_cluster",
    "bundle_places",
]

log = logging.getLogger("stowplan.cluster")

DOMAIN_PIN_AMOUNT = 0.001
"""Amount of ``nvlink_domain_<key>`` a pinned bundle asks for: a token that only
nodes of that domain have, small enough that a thousand bundles fit one node."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupRequest:
    """One placement group the virtual cluster will create."""

    name: str
    strategy: PlacementStrategy
    bundles: tuple[dict[str, float], ...]
    label_selectors: tuple[dict[str, str], ...] | None = None


class RayVirtualCluster:
    """Owns the placement groups of one fleet; call :meth:`_init_placement_groups` first.

    ``bundle_ct_per_node_list[i]`` is the bundle count of logical node ``i``;
    every bundle holds one GPU (when ``use_gpus``) and
    ``max_colocated_worker_groups`` CPUs.  ``unified_group_size`` (bundles per
    replica) switches to cross-node groups with ``placement_group_strategy``.
    ``node_domains[i]`` pins node ``i``'s bundles to an NVLink domain;
    ``node_ids[i]`` pins them to one Ray node (label ``ray.io/node-id``).
    """

    def __init__(
        self,
        bundle_ct_per_node_list: Sequence[int],
        *,
        use_gpus: bool = True,
        num_gpus_per_node: int = 1,
        max_colocated_worker_groups: int = 1,
        placement_group_strategy: PlacementStrategy | str = PlacementStrategy.SPREAD,
        name: str = "stowplan",
        unified_group_size: int | None = None,
        node_domains: Sequence[str | None] | None = None,
        node_ids: Sequence[str | None] | None = None,
        timeout_s: float = 60.0,
        log_every_s: float = 5.0,
    ) -> None:
        counts = list(bundle_ct_per_node_list)
        if not counts or any(
            isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in counts
        ):
            raise InputError(
                "bundle_ct_per_node_list", counts, "must be a non-empty list of integers >= 1"
            )
        if use_gpus and max(counts) > num_gpus_per_node:
            raise InputError(
                "bundle_ct_per_node_list",
                counts,
                f"a node holds at most num_gpus_per_node={num_gpus_per_node} GPU bundles",
            )
        for label, pins in (("node_domains", node_domains), ("node_ids", node_ids)):
            if pins is not None and len(pins) != len(counts):
                raise InputError(label, list(pins), f"must have one entry per node ({len(counts)})")
        total = sum(counts)
        if unified_group_size is not None and (
            unified_group_size < 1 or total % unified_group_size
        ):
            raise InputError(
                "unified_group_size",
                unified_group_size,
                f"must divide the {total} bundles of the cluster",
            )
        self.bundle_ct_per_node_list = tuple(counts)
        self.use_gpus = use_gpus
        self.num_gpus_per_node = num_gpus_per_node
        self.max_colocated_worker_groups = max_colocated_worker_groups
        self.placement_group_strategy = PlacementStrategy(placement_group_strategy)
        self.name = name
        self.unified_group_size = unified_group_size
        self.node_domains = None if node_domains is None else tuple(node_domains)
        self.node_ids = None if node_ids is None else tuple(node_ids)
        self.timeout_s = timeout_s
        self.log_every_s = log_every_s
        self._groups: list[Any] | None = None
        self._rank_orders: tuple[tuple[int, ...], ...] = ()

    # -- the plan of groups (pure) -----------------------------------------------------
    def _bundle(self, node: int) -> dict[str, float]:
        bundle: dict[str, float] = {"CPU": float(self.max_colocated_worker_groups)}
        if self.use_gpus:
            bundle["GPU"] = 1.0
        domain = None if self.node_domains is None else self.node_domains[node]
        if domain is not None:
            bundle[domain_resource(domain)] = DOMAIN_PIN_AMOUNT
        return bundle

    def _selector(self, node: int) -> dict[str, str]:
        node_id = None if self.node_ids is None else self.node_ids[node]
        return {} if node_id is None else {NODE_ID_LABEL: node_id}

    def group_requests(self) -> tuple[GroupRequest, ...]:
        """The groups :meth:`_init_placement_groups` creates, in order."""
        owners = [i for i, c in enumerate(self.bundle_ct_per_node_list) for _ in range(c)]
        pinned = self.node_ids is not None and any(self.node_ids)
        if self.unified_group_size is None:
            return tuple(
                GroupRequest(
                    name=f"{self.name}-node-{i}",
                    strategy=PlacementStrategy.STRICT_PACK,
                    bundles=tuple(self._bundle(i) for _ in range(c)),
                    label_selectors=tuple(self._selector(i) for _ in range(c)) if pinned else None,
                )
                for i, c in enumerate(self.bundle_ct_per_node_list)
            )
        size = self.unified_group_size
        return tuple(
            GroupRequest(
                name=f"{self.name}-replica-{r}",
                strategy=self.placement_group_strategy,
                bundles=tuple(self._bundle(owners[j]) for j in range(r * size, (r + 1) * size)),
                label_selectors=tuple(
                    self._selector(owners[j]) for j in range(r * size, (r + 1) * size)
                )
                if pinned
                else None,
            )
            for r in range(len(owners) // size)
        )

    # -- Ray ---------------------------------------------------------------------------
    def _init_placement_groups(self) -> list[Any]:
        """Create every group (once; later calls return the same groups).

        Checks the whole request against the available resources first; on any
        failure removes the groups it already created and re-raises.
        """
        if self._groups is not None:
            return self._groups
        requests = self.group_requests()
        check_available([b for r in requests for b in r.bundles], f"virtual cluster {self.name!r}")
        created: list[Any] = []
        try:
            for request in requests:
                created.append(
                    create_placement_group(
                        request.bundles,
                        request.strategy.value,
                        name=request.name,
                        timeout_s=self.timeout_s,
                        bundle_label_selector=request.label_selectors,
                        precheck=False,
                        log_every_s=self.log_every_s,
                    )
                )
            orders = tuple(
                self._rank_order(pg, request) for pg, request in zip(created, requests, strict=True)
            )
        except BaseException:
            remove_groups(created)
            raise
        self._groups = created
        self._rank_orders = orders
        log.info("virtual cluster %r: %d placement groups ready", self.name, len(created))
        return created

    def _rank_order(self, pg: Any, request: GroupRequest) -> tuple[int, ...]:
        """Bundle order of a placed group: by topology for a unified GPU group, else as asked."""
        if self.unified_group_size is None or not self.use_gpus:
            return tuple(range(len(request.bundles)))
        places = bundle_places(pg, timeout_s=self.timeout_s)
        order = rank_order(places)
        log.info(
            "virtual cluster %r, group %r ranks: %s",
            self.name,
            request.name,
            ", ".join(
                f"{r}→{places[i].node_id[:8]}:GPU{places[i].gpu_id}" for r, i in enumerate(order)
            ),
        )
        return order

    def rank_orders(self) -> tuple[tuple[int, ...], ...]:
        """Per group, its bundle indices in rank order: rank ``r`` of group ``g`` runs on
        bundle ``rank_orders()[g][r]``.  A unified GPU group is ordered by NVLink domain,
        topological rank, node and GPU (:func:`~stowplan.cluster.ranks.rank_order`); per-node
        groups keep their bundle order.  :class:`InputError` before
        :meth:`_init_placement_groups`."""
        self.get_placement_groups()
        return self._rank_orders

    def get_placement_groups(self) -> list[Any]:
        """The ready groups; :class:`InputError` before :meth:`_init_placement_groups`."""
        if self._groups is None:
            raise InputError(
                "RayVirtualCluster", self.name, "call _init_placement_groups() before using it"
            )
        return list(self._groups)

    @property
    def world_size(self) -> int:
        """Bundles of the cluster (GPUs when ``use_gpus``)."""
        return sum(self.bundle_ct_per_node_list)

    def shutdown(self) -> None:
        """Remove every group; safe to call twice (and before init)."""
        groups, self._groups = self._groups, None
        self._rank_orders = ()
        if groups:
            remove_groups(groups)


def _gpu_of_bundle() -> int:
    """The lowest GPU id Ray gave this task (its bundle's first GPU); 0 when not a number."""
    import ray

    ids = [str(g) for g in ray.get_gpu_ids()]
    numbers = [int(g) for g in ids if g.isdigit()]
    return min(numbers, default=0)


def bundle_places(pg: Any, *, timeout_s: float = 30.0) -> list[BundlePlace]:
    """Where each bundle of a ready placement group landed: node, GPU, NVLink domain, rank.

    The node comes from Ray's placement table and the domain and topological rank
    from that node's resources (or ``topo_rank`` label); the GPU id from one
    zero-CPU task per GPU bundle that holds the bundle's GPUs, so call this before
    anything else runs in the group.  Raises :class:`PlacementTimeout` when the
    tasks do not answer within ``timeout_s``.
    """
    ray = require_ray()
    from ray.util.placement_group import placement_group_table
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    table = placement_group_table(pg)
    bundles: dict[int, dict[str, float]] = table["bundles"]
    where: dict[int, str] = table["bundles_to_node_id"]
    topology = topology_from_nodes(ray.nodes())
    probe = ray.remote(num_cpus=0, max_retries=0)(_gpu_of_bundle)
    refs = {
        i: probe.options(
            num_gpus=float(b["GPU"]),
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=i
            ),
        ).remote()
        for i, b in sorted(bundles.items())
        if float(b.get("GPU", 0.0)) > 0
    }
    try:
        gpu_ids = dict(zip(refs, ray.get(list(refs.values()), timeout=timeout_s), strict=True))
    except ray.exceptions.GetTimeoutError:
        for ref in refs.values():
            ray.cancel(ref, force=True)
        name = table.get("name", "")
        raise PlacementTimeout(
            name, timeout_s, f"placement group {name!r}: bundles' GPUs not read in {timeout_s:g} s"
        ) from None
    places = []
    for i in sorted(bundles):
        node = str(where[i])
        domain, rank = topology.get(node, (None, None))
        places.append(
            BundlePlace(node_id=node, gpu_id=gpu_ids.get(i, 0), domain=domain, topo_rank=rank)
        )
    return places


def build_cluster(
    spec: FleetSpec,
    parallelism: ParallelismSpec | None = None,
    *,
    topology: Topology | None = None,
    name: str | None = None,
    timeout_s: float = 60.0,
) -> RayVirtualCluster:
    """The virtual cluster of a fleet (no group is created until ``_init_placement_groups``).

    * sandbox: one 1-bundle CPU group per episode slot;
    * trainer / inference: ``gpus_per_node`` GPU bundles per node, per-node STRICT_PACK
      groups, or, when ``parallelism`` makes a replica exceed a node, ``dp``
      unified groups of ``tp × pp`` bundles with the fleet's strategy;
    * ``spec.segment_size``: nodes are chosen as complete NVLink segments from
      ``topology`` (default: the live cluster's); each bundle is pinned to its
      segment's domain and to its selected node (label ``ray.io/node-id``).
    """
    label = name or spec.role.value
    if spec.role is FleetRole.SANDBOX:
        return RayVirtualCluster(
            [1] * spec.num_nodes,
            use_gpus=False,
            num_gpus_per_node=0,
            max_colocated_worker_groups=spec.max_colocated_worker_groups,
            placement_group_strategy=spec.strategy,
            name=label,
            timeout_s=timeout_s,
        )
    unified: int | None = None
    counts = [spec.gpus_per_node] * spec.num_nodes
    if parallelism is not None:
        check = validate_parallelism(parallelism, spec)
        if check.unified_group:
            unified = check.replica_gpus
            counts = _counts_for(check.world_size, spec.gpus_per_node)
    domains: list[str | None] | None = None
    node_ids: list[str | None] | None = None
    if spec.segment_size is not None:
        selection = select_segment_nodes(
            get_ray_cluster_topology() if topology is None else topology,
            spec.segment_size,
            spec.num_nodes,
        )
        per_node = [d for d in selection.domains for _ in range(spec.segment_size)]
        domains = list(per_node[: len(counts)])
        # The domain token alone would let a group land on a node of the domain that
        # was not selected; the node-id label pins each logical node to its own.
        node_ids = list(selection.selected[: len(counts)])
    return RayVirtualCluster(
        counts,
        use_gpus=True,
        num_gpus_per_node=spec.gpus_per_node,
        max_colocated_worker_groups=spec.max_colocated_worker_groups,
        placement_group_strategy=spec.strategy,
        name=label,
        unified_group_size=unified,
        node_domains=domains,
        node_ids=node_ids,
        timeout_s=timeout_s,
    )


def _counts_for(world: int, gpus_per_node: int) -> list[int]:
    """Fill whole nodes first: 20 GPUs on 8-GPU nodes → [8, 8, 4]."""
    full, rest = divmod(world, gpus_per_node)
    return [gpus_per_node] * full + ([rest] if rest else [])
