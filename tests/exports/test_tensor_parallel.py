"""Exports of plans that list GPUs: engines get the plan's TP degree and devices, replaying
each engine's own rank rule gives back the plan, and what an engine cannot run is refused
with the replanning line that plans what it runs."""

from __future__ import annotations

import json
import shlex

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stowplan import Constraints, load_nodes, lookup, plan
from stowplan.exports import UnsupportedByEngine, export_plan
from stowplan.model import NodeDescriptor
from stowplan.plan import Plan, plan_from_json
from tests.common.commands import engine_pp_indices, flag, parse_command
from tests.common.llamacpp_replay import llamacpp_devices
from tests.common.paths import EXAMPLES, FIXTURES
from tests.common.plans import make_tp_plan

TWO_H100 = EXAMPLES / "fleets" / "two-h100-nodes.yaml"


def h100_node(node_id: str, gpus: int) -> NodeDescriptor:
    return NodeDescriptor(
        id=node_id,
        gpu_name="H100 SXM",
        vram_bytes=gpus * 80 * 10**9,
        flops_estimate=989.0 * gpus,
        link_mbps=400_000,
        num_gpus=gpus,
    )


@pytest.fixture(scope="module")
def plan_405b() -> Plan:
    model = lookup("llama3.1:405b")
    assert model is not None
    return plan(model, load_nodes(TWO_H100), Constraints())


def test_two_nodes_of_eight_h100_run_405b_as_tp8_times_pp2_on_vllm(plan_405b: Plan) -> None:
    assert [(a.node_id, a.tensor_parallel) for a in plan_405b.assignments] == [
        ("n0", 8),
        ("n1", 8),
    ]
    result = export_plan(plan_405b, "vllm", nodes=load_nodes(TWO_H100))
    # With the fleet's descriptors the Ray cluster is still started on both nodes, and
    # vLLM serves the Hugging Face id the model table gives llama3.1:405b.
    assert result.commands[:5] == (
        "# on n0 (stage 0)",
        "ray start --head --port 6379",
        "# on n1 (stage 1)",
        "ray start --address n0:6379",
        "# on n0",
    )
    env, argv = parse_command(result.commands[-1])
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-405B"]
    assert argv[3:] == [
        "--pipeline-parallel-size", "2", "--tensor-parallel-size", "8",
        "--distributed-executor-backend", "ray", "--gpu-memory-utilization", "0.8",
    ]  # fmt: skip
    assert set(env) == {"VLLM_PP_LAYER_PARTITION"}
    for a in plan_405b.assignments:
        assert engine_pp_indices(env["VLLM_PP_LAYER_PARTITION"], 126, a.stage, 2) == a.block_range


def test_two_nodes_of_eight_h100_run_405b_as_tp8_times_pp2_on_sglang(plan_405b: Plan) -> None:
    result = export_plan(plan_405b, "sglang", nodes=load_nodes(TWO_H100))
    lines = [c for c in result.commands if not c.startswith("#")]
    assert len(lines) == 2
    for rank, line in enumerate(lines):
        env, argv = parse_command(line)
        assert "CUDA_VISIBLE_DEVICES" not in env
        assert flag(argv, "--tp-size") == "8" and flag(argv, "--pp-size") == "2"
        assert flag(argv, "--nnodes") == "2" and flag(argv, "--node-rank") == str(rank)


def test_without_the_fleet_every_node_gets_its_device_list_before_ray_start(
    plan_405b: Plan,
) -> None:
    result = export_plan(plan_405b, "vllm")
    assert result.commands[:4] == (
        "# on n0 (stage 0)",
        "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 ray start --head --port 6379",
        "# on n1 (stage 1)",
        "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 ray start --address n0:6379",
    )
    assert result.commands[4] == "# on n0"
    assert "--tensor-parallel-size 8" in result.commands[5]
    assert result.data["visible_devices"] == {"n0": "0,1,2,3,4,5,6,7", "n1": "0,1,2,3,4,5,6,7"}


def test_nodes_the_plan_leaves_out_are_kept_out_of_the_ray_cluster() -> None:
    p = make_tp_plan([("n0", (0, 1, 2, 3), 20), ("n1", (0, 1, 2, 3), 12)])
    nodes = [h100_node("n0", 4), h100_node("n1", 4), h100_node("n2", 4)]
    result = export_plan(p, "vllm", nodes=nodes)
    assert (
        "keep n2 out of this Ray cluster: the plan does not use it, and vLLM places workers on "
        "any GPU Ray has" in result.notes
    )
    assert "--tensor-parallel-size 4" in result.commands[-1]
    assert [c for c in result.commands if c.startswith("# on")] == [
        "# on n0 (stage 0)",
        "# on n1 (stage 1)",
        "# on n0",
    ]


