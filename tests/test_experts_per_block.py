"""``Topology.experts_per_block``: the block vocabulary in the code and in new plan JSON,
while plans written as ``experts_per_layer`` still load and dense plans keep their bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stowplan import Constraints, InputError, plan, plan_from_json, plan_to_json
from stowplan.files.fleets import load_nodes
from stowplan.models import resolve_model
from stowplan.plan import Topology, TopologyKind

ROOT = Path(__file__).resolve().parent.parent
PLANS = ROOT / "tests" / "fixtures" / "plans"
OLD_EXPERT_PLAN = PLANS / "mixtral_8x7b__mixed-consumer__experts_per_layer.json"
"""mixtral:8x7b on the mixed-consumer fleet, as plan JSON named the field before."""
DENSE_PLANS = sorted(p for p in PLANS.glob("*__*.json") if p != OLD_EXPERT_PLAN)
"""The stored version-1 plans (``cases.json`` lists them)."""


def test_a_plan_written_with_experts_per_layer_still_loads() -> None:
    text = OLD_EXPERT_PLAN.read_text()
    assert '"experts_per_layer": 8,' in text
    p = plan_from_json(text)
    assert p.topology == Topology.PipelineWithExperts(4, 8)
    assert p.topology.experts_per_block == 8
    assert sum(len(a.owned_experts) for a in p.assignments) == 32 * 8
    # Written again, only the field's name changes (it sorts to the same place).
    assert plan_to_json(p) == text.replace('"experts_per_layer": 8', '"experts_per_block": 8')


def test_a_new_expert_plan_is_written_with_experts_per_block() -> None:
    model = resolve_model("mixtral:8x7b")
    fleet = load_nodes(ROOT / "examples" / "fleets" / "mixed-consumer.yaml")
    text = plan_to_json(plan(model, fleet, Constraints()))
    topology = json.loads(text)["topology"]
    assert topology == {"experts_per_block": 8, "kind": "PipelineWithExperts", "num_stages": 4}
    assert "experts_per_layer" not in text
    assert plan_to_json(plan_from_json(text)) == text
    # The stored plan is this plan, written under the former name.
    assert plan_from_json(text) == plan_from_json(OLD_EXPERT_PLAN.read_text())


def test_every_stored_dense_plan_is_checked() -> None:
    listed = {c["plan"] for c in json.loads((PLANS / "cases.json").read_text())}
    assert listed <= {p.name for p in DENSE_PLANS} and len(DENSE_PLANS) >= 51


@pytest.mark.parametrize("path", DENSE_PLANS, ids=[p.name for p in DENSE_PLANS])
def test_stored_plans_without_experts_keep_their_bytes(path: Path) -> None:
    text = path.read_text()
    p = plan_from_json(text)
    assert p.topology.kind is TopologyKind.PIPELINE_CHAIN
    assert p.topology.experts_per_block is None
    assert plan_to_json(p) == text


def test_both_names_at_once_are_refused() -> None:
    data = json.loads(OLD_EXPERT_PLAN.read_text())
    data["topology"]["experts_per_block"] = 8
    with pytest.raises(InputError) as err:
        plan_from_json(json.dumps(data))
    assert err.value.field == "topology.experts_per_layer"
    assert "experts_per_block" in err.value.rule


def test_experts_per_block_without_experts_names_the_new_field() -> None:
    with pytest.raises(InputError) as err:
        Topology(kind=TopologyKind.PIPELINE_CHAIN, num_stages=2, experts_per_block=8)
    assert err.value.field == "topology.experts_per_block"
    assert err.value.value == 8
