"""vLLM / SGLang exports: the partition obeys the engines' own rule and keeps the node order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stowplan.exports import Engine, UnsupportedByEngine, export_plan
from stowplan.model import ExpertId, NodeDescriptor
from tests.common.commands import engine_pp_indices, flag, parse_command
from tests.common.plans import make_plan

counts_st = st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=8)


@given(counts_st)
def test_vllm_partition_satisfies_vllms_rule_and_gives_each_rank_its_blocks(counts):
    plan = make_plan(counts)
    env, argv = parse_command(export_plan(plan, "vllm").commands[-1])  # after ray start
    pp = int(flag(argv, "--pipeline-parallel-size"))
    assert pp == plan.num_stages
    for a in plan.assignments:
        got = engine_pp_indices(env["VLLM_PP_LAYER_PARTITION"], sum(counts), a.stage, pp)
        assert got == a.block_range


@given(counts_st)
def test_sglang_node_rank_r_runs_stage_r_with_its_blocks(counts):
    plan = make_plan(counts)
    lines = [x for x in export_plan(plan, "sglang").commands if not x.startswith("#")]
    assert len(lines) == plan.num_stages
    for a, line in zip(plan.assignments, lines, strict=True):
        env, argv = parse_command(line)
        pp = int(flag(argv, "--pp-size"))
        rank = int(flag(argv, "--node-rank"))
        assert int(flag(argv, "--nnodes")) == pp == plan.num_stages
        assert rank == a.stage
        part = env["SGLANG_PP_LAYER_PARTITION"]
        assert engine_pp_indices(part, sum(counts), rank, pp) == a.block_range


def test_vllm_export_carries_context_tp_and_the_ray_order_note():
    plan = make_plan([10, 12, 10], ["n-a", "n-b", "n-c"], context_tokens=8192)
    result = export_plan(plan, Engine.VLLM, model="meta-llama/Llama-3.1-8B")
    assert result.commands == (
        "# on n-a (stage 0)",
        "ray start --head --port 6379",
        "# on n-b (stage 1)",
        "ray start --address n-a:6379",
        "# on n-c (stage 2)",
        "ray start --address n-a:6379",
        "# on n-a",
        "VLLM_PP_LAYER_PARTITION=10,12,10 vllm serve meta-llama/Llama-3.1-8B "
        "--pipeline-parallel-size 3 --tensor-parallel-size 1 "
        "--distributed-executor-backend ray --max-model-len 8192 --gpu-memory-utilization 0.8",
    )
    assert (
        "the memory fraction 0.8 assumes the default 20% headroom: pass --nodes FLEET to read "
        "the plan's own"
    ) in result.notes
    assert any(
        "stage order n-a (stage 0) -> n-b (stage 1) -> n-c (stage 2)" in n for n in result.notes
    )


def node(node_id: str, gpus: int) -> NodeDescriptor:
    return NodeDescriptor(
        id=node_id,
        gpu_name="H100",
        vram_bytes=gpus * 80 << 30,
        flops_estimate=989,
        link_mbps=1e5,
        num_gpus=gpus,
    )


def test_equal_gpu_counts_become_the_tensor_parallel_degree():
    plan = make_plan([16, 16], ["a", "b"])
    result = export_plan(plan, "sglang", nodes=[node("a", 4), node("b", 4)])
    # The made-up plan gives each stage 20 GiB of its 4 × 80 GiB: 0.0625, rounded down.
    assert result.args == (
        "--pp-size", "2", "--tp-size", "4", "--context-length", "4096",
        "--mem-fraction-static", "0.062",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("engine", "plan", "nodes", "message"),
    [
        (
            "vllm",
            make_plan([16, 16], ["a", "b"]),
            [node("a", 2), node("b", 1)],
            "vllm cannot run this plan: stages have different GPU counts (a=2, b=1); "
            "the engine runs one tensor-parallel degree on every pipeline stage",
        ),
        (
            "sglang",
            make_plan(
                [2, 2], ["a", "b"], experts={1: [ExpertId(block=0, expert=3)]}, experts_per_block=8
            ),
            None,
            "sglang cannot run this plan: experts of block 0 are placed on stage 1 but the block "
            "is on stage 0; a pipeline stage keeps every expert of its own layers (use an "
            "expert-parallel plan for the engine's own EP); replan with every expert beside "
            "its block: stowplan plan llama3.1:8b --nodes FLEET --engine sglang --block-local "
            "--context 4096",
        ),
        (
            "vllm",
            make_plan(
                [2, 0],
                ["gpu0", "cpu"],
                experts={1: [ExpertId(block=b, expert=e) for b in (0, 1) for e in range(8)]},
                experts_per_block=8,
            ),
            None,
            "vllm cannot run this plan: experts of block 0 are placed on stage 1 but the block "
            "is on stage 0; a pipeline stage keeps every expert of its own layers (use an "
            "expert-parallel plan for the engine's own EP, or --to llamacpp); replan with "
            "every expert beside its block: stowplan plan llama3.1:8b --nodes FLEET --engine "
            "vllm --block-local --context 4096",
        ),
        (
            "vllm",
            make_plan(
                [2, 2],
                ["a", "b"],
                model_name="mixtral:8x7b",
                experts={1: [ExpertId(block=0, expert=3)]},
                experts_per_block=8,
            ),
            None,
            "vllm cannot run this plan: experts of block 0 are placed on stage 1 but the block "
            "is on stage 0; a pipeline stage keeps every expert of its own layers (use an "
            "expert-parallel plan for the engine's own EP, or --to accelerate); replan with "
            "every expert beside its block: stowplan plan mixtral:8x7b --nodes FLEET --engine "
            "vllm --block-local --context 4096",
        ),
    ],
)
def test_refusals_name_what_the_engine_cannot_express(engine, plan, nodes, message):
    with pytest.raises(UnsupportedByEngine) as info:
        export_plan(plan, engine, nodes=nodes)
    assert str(info.value) == message


def test_unknown_engine_is_an_input_error():
    with pytest.raises(ValueError) as info:
        export_plan(make_plan([4]), "tgi")
    assert str(info.value) == "--to='tgi': must be one of vllm, sglang, llamacpp, accelerate"
