"""Figures the searches derive from a cost model, computed once per model.

A cost model is never changed once handed out, so what a search reads off it (sorted
rates, stage-time tables, capacity figures) can be kept while the model lives and shared
by every stage count and range that asks for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar
from weakref import WeakKeyDictionary

from stowplan.cost import CostModel

__all__ = ["PerModel"]

T = TypeVar("T")


class PerModel(Generic[T]):
    """``build(cm)`` on the first call for each cost model ``cm``, then the same object
    while ``cm`` lives."""

    def __init__(self, build: Callable[[CostModel], T]) -> None:
        self._build = build
        self._kept: WeakKeyDictionary[CostModel, T] = WeakKeyDictionary()

    def __call__(self, cm: CostModel) -> T:
        found = self._kept.get(cm)
        if found is None:
            found = self._kept[cm] = self._build(cm)
        return found
