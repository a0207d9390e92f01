"""The worker contract (seed 000 §7.3)."""

from __future__ import annotations

import pytest

from stowplan import (
    Constraints,
    InputError,
    NodeDescriptor,
    lookup,
    plan,
    plan_from_json,
    stage_env,
    stage_from_env,
)
from stowplan.stages.worker import CONTRACT_KEYS, VISIBLE_DEVICES, even_split
from tests.common.expert_plans import ENV_VALUE_LIMIT, deepseek_v3_on_16_nodes

GB = 10**9


def _plan():  # type: ignore[no-untyped-def]
    model = lookup("llama3.1:8b")
    assert model is not None
    sizes = (24, 8, 16)
    nodes = [
        NodeDescriptor(id=f"n{s}", gpu_name="g", vram_bytes=s * GB, flops_estimate=1, link_mbps=1)
        for s in sizes
    ]
    return plan(model, nodes, Constraints(strategy="balance-by-vram", min_stages=3))


def test_every_stage_finds_its_assignment_from_plan_json() -> None:
    p = _plan()
    for env, a in zip(stage_env(p), p.assignments, strict=True):
        got = stage_from_env(env)
        assert got.source == "PLAN_JSON"
        assert (got.block_range, got.owns_embed, got.owns_head) == (
            a.block_range,
            a.owns_embed,
            a.owns_head,
        )
        assert got.node_id == a.node_id and got.num_stages == 3


def test_every_stage_env_sets_exactly_the_contract_keys() -> None:
    assert all(set(env) == set(CONTRACT_KEYS) for env in stage_env(_plan()))


def test_stage_blocks_override_without_plan_json() -> None:
    p = _plan()
    for env, a in zip(stage_env(p), p.assignments, strict=True):
        env = {k: v for k, v in env.items() if k != "PLAN_JSON"}
        got = stage_from_env(env, num_blocks=32)
        assert got.source == "PLAN_STAGE_BLOCKS"
        assert (got.block_range, got.owns_embed, got.owns_head) == (
            a.block_range,
            a.owns_embed,
            a.owns_head,
        )


def test_fallback_is_the_even_num_stages_split() -> None:
    ranges = [
        stage_from_env({"STAGE": str(s), "NUM_STAGES": "3"}, num_blocks=32).block_range
        for s in range(3)
    ]
    assert ranges == [(0, 10), (10, 21), (21, 32)]
    assert even_split(16, 2, 1) == (8, 16)
    last = stage_from_env({"STAGE": "2", "NUM_STAGES": "3"}, num_blocks=32)
    assert last.owns_head and not last.owns_embed and last.source == "NUM_STAGES"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "STAGE=None: must be set to this worker's stage index"),
        ({"STAGE": "x"}, "STAGE='x': must be an integer >= 0"),
        ({"STAGE": "3", "NUM_STAGES": "3"}, "STAGE='3': must be < NUM_STAGES (3)"),
        ({"STAGE": "0", "NUM_STAGES": "0"}, "NUM_STAGES='0': must be an integer >= 1"),
        (
            {"STAGE": "0", "PLAN_STAGE_BLOCKS": "5"},
            "PLAN_STAGE_BLOCKS='5': must be 'lo,hi' with integers 0 <= lo < hi",
        ),
        (
            {"STAGE": "0", "PLAN_STAGE_BLOCKS": "4,2"},
            "PLAN_STAGE_BLOCKS='4,2': must be 'lo,hi' with integers 0 <= lo < hi",
        ),
        (
            {"STAGE": "0", "PLAN_STAGE_BLOCKS": "0,40"},
            "PLAN_STAGE_BLOCKS='0,40': must be 'lo,hi' with integers 0 <= lo < hi <= 32",
        ),
        (
            {"STAGE": "0", "PLAN_STAGE_BLOCKS": "0,4", "PLAN_OWNS_HEAD": "maybe"},
            "PLAN_OWNS_HEAD='maybe': must be 1 or 0 (also true/false, yes/no)",
        ),
        (
            {"STAGE": "0"},
            "NUM_STAGES=None: must be set when neither PLAN_JSON nor PLAN_STAGE_BLOCKS is",
        ),
        ({"STAGE": "7", "PLAN_JSON": "{}"}, "topology=None: Field required"),
    ],
)
def test_malformed_environment_is_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(InputError) as info:
        stage_from_env(env, num_blocks=32)
    assert str(info.value).startswith(message.split(": ")[0])
    assert message.split(": ", 1)[1] in str(info.value)


