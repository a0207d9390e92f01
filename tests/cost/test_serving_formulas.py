"""Hand-computed figures of the serving terms: expert touch, KV at mean context, prefill, U*."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stowplan import Constraints, Workload
from stowplan.cost import CostModel
from stowplan.cost.serving import prefill_seconds, replica_serving
from stowplan.cost.touch import expert_touch_bytes, experts_touched
from stowplan.workload import Binding
from tests.common.moe import toy_moe
from tests.common.toy import TOY_MODEL, toy_node

MB = 10**6
GB = 10**9


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        (1, 8.0),  # one token reads its k experts
        (8, 128 * (1 - (120 / 128) ** 8)),  # 51.62
        (64, 128 * (1 - (120 / 128) ** 64)),  # 125.94: "about 126 of the 128"
    ],
)
def test_tokens_touch_e_times_one_minus_one_minus_k_over_e_to_the_u(tokens, expected):
    got = experts_touched(128, 8, tokens)
    assert got == pytest.approx(expected, rel=1e-12)


def test_expert_touch_figures_by_hand():
    assert experts_touched(128, 8, 8) == pytest.approx(51.6199, abs=1e-4)
    assert experts_touched(128, 8, 64) == pytest.approx(125.9423, abs=1e-4)
    assert experts_touched(128, 8, 0) == 0.0


def test_load_statistics_replace_the_uniform_share():
    # Two experts take every token (p = 1): u tokens touch exactly 2 of them.
    shares = [1.0, 1.0, 0.0, 0.0]
    assert experts_touched(4, 2, 16, shares) == pytest.approx(2.0)
    # p = 0.5 for each of 4 experts (k = 2): 4 × (1 − 0.5^3) = 3.5 for 3 tokens.
    assert experts_touched(4, 2, 3, [0.5] * 4) == pytest.approx(3.5)


def _moe():
    """toy MoE: block 0 dense (200 MB), block 1 MoE (200 MB + 16 experts of 100 MB, k = 4);
    a token reads 200 MB of block 0 and 200 + 4 × 100 MB of block 1."""
    model = toy_moe(blocks=2, dense=1, experts=16, k=4, expert_mb=100)
    return replace(model, block_read_bytes=(200 * MB, 600 * MB))


def test_a_layout_whose_token_reads_every_expert_reads_no_more():
    model = toy_moe(blocks=2, dense=1, experts=16, k=4, expert_mb=100)  # reads: whole blocks
    assert expert_touch_bytes(model, 64) == (0.0, 0.0)


def test_a_microbatch_reads_the_experts_its_tokens_touch_but_computes_the_active_ones():
    """toy MoE (:func:`_moe`).

    4 tokens touch 16 × (1 − 0.75^4) = 10.9375 experts: 6.9375 beyond k, 693.75 MB.
    One stage reads 200 + (200 + 400) + 693.75 + head 100 = 1593.75 MB at 100 GB/s.
    """
    model = _moe()
    assert expert_touch_bytes(model, 4) == pytest.approx((0.0, 6.9375 * 100 * MB))
    node = toy_node(0, vram_bytes=20 * GB)
    cm = CostModel(model, [node], Constraints(batch=4))
    ev = cm.evaluate([0], [0, 2])
    assert ev.stage_time_s[0] == pytest.approx(1593.75 * MB / (100 * GB), rel=1e-12)
    # Compute-bound (1 GFLOPs): 2 × 0.5 parameters/byte × 900 MB read per token × 4 tokens
    # = 3.6e9 FLOPs; the touched experts cost reads, not compute.
    slow = toy_node(0, vram_bytes=20 * GB, flops_estimate=0.001)
    ev = CostModel(model, [slow], Constraints(batch=4)).evaluate([0], [0, 2])
    assert ev.stage_time_s[0] == pytest.approx(3.6, rel=1e-12)
    # One sequence reads k experts only: 200 + 600 + 100 MB.
    one = CostModel(model, [node], Constraints(batch=1)).evaluate([0], [0, 2])
    assert one.stage_time_s[0] == pytest.approx(900 * MB / (100 * GB), rel=1e-12)


def test_a_plain_context_reserve_is_read_at_half_its_length():
    """4 blocks × 1000 B/token: a 1000-token reserve is read at 500 tokens (2 MB)."""
    c = Constraints(context_tokens=1000)
    cm = CostModel(TOY_MODEL, [toy_node(0, vram_bytes=20 * GB)], c)
    assert cm.evaluate([0], [0, 4]).stage_time_s[0] == pytest.approx((5 * GB + 2 * MB) / (100 * GB))
    # The reserve still holds 1000 tokens.
    assert cm.stage_bytes(0, 4, True, True) == 6 * GB + 4 * MB


def test_a_workload_reads_kv_at_its_mean_context():
    """P = 100, O = 100: C = 150 tokens, 4 × 1000 × 150 = 0.6 MB per sequence."""
    w = Workload(prompt_tokens=100, output_tokens=100, ttft_s=1.0, tpot_s=1.0)
    c = Constraints(context_tokens=w.context_tokens, kv_read_tokens=w.mean_context_tokens)
    cm = CostModel(TOY_MODEL, [toy_node(0, vram_bytes=20 * GB)], c)
    assert w.mean_context_tokens == 150
    assert cm.evaluate([0], [0, 4]).stage_time_s[0] == pytest.approx(
        (5 * GB + 0.6 * MB) / (100 * GB)
    )


def _fast(i: int, **kw: object):
    return toy_node(i, flops_estimate=1.0, **kw)  # 1 TFLOPs: prefill is compute-bound


def test_prefill_of_one_stage_by_hand():
    """P = 100 on 4 blocks + head, 1 TFLOPs, 100 GB/s (0.5 parameters per byte).

    read 5 GB → 50 ms; compute 2 × 2e9 × 100 + 2 × 4 × 100² × 1000 + 2 × 0.5e9 =
    4.0108e11 FLOPs → 401.08 ms.
    """
    pre = prefill_seconds(TOY_MODEL, [_fast(0)], [0, 4], 100)
    assert pre.stage_s == pytest.approx((0.40108,), rel=1e-12)
    assert pre.ttft0_s == pytest.approx(0.40108, rel=1e-12)


def test_prefill_of_two_stages_by_hand():
    """Stage 0 [0, 2): compute 2 × 1e9 × 100 + 2 × 2 × 100² × 1000 = 2.0004e11 → 200.04 ms,
    read 20 ms, send 100 × 1000 × 2 B at 1 MB/s = 200 ms.  Stage 1 [2, 4) + head:
    compute 2.0004e11 + 1e9 → 201.04 ms.  One forward hop of 10 ms (no return)."""
    pre = prefill_seconds(TOY_MODEL, [_fast(0), _fast(1)], [0, 2, 4], 100)
    assert pre.stage_s == pytest.approx((0.40004, 0.20104), rel=1e-12)
    assert pre.hops_s == pytest.approx(0.010)
    assert pre.ttft0_s == pytest.approx(0.61108, rel=1e-12)


def test_a_sliding_window_caps_p_squared_at_p_times_the_window():
    model = replace(TOY_MODEL, kv_window_tokens=(10,) * 4)
    pre = prefill_seconds(model, [_fast(0)], [0, 4], 100)
    # attention 2 × 4 × 100 × 10 × 1000 = 8e6 instead of 8e7.
    assert pre.ttft0_s == pytest.approx((4e11 + 8e6 + 1e9) / 1e12, rel=1e-12)


def test_the_attention_width_is_heads_times_head_dim_when_the_layout_states_them():
    """8 heads of 250: A = 2000, twice the hidden width of 1000 — attention
    2 × 4 × 100² × 2000 = 1.6e8 FLOPs instead of 8e7."""
    model = replace(TOY_MODEL, num_attention_heads=8, head_dim=250)
    assert model.attention_width == 2000
    assert replace(TOY_MODEL, num_attention_heads=8).attention_width == 1000  # no head_dim
    pre = prefill_seconds(model, [_fast(0)], [0, 4], 100)
    assert pre.ttft0_s == pytest.approx((4e11 + 1.6e8 + 1e9) / 1e12, rel=1e-12)


def test_prefill_pays_two_all_reduces_of_p_tokens_per_block_on_tensor_parallel_gpus():
    """2 GPUs, 100 GB/s between them, 5 µs: AR = 5 µs + 2 × ½ × 2e5 B / 1e11 = 7 µs;
    4 blocks × 2 × 7 µs = 56 µs over the single-stage prefill."""
    node = _fast(0, num_gpus=2, intra_link_gbps=100.0, intra_link_latency_us=5.0)
    pre = prefill_seconds(TOY_MODEL, [node], [0, 4], 100)
    assert pre.ttft0_s == pytest.approx(0.40108 + 56e-6, rel=1e-9)


def test_a_moe_prompt_reads_the_experts_its_tokens_touch():
    """P = 2 tokens touch 16 × (1 − 0.75²) = 7 experts: read 200 + 200 + 700 + 100 MB."""
    model = _moe()
    node = toy_node(0, vram_bytes=20 * GB)  # no FLOPs figure: the read decides
    pre = prefill_seconds(model, [node], [0, 2], 2)
    assert pre.ttft0_s == pytest.approx(1200 * MB / (100 * GB), rel=1e-12)


# U* on one toy node (1 TFLOPs, 100 GB/s, usable 8 GB, weights 6 GB), P = O = 100:
# TTFT0 = 0.40108 s; cycle(U) = max(0.05 + 6e-6·U, 0.005·U) (5 GB + U × 0.6 MB of KV
# read, 2 × 2.5e9 × U FLOPs); TPOT(U) = cycle(U) + U × 0.0040108.


def test_u_star_where_the_tpot_binds():
    """TPOT(11) = 0.055 + 0.0441188 = 0.0991188 ≤ 0.1; TPOT(12) = 0.06 + 0.0481296 > 0.1."""
    w = Workload(prompt_tokens=100, output_tokens=100, ttft_s=1.0, tpot_s=0.1)
    got = replica_serving(TOY_MODEL, [_fast(0)], [0, 4], w)
    assert got.users == 11
    assert got.binding is Binding.TPOT
    assert got.prefill_s == pytest.approx(0.40108, rel=1e-12)
    assert got.tpot_s == pytest.approx(0.055 + 11 * 0.0040108, rel=1e-12)
    assert got.ttft_s == pytest.approx(0.40108 + 0.055, rel=1e-12)
    assert got.tokens_per_s == pytest.approx(11 / 0.0991188, rel=1e-9)
    assert got.requests_per_s == pytest.approx(11 / (100 * 0.0991188), rel=1e-9)
    assert got.memory_users == 2500  # 2 GB free / (4 × 1000 × 200 B)


def test_u_star_where_the_ttft_binds():
    """TTFT(10) = 0.40108 + 0.05006 ≤ 0.456 < TTFT(11) = 0.40108 + 0.055."""
    w = Workload(prompt_tokens=100, output_tokens=100, ttft_s=0.456, tpot_s=1.0)
    got = replica_serving(TOY_MODEL, [_fast(0)], [0, 4], w)
    assert (got.users, got.binding) == (10, Binding.TTFT)


def test_u_star_where_the_memory_binds():
    """No headroom, 6.004 GB: 4 MB beside 6 GB of weights hold 5 requests of 0.8 MB."""
    w = Workload(prompt_tokens=100, output_tokens=100, ttft_s=10.0, tpot_s=10.0)
    node = _fast(0, vram_bytes=6 * GB + 4 * MB)
    got = replica_serving(TOY_MODEL, [node], [0, 4], w, Constraints(vram_headroom_frac=0.0))
    assert (got.users, got.binding, got.memory_users) == (5, Binding.MEMORY, 5)


def test_no_user_when_one_prompt_alone_misses_the_ttft():
    w = Workload(prompt_tokens=100, output_tokens=100, ttft_s=0.4, tpot_s=1.0)
    got = replica_serving(TOY_MODEL, [_fast(0)], [0, 4], w)
    assert got.users == 0 and got.tokens_per_s == 0.0 and got.binding is Binding.TTFT


def test_tpot_grows_with_users_so_bisection_finds_the_largest():
    w = Workload(prompt_tokens=100, output_tokens=100, ttft_s=1.0, tpot_s=0.1)
    got = replica_serving(TOY_MODEL, [_fast(0), _fast(1)], [0, 2, 4], w)
    # Scan every U: the bisection's U* is the last U meeting both limits.
    c = Constraints(batch=64, context_tokens=200, kv_read_tokens=150.0)
    cm = CostModel(TOY_MODEL, [_fast(0), _fast(1)], c)
    ttft0 = prefill_seconds(TOY_MODEL, [_fast(0), _fast(1)], [0, 2, 4], 100).ttft0_s
    from stowplan.cost import cycle_seconds, microbatches

    ok = []
    for u in range(1, 64):
        m, b = microbatches(u, 2)
        ev = cm.at_microbatch(b).evaluate_here([0, 1], [0, 2, 4])
        cyc = cycle_seconds(ev.stage_time_s, ev.hops_s, m)
        ok.append(cyc + u * ttft0 / 100 <= 0.1 and ttft0 + cyc <= 1.0)
    assert ok == sorted(ok, reverse=True)  # monotone: a prefix of True
    assert got.users == sum(ok)
