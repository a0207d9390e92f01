"""Certificates with a pipeline's slowest stage and its trip bounded apart: the coupled
bound (:data:`~stowplan.planner.strategies.cycle.COUPLED`) and the pipeline it lays out
left out, for the tests of the searches and bounds it would otherwise stand in for; and
certificates without the candidates that reshape the best pipeline in hand (the splits
with each kind of node at either end, the order in hand split whole, the best pipeline's
neighbours split again), for the tests of the searches those would otherwise stand in
for."""

from __future__ import annotations

from typing import Any

import pytest

from stowplan.planner.strategies import cycle


def _certificates_with(monkeypatch: pytest.MonkeyPatch, **changed: Any) -> None:
    """Every certificate (``cycle.optimum``) from now on runs with ``changed`` arguments."""
    real = cycle.optimum

    def changed_optimum(*args: Any, **kwargs: Any) -> Any:
        return real(*args, **{**kwargs, **changed})

    monkeypatch.setattr(cycle, "optimum", changed_optimum)


def bounded_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every certificate from now on runs without its coupled bound, nor the candidates
    that reshape the best pipeline in hand (which may find what the coupled bound lays
    out)."""
    _certificates_with(monkeypatch, coupled=None, reshaped=False)


def not_reshaped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every certificate from now on runs without the candidates that reshape the best
    pipeline in hand."""
    _certificates_with(monkeypatch, reshaped=False)
