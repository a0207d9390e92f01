"""llama.cpp across hosts: ``ggml-rpc-server`` per stage elsewhere, ``llama-server --rpc`` last."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from stowplan.cli import main
from stowplan.exports import UnsupportedByEngine, export_plan
from stowplan.model import ExpertId, NodeDescriptor
from stowplan.plan import plan_to_json
from tests.common.llamacpp_replay import RULES, llamacpp_devices
from tests.common.plans import make_plan, make_tp_plan


def gpu(node_id: str, **labels: str) -> NodeDescriptor:
    return NodeDescriptor(id=node_id, gpu_name="RTX 3090", vram_bytes="24GiB", labels=labels)


def test_two_hosts_give_an_rpc_server_and_llama_server_with_the_split_in_stage_order():
    nodes = [gpu("a", address="192.168.1.10"), gpu("b")]
    result = export_plan(make_plan([12, 20], ["a", "b"]), "llamacpp", nodes=nodes, model="m.gguf")
    assert result.commands == (
        "# on a (stage 0)",
        "ggml-rpc-server -H 192.168.1.10 -p 50052",
        "# on b (stage 1)",
        "llama-server -m m.gguf --rpc 192.168.1.10:50052 -ngl 33 --tensor-split 12,21 -c 4096 -np 1",
    )
    assert result.data == {
        "rpc_servers": [{"node": "a", "stage": 0, "endpoint": "192.168.1.10:50052"}],
        "llama_server_node": "b",
    }
    assert not any("<host-of-" in note for note in result.notes)
    assert not any("one host" in note for note in result.notes)


def test_three_hosts_name_the_missing_addresses_and_give_each_stage_its_own_server():
    plan = make_tp_plan(
        [("n0", (0,), 10), ("n1", (2,), 10), ("n1", (3,), 6), ("n2", (1,), 6), ("cpu", (), 0)]
    )
    result = export_plan(plan, "llamacpp", model="m.gguf")
    assert result.commands == (
        "# on n0 (stage 0)",
        "CUDA_VISIBLE_DEVICES=0 ggml-rpc-server -H 0.0.0.0 -p 50052",
        "# on n1 (stage 1)",
        "CUDA_VISIBLE_DEVICES=2 ggml-rpc-server -H 0.0.0.0 -p 50053",
        "# on n1 (stage 2)",
        "CUDA_VISIBLE_DEVICES=3 ggml-rpc-server -H 0.0.0.0 -p 50054",
        "# on n2 (stages 3, 4)",
        "CUDA_VISIBLE_DEVICES=1 llama-server -m m.gguf --rpc "
        "'<host-of-n0>:50052,<host-of-n1>:50053,<host-of-n1>:50054' -ngl 33 -sm layer "
        "--tensor-split 10,10,6,7 -ot '^output\\.weight$=CPU' -c 4096 -np 1",
    )
    assert (
        "replace <host-of-NODE> after --rpc with the address of n0, n1 (or give the node a "
        "label address=IP in the fleet file)"
    ) in result.notes
    placed = llamacpp_devices(list(result.args), 32)
    # Devices: RPC0 (n0), RPC1 (n1 gpu2), RPC2 (n1 gpu3), then n2's own GPU; the head on the CPU.
    assert [placed[f"blk.{b}.attn_q.weight"] for b in (0, 9, 10, 19, 20, 25, 26, 31)] == [
        0, 0, 1, 1, 2, 2, 3, 3,
    ]  # fmt: skip
    assert placed["output.weight"] == "CPU"


def test_a_stage_of_llama_servers_host_before_another_hosts_is_served_on_loopback():
    plan = make_tp_plan([("a", (0,), 8), ("b", (0,), 8), ("a", (1,), 8)])
    result = export_plan(plan, "llamacpp", model="m.gguf")
    assert result.commands == (
        "# on a (stage 0)",
        "CUDA_VISIBLE_DEVICES=0 ggml-rpc-server -H 127.0.0.1 -p 50052",
        "# on b (stage 1)",
        "CUDA_VISIBLE_DEVICES=0 ggml-rpc-server -H 0.0.0.0 -p 50053",
        "# on a (stage 2)",
        "CUDA_VISIBLE_DEVICES=1 llama-server -m m.gguf --rpc "
        "'127.0.0.1:50052,<host-of-b>:50053' -ngl 25 -sm layer --tensor-split 8,8,9 -c 4096 "
        "-np 1",
    )


def test_a_cpu_node_with_an_address_is_served_by_its_hosts_rpc_server():
    nodes = [
        NodeDescriptor(
            id="cpu-a", gpu_name="CPU", vram_bytes="64GiB", labels={"address": "10.0.0.1"}
        ),
        gpu("a", address="10.0.0.1"),
        gpu("b", address="10.0.0.2"),
    ]
    plan = make_plan([2, 10, 20], ["cpu-a", "a", "b"])
    result = export_plan(plan, "llamacpp", nodes=nodes, model="m.gguf")
    assert result.commands == (
        "# on cpu-a (stage 0)",
        "ggml-rpc-server --device CPU -H 10.0.0.1 -p 50052",
        "# on a (stage 1)",
        "ggml-rpc-server -H 10.0.0.1 -p 50053",
        "# on b (stage 2)",
        "llama-server -m m.gguf --rpc 10.0.0.1:50052,10.0.0.1:50053 -ngl 33 "
        "--tensor-split 2,10,21 -c 4096 -np 1",
    )


def test_a_cpu_node_without_an_address_is_llama_servers_cpu():
    nodes = [gpu("a"), gpu("b"), NodeDescriptor(id="cpu", gpu_name="CPU", vram_bytes="64GiB")]
    plan = make_plan([10, 20, 2], ["a", "b", "cpu"])
    result = export_plan(plan, "llamacpp", nodes=nodes, model="m.gguf")
    assert result.commands[-1] == (
        "llama-server -m m.gguf --rpc '<host-of-a>:50052' -ngl 33 --tensor-split 10,23 "
        "-ot 'blk\\.(30|31)\\.=CPU' -ot '^output\\.weight$=CPU' -c 4096 -np 1"
    )


@st.composite
def multi_host_plans(draw):
    num = draw(st.integers(2, 7))
    hosts = draw(st.lists(st.sampled_from(["h0", "h1", "h2"]), min_size=num, max_size=num))
    assume(len(set(hosts)) > 1)
    counts = draw(st.lists(st.integers(0, 12), min_size=num, max_size=num))
    assume(sum(counts) > 0)
    used: dict[str, int] = {}
    stages = []
    for host, count in zip(hosts, counts, strict=True):
        stages.append((host, (used.get(host, 0),), count))
        used[host] = used.get(host, 0) + 1
    return make_tp_plan(stages)


@given(multi_host_plans(), st.sampled_from(sorted(RULES)))
def test_rpc_devices_then_local_gpus_are_the_stages_in_order_and_hold_their_blocks(plan, rule):
    result = export_plan(plan, "llamacpp", model="m.gguf")
    servers = result.data["rpc_servers"]
    argv = list(result.args)
    assert argv[argv.index("--rpc") + 1].split(",") == [s["endpoint"] for s in servers]
    local = [a.stage for a in plan.assignments if a.stage > servers[-1]["stage"]]
    devices = [s["stage"] for s in servers] + local
    # llama.cpp's device list (RPC first, then local GPUs) is the plan's stage order.
    assert devices == list(range(plan.num_stages))
    assert {a.node_id for a in plan.assignments if a.stage in local} == {
        result.data["llama_server_node"]
    }
    placed = llamacpp_devices(argv, plan.num_blocks, rule)
    for a in plan.assignments:
        for b in range(*a.block_range):
            assert placed[f"blk.{b}.attn_q.weight"] == devices.index(a.stage), (b, a.stage)
    assert placed["output.weight"] == len(devices) - 1
    # Every server its own port, so servers of nodes on one machine never collide.
    ports = [s["endpoint"].rsplit(":", 1)[1] for s in servers]
    assert len(set(ports)) == len(ports)


def test_experts_on_another_hosts_cpu_are_refused_with_the_block_local_replan():
    nodes = [
        NodeDescriptor(id="cpu-a", gpu_name="CPU", vram_bytes="64GiB", labels={"address": "a"}),
        gpu("a", address="a"),
        gpu("b"),
    ]
    experts = {0: [ExpertId(block=b, expert=e) for b in (2, 3) for e in range(4)]}
    plan = make_plan([0, 2, 2], ["cpu-a", "a", "b"], experts=experts, experts_per_block=4)
    with pytest.raises(UnsupportedByEngine) as info:
        export_plan(plan, "llamacpp", nodes=nodes, nodes_file="fleet.yaml")
    assert str(info.value) == (
        "llamacpp cannot run this plan: the routed experts of block 2 are on stage 0 and the "
        "block on stage 2; the export moves experts only from a GPU block to the CPU of "
        "llama-server's host; replan with every expert beside its block: stowplan plan "
        "llama3.1:8b --nodes fleet.yaml --engine llamacpp --block-local --context 4096"
    )


def test_experts_split_across_hosts_are_refused_with_the_block_local_replan():
    experts = {1: [ExpertId(block=0, expert=e) for e in range(2)]}
    plan = make_plan([1, 1], ["a", "b"], experts=experts, experts_per_block=4)
    with pytest.raises(UnsupportedByEngine) as info:
        export_plan(plan, "llamacpp", nodes=[gpu("a"), gpu("b")])
    assert str(info.value).endswith(
        "replan with every expert beside its block: stowplan plan llama3.1:8b --nodes FLEET "
        "--engine llamacpp --block-local --context 4096"
    )


def test_whole_nodes_without_descriptors_stay_devices_of_one_host():
    result = export_plan(make_plan([12, 20]), "llamacpp", model="m.gguf")
    assert result.commands == ("llama-server -m m.gguf -ngl 33 --tensor-split 12,21 -c 4096 -np 1",)
    assert result.data == {}


def test_the_cli_exports_a_fleet_of_two_hosts_with_rpc(tmp_path: Path, capsys) -> None:
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(plan_to_json(make_plan([12, 20], ["a", "b"])))
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "- {id: a, gpu_name: RTX 3090, vram_bytes: 24GiB, labels: {address: 10.1.1.1}}\n"
        "- {id: b, gpu_name: RTX 3090, vram_bytes: 24GiB}\n"
    )
    args = ["export", str(plan_path), "--to", "llamacpp", "--nodes", str(fleet)]
    assert main([*args, "--model", "m.gguf"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-3:] == [
        "ggml-rpc-server -H 10.1.1.1 -p 50052",
        "# on b (stage 1)",
        "llama-server -m m.gguf --rpc 10.1.1.1:50052 -ngl 33 --tensor-split 12,21 -c 4096 -np 1",
    ]
    assert shlex.split(lines[-1])[0] == "llama-server"
