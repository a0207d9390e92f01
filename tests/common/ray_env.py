"""The loopback settings every real-Ray test runs under: environment and head arguments."""

from __future__ import annotations

from stowplan.cluster.ray_runtime import LOCAL_HEAD_ARGS, LOCAL_START_ENV

RAY_ENV = dict(LOCAL_START_ENV)
HEAD_ARGS = dict(LOCAL_HEAD_ARGS)
