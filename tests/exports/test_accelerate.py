"""Accelerate export: the device_map gives every module the plan's device."""

from __future__ import annotations

import json

import pytest

from stowplan.errors import InputError
from stowplan.exports import UnsupportedByEngine, export_plan
from stowplan.model import ExpertId
from tests.exports.plans import GIB, make_plan


def counts_per_device(device_map: dict[str, object]) -> dict[object, int]:
    out: dict[object, int] = {}
    for key, device in device_map.items():
        parts = key.split(".")
        if parts[:2] == ["model", "layers"] and len(parts) == 3:
            out[device] = out.get(device, 0) + 1
    return out


def test_device_map_round_trips_to_the_plans_block_counts():
    plan = make_plan([5, 17, 10], ["gpu0", "gpu1", "cpu"])
    result = export_plan(plan, "accelerate")
    device_map = json.loads(dict(result.files)["device_map.json"])
    assert counts_per_device(device_map) == {0: 5, 1: 17, "cpu": 10}
    assert device_map["model.embed_tokens"] == 0
    assert device_map["model.norm"] == device_map["lm_head"] == "cpu"
    assert device_map["model.layers.5"] == 1
    assert json.loads(dict(result.files)["max_memory.json"]) == {
        "0": 20 * GIB,
        "1": 20 * GIB,
        "cpu": 20 * GIB,
    }


def test_experts_away_from_their_block_get_their_own_entry_in_moe_families():
    plan = make_plan(
        [2, 0], ["gpu0", "cpu"], experts={1: [ExpertId(block=1, expert=6)]}, experts_per_layer=8
    )
    device_map = export_plan(plan, "accelerate", family="mixtral").data["device_map"]
    assert device_map["model.layers.1.block_sparse_moe.experts.6"] == "cpu"
    assert device_map["model.layers.1"] == 0


def test_unknown_family_and_fused_experts_are_refused():
    plan = make_plan([4], model_name="my-model")
    with pytest.raises(InputError) as info:
        export_plan(plan, "accelerate")
    assert str(info.value) == (
        "family=None: the module names of model 'my-model' are unknown; pass the family (one of "
        "gemma, gemma2, gpt2, gpt_neox, llama, mistral, mixtral, phi3, qwen2, qwen2_moe, qwen3, "
        "qwen3_moe)"
    )
    moe = make_plan(
        [2, 0], ["gpu0", "cpu"], experts={1: [ExpertId(block=1, expert=6)]}, experts_per_layer=8
    )
    with pytest.raises(UnsupportedByEngine) as refused:
        export_plan(moe, "accelerate", family="llama")
    assert str(refused.value) == (
        "accelerate cannot run this plan: expert 6 of block 1 is on stage 1, away from its "
        "block; family 'llama' has no per-expert modules to map"
    )
