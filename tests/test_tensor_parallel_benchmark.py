"""The tensor-parallel benchmark's referee: hand-computed optima, three exact methods that
agree, and stowplan's plans scored by it (equal to the optimum, or reported)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from benchmarks import tensor_parallel as bench

from stowplan import ModelLayout
from stowplan.rules.tensor_parallel import kv_heads_allow
from tests.common import tp_referee as tp

GB = 10**9


def _two_nodes(batch: int) -> object:
    """Node a: 2 GPUs of 10 GB and 100 GB/s on a 10 GB/s, 10 µs link; node b: 1 GPU of
    20 GB and 400 GB/s; 8000 Mbit/s (1 GB/s) and 1 ms between them.  Two blocks of 6 GB,
    embed and head 1 GB each, hidden 1000 (2 KB of activations per sequence)."""
    a = tp.descriptor(tp.Kind("A", 10, 100, 1e9, 10, 10), "a", 2, 8000.0, 1.0)
    b = tp.descriptor(tp.Kind("B", 20, 400, 1e9, 10, 10), "b", 1, 8000.0, 1.0)
    model = ModelLayout(
        name="two-blocks",
        num_blocks=2,
        hidden_dim=1000,
        bytes_per_activation_elem=2,
        block_params_bytes=6 * GB,
        head_params_bytes=GB,
        embed_params_bytes=GB,
        total_params=7 * GB,
        active_params=7 * GB,
        dtype="bf16",
        num_attention_heads=2,
        num_kv_heads=2,
    )
    return tp.Spec(model, [a, b], batch, None)


def test_the_referee_finds_the_hand_computed_optima() -> None:
    # Latency (batch 1): b alone reads 13 GB at 400 GB/s = 32.5 ms (one stage, no hop);
    # a as tp 2 alone takes 65 ms, and a:tp2 → b pays 30.02 + 17.5 ms + two 1 ms hops.
    spec = _two_nodes(1)
    for value, layout in _three_ways(spec):
        assert value == pytest.approx(13 * GB / (400 * GB), rel=1e-12)
        assert layout == tp.Layout(stages=((1, 1),), bounds=(0, 2))
    # 4 sequences: memory-bound stages gain nothing from a pipeline, so b alone (one
    # microbatch of 4, compute negligible) is still best at 32.5 ms a cycle.
    spec = _two_nodes(4)
    for value, layout in _three_ways(spec):
        assert value == pytest.approx(0.0325, rel=1e-12)
        assert layout == tp.Layout(stages=((1, 1),), bounds=(0, 2))
    # a:tp2 → b runs 2 microbatches of 2 (4 KB of activations): a takes block 0 in
    # 6 GB / 200 GB/s + 2 all-reduces (10 µs + 4 KB / 10 GB/s each) + 4 KB over 1 GB/s,
    # b the last block and the head in 7 GB / 400 GB/s; the cycle is 2 × a's time (the
    # trip, a + b + two 1 ms hops, is shorter).
    slowest = 0.03 + 2 * (10e-6 + 4000 / 10e9) + 4000 / 1e9
    score = tp.score(spec, tp.Layout(stages=((0, 2), (1, 1)), bounds=(0, 1, 2)))
    assert score.stage_time_s == pytest.approx((slowest, 0.0175), rel=1e-12)
    assert score.trip_s == pytest.approx(slowest + 0.0175 + 0.002, rel=1e-12)
    assert score.cycle_s == pytest.approx(2 * slowest, rel=1e-12)
    assert score.tokens_per_s == pytest.approx(4 / (2 * slowest), rel=1e-12)
    # Two tp-1 groups of node a: intra-node transfer and hops (10 µs each way).
    one = tp.score(_two_nodes(1), tp.Layout(stages=((0, 1), (0, 1)), bounds=(0, 1, 2)))
    assert one.time_per_token_s == pytest.approx(0.06 + 2000 / 10e9 + 0.07 + 2 * 10e-6)


def _compute_bound(batch: int) -> object:
    """Nodes c (400 GB/s) and d (350 GB/s): one GPU of 20 GB and 1 TFLOP/s each, 1 GB/s
    and 1 ms between them; the model of :func:`_two_nodes` (0.5 parameters per byte, so a
    stage computes weight bytes × u / 1e12 seconds)."""
    c = tp.descriptor(tp.Kind("C", 20, 400, 1, 10, 10), "c", 1, 8000.0, 1.0)
    d = tp.descriptor(tp.Kind("D", 20, 350, 1, 10, 10), "d", 1, 8000.0, 1.0)
    spec = _two_nodes(batch)
    return tp.Spec(spec.model, [c, d], batch, None)


def test_the_cycle_is_the_trip_or_m_times_the_slowest_stage_whichever_is_longer() -> None:
    # One stage holds the model but computes 13 GB × 4 / 1e12 = 52 ms (reading takes
    # 32.5 ms on c).  Two stages step microbatches of 2: d[0,1) reads 6 GB at 350 GB/s
    # (17.14 ms; computes 12 ms) and sends 4 KB (4 µs), c[1,2) reads 7 GB (17.5 ms;
    # computes 14 ms): 2 × 17.5 = 35 ms, but the trip with two 1 ms hops is longer.
    spec = _compute_bound(4)
    d_first = 6 / 350 + 4000 / 1e9
    for value, layout in _three_ways(spec):
        assert value == pytest.approx(d_first + 0.0175 + 0.002, rel=1e-12)
        assert layout == tp.Layout(stages=((1, 1), (0, 1)), bounds=(0, 1, 2))
    # The other order: c[0,1) 15 ms + 4 µs, d[1,2) 20 ms: 2 × 20 ms beats the 37 ms trip.
    other = tp.score(spec, tp.Layout(stages=((0, 1), (1, 1)), bounds=(0, 1, 2)))
    assert other.trip_s == pytest.approx(0.015 + 4e-6 + 0.02 + 0.002, rel=1e-12)
    assert other.cycle_s == pytest.approx(0.04, rel=1e-12)
    alone = tp.score(spec, tp.Layout(stages=((0, 1),), bounds=(0, 2)))
    assert alone.cycle_s == pytest.approx(0.052, rel=1e-12)
    # One sequence: c alone reads 13 GB in 32.5 ms and computes 13 ms: the single stream.
    for value, layout in _three_ways(_compute_bound(1)):
        assert value == pytest.approx(0.0325, rel=1e-12)
        assert layout == tp.Layout(stages=((0, 1),), bounds=(0, 2))


def test_the_kv_reserve_holds_every_sequence_and_a_step_reads_its_microbatch() -> None:
    spec = _two_nodes(4)
    model = replace(spec.model, kv_bytes_per_token=(1000, 1000))
    spec = tp.Spec(model, spec.descriptors, 4, 1000)  # 1 MB of KV per sequence and block
    assert spec.mem == [6 * GB + 4 * 10**6] * 2
    # A step reads each sequence's KV at half the reserve (its mean context).
    assert spec.read == [6 * GB + 2 * 10**6] * 2  # one stage: one microbatch of 4
    assert spec.at(2).read == [6 * GB + 1 * 10**6] * 2
    assert spec.at(2).mem == spec.mem
    assert spec.at(3).micro == 2 and spec.at(4).micro == 1 and spec.at(9).micro == 1
    score = tp.score(spec, tp.Layout(stages=((1, 1), (1, 1)), bounds=(0, 1, 2)))
    assert score.stage_time_s[1] == pytest.approx((7 * GB + 1 * 10**6) / (400 * GB), rel=1e-12)


def test_microbatches_and_stage_count_ranges() -> None:
    assert tp.microbatches(4, 3) == (3, 2)
    assert tp.microbatches(32, 6) == (6, 6)
    assert tp.microbatches(1, 5) == (1, 1)
    assert tp.microbatches(4, 9) == (4, 1)
    assert tp.stage_groups(4, 8) == [(1, 1), (2, 2), (3, 3), (4, 8)]
    assert tp.stage_groups(1, 8) == [(1, 8)]
    assert tp.stage_groups(16, 5) == [(1, 1), (2, 2), (3, 3), (4, 4), (5, 5)]


def _three_ways(spec: object) -> list[tuple[float, object]]:
    """The optimum by the pruned search, the unpruned one and the sequence programme."""
    degrees = tp.allowed(spec, "free")
    return [
        tp.search(spec, degrees),
        tp.search(spec, degrees, prune=False),
        tp.solve_by_sequences(spec, degrees),
    ]


@pytest.mark.parametrize(("tp_", "heads", "kv"), [(3, 24, 8), (6, 48, 48), (7, 56, 1), (8, 64, 8)])
def test_the_legal_degrees_follow_the_heads_rule(tp_: int, heads: int, kv: int) -> None:
    assert tp.legal(tp_, heads, kv) == (heads % tp_ == 0 and kv_heads_allow(tp_, kv))


@pytest.mark.parametrize("seed", [3, 11, 25, 40, 57])
def test_three_exact_methods_agree(seed: int) -> None:
    inst = tp.draw(seed, 5)
    for objective in ("latency", "throughput"):
        spec = inst.spec(objective)
        for rule, degree in (("free", None), ("whole", None), ("uniform", 2)):
            degrees = tp.allowed(spec, rule, degree)
            got = [
                tp.search(spec, degrees),
                tp.search(spec, degrees, prune=False),
                tp.solve_by_sequences(spec, degrees),
            ]
            assert (got[0] is None) == (got[1] is None) == (got[2] is None)
            if got[0] is not None:
                for value, layout in got:
                    assert not tp.violations(spec, layout)
                    assert tp.score(spec, layout).cycle_s == pytest.approx(value, rel=1e-12)
                    assert value == pytest.approx(got[0][0], rel=1e-12)


@pytest.mark.parametrize("first", [0, 6000, 60000])
def test_stowplan_equals_the_optimum_or_is_reported(first: int) -> None:
    for objective in ("latency", "throughput"):
        out = next(
            o
            for seed in range(first, first + 20)
            if (o := tp.run_instance(tp.draw(seed), objective))
        )
        seed = out.seed
        assert not out.illegal, out.illegal  # no plan breaks a rule
        assert out.disagreement is not None and out.disagreement <= 1e-9
        assert out.repredicted is not None and out.repredicted <= 1e-9
        # No certificate's bound is beaten by the referee's optimum (a throughput bound
        # in tokens/s is at least U / the least cycle), on any groups or the plan's own.
        assert out.certificate is None and out.own_certificate is None
        lines = "\n".join(bench.report([out], worst=3))
        if out.ratios["stowplan"] < 1 - 1e-9:
            assert out.claimed_gap is not None and out.claimed_gap > 0  # the gap is stated
            assert f"seed {seed}" in lines, lines
        else:
            assert out.ratios["stowplan"] == pytest.approx(1.0, abs=1e-9)


def test_the_quick_run_prints_the_tables(capsys: pytest.CaptureFixture[str]) -> None:
    lines: list[str] = []
    bench.main(["--instances", "2", "--skip", "case", "speed"], out=lines.append)
    text = "\n".join(lines)
    assert "| latency | stowplan (per-stage tp) |" in text
    assert "| throughput | one tp for all stages (best such) |" in text


def test_adjacent_stages_may_wrap_around_the_cycle_only_through_the_first_node() -> None:
    ok = tp.adjacent_next
    assert ok([(0, 1), (1, 1)], 0)  # back to the first node: it holds both ends
    assert not ok([(0, 1), (1, 1), (0, 1)], 1)  # after that, only the first node
    assert not ok([(0, 1), (1, 1), (2, 1)], 1)  # node 1 left: it cannot come back
    assert ok([(0, 1), (1, 1)], 1) and ok([(0, 1), (1, 1)], 2)
    inst = tp.draw(72000)
    spec = inst.spec("throughput")
    free = tp.solve(spec, "free")
    adjacent = tp.solve(spec, "adjacent")
    assert free is not None and adjacent is not None and adjacent[0] >= free[0]
