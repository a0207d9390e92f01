"""Lazy access to Ray, and the settings every local Ray cluster starts with.

:func:`require_ray` is the one import point; it names the extra when Ray is
missing. The settings are the ones measured for local clusters on loopback
(see the module docs of :mod:`stowplan.cluster.local`): they are shared by
:func:`~stowplan.cluster.bootstrap.init_ray`, the fake multi-node cluster and
the Ray test fixtures.
"""

from __future__ import annotations

import os
from types import MappingProxyType, ModuleType
from typing import Any

from stowplan.errors import DependencyError

__all__ = [
    "LOCAL_HEAD_ARGS",
    "LOCAL_START_ENV",
    "LOOPBACK_ENV",
    "OBJECT_STORE_BYTES",
    "prepare_local_ray",
    "require_ray",
]

LOOPBACK_ENV: MappingProxyType[str, str] = MappingProxyType(
    {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "disabled",
        "RAY_SCHEDULER_EVENTS": "0",
    }
)
"""Set before a local Ray starts: bind to 127.0.0.1 only, write no auth token,
no autoscaler noise for infeasible groups."""
LOCAL_START_ENV: MappingProxyType[str, str] = MappingProxyType(
    {**LOOPBACK_ENV, "RAY_raylet_start_wait_time_s": "120"}
)
"""Defaults of every local start: :data:`LOOPBACK_ENV` plus a raylet start-up wait of
120 s (Ray's 30 s default ends a start on a loaded machine with "The current node
timed out during startup")."""
OBJECT_STORE_BYTES = 80 << 20
"""Object store per local node: the demo and the tests move kilobytes."""
LOCAL_HEAD_ARGS: MappingProxyType[str, Any] = MappingProxyType(
    {
        "include_dashboard": False,
        "object_store_memory": OBJECT_STORE_BYTES,
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3},
    }
)
"""Head-node arguments of a local cluster: no dashboard, a small object store,
and a hard-killed node marked dead in about a second instead of fifteen."""


def require_ray() -> ModuleType:
    """The ``ray`` module; :class:`DependencyError` naming the ``ray`` extra when absent."""
    try:
        import ray
    except ImportError:
        raise DependencyError("ray", "ray") from None
    return ray


def prepare_local_ray() -> ModuleType:
    """Make Ray ready for a local start on 127.0.0.1, then return the ``ray`` module.

    Each variable of :data:`LOCAL_START_ENV` the process environment does not
    set yet is set first, so a user's explicit setting wins.  Ray reads
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` once, when it is first imported
    (``ray._private.ray_constants.ENABLE_RAY_CLUSTER``): the import below reads
    the variable now in force, and when Ray was imported earlier the constant
    is set from it here.
    """
    for key, value in LOCAL_START_ENV.items():
        os.environ.setdefault(key, value)
    ray = require_ray()
    from ray._private import ray_constants

    raw = os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"].strip().lower()
    ray_constants.ENABLE_RAY_CLUSTER = raw in ("1", "true")
    return ray
