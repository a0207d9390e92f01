"""Joining a Ray cluster: :func:`init_ray` and the fleet role.

Two modes:

* **data centre** — ``RAY_ADDRESS`` is set: attach to that cluster, always;
* **local** — no ``RAY_ADDRESS``: join the local head of the same set of
  ``CUDA_VISIBLE_DEVICES`` (it carries a custom resource
  ``stowplan_devices_<sorted ids>``) — the one this process is connected to,
  or the one an earlier process started and recorded
  (:mod:`stowplan.cluster.head`) — or start a detached head bound to
  127.0.0.1.  :func:`~stowplan.cluster.ray_runtime.prepare_local_ray` runs before
  Ray is imported or started: the variables of
  :data:`~stowplan.cluster.ray_runtime.LOCAL_START_ENV` are set unless the
  environment already sets them (loopback only, no auth token).

Either way the process environment is forwarded to every Ray worker through
the job's runtime env, except variables that break or mislead workers:
launcher variables (``OMPI_*``, ``PMI_*``, ``PMIX_*``, ``MPI_*``, ``I_MPI_*``,
``HYDRA_*``, ``MV2_*``, ``SLURM_*``: a worker that sees them believes it is an
MPI/SLURM rank and tries to join that job), ``RAY_*`` (Ray's own settings for
this process) and the device masks (``CUDA_VISIBLE_DEVICES`` and kin: Ray sets
them per worker from the GPUs it assigns).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from stowplan.cluster.fleet import FleetRole, get_fleet_role
from stowplan.cluster.head import (
    discard_local_head,
    head_alive,
    head_lock,
    read_local_head,
    start_local_head,
)
from stowplan.cluster.ray_runtime import prepare_local_ray, require_ray

__all__ = [
    "STRIPPED_ENV_NAMES",
    "STRIPPED_ENV_PREFIXES",
    "InitMode",
    "RayInit",
    "device_tag",
    "get_fleet_role",
    "init_ray",
    "worker_env",
]

log = logging.getLogger("stowplan.cluster")

STRIPPED_ENV_PREFIXES = (
    "OMPI_",
    "PMI_",
    "PMIX_",
    "MPI_",
    "I_MPI_",
    "HYDRA_",
    "MV2_",
    "SLURM_",
    "RAY_",
)
"""Variables with these prefixes are not forwarded to Ray workers."""
STRIPPED_ENV_NAMES = frozenset(
    {"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "PMI_RANK", "PMI_SIZE"}
)
"""Variables never forwarded to Ray workers."""
DEVICE_TAG_PREFIX = "stowplan_devices_"


class InitMode(StrEnum):
    """How :func:`init_ray` reached a cluster."""

    ATTACHED = "attached"
    """``RAY_ADDRESS`` named a cluster; this process attached to it."""
    REUSED = "reused"
    """The local head of the same device set was running (in this process or recorded
    by an earlier one) and this process joined it."""
    STARTED = "started"
    """A new detached local head was started."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RayInit:
    """What :func:`init_ray` did."""

    mode: InitMode
    address: str
    """The GCS address of the cluster."""
    device_tag: str | None
    """The local cluster's device tag (None when attached)."""
    forwarded: tuple[str, ...]
    """Names of the variables forwarded to workers, sorted."""
    stripped: tuple[str, ...]
    """Names of the variables withheld from workers, sorted."""
    role: FleetRole | None
    """``STOWPLAN_FLEET_ROLE`` when set (validated), else None."""


def device_tag(cuda_visible_devices: str | None) -> str:
    """``stowplan_devices_<ids>``: the device list sorted (numbers numerically), ``none`` if empty.

    ``"3,1"`` and ``"1,3"`` give the same tag ``stowplan_devices_1_3``.
    """
    ids = [x.strip() for x in (cuda_visible_devices or "").split(",") if x.strip()]
    ids.sort(key=lambda x: (0, int(x), "") if x.isdigit() else (1, 0, x))
    cleaned = ["".join(c if c.isalnum() or c == "-" else "-" for c in i) for i in ids]
    return DEVICE_TAG_PREFIX + ("_".join(cleaned) or "none")


def worker_env(env: Mapping[str, str]) -> tuple[dict[str, str], tuple[str, ...]]:
    """The variables to forward to workers and the names withheld (both sorted)."""
    forwarded: dict[str, str] = {}
    stripped: list[str] = []
    for key in sorted(env):
        if key in STRIPPED_ENV_NAMES or key.startswith(STRIPPED_ENV_PREFIXES):
            stripped.append(key)
        else:
            forwarded[key] = env[key]
    return forwarded, tuple(stripped)


def _gcs_address(ray: object) -> str:
    context = ray.get_runtime_context()  # type: ignore[attr-defined]
    return str(getattr(context, "gcs_address", ""))


def init_ray(
    env: Mapping[str, str] | None = None,
    *,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    object_store_memory: int | None = None,
) -> RayInit:
    """Attach to or start a Ray cluster for this process (see the module docs).

    ``env`` defaults to the process environment.  Raises ``DependencyError``
    when Ray is not installed and ``InputError`` for an unknown fleet role.
    """
    source = dict(os.environ if env is None else env)
    ray = require_ray()
    role = get_fleet_role(source) if source.get("STOWPLAN_FLEET_ROLE") else None
    forwarded, stripped = worker_env(source)
    runtime_env = {"env_vars": forwarded}
    address = source.get("RAY_ADDRESS", "").strip()

    def result(mode: InitMode, tag: str | None) -> RayInit:
        return RayInit(
            mode=mode,
            address=_gcs_address(ray),
            device_tag=tag,
            forwarded=tuple(forwarded),
            stripped=stripped,
            role=role,
        )

    if address:
        if ray.is_initialized():
            if _gcs_address(ray) == address:
                return result(InitMode.ATTACHED, None)
            ray.shutdown()
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
        log.info("attached to Ray cluster at %s", address)
        return result(InitMode.ATTACHED, None)
    tag = device_tag(source.get("CUDA_VISIBLE_DEVICES"))
    ray = prepare_local_ray()
    if ray.is_initialized():
        if ray.cluster_resources().get(tag):
            log.info("reusing the local Ray cluster %s", tag)
            return result(InitMode.REUSED, tag)
        log.info("connected to a cluster of another device set; switching to %s", tag)
        ray.shutdown()
    with head_lock(tag):
        head = read_local_head(tag)
        if head is not None and head_alive(head):
            ray.init(address=head.address, runtime_env=runtime_env, log_to_driver=False)
            if ray.cluster_resources().get(tag):
                log.info("reusing the local Ray head %s at %s", tag, head.address)
                return result(InitMode.REUSED, tag)
            ray.shutdown()
        if head is not None:
            log.info(
                "the recorded local Ray head %s at %s is gone; starting a new one",
                tag,
                head.address,
            )
            discard_local_head(head)
        head = start_local_head(
            tag, num_cpus=num_cpus, num_gpus=num_gpus, object_store_memory=object_store_memory
        )
        ray.init(address=head.address, runtime_env=runtime_env, log_to_driver=False)
    log.info("started a local Ray head %s at %s", tag, head.address)
    return result(InitMode.STARTED, tag)