def test_a_node_split_into_two_stages_runs_on_one_host_without_ray() -> None:
    p = make_tp_plan([("n0", (0, 1, 2, 3), 20), ("n0", (4, 5, 6, 7), 12)])
    result = export_plan(p, "vllm", nodes=[h100_node("n0", 8)], model="meta-llama/Llama-3.1-8B")
    # The made-up plan gives each GPU 20 GiB of its 80 GB: 21.47 / 80 = 0.268 of it.
    assert result.commands == (
        "VLLM_PP_LAYER_PARTITION=20,12 vllm serve meta-llama/Llama-3.1-8B "
        "--pipeline-parallel-size 2 --tensor-parallel-size 4 --max-model-len 4096 "
        "--gpu-memory-utilization 0.268",
    )


def test_a_subset_of_a_nodes_gpus_is_its_cuda_visible_devices() -> None:
    p = make_tp_plan([("n0", (6, 7), 20), ("n0", (2, 3), 12)])
    result = export_plan(p, "vllm", nodes=[h100_node("n0", 8)], model="m")
    assert result.commands == (
        "CUDA_VISIBLE_DEVICES=2,3,6,7 VLLM_PP_LAYER_PARTITION=20,12 vllm serve m "
        "--pipeline-parallel-size 2 --tensor-parallel-size 2 --max-model-len 4096 "
        "--gpu-memory-utilization 0.268",
    )
    sglang = export_plan(p, "sglang", nodes=[h100_node("n0", 8)], model="m")
    assert sglang.commands == (
        "# on n0 (stages 0-1)",
        "CUDA_VISIBLE_DEVICES=6,7,2,3 SGLANG_PP_LAYER_PARTITION=20,12 python -m "
        "sglang.launch_server --model-path m --pp-size 2 --tp-size 2 --context-length 4096 "
        "--mem-fraction-static 0.268 --nnodes 1 --node-rank 0",
    )


# Nodes of 8 GPUs, each split into 1, 2 or 4 stages of one degree, in stage order.
split_fleets = st.tuples(
    st.sampled_from([1, 2, 4, 8]), st.integers(1, 3), st.sampled_from([1, 2, 4])
).filter(lambda t: t[0] * t[2] <= 8)


def _split_plan(tp: int, num_nodes: int, per_node: int, counts: list[int]) -> Plan:
    stages = []
    for node in range(num_nodes):
        order = list(range(per_node))[::-1] if node % 2 else list(range(per_node))
        for k in order:
            stages.append((f"n{node}", tuple(range(k * tp, (k + 1) * tp)), 0))
    return make_tp_plan([(n, g, c) for (n, g, _), c in zip(stages, counts, strict=False)])


