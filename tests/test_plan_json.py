"""Plans are data: canonical JSON, validated loading."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from stowplan import (
    Constraints,
    InputError,
    NodeDescriptor,
    lookup,
    plan,
    plan_from_json,
    plan_to_json,
)
from stowplan.model import ExpertId
from stowplan.plan import SCHEMA_VERSION, plan_to_dict
from tests.common.expert_plans import ENV_VALUE_LIMIT, deepseek_v3_on_16_nodes

GB = 10**9


def _plan():  # type: ignore[no-untyped-def]
    model = lookup("llama3.1:8b")
    assert model is not None
    nodes = [
        NodeDescriptor(
            id=f"n{i}", gpu_name="RTX 3090", vram_bytes=12 * GB, flops_estimate=71, link_mbps=1e3
        )
        for i in range(3)
    ]
    return plan(model, nodes, Constraints(strategy="balance-by-vram"))


def test_json_round_trip_gives_an_equal_plan_and_identical_bytes() -> None:
    p = _plan()
    text = plan_to_json(p)
    again = plan_from_json(text)
    assert again == p
    assert plan_to_json(again) == text
    # No stage uses a version-2 field, so the plan is written as version 1, byte for byte.
    assert json.loads(text)["schema_version"] == 1 < SCHEMA_VERSION


def test_unknown_schema_version_is_rejected() -> None:
    data = plan_to_dict(_plan())
    data["schema_version"] = 99
    with pytest.raises(InputError, match=r"^schema_version=99: must be one of 1, 2$"):
        plan_from_json(json.dumps(data))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("topology"), r"^topology=.*Field required"),
        (lambda d: d["assignments"][1].update(stage=5), r"assignments\[1\]\.stage=5: must be 1"),
        (
            lambda d: d["assignments"][0].update(owns_head=True),
            r"assignments\[0\]\.owns_head=True: only the last stage owns the head",
        ),
        (
            lambda d: d["assignments"][1].update(block_range=[3, 9]),
            r"assignments\[1\]\.block_range=\(3, 9\): must start at",
        ),
        (lambda d: d.update(extra_key=1), r"^extra_key=1: Unexpected keyword argument$"),
        (lambda d: d["topology"].update(num_stages=0), r"topology\.num_stages=0"),
    ],
)
def test_malformed_plans_are_rejected_with_the_field(mutate, message) -> None:  # type: ignore[no-untyped-def]
    data = plan_to_dict(_plan())
    mutate(data)
    with pytest.raises(InputError, match=message):
        plan_from_json(json.dumps(data))


def test_non_json_is_rejected() -> None:
    with pytest.raises(InputError, match=r"^plan='<8 bytes>': is not valid JSON"):
        plan_from_json("{not js}")
    with pytest.raises(InputError, match=r"^plan='list': must be a JSON object$"):
        plan_from_json("[]")


def test_unbounded_rates_survive_the_round_trip() -> None:
    from stowplan import ModelLayout

    empty = ModelLayout(
        name="empty", num_blocks=1, hidden_dim=1, bytes_per_activation_elem=2,
        block_params_bytes=0, head_params_bytes=0, embed_params_bytes=0,
    )  # fmt: skip
    node = NodeDescriptor(id="a", gpu_name="RTX 3090", vram_bytes=0, flops_estimate=0, link_mbps=0)
    p = plan(empty, [node], Constraints())
    assert p.rationale.prediction is not None
    assert p.rationale.prediction.tokens_per_s == float("inf")
    text = plan_to_json(p)
    assert '"tokens_per_s": "inf"' in text
    assert plan_from_json(text) == p


def test_a_bad_stage_in_plan_json_names_the_stage_field_not_the_whole_stage() -> None:
    data = json.loads(plan_to_json(_plan()))
    data["assignments"][0]["block_range"] = [5, 1]
    with pytest.raises(InputError) as info:
        plan_from_json(json.dumps(data))
    assert (
        str(info.value) == "assignments[0].block_range=(5, 1): must satisfy 0 <= lo <= hi <= 4096"
    )


def test_an_expert_plan_writes_expert_masks_and_reads_back_the_same_plan() -> None:
    p = deepseek_v3_on_16_nodes()
    text = plan_to_json(p, indent=None)
    assert len(text.encode()) < ENV_VALUE_LIMIT // 2
    again = plan_from_json(text)
    assert again == p
    assert plan_to_json(again, indent=None) == text
    stage = json.loads(text)["assignments"][0]["owned_experts"]
    mine = [e for e in p.assignments[0].owned_experts if e.block == stage[0][0]]
    assert int(stage[0][1], 16) == sum(1 << e.expert for e in mine)


def test_expert_objects_of_earlier_plans_still_load() -> None:
    p = deepseek_v3_on_16_nodes()
    data = plan_to_dict(p)
    for stage, a in zip(data["assignments"], p.assignments, strict=True):
        stage["owned_experts"] = [{"block": e.block, "expert": e.expert} for e in a.owned_experts]
    assert plan_from_json(json.dumps(data)) == p


def test_unsorted_experts_are_written_as_objects_and_kept_in_order() -> None:
    p = _plan()
    a0 = replace(
        p.assignments[0],
        owned_experts=(ExpertId(block=1, expert=5), ExpertId(block=1, expert=2)),
    )
    q = replace(p, assignments=(a0, *p.assignments[1:]))
    data = plan_to_dict(q)
    assert data["assignments"][0]["owned_experts"] == [
        {"block": 1, "expert": 5},
        {"block": 1, "expert": 2},
    ]
    assert plan_from_json(plan_to_json(q)) == q


def test_a_malformed_expert_mask_is_an_input_error() -> None:
    data = plan_to_dict(_plan())
    data["assignments"][0]["owned_experts"] = [[3, "xyz"]]
    with pytest.raises(InputError) as info:
        plan_from_json(json.dumps(data))
    assert str(info.value) == (
        "assignments.0.owned_experts[0]=[3, 'xyz']: must be [block, HEX] with block < 4096 "
        "and bit e of the lower-case hexadecimal HEX (at most 1024 digits) set for each owned "
        'expert e, or {"block": b, "expert": e}'
    )


@pytest.mark.parametrize(
    ("masks", "message"),
    [
        ([[0, "f" * 1025]], "at most 1024 digits"),
        ([[4096, "f"]], "with block < 4096"),
        ([[1, "f"], [1, "1"]], "repeats block 1: one mask per block"),
    ],
)
def test_expert_masks_beyond_the_caps_are_refused(masks: list, message: str) -> None:
    data = plan_to_dict(_plan())
    data["assignments"][0]["owned_experts"] = masks
    with pytest.raises(InputError, match=message):
        plan_from_json(json.dumps(data))


def test_a_plan_owns_at_most_the_capped_number_of_experts() -> None:
    data = plan_to_dict(_plan())
    data["assignments"][0]["owned_experts"] = [[b, "f" * 1024] for b in range(257)]
    with pytest.raises(InputError, match="a plan owns at most 1048576 experts"):
        plan_from_json(json.dumps(data))


def test_a_two_megabyte_expert_plan_is_read_in_linear_time() -> None:
    # 64 blocks of 1024-digit masks, repeated over stages' worth of text: 2 MB of masks took
    # minutes when each bit was found by shifting the whole mask.
    import time

    data = plan_to_dict(_plan())
    first, last = data["assignments"][0], data["assignments"][-1]
    first["owned_experts"] = [[b, "f" * 1024] for b in range(64)]
    last["owned_experts"] = [{"block": b, "expert": e} for b in range(32) for e in range(2400)]
    text = json.dumps(data)
    assert len(text) > 2_000_000
    t0 = time.perf_counter()
    loaded = plan_from_json(text)
    elapsed = time.perf_counter() - t0
    assert sum(len(a.owned_experts) for a in loaded.assignments) == 64 * 4096 + 32 * 2400
    assert elapsed < 10  # < 1 s on an idle core; the bound leaves room for a loaded machine


def test_a_node_used_twice_is_named() -> None:
    data = plan_to_dict(_plan())
    data["assignments"][1]["node_id"] = data["assignments"][0]["node_id"]
    twice = data["assignments"][0]["node_id"]
    with pytest.raises(InputError) as info:
        plan_from_json(json.dumps(data))
    assert str(info.value) == (
        f"assignments[1].node_id={twice!r}: is already an earlier stage's node; "
        "stages share a node only on disjoint gpu_indices"
    )
