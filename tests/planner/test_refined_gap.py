"""How far a certificate's least bound is refined: to the end on small fleets, within
0.01 % up to the fleets whose stage counts are searched in full, within 1 % beyond."""

from __future__ import annotations

import pytest

from stowplan import Constraints, Plan, lookup, plan
from stowplan.plan import Certificate
from stowplan.planner.strategies import cycle
from tests.common.identical_nodes import fleet_with_copies
from tests.common.seeded import seeded_cluster


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


def _proof(p: Plan) -> Certificate:
    assert p.rationale.certificate is not None
    return p.rationale.certificate


def test_fleets_up_to_proven_nodes_are_refined_to_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nodes = seeded_cluster(6, cycle.PROVEN_NODES)
    model, constraints = lookup("llama3.1:405b-q4_0"), Constraints(batch=16)
    proven = _proof(plan(model, nodes, constraints))
    assert proven.exact and proven.gap == 0.0
    # Held to the gap of larger fleets, the plan stops short of its proof, within it.
    monkeypatch.setattr(cycle, "PROVEN_NODES", cycle.PROVEN_NODES - 1)
    near = _proof(plan(model, nodes, constraints))
    assert not near.exact
    assert 0 < near.gap <= cycle.NEAR_GAP
    assert proven.value * (1 - cycle.NEAR_GAP) <= near.value <= proven.value
    assert near.bound >= proven.bound


def test_fleets_up_to_the_full_search_stop_within_a_hundredth_of_a_percent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nodes = seeded_cluster(7, cycle.COUNT_SEARCH_NODES)
    assert len(nodes) > cycle.PROVEN_NODES
    model, constraints = lookup("llama3.1:70b"), Constraints(batch=16)
    planned = plan(model, nodes, constraints)
    kept = _proof(planned)
    assert not kept.exact
    assert 0 < kept.gap <= cycle.NEAR_GAP
    # A gap that rounds to 0.00 % reads as below 0.01 %, not as a proof.
    assert kept.gap < 5e-5
    assert "vs bound" in _certificate(planned) and "gap < 0.01%" in _certificate(planned)
    monkeypatch.setattr(cycle, "NEAR_GAP", 0.0)
    proven = plan(model, nodes, constraints)
    refined = _proof(proven)
    # Refined to the end: proven, and no faster plan than the one kept.
    assert refined.exact and refined.gap == 0.0
    assert "vs optimum" in _certificate(proven) and "gap 0.00%" in _certificate(proven)
    assert refined.value == pytest.approx(kept.value, rel=1e-12)
    assert kept.bound > refined.bound
