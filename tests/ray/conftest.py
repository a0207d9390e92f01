"""Real Ray on loopback: the environment every Ray test module runs under.

Settings from the measurements of Ray on these machines: bind to 127.0.0.1,
no auth token, a fresh temp dir per module, no autoscaler noise.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import pytest

from stowplan.cluster._ray import LOCAL_HEAD_ARGS, LOOPBACK_ENV

RAY_ENV = dict(LOOPBACK_ENV, RAY_raylet_start_wait_time_s="120")
HEAD_ARGS = dict(LOCAL_HEAD_ARGS)


@pytest.fixture(scope="module")
def ray_env() -> Iterator[dict[str, str]]:
    """Set the loopback settings and a short fresh ``RAY_TMPDIR`` for one module."""
    tmp = tempfile.mkdtemp(prefix="spray-", dir="/tmp")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in (RAY_ENV | {"RAY_TMPDIR": tmp}).items():
            mp.setenv(key, value)
        mp.delenv("RAY_ADDRESS", raising=False)
        yield RAY_ENV | {"RAY_TMPDIR": tmp}
    shutil.rmtree(tmp, ignore_errors=True)
