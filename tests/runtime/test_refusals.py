"""Plans the worker cannot execute are refused before anything loads, naming reason and remedy."""

from __future__ import annotations

import json

import pytest

from stowplan.errors import InputError, UnsupportedByWorker
from stowplan.model import ExpertId
from stowplan.runtime import Family, check_runnable, family_of
from stowplan.runtime.run import plan_checkpoint
from stowplan.runtime.stage import StageModel
from stowplan.stages.worker import WorkerStage
from tests.common.plans import make_plan, make_tp_plan

LLAMA = {"model_type": "llama", "num_hidden_layers": 4}


def test_a_family_without_code_is_refused_naming_the_families_and_the_way_out() -> None:
    with pytest.raises(UnsupportedByWorker) as info:
        family_of({"model_type": "gpt2"})
    assert str(info.value) == (
        "the stage worker cannot run this: model_type 'gpt2' is not one of the families it "
        "runs (llama, mistral, qwen2, qwen3, mixtral); export the plan for an engine that "
        "runs this model (`stowplan export`)"
    )
    assert [family_of({"model_type": f.value}) for f in Family] == list(Family)


def test_tensor_parallel_stages_are_refused_with_the_flag_that_avoids_them() -> None:
    plan = make_tp_plan([("n0", (0, 1), 2), ("n1", (0,), 2)], context_tokens=None)
    with pytest.raises(UnsupportedByWorker) as info:
        check_runnable(plan, {"model_type": "llama", "num_hidden_layers": plan.num_blocks})
    assert "stage 0 splits its blocks over tensor_parallel=2 GPUs" in str(info.value)
    assert info.value.remedy == "plan with --tp 1 (Constraints(tensor_parallel=1))"


def test_expert_parallel_experts_are_refused_with_block_local_as_the_remedy() -> None:
    experts = {0: [ExpertId(block=3, expert=0)], 1: [ExpertId(block=0, expert=1)]}
    plan = make_plan([2, 2], experts=experts, experts_per_block=4)
    with pytest.raises(UnsupportedByWorker) as info:
        check_runnable(plan, {"model_type": "mixtral", "num_hidden_layers": 4})
    assert "places 2 experts expert-parallel" in info.value.reason
    assert "--block-local" in info.value.remedy


def test_a_plan_of_another_model_is_refused_naming_both_block_counts() -> None:
    with pytest.raises(InputError) as info:
        check_runnable(make_plan([3, 3]), LLAMA)
    assert str(info.value) == (
        "plan.num_blocks=6: must equal the checkpoint's num_hidden_layers=4: plan this checkpoint"
    )
    assert check_runnable(make_plan([1, 3]), LLAMA) is Family.LLAMA


def test_a_stage_refuses_before_reading_any_weight(tmp_path, monkeypatch) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "gpt2", "num_hidden_layers": 2})
    )
    (tmp_path / "model.safetensors").write_bytes(b"not read")
    import safetensors

    monkeypatch.setattr(safetensors, "safe_open", lambda *a, **k: pytest.fail("read weights"))
    stage = WorkerStage(
        stage=0, num_stages=1, block_range=(0, 2), owns_embed=True, owns_head=True, source="test"
    )
    with pytest.raises(UnsupportedByWorker):
        StageModel.load(tmp_path, stage)


def test_a_stage_of_tensor_parallel_refuses_before_reading_any_weight(
    checkpoints, monkeypatch
) -> None:
    import safetensors

    monkeypatch.setattr(safetensors, "safe_open", lambda *a, **k: pytest.fail("read weights"))
    stage = WorkerStage(
        stage=0,
        num_stages=1,
        block_range=(0, 4),
        owns_embed=True,
        owns_head=True,
        source="test",
        tensor_parallel=2,
    )
    with pytest.raises(UnsupportedByWorker) as info:
        StageModel.load(checkpoints["llama"], stage)
    assert "tensor_parallel=2" in str(info.value)


def test_planning_a_checkpoint_gives_a_plan_the_worker_runs(checkpoints) -> None:
    from stowplan.model import Constraints, NodeDescriptor

    nodes = [
        NodeDescriptor(id=f"n{i}", gpu_name="RTX-4090", vram_bytes=v)
        for i, v in enumerate((400_000, 300_000, 250_000))
    ]
    layout, plan = plan_checkpoint(
        checkpoints["mixtral"],
        nodes,
        prompt_tokens=6,
        max_new_tokens=4,
        batch=2,
        constraints=Constraints(min_stages=2),
    )
    assert plan.num_stages >= 2 and plan.context_tokens == 10
    assert all(a.tensor_parallel == 1 for a in plan.assignments)
    for a in plan.assignments:  # block-local: every expert on its block's stage
        assert all(a.block_range[0] <= e.block < a.block_range[1] for e in a.owned_experts)
    assert plan.assignments[-1].block_range[1] == layout.num_blocks == 4
