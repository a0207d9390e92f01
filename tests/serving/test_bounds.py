"""The relaxation bounds of serving: never below what a replica (or a fleet) serves, and
tight where the formulas allow — a tensor-parallel node pays its all-reduces, the KV a
decode step reads grows with U."""

from __future__ import annotations

import contextlib
import math
from itertools import combinations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stowplan import Constraints, NodeDescriptor, Workload, serve
from stowplan.cost import CostModel
from stowplan.cost.serving import pipeline_prefill, serving_constraints
from stowplan.errors import Infeasible
from stowplan.model import gpu_group_node
from stowplan.serving.bounds import FleetRates, fleet_users_bound, rate_bound, users_bound
from stowplan.serving.candidates import replica_of
from tests.common.serving_models import dense, models, serve_settings, workload
from tests.common.serving_referee import Load, Referee

GB = 10**9
SETTINGS = serve_settings(15)


def _node(i: int, gpus: int, gb: int, bw: float, tflops: float, intra: float) -> NodeDescriptor:
    return NodeDescriptor(
        id=f"n{i}",
        gpu_name="RTX 4090",
        vram_bytes=gpus * gb * GB,
        num_gpus=gpus,
        mem_bandwidth_gbps=gpus * bw,
        flops_estimate=gpus * tflops,
        link_mbps=10_000.0,
        link_latency_ms=0.5,
        intra_link_gbps=intra,
        intra_link_latency_us=10.0,
        price_per_hour=float(gpus),
    )


@st.composite
def fleets(draw: st.DrawFn) -> list[NodeDescriptor]:
    """1–3 nodes of 1, 2 or 4 GPUs (slow or fast GPU links)."""
    return [
        _node(
            i,
            draw(st.sampled_from([1, 2, 4])),
            draw(st.integers(4, 48)),
            draw(st.floats(200, 3000)),
            draw(st.floats(20, 400)),
            draw(st.sampled_from([16.0, 64.0, 450.0])),
        )
        for i in range(draw(st.integers(1, 3)))
    ]


loads = st.builds(
    lambda p, o, ttft, tpot: Load(prompt_tokens=p, output_tokens=o, ttft_s=ttft, tpot_s=tpot),
    st.integers(64, 4096),
    st.integers(16, 512),
    st.floats(0.2, 5.0),
    st.floats(0.02, 0.3),
)


@SETTINGS
@given(models, fleets(), loads)
def test_no_replica_and_no_fleet_serves_more_than_the_bounds(model, nodes, load) -> None:
    """Every node subset's users bound is at least what the referee's pipelines (a
    multi-GPU node as one tensor-parallel stage) and the planner's replicas (any split
    of its GPUs into stages, replicas side by side) serve; the pooled bound of the
    whole fleet is at least the referee's best disjoint replicas and serve()'s."""
    w = workload(load)
    ref = Referee(model, nodes, load)
    rates = FleetRates.of(model, nodes, Constraints(), w)
    for size in range(1, len(nodes) + 1):
        for members in combinations(range(len(nodes)), size):
            ub = users_bound(rates, members, w)
            users, rate = ref.best_replica(members)
            assert ub >= users
            assert rate_bound(rates, members, w) >= rate * (1 - 1e-9)
            got = replica_of(model, [nodes[i] for i in members], w, Constraints(), max(1, ub))
            if got is not None:
                assert ub >= got.serving.users
    gpus = sum(n.num_gpus for n in nodes)
    pooled = fleet_users_bound(rates, list(range(len(nodes))), w, gpus)
    assert pooled >= ref.fleet_users()
    with contextlib.suppress(Infeasible):
        assert pooled >= serve(model, nodes, w).users


LLAMA_LIKE = dense(32, 400, 131_072, 4096)
"""32 blocks of 400 MB, 128 KiB of KV per token: an 8B model's shape."""


def _pcie_node(gpus: int) -> NodeDescriptor:
    return _node(0, gpus, 24, 1000.0, 165.0, 16.0)


