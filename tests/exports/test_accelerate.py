"""Accelerate export: the device_map gives every module the plan's device."""

from __future__ import annotations

import json

import pytest

from stowplan.cli import main
from stowplan.errors import InputError
from stowplan.exports import UnsupportedByEngine, export_plan
from stowplan.model import ExpertId
from stowplan.models import resolve_model
from stowplan.plan import Plan
from tests.common.paths import FIXTURES
from tests.common.plans import GIB, make_plan

CONFIGS = FIXTURES / "hf-configs"


def expert_away_from_its_block(experts_per_block: int) -> Plan:
    """Blocks 0-1 on gpu0, an empty cpu stage owning expert 6 of block 1."""
    return make_plan(
        [2, 0],
        ["gpu0", "cpu"],
        experts={1: [ExpertId(block=1, expert=6)]},
        experts_per_block=experts_per_block,
    )


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
    plan = expert_away_from_its_block(8)
    device_map = export_plan(plan, "accelerate", family="mixtral").data["device_map"]
    assert device_map["model.layers.1.block_sparse_moe.experts.6"] == "cpu"
    assert device_map["model.layers.1"] == 0


def test_unknown_family_and_fused_experts_are_refused():
    plan = make_plan([4], model_name="my-model")
    with pytest.raises(InputError) as info:
        export_plan(plan, "accelerate")
    assert str(info.value) == (
        "family=None: the module names of model 'my-model' are unknown; pass --model with the "
        "model's config.json, checkpoint folder or .gguf (its family is read from it), or the "
        "family (one of deepseek_v3, gemma, gemma2, gemma3, gpt2, gpt_neox, gpt_oss, kimi_k2, "
        "llama, mistral, mixtral, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe)"
    )
    moe = expert_away_from_its_block(8)
    with pytest.raises(UnsupportedByEngine) as refused:
        export_plan(moe, "accelerate", family="llama")
    assert str(refused.value) == (
        "accelerate cannot run this plan: expert 6 of block 1 is on stage 1, away from its "
        "block; family 'llama' has no per-expert modules to map"
    )


@pytest.mark.parametrize(
    ("config", "family", "expert_key"),
    [
        ("DeepSeek-V3.json", "deepseek_v3", "model.layers.60.mlp.experts.6"),
        ("gpt-oss-20b.json", "gpt_oss", None),
        ("Gemma-2-9B.json", "gemma2", None),
    ],
)
def test_families_of_the_fixture_configs_map_to_their_transformers_modules(
    config, family, expert_key
):
    layout = resolve_model(str(CONFIGS / config))
    assert layout.family == family
    n = layout.num_blocks
    plan = make_plan([n - 1, 1], ["gpu0", "gpu1"], model_name=layout.name)
    device_map = export_plan(plan, "accelerate", layout=layout).data["device_map"]
    assert device_map["model.embed_tokens"] == 0
    assert device_map[f"model.layers.{n - 1}"] == 1
    assert device_map["lm_head"] == device_map["model.norm"] == 1
    if expert_key is not None:
        moe = make_plan(
            [n, 0],
            ["gpu0", "cpu"],
            model_name=layout.name,
            experts={1: [ExpertId(block=n - 1, expert=6)]},
            experts_per_block=256,
        )
        assert export_plan(moe, "accelerate", layout=layout).data["device_map"][expert_key] == (
            "cpu"
        )


def test_kimi_and_gemma3_have_module_names():
    for family in ("kimi_k2", "gemma3"):
        device_map = export_plan(make_plan([3]), "accelerate", family=family).data["device_map"]
        assert device_map["model.layers.2"] == 0
    gemma3 = export_plan(make_plan([3]), "accelerate", family="gemma3").data["device_map"]
    assert gemma3["model.rotary_emb_local"] == 0


def test_gpt_oss_experts_are_fused_so_they_move_only_with_their_block():
    plan = expert_away_from_its_block(32)
    with pytest.raises(UnsupportedByEngine) as refused:
        export_plan(plan, "accelerate", family="gpt_oss")
    assert str(refused.value) == (
        "accelerate cannot run this plan: expert 6 of block 1 is on stage 1, away from its "
        "block; family 'gpt_oss' fuses a block's experts into one module "
        "(model.layers.1.mlp.experts)"
    )


def test_a_plan_made_from_a_config_path_exports_with_model_path_and_no_family(tmp_path, capsys):
    config = tmp_path / "local-moe" / "config.json"
    config.parent.mkdir()
    config.write_text((CONFIGS / "gpt-oss-20b.json").read_text())
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps([{"id": "big", "vram_bytes": 80 * GIB, "gpu_name": "H100"}]))
    assert main(["plan", str(config), "--nodes", str(fleet), "--json"]) == 0
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(capsys.readouterr().out)
    # The plan records the config's path: the export reads the family from it and
    # loads the checkpoint folder.
    assert main(["export", str(plan_file), "--to", "accelerate", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["data"]["family"] == "gpt_oss"
    assert f"from_pretrained({str(config.parent)!r}," in result["commands"][0]
    # Without the path (a plan written before plans recorded it) the family is asked for.
    old = json.loads(plan_file.read_text())
    del old["model_source"]
    plan_file.write_text(json.dumps(old))
    assert main(["export", str(plan_file), "--to", "accelerate"]) == 2
    assert "pass --model with the model's config.json" in capsys.readouterr().err
    folder = str(config.parent)
    assert main(["export", str(plan_file), "--to", "accelerate", "--model", folder, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["data"]
    assert data["family"] == "gpt_oss"
    assert data["device_map"]["model.layers.23"] == 0
