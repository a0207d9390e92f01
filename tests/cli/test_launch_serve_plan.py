"""``stowplan launch SERVE.json`` without Ray: every replica's stage envs (--plan-debug),
and the refusals of what does not apply to a serve plan."""

from __future__ import annotations

import json

import pytest

from stowplan import ServePlan
from stowplan.cli import main
from stowplan.cluster.local import fake_node_descriptors
from stowplan.cluster.realise import stage_actor_env
from stowplan.cluster.replicas import check_disjoint
from stowplan.errors import InputError
from stowplan.exports.replica_env import REPLICA_KEYS, replica_stage_env
from stowplan.plan import plan_from_json
from stowplan.stages.worker import stage_env
from tests.common.serve_fleet import FLEET, serve_fleet


@pytest.fixture(scope="module")
def served() -> ServePlan:
    return serve_fleet(fake_node_descriptors(FLEET))


@pytest.fixture
def plan_file(tmp_path, served):
    path = tmp_path / "serve.json"
    path.write_text(served.to_json())
    return path


def test_the_fleet_serves_three_disjoint_replicas_one_a_pipeline_one_tensor_parallel(served):
    assert len(served.replicas) == 3
    assert sorted(r.plan.num_stages for r in served.replicas) == [1, 1, 2]
    assert any(a.tensor_parallel == 2 for r in served.replicas for a in r.plan.assignments)
    check_disjoint(served)


def test_each_replica_stage_gets_its_replica_plan_and_keys(served):
    envs = replica_stage_env(served)
    assert [len(e) for e in envs] == [r.plan.num_stages for r in served.replicas]
    for i, (r, stages) in enumerate(zip(served.replicas, envs, strict=True)):
        for env, contract in zip(stages, stage_env(r.plan), strict=True):
            assert env.items() >= contract.items()  # the worker contract, unchanged
            assert plan_from_json(env["PLAN_JSON"]) == r.plan
            assert env["STOWPLAN_REPLICA"] == str(i)
            assert env["STOWPLAN_NUM_REPLICAS"] == "3"
            assert env["STOWPLAN_MAX_REQUESTS"] == str(r.users)
            assert env["STOWPLAN_REQUEST_TOKENS"] == str(64 + 32)
        assert set(stages[0]) - set(stage_env(r.plan)[0]) == set(REPLICA_KEYS)


def test_plan_debug_prints_exactly_what_each_replica_stage_actor_gets(plan_file, served, capsys):
    assert main(["launch", str(plan_file), "--plan-debug", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["serve_plan"] == served.to_dict()
    expected = [
        [{**e, **k} for e, k in zip(stage_actor_env(r.plan), keys, strict=True)]
        for r, keys in zip(served.replicas, replica_stage_env(served), strict=True)
    ]
    assert doc["stage_env"] == expected
    assert main(["launch", str(plan_file), "--plan-debug"]) == 0
    text = capsys.readouterr().out
    assert text.count("# replica ") == 3 and text.count("PLAN_JSON=<") == 4
    assert "plan-debug: nothing was provisioned" in text


@pytest.mark.parametrize(
    ("extra", "flag"),
    [(["--min-stages", "2"], "--min-stages"), (["--batch", "4"], "--batch")],
)
def test_planning_options_are_refused_for_a_serve_plan(plan_file, capsys, extra, flag):
    assert main(["launch", str(plan_file), "--plan-debug", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"stowplan: error: {flag}=") and err.count("\n") == 1
    assert "launched as planned" in err


def test_a_serve_plan_needs_a_ray_cluster(plan_file, capsys):
    assert main(["launch", str(plan_file)]) == 2
    err = capsys.readouterr().err
    assert "--ray" in err and "serve plan" in err and err.count("\n") == 1


def test_replicas_sharing_a_node_are_refused(served):
    data = served.to_dict()
    first, second = data["replicas"][0], data["replicas"][1]
    second["plan"] = first["plan"]
    with pytest.raises(InputError, match="replicas must use disjoint nodes"):
        check_disjoint(ServePlan.from_dict(data))
