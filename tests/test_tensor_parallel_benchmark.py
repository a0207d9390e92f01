"""The tensor-parallel benchmark's referee: hand-computed optima, three exact methods that
agree, and stowplan's plans scored by it (equal to the optimum, or reported)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import pytest

from stowplan import ModelLayout
from stowplan.parallel_rules import kv_heads_allow
from tests.conftest import ROOT


def _bench() -> ModuleType:
    name = "tensor_parallel_benchmark"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, ROOT / "benchmarks" / "tensor_parallel.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


tp = _bench()

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
    for value, layout in (
        tp.search(spec, "latency", tp.allowed(spec, "free")),
        tp.solve_by_sequences(spec, "latency", tp.allowed(spec, "free")),
    ):
        assert value == pytest.approx(13 * GB / (400 * GB), rel=1e-12)
        assert layout == tp.Layout(stages=((1, 1),), bounds=(0, 2))
    # Throughput (batch 4, 8 KB of activations): a:tp2 takes block 0 in
    # 6 GB / 200 GB/s + 2 all-reduces (10 µs + 8 KB / 10 GB/s each) + 8 KB over 1 GB/s;
    # b the last block and the head in 7 GB / 400 GB/s = 17.5 ms.
    spec = _two_nodes(4)
    slowest = 0.03 + 2 * (10e-6 + 8000 / 10e9) + 8000 / 1e9
    for value, layout in (
        tp.search(spec, "throughput", tp.allowed(spec, "free")),
        tp.solve_by_sequences(spec, "throughput", tp.allowed(spec, "free")),
    ):
        assert value == pytest.approx(slowest, rel=1e-12)
        assert layout == tp.Layout(stages=((0, 2), (1, 1)), bounds=(0, 1, 2))
    score = tp.score(spec, tp.Layout(stages=((0, 2), (1, 1)), bounds=(0, 1, 2)))
    assert score.tokens_per_s == pytest.approx(4 / slowest, rel=1e-12)
    # Two tp-1 groups of node a: intra-node transfer and hops (10 µs each way).
    one = tp.score(_two_nodes(1), tp.Layout(stages=((0, 1), (0, 1)), bounds=(0, 1, 2)))
    assert one.time_per_token_s == pytest.approx(0.06 + 2000 / 10e9 + 0.07 + 2 * 10e-6)


@pytest.mark.parametrize(("tp_", "heads", "kv"), [(3, 24, 8), (6, 48, 48), (7, 56, 1), (8, 64, 8)])
def test_the_legal_degrees_follow_the_heads_rule(tp_: int, heads: int, kv: int) -> None:
    assert tp.legal(tp_, heads, kv) == (heads % tp_ == 0 and kv_heads_allow(tp_, kv))


@pytest.mark.parametrize("seed", [3, 11, 25])
def test_three_exact_methods_agree(seed: int) -> None:
    inst = tp.draw(seed, 4)
    for objective in ("latency", "throughput"):
        spec = inst.spec(objective)
        for rule, degree in (("free", None), ("whole", None), ("uniform", 2)):
            degrees = tp.allowed(spec, rule, degree)
            got = [
                tp.search(spec, objective, degrees),
                tp.search(spec, objective, degrees, prune=False),
                tp.solve_by_sequences(spec, objective, degrees),
            ]
            assert (got[0] is None) == (got[1] is None) == (got[2] is None)
            if got[0] is not None:
                assert not tp.violations(spec, got[0][1])
                for other in got[1:]:
                    assert other[0] == pytest.approx(got[0][0], rel=1e-12)


@pytest.mark.parametrize("first", [0, 6000, 60000])
def test_stowplan_equals_the_optimum_or_is_reported(first: int) -> None:
    for objective in ("latency", "throughput"):
        out = next(
            o
            for seed in range(first, first + 20)
            if (o := tp.run_instance(tp.draw(seed), objective))
        )
        seed = out.seed
        if not out.illegal:
            assert out.disagreement is not None and out.disagreement <= 1e-9
        lines = "\n".join(tp.report([out], worst=3))
        if out.ratios["stowplan"] < 1 - 1e-9:
            assert f"seed {seed}" in lines, lines
        else:
            assert out.ratios["stowplan"] == pytest.approx(1.0, abs=1e-9)


def test_the_quick_run_prints_the_tables(capsys: pytest.CaptureFixture[str]) -> None:
    lines: list[str] = []
    tp.main(["--instances", "2", "--skip", "case", "speed"], out=lines.append)
    text = "\n".join(lines)
    assert "| latency | stowplan (per-stage tp) |" in text
    assert "| throughput | one tp for all stages (best such) |" in text


def test_adjacent_stages_may_wrap_around_the_cycle_only_through_the_first_node() -> None:
    ok = tp._adjacent_next
    assert ok([(0, 1), (1, 1)], 0)  # back to the first node: it holds both ends
    assert not ok([(0, 1), (1, 1), (0, 1)], 1)  # after that, only the first node
    assert not ok([(0, 1), (1, 1), (2, 1)], 1)  # node 1 left: it cannot come back
    assert ok([(0, 1), (1, 1)], 1) and ok([(0, 1), (1, 1)], 2)
    inst = tp.draw(72000)
    spec = inst.spec("throughput")
    free = tp.solve(spec, "throughput", "free")
    adjacent = tp.solve(spec, "throughput", "adjacent")
    assert free is not None and adjacent is not None and adjacent[0] >= free[0]
