"""Errors of the Ray layer (all under :class:`~stowplan.errors.StowplanError`).

::

    StowplanError
    └── PlacementError            a placement group could not be made
        ├── InsufficientResources  the cluster lacks what the groups ask for (checked first)
        ├── PlacementInfeasible    Ray reports no live node can ever hold a bundle
        └── PlacementTimeout       not ready within the timeout (also a TimeoutError)

Every path that raises one of these has already removed the groups it created.
"""

from __future__ import annotations

from stowplan.errors import StowplanError

__all__ = ["InsufficientResources", "PlacementError", "PlacementInfeasible", "PlacementTimeout"]


class PlacementError(StowplanError):
    """A placement group could not be created; no group of the request is left behind."""


class InsufficientResources(PlacementError):
    """``missing`` maps each short resource to ``(needed, available)``."""

    def __init__(self, what: str, missing: dict[str, tuple[float, float]], detail: str) -> None:
        self.what = what
        self.missing = missing
        super().__init__(f"{what} cannot be placed: {detail}")


class PlacementInfeasible(PlacementError):
    """Ray marked the group INFEASIBLE: no live node (set) can ever satisfy it."""

    def __init__(self, name: str, waited_s: float, detail: str) -> None:
        self.name = name
        self.waited_s = waited_s
        super().__init__(detail)


class PlacementTimeout(PlacementError, TimeoutError):
    """The group was not ready after ``timeout_s`` seconds."""

    def __init__(self, name: str, timeout_s: float, detail: str) -> None:
        self.name = name
        self.timeout_s = timeout_s
        super().__init__(detail)