def test_a_tensor_parallel_node_pays_its_all_reduces_in_the_prefill_floor() -> None:
    """Four GPUs on a slow GPU link: the floor is the one-stage TTFT0 at the cheapest
    grouping, all-reduces included (the formula of cost.serving), not the prompt's FLOPs
    at four GPUs' speed."""
    w = Workload(prompt_tokens=2048, output_tokens=256, ttft_s=1.0, tpot_s=0.05)
    node = _pcie_node(4)
    rates = FleetRates.of(LLAMA_LIKE, [node], Constraints(), w)
    cm = CostModel(LLAMA_LIKE, [node], serving_constraints(w))
    one_stage = pipeline_prefill(cm, [0], [0, 32], 2048).ttft0_s
    flops_only = rates.prefill_flops * rates.inv_flops[0]
    floor = rates.ttft0_floor([0])
    assert floor > flops_only * 1.05  # the all-reduces of 2048 tokens over 16 GB/s count
    # Every grouping of the four GPUs is a candidate: the floor is the cheapest of them.
    stages = []
    for t in (1, 2, 4):
        group = gpu_group_node(node, 0, t)
        gm = CostModel(LLAMA_LIKE, [group], serving_constraints(w))
        stages.append(pipeline_prefill(gm, [0], [0, 32], 2048).ttft0_s)
    assert floor == pytest.approx(min(stages), rel=1e-9)
    assert floor <= one_stage


def test_the_users_bound_counts_the_kv_a_decode_step_reads() -> None:
    """U·KV read at the node's bandwidth joins the TPOT limit: the bound is the
    closed form (tpot − W/B) / (K/B + TTFT0/O) when that binds."""
    w = Workload(prompt_tokens=2048, output_tokens=256, ttft_s=10.0, tpot_s=0.05)
    node = _pcie_node(1)
    rates = FleetRates.of(LLAMA_LIKE, [node], Constraints(), w)
    t0 = rates.ttft0_floor([0])
    b = rates.bandwidth[0]
    k = rates.kv_read_per_request
    expected = math.floor((w.tpot_s - rates.decode_read / b) / (k / b + t0 / 256))
    memory = rates.memory_users([0])
    assert users_bound(rates, [0], w) == min(memory, expected)
    assert k == pytest.approx(32 * 131_072 * (2048 + 128))


def test_a_fleet_of_small_replicas_gets_an_exact_certificate() -> None:
    """llama3.1:8b on the shipped consumer fleet: every replica is one GPU, so the
    compositions the bound packs are tried pipeline by pipeline and the bound is the
    answer itself (gap 0); their values equal the exhaustive search's."""
    from stowplan.files.fleets import load_nodes
    from stowplan.serving.exhaustive import best_replica_value
    from tests.common.paths import EXAMPLES

    nodes = load_nodes(EXAMPLES / "fleets" / "mixed-consumer.yaml")
    w = Workload(prompt_tokens=2048, output_tokens=256, ttft_s=1.0, tpot_s=0.05)
    sp = serve("llama3.1:8b", nodes, w)
    assert sp.certificate.exact and sp.certificate.gap == 0.0
    assert sp.certificate.bound == sp.users
    assert "every pipeline tried" in sp.certificate.method
    from stowplan.models import resolve_model

    model = resolve_model("llama3.1:8b")
    by_id = {n.id: n for n in nodes}
    for r in sp.replicas:
        (nid,) = r.node_ids
        assert best_replica_value(model, [by_id[nid]], w, Constraints(), by_rate=False) == r.users


def test_a_pair_of_nodes_is_tried_pipeline_by_pipeline() -> None:
    """Two single-GPU nodes: the exhaustive value is the best of both orders and every
    split (and each node alone), at least what the planner's replica serves, and at
    most the relaxation bound."""
    from stowplan.serving.exhaustive import best_replica_value, pipeline_count

    nodes = [_node(0, 1, 16, 900.0, 80.0, 16.0), _node(1, 1, 12, 500.0, 40.0, 16.0)]
    w = Workload(prompt_tokens=512, output_tokens=128, ttft_s=2.0, tpot_s=0.1)
    got = best_replica_value(LLAMA_LIKE, nodes, w, Constraints(), by_rate=False)
    assert got is not None and got >= 1
    rates = FleetRates.of(LLAMA_LIKE, nodes, Constraints(), w)
    planned = replica_of(LLAMA_LIKE, nodes, w, Constraints(), users_bound(rates, [0, 1], w))
    assert planned is not None and planned.serving.users <= got <= users_bound(rates, [0, 1], w)
    # A node of several GPUs, or three nodes of 32 blocks (3 + 6·31 + 6·465 pipelines),
    # is not tried this way; three nodes of a 3-block model (3 + 6·2 + 6·1) are.
    assert best_replica_value(LLAMA_LIKE, [_pcie_node(2)], w, Constraints(), by_rate=False) is None
    three = [*nodes, _node(2, 1, 8, 500.0, 40.0, 16.0)]
    assert pipeline_count(3, 32) == 3 + 6 * 31 + 6 * 465
    assert best_replica_value(LLAMA_LIKE, three, w, Constraints(), by_rate=False) is None
    small = dense(3, 400, 131_072, 4096)
    assert pipeline_count(3, 3) == 21
    assert best_replica_value(small, three, w, Constraints(), by_rate=False) is not None
