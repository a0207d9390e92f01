"""A cost model's evaluations of the pipelines the searches score, each computed once.

:meth:`CostModel.evaluate` and :meth:`CostModel.evaluate_here` are pure (a cost model is
never changed once handed out): the searches, their peers and the certificate score many
pipelines more than once (each stage count's candidates against the best in hand, the
bisection's bounds, the ranking of the finalists), and read the kept evaluation again.
"""

from __future__ import annotations

from collections.abc import Sequence

from stowplan.cost import CostModel, Evaluation
from stowplan.planner.strategies.memo import PerModel

__all__ = ["evaluated", "evaluated_here"]

_Key = tuple[tuple[int, ...], tuple[int, ...]]


def _none(cm: CostModel) -> dict[_Key, Evaluation]:
    return {}


_cycles = PerModel(_none)
_here = PerModel(_none)


def evaluated(cm: CostModel, order: Sequence[int], bounds: Sequence[int]) -> Evaluation:
    """``cm.evaluate(order, bounds)``, kept per cost model."""
    kept = _cycles(cm)
    key = (tuple(order), tuple(bounds))
    found = kept.get(key)
    if found is None:
        found = kept[key] = cm.evaluate(order, bounds)
    return found


def evaluated_here(cm: CostModel, order: Sequence[int], bounds: Sequence[int]) -> Evaluation:
    """``cm.evaluate_here(order, bounds)``, kept per cost model."""
    kept = _here(cm)
    key = (tuple(order), tuple(bounds))
    found = kept.get(key)
    if found is None:
        found = kept[key] = cm.evaluate_here(order, bounds)
    return found
