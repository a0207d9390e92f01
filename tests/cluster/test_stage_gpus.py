"""Each stage's GPUs on its node: the bundle, the env, and what a node cannot hold (pure)."""

from __future__ import annotations

import pytest

from stowplan.cluster.realise import WORKER_ENV, stage_actor_env
from stowplan.cluster.stage_gpus import (
    NOSET_VISIBLE_DEVICES,
    gpu_shortfalls,
    stage_bundle,
    stage_device_env,
    stage_gpus,
)
from stowplan.demo.model import DemoConfig, demo_layout
from stowplan.stages.worker import stage_env
from tests.common.tp_plans import tp_plan

LAYOUT = demo_layout(DemoConfig())
FOUR = {"CPU": 4.0, "GPU": 4.0}


def _split():
    """Two tp-2 stages on node a (GPUs 2,3 then 0,1), one tp-4 stage on b."""
    return tp_plan(LAYOUT, [("a", (2, 3)), ("a", (0, 1)), ("b", (0, 1, 2, 3))])


def test_stages_run_on_their_indices_else_the_first_tp_gpus() -> None:
    p = _split()
    assert [stage_gpus(a) for a in p.assignments] == [(2, 3), (0, 1), (0, 1, 2, 3)]
    whole = tp_plan(LAYOUT, [("a", ()), ("b", ())], tp=1)
    assert [stage_gpus(a) for a in whole.assignments] == [(0,), (0,)]


def test_the_env_names_the_tp_size_and_the_plans_gpus_in_order() -> None:
    a = _split().assignments[0]
    assert stage_device_env(a) == {
        "PLAN_TP_SIZE": "2",
        "CUDA_VISIBLE_DEVICES": "2,3",
        NOSET_VISIBLE_DEVICES: "1",
    }


def test_each_actor_env_is_worker_env_extra_devices_then_the_contract() -> None:
    p = _split()
    envs = stage_actor_env(p, {"CUDA_VISIBLE_DEVICES": "7", "X": "1"})
    for a, env, contract in zip(p.assignments, envs, stage_env(p), strict=True):
        assert env == {**WORKER_ENV, "X": "1", **stage_device_env(a), **contract}
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["2,3", "0,1", "0,1,2,3"]
    assert [e["PLAN_TP_SIZE"] for e in envs] == ["2", "2", "4"]


def test_a_bundle_holds_one_cpu_and_the_stages_gpus() -> None:
    a0, _, b = _split().assignments
    assert stage_bundle(a0, FOUR) == {"CPU": 1.0, "GPU": 2.0}
    assert stage_bundle(b, FOUR) == {"CPU": 1.0, "GPU": 4.0}
    single = tp_plan(LAYOUT, [("c", ())], tp=1).assignments[0]
    assert stage_bundle(single, {"CPU": 2.0}) == {"CPU": 1.0}  # a CPU node runs a plain stage
    assert stage_bundle(single, {"CPU": 2.0, "GPU": 8.0}) == {"CPU": 1.0, "GPU": 1.0}


def test_nodes_that_hold_their_stages_have_no_shortfall() -> None:
    assert gpu_shortfalls(_split(), {"a": FOUR, "b": FOUR}) == {}
    assert gpu_shortfalls(_split(), {}) == {}  # absent nodes are judged elsewhere


@pytest.mark.parametrize(
    ("stages", "resources", "free", "expected"),
    [
        (
            [("a", (2, 3)), ("a", (4, 5))],
            {"a": FOUR},
            {"a": 4.0},
            {1: "needs 2 GPUs (indices 4,5) but the node has GPUs 0-3, 4 free now"},
        ),
        (
            [("a", (0, 1)), ("b", (0, 1))],
            {"a": FOUR, "b": {"CPU": 4.0}},
            {},
            {1: "needs 2 GPUs (indices 0,1) but the node has no GPU"},
        ),
        (
            [("a", (0, 1, 2)), ("a", (3,)), ("b", (0, 1))],
            {"a": {"CPU": 1.0, "GPU": 4.0}, "b": FOUR},
            {"a": 1.0},
            {
                0: "needs 1 CPU of the node's 1; its stages 0 (1), 1 (1) need 2 in all",
                1: "needs 1 CPU of the node's 1; its stages 0 (1), 1 (1) need 2 in all",
            },
        ),
    ],
)
def test_a_node_short_of_gpus_names_the_stage_the_gpus_needed_and_free(
    stages, resources, free, expected
) -> None:
    assert gpu_shortfalls(tp_plan(LAYOUT, stages), resources, free) == expected


def test_stages_that_need_more_gpus_than_the_node_has_are_each_named() -> None:
    # Ray reports 3 GPUs on a node the plan splits into 2 + 2 (indices fit only if it had 4).
    p = tp_plan(LAYOUT, [("a", (0, 1)), ("a", (2,)), ("a", (3,))])
    short = gpu_shortfalls(p, {"a": {"CPU": 8.0, "GPU": 3.0}}, {"a": 3.0})
    assert short == {
        0: "needs 2 GPUs of the node's 3, 3 free now; its stages 0 (2), 1 (1), 2 (1) need 4 in all",
        1: "needs 1 GPU of the node's 3, 3 free now; its stages 0 (2), 1 (1), 2 (1) need 4 in all",
        2: "needs 1 GPU (indices 3) but the node has GPUs 0-2, 3 free now",
    }
