"""Exports that run as printed: the plan JSON keeps the model's path and the nodes'
addresses, llama.cpp's RPC servers are named and numbered as current builds take them,
and every refusal's replanning command runs."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from stowplan.cli import main
from stowplan.exports import export_plan
from stowplan.exports.common import replan_command
from stowplan.model import NodeDescriptor
from stowplan.plan import plan_from_json
from tests.common.llamacpp_replay import llamacpp_devices
from tests.common.plans import make_plan
from tests.common.tiny_gguf import write_tiny_llama

LOOPBACK_FLEET = """\
nodes:
  - {id: s0, gpu_name: CPU, vram_bytes: 1GiB, mem_bandwidth_gbps: 40, link_mbps: 10000,
     labels: {address: 127.0.0.2}}
  - {id: s1, gpu_name: CPU, vram_bytes: 1GiB, mem_bandwidth_gbps: 40, link_mbps: 10000,
     labels: {address: 127.0.0.3}}
  - {id: s2, gpu_name: CPU, vram_bytes: 1GiB, mem_bandwidth_gbps: 40, link_mbps: 10000,
     labels: {address: 127.0.0.1}}
"""


def _plan_json(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> Path:
    assert main(["plan", *args, "--json"]) == 0
    path = tmp_path / "plan.json"
    path.write_text(capsys.readouterr().out)
    return path


@pytest.fixture
def gguf_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path, Path]:
    """A 3-stage plan of a tiny GGUF on three loopback CPU nodes: (plan, model, fleet)."""
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    fleet = tmp_path / "loop.yaml"
    fleet.write_text(LOOPBACK_FLEET)
    plan = _plan_json(tmp_path, capsys, str(model), "--nodes", str(fleet), "--min-stages", "3")
    return plan, model, fleet


def test_the_plan_json_keeps_the_model_path_and_the_nodes(gguf_plan) -> None:
    plan_file, model, _ = gguf_plan
    plan = plan_from_json(plan_file.read_text())
    assert plan.model_source == str(model.resolve())
    used = [a.node_id for a in plan.assignments]
    assert [n.id for n in plan.nodes] == list(dict.fromkeys(used))
    assert {n.id: dict(n.labels)["address"] for n in plan.nodes} == {
        "s0": "127.0.0.2",
        "s1": "127.0.0.3",
        "s2": "127.0.0.1",
    }


def test_a_multi_host_plan_exports_without_nodes_and_runs_as_printed(
    gguf_plan, capsys: pytest.CaptureFixture[str]
) -> None:
    plan_file, model, _ = gguf_plan
    plan = plan_from_json(plan_file.read_text())
    assert main(["export", str(plan_file), "--to", "llamacpp", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    servers = result["data"]["rpc_servers"]
    commands = [c for c in result["commands"] if not c.startswith("#")]
    # One ggml-rpc-server per stage the llama-server does not run itself, each on a port
    # of its own, bound to its node's address.
    assert [shlex.split(c)[0] for c in commands] == ["ggml-rpc-server"] * len(servers) + [
        "llama-server"
    ]
    ports = [s["endpoint"].rsplit(":", 1)[1] for s in servers]
    assert len(set(ports)) == len(ports) == plan.num_stages - 1
    argv = shlex.split(commands[-1])[1:]
    # -m the GGUF the plan was made from, -np the plan's one sequence.
    assert argv[argv.index("-m") + 1] == str(model.resolve())
    assert argv[argv.index("-np") + 1] == "1"
    placed = llamacpp_devices(argv, plan.num_blocks)
    for a in plan.assignments[:-1]:
        for b in range(*a.block_range):
            assert placed[f"blk.{b}.attn_q.weight"] == a.stage
    for b in range(*plan.assignments[-1].block_range):
        assert placed[f"blk.{b}.attn_q.weight"] == "CPU"
    # The head's matrix on the CPU tail; its norm stays with the last device's layers.
    assert placed["output.weight"] == "CPU"
    assert placed["output_norm.weight"] == plan.num_stages - 2
    assert any(n.startswith("llama.cpp builds before the rename name") for n in result["notes"])


def test_plans_written_before_the_nodes_were_kept_still_load_and_export(gguf_plan) -> None:
    plan_file, _, _ = gguf_plan
    old = json.loads(plan_file.read_text())
    del old["nodes"], old["model_source"]
    plan = plan_from_json(json.dumps(old))
    assert plan.nodes == () and plan.model_source is None
    # Without the descriptors its nodes read as devices of one host, as before.
    assert export_plan(plan, "llamacpp").data == {}


def test_the_refusals_replanning_command_runs_as_printed(
    gguf_plan, capsys: pytest.CaptureFixture[str]
) -> None:
    plan_file, model, fleet = gguf_plan
    plan = plan_from_json(plan_file.read_text())
    line = replan_command(plan, "llamacpp", str(fleet), "--block-local")
    words = shlex.split(line)
    assert words[:3] == ["stowplan", "plan", str(model.resolve())]
    assert main(words[1:]) == 0
    capsys.readouterr()


def test_a_priced_dtype_is_replanned_with_dtype(capsys: pytest.CaptureFixture[str], tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("- {id: g, gpu_name: H100 SXM, vram_bytes: 80GB}\n")
    plan = make_plan([32], ["g"], model_name="llama3.1:8b@fp8")
    words = shlex.split(replan_command(plan, "vllm", str(fleet)))
    assert words[2:5] == ["llama3.1:8b", "--dtype", "fp8"]
    assert main(words[1:]) == 0
    capsys.readouterr()
    # The engines serve the published checkpoint and say that the plan priced fp8.
    result = export_plan(plan, "vllm")
    assert shlex.split(result.commands[-1])[3] == "meta-llama/Llama-3.1-8B"
    assert any("prices the weights as fp8" in n for n in result.notes)


def test_accelerate_loads_a_gguf_plan_with_gguf_file(gguf_plan) -> None:
    plan_file, model, _ = gguf_plan
    # Accelerate runs on one host: the same blocks as stages of one machine.
    plan = plan_from_json(plan_file.read_text())
    one_host = plan_from_json(json.dumps({**json.loads(plan_file.read_text()), "nodes": []}))
    assert one_host.model_source == plan.model_source
    snippet = export_plan(one_host, "accelerate").commands[0]
    path = model.resolve()
    assert f"from_pretrained({str(path.parent)!r}, gguf_file={path.name!r}," in snippet
    assert f"from_pretrained({str(path)!r}" not in snippet


def gpu(node_id: str, **labels: str) -> NodeDescriptor:
    return NodeDescriptor(id=node_id, gpu_name="RTX 3090", vram_bytes="24GiB", labels=labels)


def test_cpu_blocks_between_hosts_count_on_llama_servers_own_gpu() -> None:
    nodes = [
        gpu("a", address="10.0.0.1"),
        NodeDescriptor(id="cpu", gpu_name="CPU", vram_bytes="64GiB"),
        gpu("b", address="10.0.0.2"),
    ]
    result = export_plan(make_plan([10, 2, 20], ["a", "cpu", "b"]), "llamacpp", nodes=nodes)
    argv = list(result.args)
    # The CPU blocks 10-11 count on b's GPU (llama-server's host), not on a's over RPC.
    assert argv[argv.index("--tensor-split") + 1] == "10,23"
    placed = llamacpp_devices(argv, 32)
    assert [placed[f"blk.{b}.attn_q.weight"] for b in (9, 10, 11, 12)] == [0, "CPU", "CPU", 1]
    assert (
        "the KV cache of blocks 10-11, kept on the CPU with -ot, lives on b (stage 2): llama.cpp "
        "keeps a layer's KV cache on the device its --tensor-split share gives it"
    ) in result.notes


def test_cpu_blocks_next_to_another_hosts_device_only_say_where_their_kv_is() -> None:
    nodes = [
        gpu("a", address="10.0.0.1"),
        NodeDescriptor(
            id="cpu", gpu_name="CPU", vram_bytes="64GiB", labels={"address": "10.0.0.2"}
        ),
    ]
    result = export_plan(make_plan([30, 2], ["a", "cpu"]), "llamacpp", nodes=nodes)
    (note,) = [n for n in result.notes if n.startswith("the KV cache of")]
    assert note.startswith("the KV cache of blocks 30-31, kept on the CPU with -ot, lives on a")
    assert "another host's" in note and "--no-kv-offload" in note
