"""The exact value of a multi-GPU node (alone, or with single-GPU nodes) against the
independent referee (tests/common/serving_referee.py): every GPU group of the node is a
referee node of its share of the node's memory, bandwidth and FLOPs whose stages pass
activations over the node's own link."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stowplan import Constraints, ModelLayout, NodeDescriptor, resolve_model, serve
from stowplan.rules.tensor_parallel import legal_tensor_parallel
from stowplan.serving.node_groups import best_node_replicas
from tests.common.serving_models import loads, models, serve_settings, workload
from tests.common.serving_referee import Load, Referee

GB = 10**9
SETTINGS = serve_settings(25)


def two_gpus(vram_gb: int, flops: float, bw: float) -> NodeDescriptor:
    return NodeDescriptor(
        id="m",
        gpu_name="L40S",
        vram_bytes=vram_gb * GB,
        num_gpus=2,
        flops_estimate=flops,
        mem_bandwidth_gbps=bw,
        link_mbps=1000.0,
        intra_link_gbps=25.0,
        intra_link_latency_us=10.0,
        price_per_hour=2.0,
    )


def group(node: NodeDescriptor, gpus: int, tag: str) -> NodeDescriptor:
    """``gpus`` of ``node``'s GPUs as a referee node: their share of it, its own link."""
    share = gpus / node.num_gpus
    assert node.mem_bandwidth_gbps is not None and node.intra_link_gbps is not None
    assert node.intra_link_latency_us is not None
    return replace(
        node,
        id=f"{node.id}{tag}",
        num_gpus=gpus,
        vram_bytes=int(node.vram_bytes * share),
        flops_estimate=node.flops_estimate * share,
        mem_bandwidth_gbps=node.mem_bandwidth_gbps * share,
        link_mbps=node.intra_link_gbps * 8000.0,
        link_latency_ms=node.intra_link_latency_us / 1000.0,
    )


def referee_best(model: ModelLayout, node: NodeDescriptor, load: Load) -> tuple[int, float]:
    """Most users and requests/s of replicas on a node of two GPUs: both GPUs as one
    group (where the model allows it), or a pipeline of the two single GPUs, or each
    GPU a replica of its own."""
    groups = [group(node, 1, "a"), group(node, 1, "b")]
    ref = Referee(model, groups, load)
    users, rate = ref.fleet_users(), ref.fleet_rate()
    if 2 in legal_tensor_parallel(model, 2):
        whole = Referee(model, [group(node, 2, "")], load)
        users, rate = max(users, whole.fleet_users()), max(rate, whole.fleet_rate())
    return users, rate


@SETTINGS
@given(
    models,
    loads,
    st.integers(min_value=1, max_value=24),
    st.sampled_from([20.0, 90.0, 180.0]),
    st.sampled_from([300.0, 900.0]),
)
def test_a_node_of_two_gpus_gets_the_referees_value(
    model: ModelLayout, load: Load, vram: int, flops: float, bw: float
) -> None:
    node = two_gpus(vram, flops, bw)
    users, rate = referee_best(model, node, load)
    w = workload(load)
    got = best_node_replicas(model, [node], w, Constraints(), by_rate=False)
    assert got is not None
    assert got.value == users
    by_rate = best_node_replicas(model, [node], w, Constraints(), by_rate=True)
    assert by_rate is not None
    assert by_rate.value == pytest.approx(rate, rel=0.01, abs=1e-9)


F4 = [
    NodeDescriptor(
        id="a", gpu_name="RTX 4090", vram_bytes=24 * GB, link_mbps=1000, price_per_hour=0.4
    ),
    NodeDescriptor(
        id="b", gpu_name="RTX 4090", vram_bytes=24 * GB, link_mbps=1000, price_per_hour=0.4
    ),
    NodeDescriptor(
        id="c",
        gpu_name="A100 80GB PCIe",
        vram_bytes=80 * GB,
        link_mbps=10000,
        price_per_hour=1.2,
    ),
    NodeDescriptor(
        id="d",
        gpu_name="L40S",
        vram_bytes=96 * GB,
        num_gpus=2,
        link_mbps=10000,
        price_per_hour=1.6,
    ),
]


def test_a_small_fleet_with_a_node_of_two_gpus_is_certified_exactly() -> None:
    """Four nodes, one of two GPUs: the compositions holding it are valued exactly, so
    the certificate closes (their relaxation bounds left 118 users against 120)."""
    load = Load(prompt_tokens=2048, output_tokens=256, ttft_s=1.0, tpot_s=1 / 30)
    got = serve("llama3.1:8b", F4, workload(load))
    assert got.users == 118
    assert got.certificate.gap == 0.0
    assert got.certificate.exact
    assert "GPU grouping" in got.certificate.method


def test_a_node_whose_best_grouping_beats_the_planner_is_served_by_it() -> None:
    """Two H100 GPUs, llama3.2:3b: the planner's pipeline of two single GPUs serves 1,561
    users, both GPUs as one tensor-parallel group 1,645; the answer is the grouping's,
    its replica a plan on both GPUs whose U*, TTFT and TPOT are the search's."""
    node = NodeDescriptor(
        id="m",
        gpu_name="H100 80GB SXM",
        vram_bytes=160 * GB,
        num_gpus=2,
        link_mbps=10000,
        intra_link_gbps=300.0,
        price_per_hour=1.0,
    )
    load = Load(prompt_tokens=512, output_tokens=128, ttft_s=1.0, tpot_s=0.05)
    w = workload(load)
    got = serve("llama3.2:3b", [node], w)
    best = best_node_replicas(resolve_model("llama3.2:3b"), [node], w, Constraints(), by_rate=False)
    assert best is not None and best.value == 1645
    assert got.users == 1645
    assert got.certificate.bound == 1645
    assert got.certificate.gap == 0.0
    (replica,) = got.replicas
    (stage,) = replica.plan.assignments
    assert (stage.node_id, stage.tensor_parallel, stage.gpu_indices) == ("m", 2, (0, 1))
    formula = best.best[2].serving
    assert (replica.users, replica.ttft_s, replica.tpot_s) == (
        formula.users,
        pytest.approx(formula.ttft_s),
        pytest.approx(formula.tpot_s),
    )
    assert replica.plan.rationale.prediction is not None


def test_a_node_and_two_single_gpus_reach_the_grouped_value() -> None:
    """Four H100 GPUs with an A10 and an L4, llama3.2:1b: the planner's replicas served
    3,221 users, every grouping of the node's GPUs 3,257; the answer reaches it."""
    node = NodeDescriptor(
        id="m",
        gpu_name="H100 80GB SXM",
        vram_bytes=320 * GB,
        num_gpus=4,
        link_mbps=10000,
        intra_link_gbps=300.0,
        price_per_hour=1.0,
    )
    nodes = [
        node,
        NodeDescriptor(
            id="s0", gpu_name="A10", vram_bytes=24 * GB, link_mbps=1000, price_per_hour=0.5
        ),
        NodeDescriptor(
            id="s1", gpu_name="L4", vram_bytes=24 * GB, link_mbps=10000, price_per_hour=0.5
        ),
    ]
    load = Load(prompt_tokens=2048, output_tokens=512, ttft_s=3.0, tpot_s=1 / 30)
    got = serve("llama3.2:1b", nodes, workload(load))
    assert got.users == 3257
    assert got.certificate.gap == 0.0
