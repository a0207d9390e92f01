"""Real Ray on loopback: the environment every Ray test module runs under.

Settings from the measurements of Ray on these machines: bind to 127.0.0.1,
no auth token, a fresh temp dir per module, no autoscaler noise.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import pytest

from tests.common.ray_env import RAY_ENV


@pytest.fixture(scope="module")
def ray_env() -> Iterator[dict[str, str]]:
    """Set the loopback settings, a short fresh ``RAY_TMPDIR`` and a fresh stowplan cache
    dir (where detached local heads are recorded) for one module."""
    tmp = tempfile.mkdtemp(prefix="spray-", dir="/tmp")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STOWPLAN_CACHE_DIR", f"{tmp}/cache")
        for key, value in (RAY_ENV | {"RAY_TMPDIR": tmp}).items():
            mp.setenv(key, value)
        mp.delenv("RAY_ADDRESS", raising=False)
        yield RAY_ENV | {"RAY_TMPDIR": tmp}
    shutil.rmtree(tmp, ignore_errors=True)
