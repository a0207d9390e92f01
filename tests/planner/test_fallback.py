"""The pipeline a search falls back on when its own finds none: the other search's, and
on small clusters the exact subset DP's at one stream or where the other search found
none either (at several sequences the DP's least time per token is no candidate for the
cycle beside a search's pipeline)."""

from __future__ import annotations

from typing import Any

import pytest

import stowplan.planner as planner
from stowplan import Constraints, Metric
from stowplan.models import resolve_model
from stowplan.planner.certify import key_of
from stowplan.planner.problem import prepare
from tests.common.gpu_fleets import single_gpu_kinds


def _spied(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []
    real = planner.solve_exact

    def spy(*args: Any, **kwargs: Any) -> Any:
        got = real(*args, **kwargs)
        calls.append(got.pipeline)
        return got

    monkeypatch.setattr(planner, "solve_exact", spy)
    return calls


def test_at_several_sequences_a_searchs_pipeline_needs_no_exact_solve(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    problem = prepare(resolve_model("llama3.1:70b"), single_gpu_kinds(6, 3), Constraints(batch=16))
    cm = problem.cost_model()
    calls = _spied(monkeypatch)
    got = planner._fallback(problem, cm, Metric.LATENCY)
    searched = planner.throughput_search(problem, cm)[0]
    assert got is not None and searched is not None
    assert calls == []
    assert key_of(cm, Metric.LATENCY, got) == key_of(cm, Metric.LATENCY, searched)


def test_at_one_stream_the_exact_solve_is_a_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    problem = prepare(resolve_model("llama3.1:70b"), single_gpu_kinds(6, 3), Constraints(batch=1))
    cm = problem.cost_model()
    calls = _spied(monkeypatch)
    got = planner._fallback(problem, cm, Metric.LATENCY)
    assert got is not None and len(calls) == 1 and calls[0] is not None
    # The best of the two: no worse than the exact solve's least time per token.
    assert key_of(cm, Metric.LATENCY, got) <= key_of(cm, Metric.LATENCY, calls[0])


def test_where_no_search_finds_one_the_exact_solve_does(monkeypatch: pytest.MonkeyPatch) -> None:
    problem = prepare(resolve_model("llama3.1:70b"), single_gpu_kinds(6, 3), Constraints(batch=16))
    cm = problem.cost_model()
    calls = _spied(monkeypatch)
    monkeypatch.setattr(planner, "throughput_search", lambda *_: (None, False))
    got = planner._fallback(problem, cm, Metric.LATENCY)
    assert len(calls) == 1 and calls[0] is not None
    assert got is not None and list(got[0]) == list(calls[0][0])
    assert cm.fits_pipeline(*got)