@given(split_fleets, st.data())
def test_sglang_ranks_land_on_the_gpus_the_plan_lists(case, data) -> None:
    tp, num_nodes, per_node = case
    n = num_nodes * per_node
    counts = data.draw(st.lists(st.integers(1, 9), min_size=n, max_size=n))
    p = _split_plan(tp, num_nodes, per_node, counts)
    result = export_plan(p, "sglang", nodes=[h100_node(f"n{i}", 8) for i in range(num_nodes)])
    lines = [c for c in result.commands if not c.startswith("#")]
    assert len(lines) == num_nodes
    for line in lines:
        env, argv = parse_command(line)
        pp, t = int(flag(argv, "--pp-size")), int(flag(argv, "--tp-size"))
        nnodes, rank = int(flag(argv, "--nnodes")), int(flag(argv, "--node-rank"))
        assert (pp, t, nnodes) == (n, tp, num_nodes)
        # SGLang's _launch_scheduler_processes: pipeline ranks and GPU ids of this node.
        k = max(pp // nnodes, 1)
        visible = env.get("CUDA_VISIBLE_DEVICES")
        for pp_rank in range(k * rank, k * (rank + 1)):
            a = p.assignments[pp_rank]
            assert a.node_id == f"n{rank}"
            gpu_ids = [(pp_rank % k) * t + r for r in range(t)]
            physical = [int(visible.split(",")[g]) if visible else g for g in gpu_ids]
            assert tuple(physical) == a.gpu_indices
            part = env["SGLANG_PP_LAYER_PARTITION"]
            assert engine_pp_indices(part, sum(counts), pp_rank, pp) == a.block_range


@given(split_fleets, st.data())
def test_vllm_gives_each_node_its_stages_and_exactly_their_gpus(case, data) -> None:
    tp, num_nodes, per_node = case
    n = num_nodes * per_node
    counts = data.draw(st.lists(st.integers(1, 9), min_size=n, max_size=n))
    p = _split_plan(tp, num_nodes, per_node, counts)
    result = export_plan(p, "vllm", nodes=[h100_node(f"n{i}", 8) for i in range(num_nodes)])
    serve_env, argv = parse_command(result.commands[-1])
    assert int(flag(argv, "--tensor-parallel-size")) == tp
    assert int(flag(argv, "--pipeline-parallel-size")) == n
    devices = result.data.get("visible_devices", {})
    # Ray's workers, sorted the way vLLM sorts them (driver node first, then fewer workers).
    workers = []
    for i in range(num_nodes):
        listed = devices.get(f"n{i}", serve_env.get("CUDA_VISIBLE_DEVICES"))
        gpus = [int(g) for g in listed.split(",")] if listed else list(range(8))
        workers.append((i != 0, len(gpus), f"n{i}", sorted(gpus)))
    ranks = [(node, g) for *_, node, gpus in sorted(workers) for g in gpus]
    assert len(ranks) == tp * n
    for a in p.assignments:
        mine = ranks[a.stage * tp : (a.stage + 1) * tp]
        assert {node for node, _ in mine} == {a.node_id}
    for i in range(num_nodes):
        used = sorted(g for a in p.assignments if a.node_id == f"n{i}" for g in a.gpu_indices)
        assert sorted(g for node, g in ranks if node == f"n{i}") == used


def test_llamacpp_runs_one_tensor_parallel_stage_with_row_split() -> None:
    p = make_tp_plan([("n0", (4, 5, 6, 7), 32)], context_tokens=8192)
    result = export_plan(p, "llamacpp", model="m.gguf")
    assert result.commands == (
        "CUDA_VISIBLE_DEVICES=4,5,6,7 llama-server -m m.gguf -ngl 33 -sm row "
        "--tensor-split 1,1,1,1 -c 8192 -np 1",
    )
    assert any("KV cache and the intermediate results on the main GPU" in n for n in result.notes)


@pytest.mark.parametrize("rule", ["n_layer + 1 - ngl", "n_layer - ngl"])
def test_llamacpp_layer_split_puts_each_stages_blocks_on_its_own_gpu(rule: str) -> None:
    p = make_tp_plan([("n0", (5,), 10), ("n0", (1,), 14), ("n0", (3,), 8)])
    result = export_plan(p, "llamacpp", model="m.gguf")
    env, argv = parse_command(result.commands[0])
    assert argv[1:] == [
        "-m", "m.gguf", "-ngl", "33", "-sm", "layer", "--tensor-split", "10,14,9", "-c", "4096",
        "-np", "1",
    ]  # fmt: skip
    visible = [int(g) for g in env["CUDA_VISIBLE_DEVICES"].split(",")]
    assert visible == [5, 1, 3]
    placed = llamacpp_devices(argv[1:], 32, rule)
    for a in p.assignments:
        for b in range(*a.block_range):
            device = placed[f"blk.{b}.attn_q.weight"]
            assert isinstance(device, int) and (visible[device],) == a.gpu_indices
    assert visible[placed["output.weight"]] == 3  # type: ignore[index]


def test_accelerate_maps_each_stage_to_its_own_cuda_index() -> None:
    p = make_tp_plan([("n0", (3,), 20), ("n0", (5,), 12)])
    result = export_plan(p, "accelerate")
    device_map = result.data["device_map"]
    assert device_map["model.embed_tokens"] == device_map["model.layers.19"] == 3
    assert device_map["model.layers.20"] == device_map["lm_head"] == 5
    assert json.loads(dict(result.files)["max_memory.json"]) == {
        "3": 20 << 30,
        "5": 20 << 30,
    }
    assert any("cuda:3 = n0 gpu3 (stage 0), cuda:5 = n0 gpu5 (stage 1)" in n for n in result.notes)


REPLAN = "replan for it: stowplan plan llama3.1:8b --nodes fleet.yaml --engine"


@pytest.mark.parametrize(
    ("engine", "stages", "message"),
    [
        (
            "vllm",
            [("n0", (0, 1, 2, 3), 16), ("n1", (0, 1), 16)],
            "vllm cannot run this plan: stages have different tensor-parallel degrees (stage 0 "
            "tp4, stage 1 tp2); the engine runs one tensor-parallel degree on every pipeline "
            f"stage; {REPLAN} vllm --context 4096",
        ),
        (
            "sglang",
            [("n0", (0, 1), 16), ("n1", (0,), 16)],
            "sglang cannot run this plan: stages have different tensor-parallel degrees (stage 0 "
            "tp2, stage 1 tp1); the engine runs one tensor-parallel degree on every pipeline "
            f"stage; {REPLAN} sglang --context 4096",
        ),
        (
            "vllm",
            [("n0", (0, 1), 10), ("n1", (0, 1), 10), ("n0", (2, 3), 12)],
            "vllm cannot run this plan: node n0 runs stages 0, 2 with other nodes' stages "
            "between them; the engine gives each node one run of consecutive pipeline ranks; "
            f"{REPLAN} vllm --context 4096",
        ),
        (
            "sglang",
            [("n0", (0, 1), 10), ("n0", (2, 3), 10), ("n1", (0, 1), 12)],
            "sglang cannot run this plan: nodes run different numbers of stages (n0: 2, n1: 1); "
            f"SGLang gives every node --pp-size / --nnodes of them; {REPLAN} sglang --context 4096",
        ),
        (
            "vllm",
            [("n0", (0,), 8), ("n1", (0,), 8), ("n1", (1,), 8), ("n2", (0,), 8)],
            "vllm cannot run this plan: n1 (2 GPUs) comes before n2 (1 GPUs) in the pipeline, "
            "but vLLM's Ray executor ranks the nodes after the first by the GPUs they use, "
            f"fewest first; {REPLAN} vllm --context 4096",
        ),
        (
            "llamacpp",
            [("n0", (0, 1), 16), ("n0", (2,), 16)],
            "llamacpp cannot run this plan: stage 0 splits its blocks over 2 GPUs (n0 gpu0-1 tp2) "
            "and the plan has 2 stages; llama.cpp splits the whole model either by rows over all "
            "its GPUs (-sm row) or by whole layers per GPU (-sm layer), not both; "
            f"{REPLAN} llamacpp --context 4096",
        ),
        (
            "llamacpp",
            [("n0", (0, 1), 16), ("n1", (0,), 16)],
            "llamacpp cannot run this plan: stage 0 splits its blocks over 2 GPUs (n0 gpu0-1 tp2) "
            "and the plan spans 2 hosts; across hosts llama.cpp gives each GPU whole layers "
            f"(-sm layer), one GPU per stage; {REPLAN} llamacpp --context 4096",
        ),
        (
            "accelerate",
            [("n0", (0,), 16), ("n0", (2, 3), 16)],
            "accelerate cannot run this plan: stage 1 splits its blocks over 2 GPUs (n0 gpu2-3 "
            "tp2); a device_map puts each module on one device; replan with one GPU per stage: "
            "stowplan plan llama3.1:8b --nodes fleet.yaml --engine transformers --context 4096",
        ),
    ],
)
def test_what_an_engine_cannot_run_is_refused_with_the_replanning_line(
    engine: str, stages: list[tuple[str, tuple[int, ...], int]], message: str
) -> None:
    with pytest.raises(UnsupportedByEngine) as info:
        export_plan(make_tp_plan(stages), engine, nodes_file="fleet.yaml")
    assert str(info.value) == message


def test_version_1_plans_export_exactly_as_before() -> None:
    stored = json.loads((FIXTURES / "exports" / "v1-plans.json").read_text())
    assert len(stored) >= 15
    for name, per_engine in stored.items():
        p = plan_from_json((FIXTURES / "plans" / name).read_text())
        for engine, expected in per_engine.items():
            assert export_plan(p, engine).to_dict() == expected, (name, engine)


def test_the_cli_refusal_names_the_fleet_file_and_exits_2(tmp_path, capsys) -> None:
    from stowplan.cli import main
    from stowplan.plan import plan_to_json

    path = tmp_path / "plan.json"
    path.write_text(plan_to_json(make_tp_plan([("n0", (0, 1), 16), ("n1", (0,), 16)])))
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "- {id: n0, gpu_name: H100 SXM, vram_bytes: 160GB, num_gpus: 2, link_mbps: 1000}\n"
        "- {id: n1, gpu_name: H100 SXM, vram_bytes: 80GB, num_gpus: 1, link_mbps: 1000}\n"
    )
    assert main(["export", str(path), "--to", "vllm", "--nodes", str(fleet)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.rstrip().endswith(
        f"stowplan plan llama3.1:8b --nodes {shlex.quote(str(fleet))} --engine vllm --context 4096"
    )
