"""Beyond the fleets whose stage counts are searched in full, a certificate's least bound
is refined only while the plan is more than 1 % above it."""

from __future__ import annotations

import pytest

from stowplan import Constraints, Plan, lookup, plan
from stowplan.planner.strategies import cycle
from tests.common.identical_nodes import fleet_with_copies


def _certificate(p: Plan) -> str:
    return next(n for n in p.rationale.notes if n.startswith("certificate"))


def _bound(p: Plan) -> float:
    """The certificate's bound in tokens/s (its optimum where it is proven)."""
    text = _certificate(p).split(" vs ")[1]
    return float(text.split()[1].rstrip(","))


def _gap(p: Plan) -> float:
    return float(_certificate(p).split("gap ")[1].split("%")[0]) / 100


def test_a_large_fleets_bound_within_one_percent_is_not_refined_further(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nodes = fleet_with_copies(0, 100, 0.3)
    assert len(nodes) > cycle.COUNT_SEARCH_NODES
    model, constraints = lookup("llama3.1:405b-q4_0"), Constraints(batch=16)
    kept = plan(model, nodes, constraints)
    within = cycle.REFINED_GAP
    monkeypatch.setattr(cycle, "REFINED_GAP", 0.0)
    refined = plan(model, nodes, constraints)
    # The same plan; refined to the end, its optimum proven; stopped within 1 %.
    assert kept.assignments == refined.assignments
    assert "vs optimum" in _certificate(refined)
    assert "vs bound" in _certificate(kept)
    assert 0 < _gap(kept) <= within
    assert _bound(kept) > _bound(refined)


def test_fleets_up_to_the_full_search_are_refined_to_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nodes = fleet_with_copies(0, 100, 0.3)[: cycle.COUNT_SEARCH_NODES]
    model, constraints = lookup("llama3.1:405b-q4_0"), Constraints(batch=16)
    kept = plan(model, nodes, constraints)
    monkeypatch.setattr(cycle, "REFINED_GAP", 0.0)
    assert _certificate(plan(model, nodes, constraints)) == _certificate(kept)
