"""Certificates with a pipeline's slowest stage and its trip bounded apart: the coupled
bound (:data:`~stowplan.planner.strategies.cycle.COUPLED`) and the pipeline it lays out
left out, for the tests of the searches and bounds it would otherwise stand in for."""

from __future__ import annotations

from typing import Any

import pytest

from stowplan.planner.strategies import cycle


def bounded_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every certificate (``cycle.optimum``) from now on runs without its coupled bound."""
    real = cycle.optimum

    def apart(*args: Any, **kwargs: Any) -> Any:
        kwargs["coupled"] = None
        return real(*args, **kwargs)

    monkeypatch.setattr(cycle, "optimum", apart)
