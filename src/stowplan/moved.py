"""Names that moved: an old module path or keyword keeps working, with a warning naming
the new one.

A module whose names now live elsewhere ends in::

    __getattr__ = moved(__name__, {"plan_employment": "stowplan.planner.residency"})

and ``old.plan_employment`` then warns (:class:`DeprecationWarning`) and returns the name
from its new module.  A function whose keyword was renamed is decorated with
``@renamed_keywords(tp="tensor_parallel")``: ``f(tp=2)`` then warns and calls
``f(tensor_parallel=2)``.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = ["moved", "renamed_keywords"]

_F = TypeVar("_F", bound=Callable[..., Any])


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


def renamed_keywords(**renames: str) -> Callable[[_F], _F]:
    """A decorator: each keyword ``old`` of ``old="new"`` is still accepted for ``new``,
    with a :class:`DeprecationWarning` naming ``new``; giving both is a :class:`TypeError`."""

    def decorate(fn: _F) -> _F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if kwargs:
                for old, new in renames.items():
                    if old not in kwargs:
                        continue
                    if new in kwargs:
                        raise TypeError(
                            f"{fn.__qualname__}() got both {new}= and its former name {old}="
                        )
                    warnings.warn(
                        f"{fn.__qualname__}({old}=...) is deprecated; use {new}=",
                        DeprecationWarning,
                        stacklevel=2,
                    )
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate
