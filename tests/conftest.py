"""Shared test settings: the hypothesis profiles.

Shared helpers live in :mod:`tests.common`; the paths are re-exported here only
for the README and docs tests, which still read them from this module.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

from tests.common.paths import EXAMPLES, FIXTURES, ROOT

__all__ = ["EXAMPLES", "FIXTURES", "ROOT"]

settings.register_profile(
    "dev", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
