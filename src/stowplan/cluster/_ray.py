"""Lazy access to Ray: one import point that names the extra when Ray is missing."""

from __future__ import annotations

from types import ModuleType

from stowplan.errors import DependencyError

__all__ = ["require_ray"]


def require_ray() -> ModuleType:
    """The ``ray`` module; :class:`DependencyError` naming the ``ray`` extra when absent."""
    try:
        import ray
    except ImportError:
        raise DependencyError("ray", "ray") from None
    return ray
