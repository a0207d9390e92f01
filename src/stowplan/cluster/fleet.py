"""Fleet roles and fleet specifications (pure: no Ray).

A container declares its role with ``STOWPLAN_FLEET_ROLE``; the fleet's shape
comes from the other ``STOWPLAN_*`` variables:

=====================================  ==================================================
``STOWPLAN_FLEET_ROLE``                ``trainer`` / ``inference`` / ``sandbox`` (required)
``STOWPLAN_NUM_NODES``                 nodes, or concurrent episode slots for sandbox (required)
``STOWPLAN_GPUS_PER_NODE``             GPUs per node: ``0`` for sandbox, ``> 0`` otherwise
``STOWPLAN_PG_STRATEGY``               ``SPREAD`` / ``PACK`` / ``STRICT_PACK`` (default per role)
``STOWPLAN_MAX_COLOCATED_WORKER_GROUPS``  CPUs per bundle (default 1)
``STOWPLAN_SEGMENT_SIZE``              nodes per NVLink segment (default: none)
=====================================  ==================================================
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from stowplan.errors import InputError
from stowplan.quantities.checks import check_choice, check_int
from stowplan.quantities.limits import MAX_GPUS_PER_NODE, MAX_NODES

__all__ = [
    "ENV_GPUS_PER_NODE",
    "ENV_MAX_COLOCATED",
    "ENV_NUM_NODES",
    "ENV_PG_STRATEGY",
    "ENV_ROLE",
    "ENV_SEGMENT_SIZE",
    "FleetRole",
    "FleetSpec",
    "PlacementStrategy",
    "default_strategy",
    "get_fleet_role",
]

ENV_ROLE = "STOWPLAN_FLEET_ROLE"
ENV_NUM_NODES = "STOWPLAN_NUM_NODES"
ENV_GPUS_PER_NODE = "STOWPLAN_GPUS_PER_NODE"
ENV_PG_STRATEGY = "STOWPLAN_PG_STRATEGY"
ENV_MAX_COLOCATED = "STOWPLAN_MAX_COLOCATED_WORKER_GROUPS"
ENV_SEGMENT_SIZE = "STOWPLAN_SEGMENT_SIZE"


class FleetRole(StrEnum):
    """What a fleet does; decides its default placement strategy."""

    TRAINER = "trainer"
    INFERENCE = "inference"
    SANDBOX = "sandbox"


class PlacementStrategy(StrEnum):
    """Ray placement-group strategies a fleet may ask for."""

    SPREAD = "SPREAD"
    PACK = "PACK"
    STRICT_PACK = "STRICT_PACK"


_DEFAULT_STRATEGY = {
    FleetRole.TRAINER: PlacementStrategy.SPREAD,
    FleetRole.INFERENCE: PlacementStrategy.PACK,
    FleetRole.SANDBOX: PlacementStrategy.SPREAD,
}


def default_strategy(role: FleetRole) -> PlacementStrategy:
    """trainer → SPREAD (one group per node), inference → PACK (TP ranks together),
    sandbox → SPREAD (episode slots over CPU nodes)."""
    return _DEFAULT_STRATEGY[role]


def _role(value: object) -> FleetRole:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise InputError(
            ENV_ROLE,
            value,
            f"is required; set it to one of {', '.join(r.value for r in FleetRole)}",
        )
    return check_choice(ENV_ROLE, value, FleetRole, normalise=lambda v: v.strip().lower())


def get_fleet_role(env: Mapping[str, str] | None = None) -> FleetRole:
    """The role named by ``STOWPLAN_FLEET_ROLE``; :class:`InputError` when missing or unknown."""
    source = os.environ if env is None else env
    return _role(source.get(ENV_ROLE))


def _parse_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        if not raw.isascii():
            raise ValueError(raw)
        return int(raw.strip())
    except ValueError:
        raise InputError(name, raw, "must be an integer") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetSpec:
    """The shape of one fleet; invariants are checked at construction.

    Error messages name the environment variable that sets each field.
    """

    role: FleetRole
    num_nodes: int
    """Nodes in the fleet (sandbox: concurrent episode slots)."""
    gpus_per_node: int
    """GPUs per node; 0 for the CPU-only sandbox fleet, > 0 for the GPU fleets."""
    placement_strategy: PlacementStrategy | None = None
    """Fleet-level strategy; None → the role's default (see :func:`default_strategy`)."""
    max_colocated_worker_groups: int = 1
    """CPUs reserved per bundle, one per worker group sharing the bundle."""
    segment_size: int | None = None
    """Nodes per NVLink segment; None → topology-agnostic placement."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "role", _role(self.role))
        check_int(ENV_NUM_NODES, self.num_nodes, minimum=1, maximum=MAX_NODES)
        check_int(ENV_GPUS_PER_NODE, self.gpus_per_node, minimum=0, maximum=MAX_GPUS_PER_NODE)
        if self.role is FleetRole.SANDBOX and self.gpus_per_node != 0:
            raise InputError(
                ENV_GPUS_PER_NODE,
                self.gpus_per_node,
                "must be 0 for the sandbox fleet (it is CPU-only)",
            )
        if self.role is not FleetRole.SANDBOX and self.gpus_per_node == 0:
            raise InputError(
                ENV_GPUS_PER_NODE,
                self.gpus_per_node,
                f"must be > 0 for the {self.role.value} fleet",
            )
        if self.placement_strategy is None:
            object.__setattr__(self, "placement_strategy", default_strategy(self.role))
        else:
            strategy = check_choice(
                ENV_PG_STRATEGY,
                self.placement_strategy,
                PlacementStrategy,
                normalise=lambda v: v.strip().upper(),
            )
            object.__setattr__(self, "placement_strategy", strategy)
        check_int(ENV_MAX_COLOCATED, self.max_colocated_worker_groups, minimum=1, maximum=MAX_NODES)
        if self.segment_size is not None:
            check_int(ENV_SEGMENT_SIZE, self.segment_size, minimum=1, maximum=MAX_NODES)
            if self.role is FleetRole.SANDBOX:
                raise InputError(
                    ENV_SEGMENT_SIZE,
                    self.segment_size,
                    "must be unset for the sandbox fleet (it uses no NVLink)",
                )
            if self.num_nodes % self.segment_size:
                raise InputError(
                    ENV_SEGMENT_SIZE,
                    self.segment_size,
                    f"must divide {ENV_NUM_NODES}={self.num_nodes} "
                    f"({self.num_nodes} % {self.segment_size} = "
                    f"{self.num_nodes % self.segment_size})",
                )

    @property
    def strategy(self) -> PlacementStrategy:
        """The resolved fleet-level strategy."""
        assert self.placement_strategy is not None
        return self.placement_strategy

    @property
    def total_gpus(self) -> int:
        """GPUs in the whole fleet."""
        return self.num_nodes * self.gpus_per_node

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> FleetSpec:
        """Build from the ``STOWPLAN_*`` variables of ``env`` (default: the process environment)."""
        source = os.environ if env is None else env
        role = get_fleet_role(source)
        num_nodes = _parse_int(source, ENV_NUM_NODES)
        if num_nodes is None:
            raise InputError(ENV_NUM_NODES, None, "is required (an integer >= 1)")
        gpus = _parse_int(source, ENV_GPUS_PER_NODE)
        if gpus is None:
            if role is not FleetRole.SANDBOX:
                raise InputError(
                    ENV_GPUS_PER_NODE, None, f"is required for the {role.value} fleet (> 0)"
                )
            gpus = 0
        strategy_raw = source.get(ENV_PG_STRATEGY, "").strip()
        colocated = _parse_int(source, ENV_MAX_COLOCATED)
        return cls(
            role=role,
            num_nodes=num_nodes,
            gpus_per_node=gpus,
            placement_strategy=strategy_raw or None,  # type: ignore[arg-type]  # validated
            max_colocated_worker_groups=1 if colocated is None else colocated,
            segment_size=_parse_int(source, ENV_SEGMENT_SIZE),
        )
