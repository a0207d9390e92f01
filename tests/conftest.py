"""Shared test settings: the hypothesis profiles and a session home (shared helpers
live in :mod:`tests.common`).

Every folder the code reads from the environment for a home or a cache
(``HOME``, ``XDG_CACHE_HOME``, ``XDG_CONFIG_HOME``, ``STOWPLAN_HOME``,
``STOWPLAN_CACHE_DIR``) points into one temporary folder for the whole session, set
before any test module is imported: no test writes into the user's home.  The real
values are kept in ``STOWPLAN_TEST_REAL_HOME`` for the test that proves it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings

settings.register_profile(
    "dev", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


SESSION_HOME_VARS = (
    "HOME",
    "XDG_CACHE_HOME",
    "XDG_CONFIG_HOME",
    "STOWPLAN_HOME",
    "STOWPLAN_CACHE_DIR",
)


def _isolate_home() -> None:
    if "STOWPLAN_TEST_SESSION_HOME" in os.environ:  # a nested run keeps the outer one
        return
    os.environ.setdefault("STOWPLAN_TEST_REAL_HOME", str(Path.home()))
    home = Path(tempfile.mkdtemp(prefix="stowplan-test-home-"))
    os.environ["STOWPLAN_TEST_SESSION_HOME"] = str(home)
    os.environ["HOME"] = str(home)
    os.environ["XDG_CACHE_HOME"] = str(home / ".cache")
    os.environ["XDG_CONFIG_HOME"] = str(home / ".config")
    os.environ["STOWPLAN_HOME"] = str(home / ".stowplan")
    os.environ.pop("STOWPLAN_CACHE_DIR", None)  # the passport follows XDG_CACHE_HOME


_isolate_home()


def pytest_unconfigure(config: object) -> None:
    """The session home goes with the session."""
    home = os.environ.get("STOWPLAN_TEST_SESSION_HOME")
    if home and Path(home).name.startswith("stowplan-test-home-"):
        shutil.rmtree(home, ignore_errors=True)
