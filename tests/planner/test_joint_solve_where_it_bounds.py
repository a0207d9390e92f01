"""The exact joint solve over GPU groups runs where its value is the optimum (blocks
alike, GPU links no dearer than the network), under the exact strategy, and for a MoE
backbone; where blocks differ its pipelines are candidates only, and the plans without
it are the same."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from stowplan import Constraints, lookup, plan
from stowplan.calibration import resolve_calibration
from stowplan.planner.certify import is_backbone
from stowplan.planner.tensor import groups, joint
from stowplan.planner.tensor.joint import joint_runs
from tests.common.h100 import h100_nodes


def _planned(
    monkeypatch: pytest.MonkeyPatch,
    model: str,
    n: int,
    batch: int,
    calibrated: bool = True,
    prefix: str = "",
) -> Any:
    """The plan's stages (each node by its place in the fleet) and tokens/s, and whether
    each joint solve ran for a backbone; the nodes' ids start with ``prefix`` (a fleet of
    other ids is planned afresh, not from what a plan of the same problem kept)."""
    calls: list[bool] = []
    real = joint.solve_grouped

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(is_backbone())
        return real(*args, **kwargs)

    monkeypatch.setattr(joint, "solve_grouped", spy)
    c = Constraints(batch=batch, calibration=resolve_calibration("generic") if calibrated else None)
    nodes = [replace(node, id=prefix + node.id) for node in h100_nodes(n)]
    got = plan(lookup(model), nodes, c)
    place = {node.id: i for i, node in enumerate(nodes)}
    pred, cert = got.rationale.prediction, got.rationale.certificate
    assert pred is not None and cert is not None
    stages = [(place[a.node_id], a.block_range, a.gpu_indices) for a in got.assignments]
    return stages, pred.tokens_per_s, cert.gap, calls


@pytest.mark.parametrize(("model", "calibrated"), [("gpt-oss:120b", False), ("deepseek-v3", True)])
def test_where_blocks_differ_the_plan_needs_no_joint_solve(
    monkeypatch: pytest.MonkeyPatch, model: str, calibrated: bool
) -> None:
    # Four 8 x H100 nodes at 16 sequences: the bounds leave the plan unproven (0.72 %
    # and 0.16 %), where the solve ran when affordable.
    stages, rate, gap, calls = _planned(monkeypatch, model, 4, 16, calibrated)
    assert not any(c is False for c in calls)  # only the expert-parallel backbone's
    monkeypatch.setattr(
        groups,
        "_solve_runs",
        lambda problem, rule, exact, adjacent: joint_runs(problem, rule, exact),
    )
    before, rate_before, gap_before, calls_before = _planned(
        monkeypatch, model, 4, 16, calibrated, prefix="x"
    )
    assert any(c is False for c in calls_before)
    assert stages == before and rate == rate_before  # the same plan without it
    assert 0 < gap <= 0.01 and gap == pytest.approx(gap_before, abs=1e-12)


def test_where_blocks_are_alike_the_joint_solve_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(groups, "BOUNDS_FIRST", False)  # the solve runs, not only bounds
    *_, calls = _planned(monkeypatch, "llama3.1:70b", 2, 16, calibrated=False)
    assert calls and not any(calls)
    monkeypatch.setattr(groups, "_solve_runs", lambda *_: False)
    *_, without = _planned(monkeypatch, "llama3.1:70b", 2, 16, calibrated=False, prefix="x")
    assert without == []
