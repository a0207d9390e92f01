"""A probed host becomes a node of the cluster planner."""

from __future__ import annotations

import pytest

from stowplan.errors import InputError
from stowplan.host.node import node_from_passport
from stowplan.host.passport import Passport
from stowplan.model import Constraints
from stowplan.models import lookup
from stowplan.planner import plan
from tests.common.host import cap, fixture_topology, matrix


def _passport() -> Passport:
    topo = fixture_topology("thamada_nvsim/RTX3090_smi_-a.txt")
    m = matrix(cap("gpu0", 800.0, upload_gbps=20.0), cap("gpu1", 780.0, 20.0), cap("cpu", 50.0))
    return Passport.create(topo, m)


def test_node_carries_the_measured_figures_of_the_best_circuit() -> None:
    node = node_from_passport(_passport())
    assert node.id == "RTX3090_smi_-a:gpu0"
    assert node.gpu_name == "NVIDIA GeForce RTX 3090"
    assert node.vram_bytes == 24576 * 2**20
    assert node.mem_bandwidth_gbps == pytest.approx(800.0)
    assert node.flops_estimate == 0.0  # the GEMV measures bandwidth, not FLOPs
    assert dict(node.labels)["measured"] == "bandwidth"
    assert ("source", "passport") in node.labels


def test_nodes_from_two_circuits_feed_plan() -> None:
    p = _passport()
    nodes = [node_from_passport(p, circuit=c, node_id=c) for c in ("gpu0", "gpu1")]
    result = plan(lookup("llama3.1:8b-q4_0"), nodes, Constraints(min_stages=2))
    assert sorted(a.node_id for a in result.assignments) == ["gpu0", "gpu1"]
    prediction = result.rationale.prediction
    assert prediction is not None
    # the measured bandwidth is used: nothing about these nodes' bandwidth is assumed
    assert not any("mem_bandwidth_gbps" in item for item in prediction.assumed)


def test_unmeasured_circuit_is_refused() -> None:
    with pytest.raises(InputError) as err:
        node_from_passport(_passport(), circuit="gpu9")
    assert str(err.value) == (
        "circuit='gpu9': must be one of the measured circuits ('gpu0', 'gpu1', 'cpu')"
    )