def test_stage_index_outside_the_plan_is_refused() -> None:
    env = stage_env(_plan())[0] | {"STAGE": "9"}
    with pytest.raises(InputError, match=r"^STAGE=9: must be in \[0, 3\)$"):
        stage_from_env(env)


def test_a_deepseek_v3_expert_plan_fits_one_environment_variable_and_every_stage_reads_it():
    p = deepseek_v3_on_16_nodes()
    assert sum(len(a.owned_experts) for a in p.assignments) >= 58 * 256
    for env, a in zip(stage_env(p), p.assignments, strict=True):
        # Linux refuses an environment string of 128 KiB or more (MAX_ARG_STRLEN)
        assert len(f"PLAN_JSON={env['PLAN_JSON']}".encode()) < ENV_VALUE_LIMIT // 2
        got = stage_from_env(env)
        assert got.source == "PLAN_JSON"
        assert got.block_range == a.block_range and got.node_id == a.node_id
        assert plan_from_json(env["PLAN_JSON"]) == p


def _split_plan():  # type: ignore[no-untyped-def]
    from tests.common.plans import make_tp_plan

    return make_tp_plan([("n0", (0, 1, 2, 3), 20), ("n0", (4, 5, 6, 7), 10), ("n1", (), 2)])


def test_a_stage_on_listed_gpus_gets_its_tp_size_and_device_list() -> None:
    envs = stage_env(_split_plan())
    assert [(e["PLAN_TP_SIZE"], e.get("CUDA_VISIBLE_DEVICES")) for e in envs] == [
        ("4", "0,1,2,3"),
        ("4", "4,5,6,7"),
        ("1", None),
    ]
    assert all(set(e) - {VISIBLE_DEVICES} == set(CONTRACT_KEYS) for e in envs)


def test_a_plan_of_single_gpu_nodes_leaves_cuda_visible_devices_alone() -> None:
    envs = stage_env(_plan())
    assert all(VISIBLE_DEVICES not in e and e["PLAN_TP_SIZE"] == "1" for e in envs)


def test_every_stage_reads_back_its_tensor_parallel_degree_and_gpus() -> None:
    p = _split_plan()
    for env, a in zip(stage_env(p), p.assignments, strict=True):
        got = stage_from_env(env)
        assert (got.tensor_parallel, got.gpu_indices) == (a.tensor_parallel, a.gpu_indices)
        info = got.placement_info("ray-node")
        assert info["tensor_parallel"] == a.tensor_parallel
        assert info["gpu_indices"] == list(a.gpu_indices)
        bare = {k: v for k, v in env.items() if k != "PLAN_JSON"}
        assert stage_from_env(bare).tensor_parallel == a.tensor_parallel


def test_the_planned_405b_stages_on_two_h100_nodes_see_all_eight_gpus() -> None:
    from stowplan import load_nodes
    from tests.common.paths import EXAMPLES

    model = lookup("llama3.1:405b")
    assert model is not None
    p = plan(model, load_nodes(EXAMPLES / "fleets" / "two-h100-nodes.yaml"), Constraints())
    envs = stage_env(p)
    assert [(e["PLAN_TP_SIZE"], e["CUDA_VISIBLE_DEVICES"]) for e in envs] == [
        ("8", "0,1,2,3,4,5,6,7"),
        ("8", "0,1,2,3,4,5,6,7"),
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"PLAN_TP_SIZE": "four"}, "PLAN_TP_SIZE='four': must be an integer >= 1"),
        ({"PLAN_TP_SIZE": "0"}, "PLAN_TP_SIZE='0': must be an integer >= 1"),
        (
            {"PLAN_TP_SIZE": "2"},
            "PLAN_TP_SIZE='2': must equal the tensor_parallel=4 of stage 0 in PLAN_JSON "
            "(or be unset)",
        ),
    ],
)
def test_a_bad_tp_size_is_refused_naming_the_variable(extra: dict[str, str], message: str) -> None:
    env = stage_env(_split_plan())[0] | extra
    with pytest.raises(InputError) as info:
        stage_from_env(env)
    assert str(info.value) == message
