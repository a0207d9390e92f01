"""Plans never get worse: objective values on seeded clusters vs those recorded before a change.

A plan may be up to the tie-break margin slower than recorded: within 0.1 % of the best
the planner takes more KV room (:mod:`stowplan.planner.tiebreak`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stowplan import Constraints, PlanError, lookup
from stowplan.planner import plan_blocks
from stowplan.planner.tiebreak import TOLERANCE
from tests.common.seeded import cases, seeded_cluster

RECORDED = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "planner" / "objective_before.json").read_text()
)


def _objective(model_name: str, n: int, seed: int, objective: str) -> float | None:
    model = lookup(model_name)
    assert model is not None
    c = Constraints(batch=1 if objective == "latency" else 16)
    try:
        p = plan_blocks(model, seeded_cluster(seed, n), c)  # the block planner's record
    except PlanError:
        return None
    pred = p.rationale.prediction
    assert pred is not None
    return pred.time_per_token_s  # the cycle: 16 sequences get one token each per cycle


@pytest.mark.parametrize("objective", ["latency", "throughput"])
def test_objective_on_seeded_clusters_is_not_worse_than_recorded(objective):
    checked = 0
    for model_name, n, seed in cases():
        before = RECORDED[f"{model_name}|{n}|{seed}|{objective}"]
        now = _objective(model_name, n, seed, objective)
        if before is None:
            assert now is None, (model_name, n, seed)
            continue
        assert now is not None, (model_name, n, seed)
        assert now <= before * (1 + TOLERANCE) * (1 + 1e-9), (model_name, n, seed, now, before)
        checked += 1
    assert checked >= 70
