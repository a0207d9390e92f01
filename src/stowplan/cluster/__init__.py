"""Ray clusters: bootstrap, fleets, the virtual cluster, NVLink segments, pre-flight checks.

Ray is imported lazily: importing this package does not import Ray.
"""

from __future__ import annotations

from stowplan.cluster.bootstrap import InitMode, RayInit, device_tag, init_ray, worker_env
from stowplan.cluster.errors import (
    InsufficientResources,
    PlacementError,
    PlacementInfeasible,
    PlacementTimeout,
)
from stowplan.cluster.fleet import FleetRole, FleetSpec, PlacementStrategy, get_fleet_role
from stowplan.cluster.groups import create_placement_group, live_groups, remove_groups
from stowplan.cluster.head import LocalHead, stop_local_head
from stowplan.cluster.parallelism import ParallelismCheck, ParallelismSpec, validate_parallelism
from stowplan.cluster.ranks import BundlePlace, rank_order
from stowplan.cluster.topology import (
    UNKNOWN_DOMAIN,
    NodeResources,
    SegmentSelection,
    get_ray_cluster_topology,
    select_segment_nodes,
)
from stowplan.cluster.virtual_cluster import RayVirtualCluster, build_cluster, bundle_places

__all__ = [
    "UNKNOWN_DOMAIN",
    "BundlePlace",
    "FleetRole",
    "FleetSpec",
    "InitMode",
    "InsufficientResources",
    "LocalHead",
    "NodeResources",
    "ParallelismCheck",
    "ParallelismSpec",
    "PlacementError",
    "PlacementInfeasible",
    "PlacementStrategy",
    "PlacementTimeout",
    "RayInit",
    "RayVirtualCluster",
    "SegmentSelection",
    "build_cluster",
    "bundle_places",
    "create_placement_group",
    "device_tag",
    "get_fleet_role",
    "get_ray_cluster_topology",
    "init_ray",
    "live_groups",
    "rank_order",
    "remove_groups",
    "select_segment_nodes",
    "stop_local_head",
    "validate_parallelism",
    "worker_env",
]
