"""A serve plan's exports: every replica sized for its U*, identical ones data parallel."""

from __future__ import annotations

import pytest

from stowplan import NodeDescriptor, Workload, serve
from stowplan.exports.serving import export_serve_plan
from tests.common.commands import flag, parse_command

W = Workload(prompt_tokens=1024, output_tokens=256, ttft_s=1.0, tpot_s=0.05)


def _fleet(n: int) -> list[NodeDescriptor]:
    return [
        NodeDescriptor(
            id=f"g{i}",
            gpu_name="RTX 4090",
            vram_bytes="24GiB",
            link_mbps="1Gbit",
            price_per_hour=0.35,
        )
        for i in range(n)
    ]


def _serving_line(commands: tuple[str, ...], words: str) -> list[str]:
    line = next(c for c in commands if words in c)
    return parse_command(line)[1]


@pytest.mark.parametrize(
    ("engine", "words", "users_flag", "length_flag"),
    [
        ("vllm", "vllm", "--max-num-seqs", "--max-model-len"),
        ("sglang", "sglang.launch_server", "--max-running-requests", "--context-length"),
    ],
)
def test_every_replica_runs_its_u_star_requests_of_p_plus_o_tokens(
    engine, words, users_flag, length_flag
):
    sp = serve("llama3.1:8b", _fleet(3), W)
    out = export_serve_plan(sp, engine)
    assert len(out.replicas) == len(sp.replicas) == 3
    for e, r in zip(out.replicas, sp.replicas, strict=True):
        argv = _serving_line(e.commands, words)
        assert flag(argv, users_flag) == str(r.users)
        assert flag(argv, length_flag) == "1280"


def test_llamacpp_gets_u_star_slots_of_p_plus_o_tokens_each():
    sp = serve("llama3.1:8b", _fleet(2), W)
    out = export_serve_plan(sp, "llamacpp")
    for e, r in zip(out.replicas, sp.replicas, strict=True):
        argv = _serving_line(e.commands, "llama-server")
        assert flag(argv, "-np") == str(r.users)
        assert flag(argv, "-c") == str(r.users * 1280)
        assert argv.count("-np") == 1 and argv.count("-c") == 1


def test_identical_replicas_are_one_data_parallel_instance():
    sp = serve("llama3.1:8b", _fleet(3), W)
    vllm = export_serve_plan(sp, "vllm")
    assert len(vllm.commands) == 1
    assert flag(parse_command(vllm.commands[0])[1], "--data-parallel-size") == "3"
    assert "replicas 0, 1, 2 are identical" in vllm.notes[0]
    sglang = export_serve_plan(sp, "sglang")
    assert flag(parse_command(sglang.commands[0])[1], "--dp-size") == "3"
    llama = export_serve_plan(sp, "llamacpp")
    assert llama.commands == () and "no data parallelism" in llama.notes[0]


def test_the_export_is_data_too():
    sp = serve("llama3.1:8b", _fleet(2), W)
    data = export_serve_plan(sp, "vllm").to_dict()
    assert [r["nodes"] for r in data["replicas"]] == [list(r.node_ids) for r in sp.replicas]
    assert data["engine"] == "vllm" and len(data["commands"]) == 1
