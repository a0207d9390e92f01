"""Errors of the Ray layer, defined in :mod:`stowplan.errors` and re-exported here.

::

    ClusterError
    └── PlacementError            a placement group could not be made
        ├── InsufficientResources  the cluster lacks what the groups ask for (checked first)
        ├── PlacementInfeasible    Ray reports no live node can ever hold a bundle
        └── PlacementTimeout       not ready within the timeout (also a TimeoutError)

Every path that raises one of these has already removed the groups it created.
"""

from __future__ import annotations

from stowplan.errors import (
    InsufficientResources,
    PlacementError,
    PlacementInfeasible,
    PlacementTimeout,
)

__all__ = ["InsufficientResources", "PlacementError", "PlacementInfeasible", "PlacementTimeout"]
