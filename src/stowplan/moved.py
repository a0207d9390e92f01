"""Names that moved: an old module path keeps working, with a warning naming the new one.

A module whose names now live elsewhere ends in::

    __getattr__ = moved(__name__, {"plan_employment": "stowplan.planner.residency"})

and ``old.plan_employment`` then warns (:class:`DeprecationWarning`) and returns the name
from its new module.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["moved"]


def moved(old: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``old`` whose ``names`` live in the modules they map to."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        new = names[name]
        warnings.warn(
            f"{old}.{name} is deprecated; import it from {new}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(new), name)

    return __getattr__
