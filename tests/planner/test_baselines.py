"""Peer rules follow their documented splits."""

from __future__ import annotations

from stowplan import Constraints, ModelLayout, NodeDescriptor
from stowplan.cost import CostModel
from stowplan.planner.baselines.peers import BASELINES, compare
from stowplan.planner.problem import prepare

MODEL = ModelLayout(
    name="toy",
    num_blocks=10,
    hidden_dim=64,
    bytes_per_activation_elem=2,
    block_params_bytes=10**9,
    head_params_bytes=0,
    embed_params_bytes=0,
)


def _nodes(*gbs):
    return [
        NodeDescriptor(
            id=f"n{i}",
            gpu_name="RTX 4090",
            vram_bytes=gb * 10**9,
            flops_estimate=0.0,
            link_mbps=1000,
        )
        for i, gb in enumerate(gbs)
    ]


def _run(name, nodes):
    c = Constraints(vram_headroom_frac=0.0)
    return BASELINES[name](prepare(MODEL, nodes, c), CostModel(MODEL, nodes, c))


def test_vllm_gives_extra_layers_to_the_stages_before_the_last():
    # get_pp_indices: 10 layers over 4 → [2, 3, 3, 2]
    assert _run("vllm", _nodes(10, 10, 10, 10)) == ([0, 1, 2, 3], [0, 2, 5, 8, 10])


def test_exo_splits_in_proportion_to_memory_largest_first():
    assert _run("exo", _nodes(5, 20)) == ([1, 0], [0, 8, 10])


def test_accelerate_fills_each_node_in_turn():
    assert _run("accelerate", _nodes(6, 6, 6)) == ([0, 1], [0, 6, 10])


def test_a_rule_that_does_not_fit_says_so():
    results = compare(
        prepare(MODEL, _nodes(1, 19), Constraints(vram_headroom_frac=0.0)),
        CostModel(MODEL, _nodes(1, 19), Constraints(vram_headroom_frac=0.0)),
    )
    vllm = next(r for r in results if r.name == "vllm")
    assert vllm.pipeline is None and vllm.tokens_per_s is None
