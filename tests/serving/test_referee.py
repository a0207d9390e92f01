"""The serving referee itself, against figures computed by hand on the toy model.

TOY_MODEL: 4 blocks of 1 GB, 1 GB head and embed, 1000 B of KV per token and block,
0.5 parameters per byte; nodes of 10 GB (8 GB usable), 100 GB/s, 10 TFLOP/s, 1 MB/s
links, 10 ms.  Workload: P = 100, O = 50 (mean context 125)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stowplan import ExpertLayout, ModelLayout, NodeDescriptor
from tests.common.serving_referee import Load, Referee, experts_touched
from tests.common.toy import TOY_MODEL

LOAD = Load(prompt_tokens=100, output_tokens=50, ttft_s=1.0, tpot_s=0.2)


def node(i: int, vram_gb: float = 10, price: float | None = 1.0) -> NodeDescriptor:
    return NodeDescriptor(
        id=f"n{i}",
        gpu_name="GPU",
        vram_bytes=int(vram_gb * 10**9),
        flops_estimate=10.0,
        link_mbps=8.0,
        mem_bandwidth_gbps=100.0,
        link_latency_ms=10.0,
        price_per_hour=price,
    )


def test_one_stage_decode_reads_weights_and_kv_at_mean_context() -> None:
    ref = Referee(TOY_MODEL, [node(0)], LOAD)
    # 5 GB of weights + 4 blocks x 1000 B x 125 tokens, at 100 GB/s; compute 5e-4 s.
    assert ref.decode_stage(0, 0, 4, True, 1) == pytest.approx(0.050005, rel=1e-12)
    # 102 sequences: compute 2 x 2.5e9 params x 102 / 1e13 = 0.051 s beats the read.
    assert ref.decode_stage(0, 0, 4, True, 102) == pytest.approx(0.051, rel=1e-12)


def test_one_stage_prefill_is_the_read_when_compute_is_less() -> None:
    ref = Referee(TOY_MODEL, [node(0)], LOAD)
    # compute (2 x 2e9 x 100 + 4 x 2 x 100² x 1000 + 2 x 5e8) / 1e13 = 0.040108 s < 0.05 s.
    assert ref.ttft0((0,), [0, 4]) == pytest.approx(0.05, rel=1e-12)
    slow = Referee(TOY_MODEL, [replace(node(0), flops_estimate=5.0)], LOAD)
    assert slow.ttft0((0,), [0, 4]) == pytest.approx(0.080216, rel=1e-12)


def test_one_stage_serves_133_users_bound_by_tpot() -> None:
    ref = Referee(TOY_MODEL, [node(0)], LOAD)
    # TPOT(133) = 0.0665 + 133 x 0.05 / 50 = 0.1995 s; TPOT(134) = 0.067 + 0.134 = 0.201 s.
    assert ref.tpot((0,), [0, 4], 133) == pytest.approx(0.1995, rel=1e-12)
    assert ref.tpot((0,), [0, 4], 134) == pytest.approx(0.201, rel=1e-12)
    assert ref.ttft((0,), [0, 4], 133) == pytest.approx(0.1165, rel=1e-12)
    assert ref.max_users((0,), [0, 4]) == 133
    assert ref.max_users((0,), [0, 4], exhaustive=True) == 133


def test_two_stages_pay_transfers_hops_and_microbatches() -> None:
    ref = Referee(TOY_MODEL, [node(0), node(1)], LOAD)
    order, bounds = (0, 1), [0, 2, 4]
    # stage 0: 0.02 + 2.5e-6 + 0.002 s transfer; stage 1: 0.03 + 2.5e-6; hops 2 x 10 ms.
    assert ref.cycle(order, bounds, 1) == pytest.approx(0.072005, rel=1e-12)
    # U = 2: two microbatches of one; the trip still dominates 2 x 0.0300025.
    assert ref.cycle(order, bounds, 2) == pytest.approx(0.072005, rel=1e-12)
    # prefill: stage 0 0.020004 s + 0.2 s of activations at 1 MB/s; stage 1 0.03 s; 10 ms.
    assert ref.ttft0(order, bounds) == pytest.approx(0.260004, rel=1e-12)


def test_memory_binds_when_kv_of_p_plus_o_tokens_fills_the_node() -> None:
    # 7.5 GB usable - 6 GB of weights = 1.5 GB; a user holds 4 x 1000 x 150 = 600 kB.
    ref = Referee(
        TOY_MODEL,
        [node(0, vram_gb=7.5 / 0.8)],
        Load(prompt_tokens=100, output_tokens=50, ttft_s=100.0, tpot_s=100.0),
    )
    assert ref.max_users((0,), [0, 4]) == 2500
    assert not ref.fits((0,), [0, 4], 2501)


def test_expert_touch_rule_at_1_8_and_64_tokens() -> None:
    assert experts_touched(128, 8, 1) == pytest.approx(8.0)
    assert experts_touched(128, 8, 8) == pytest.approx(128 * (1 - (120 / 128) ** 8))
    assert experts_touched(128, 8, 64) == pytest.approx(125.94, abs=0.01)


def test_a_moe_block_reads_its_dense_part_and_the_experts_touched() -> None:
    moe = ModelLayout(
        name="moe",
        num_blocks=2,
        hidden_dim=1000,
        bytes_per_activation_elem=2,
        block_params_bytes=1_800_000_000,
        block_bytes=(200_000_000, 3_400_000_000),
        block_read_bytes=(200_000_000, 600_000_000),
        head_params_bytes=0,
        embed_params_bytes=0,
        experts=ExpertLayout(
            num_experts=16, experts_per_token=2, expert_params_bytes=200_000_000, moe_blocks=(1,)
        ),
    )
    ref = Referee(moe, [node(0)], LOAD)
    assert ref.block_read(1, 1) == pytest.approx(600e6)
    assert ref.block_read(1, 8) == pytest.approx(200e6 + 16 * (1 - (14 / 16) ** 8) * 200e6)
    assert ref.block_read(0, 64) == 200e6


def test_two_nodes_serve_most_as_two_replicas_and_one_is_cheapest_for_133() -> None:
    ref = Referee(TOY_MODEL, [node(0, price=1.0), node(1, price=2.0)], LOAD)
    assert ref.best_replica([0]) == (133, pytest.approx(133 / (50 * 0.1995)))
    assert ref.fleet_users() == 266
    assert ref.fleet_users(0b01) == 133
    assert ref.cheapest(133) == 1.0
    assert ref.cheapest(134) == 3.0
    assert ref.cheapest(267) == math.inf


@settings(max_examples=25, deadline=None)
@given(
    st.integers(10, 400),
    st.integers(1, 200),
    st.floats(0.05, 3.0),
    st.floats(0.01, 0.5),
    st.integers(1, 2),
)
def test_bisection_finds_the_u_star_of_trying_every_u(
    p: int, o: int, ttft: float, tpot: float, stages: int
) -> None:
    ref = Referee(
        TOY_MODEL,
        [node(0), node(1)],
        Load(prompt_tokens=p, output_tokens=o, ttft_s=ttft, tpot_s=tpot),
    )
    order, bounds = ((0,), [0, 4]) if stages == 1 else ((0, 1), [0, 1, 4])
    assert ref.max_users(order, bounds) == ref.max_users(order, bounds, exhaustive=True)
