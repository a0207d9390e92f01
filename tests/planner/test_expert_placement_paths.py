"""The expert placement's shortcuts give what the plain computations give, value for value."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from stowplan import Constraints, ExpertInputs, ExpertPlacement, NodeDescriptor, Plan, lookup, plan
from stowplan.calibration.profile import Calibration, DeviceCalibration, Engine, Figure
from stowplan.cost import experts as cost_experts
from stowplan.cost.experts import expert_prediction
from stowplan.model import ModelLayout
from stowplan.moe.stats import zipf_load
from tests.common.moe import node
from tests.common.seeded import seeded_cluster

HALF = Calibration(
    name="half",
    engine=Engine.GENERIC,
    devices=(DeviceCalibration(device="*", bandwidth_fraction={"default": Figure(value=0.5)}),),
)


def _fleets() -> list[tuple[str, list[NodeDescriptor]]]:
    many_kinds = [node(i, 24 + i % 7, 500 + 37 * i, link=1000 + i, lat=i % 3) for i in range(90)]
    return [
        ("seeded", seeded_cluster(7, 12)),
        ("seeded-wide", seeded_cluster(3, 40)),
        ("many-kinds", many_kinds),
    ]


def _expert_plan(model: ModelLayout, nodes: Sequence[NodeDescriptor], c: Constraints) -> Plan:
    ex = model.experts
    assert ex is not None
    load = zipf_load(len(ex.moe_blocks), ex.num_experts, exponent=1.1)
    inputs = ExpertInputs(placement=ExpertPlacement.EXPERT_PARALLEL, load=load)
    return plan(model, nodes, c, experts=inputs)


@pytest.mark.parametrize("fleet", range(3))
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("calibrated", [False, True])
def test_prediction_on_the_stage_nodes_is_the_whole_fleets(
    fleet: int, batch: int, calibrated: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prediction's cost model over the stages' nodes alone predicts as over every node."""
    model = lookup("mixtral:8x7b")
    assert model is not None
    _, nodes = _fleets()[fleet]
    c = Constraints(batch=batch)
    got = _expert_plan(model, nodes, c)
    assert got.num_stages < len(nodes) or fleet == 0
    cal = HALF if calibrated else None
    short = expert_prediction(model, nodes, c, got, calibration=cal)
    assert len(cost_experts._stage_nodes(got, nodes)) == len({a.node_id for a in got.assignments})
    monkeypatch.setattr(cost_experts, "_stage_nodes", lambda _plan, every: every)
    assert expert_prediction(model, nodes, c, got, calibration=cal) == short


def test_stage_nodes_fall_back_to_the_fleet_when_ids_repeat() -> None:
    nodes = seeded_cluster(7, 12)
    model = lookup("mixtral:8x7b")
    assert model is not None
    got = _expert_plan(model, nodes, Constraints())
    assert cost_experts._stage_nodes(got, [*nodes, nodes[0]]) == [*nodes, nodes[0]]
    assert cost_experts._stage_nodes(got, nodes[:1]) == nodes[:1]
