"""objective='cost': the cheapest node set meeting the target."""

from __future__ import annotations

import pytest

from stowplan import Constraints, Infeasible, ModelLayout, NodeDescriptor, Objective, plan
from stowplan.cli import main

MODEL = ModelLayout(
    name="toy",
    num_blocks=4,
    hidden_dim=64,
    bytes_per_activation_elem=2,
    block_params_bytes=10**9,
    head_params_bytes=0,
    embed_params_bytes=0,
)
NODES = [
    NodeDescriptor(
        id="slow",
        gpu_name="x",
        vram_bytes=10 * 10**9,
        flops_estimate=0,
        link_mbps=0,
        mem_bandwidth_gbps=40,
        price_per_hour=0.1,
    ),
    NodeDescriptor(
        id="fast",
        gpu_name="x",
        vram_bytes=10 * 10**9,
        flops_estimate=0,
        link_mbps=0,
        mem_bandwidth_gbps=400,
        price_per_hour=1.0,
    ),
]


def _cost(target):
    return Constraints(objective=Objective.COST, target_tokens_per_s=target, vram_headroom_frac=0.0)


def test_the_cheap_node_is_chosen_when_it_meets_the_target():
    # slow alone: 4 GB / 40 GB/s = 100 ms per token = 10 tokens/s
    p = plan(MODEL, NODES, _cost(10))
    assert [a.node_id for a in p.assignments] == ["slow"]
    assert p.rationale.prediction.cost_per_hour == pytest.approx(0.1)


def test_a_higher_target_buys_the_fast_node():
    p = plan(MODEL, NODES, _cost(50))
    assert [a.node_id for a in p.assignments] == ["fast"]


def test_an_unreachable_target_says_why():
    with pytest.raises(Infeasible, match="no node set reaches 500 tokens/s: the fastest plan"):
        plan(MODEL, NODES, _cost(500))


def test_cli_prints_the_plan_with_peers(capsys, tmp_path):
    fleet = tmp_path / "f.yaml"
    fleet.write_text(
        "nodes:\n"
        "  - {id: a, gpu_name: RTX 4090, vram_bytes: 24GB, link_mbps: 1000, link_latency_ms: 20}\n"
        "  - {id: b, gpu_name: RTX 5090, vram_bytes: 32GB, link_mbps: 1000, link_latency_ms: 10}\n"
    )
    assert (
        main(
            [
                "plan",
                "llama3.1:8b",
                "--nodes",
                str(fleet),
                "--compare",
                "--batch",
                "4",
                "--context",
                "4096",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "throughput" in out and "certificate (throughput):" in out and "vllm" in out


def test_cli_target_without_prices_is_an_input_error(capsys, tmp_path):
    fleet = tmp_path / "f.yaml"
    fleet.write_text("nodes:\n  - {id: a, gpu_name: RTX 4090, vram_bytes: 24GB}\n")
    assert main(["plan", "llama3.1:8b-q4_0", "--nodes", str(fleet), "--target", "20tok/s"]) == 2
    assert "price_per_hour" in capsys.readouterr().err
