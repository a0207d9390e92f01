"""llama.cpp export: replaying llama.cpp's own layer placement gives back the plan."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stowplan.exports import UnsupportedByEngine, export_plan
from stowplan.model import ExpertId
from tests.common.llamacpp_replay import RULES, llamacpp_devices
from tests.common.plans import make_plan


def argv_of(plan, **kw) -> list[str]:
    words = shlex.split(export_plan(plan, "llamacpp", **kw).commands[0])
    assert words[0] == "llama-server"
    return words[1:]


def expected_devices(kinds: list[str]) -> list[object]:
    out: list[object] = []
    gpu = 0
    for k in kinds:
        out.append("CPU" if k == "cpu" else gpu)
        gpu += k == "gpu"
    return out


@st.composite
def one_host_plans(draw):
    kinds = draw(st.lists(st.sampled_from(["gpu", "cpu"]), min_size=1, max_size=6))
    counts = draw(st.lists(st.integers(0, 21), min_size=len(kinds), max_size=len(kinds)))
    if sum(counts) == 0:
        counts[0] = 1
    ids = [f"{k}{i}" for i, k in enumerate(kinds)]
    return kinds, make_plan(counts, ids)


@given(one_host_plans(), st.sampled_from(sorted(RULES)))
def test_llamacpp_places_blocks_and_head_where_the_plan_does_under_both_rules(case, rule):
    kinds, plan = case
    n = plan.num_blocks
    placed = llamacpp_devices(argv_of(plan), n, rule)
    want = expected_devices(kinds)
    for a in plan.assignments:
        for b in range(*a.block_range):
            assert placed[f"blk.{b}.attn_q.weight"] == want[a.stage], (b, a.stage, rule)
    assert placed["output.weight"] == want[-1]
    # output_norm (one vector) stays with the last device's layers: the -ot rule names
    # the output matrix alone.
    devices = [w for w in want if w != "CPU"]
    assert placed["output_norm.weight"] == (devices[-1] if devices else "CPU")


@pytest.mark.parametrize("rule", sorted(RULES))
def test_cpu_blocks_ahead_of_the_gpus_stay_on_the_cpu_under_both_rules(rule):
    plan = make_plan([3, 20, 9], ["cpu", "gpu0", "gpu1"], context_tokens=None)
    argv = argv_of(plan, model="m.gguf")
    assert argv[argv.index("-ngl") + 1] == "33"
    assert argv[argv.index("--tensor-split") + 1] == "23,10"
    assert "blk\\.(0|1|2)\\.=CPU" in argv
    placed = llamacpp_devices(argv, 32, rule)
    assert [placed[f"blk.{b}.attn_q.weight"] for b in (0, 2, 3, 22, 23, 31)] == [
        "CPU", "CPU", 0, 0, 1, 1,
    ]  # fmt: skip
    assert placed["output.weight"] == 1


def test_two_gpus_and_a_cpu_tail_give_exact_flags():
    plan = make_plan([20, 10, 2], ["gpu0", "gpu1", "cpu"], context_tokens=8192)
    assert argv_of(plan, model="m.gguf") == [
        "-m",
        "m.gguf",
        "-ngl",
        "33",
        "--tensor-split",
        "20,13",
        "-ot",
        "blk\\.(30|31)\\.=CPU",
        "-ot",
        "^output\\.weight$=CPU",
        "-c",
        "8192",
        "-np",
        "1",
    ]


def test_experts_kept_on_the_cpu_become_an_exps_override():
    experts = {1: [ExpertId(block=b, expert=e) for b in (0, 1) for e in range(4)]}
    plan = make_plan([2, 0], ["gpu0", "cpu"], experts=experts, experts_per_block=4)
    argv = argv_of(plan)
    rules = [argv[i + 1] for i, a in enumerate(argv) if a == "-ot"]
    assert rules == ["^output\\.weight$=CPU", "blk\\.(0|1)\\.ffn_.*_exps\\.=CPU"]
    placed = llamacpp_devices(argv, 2)
    assert placed["blk.0.ffn_up_exps.weight"] == "CPU"
    assert placed["blk.1.attn_q.weight"] == 0


def test_experts_split_inside_a_block_are_refused():
    experts = {1: [ExpertId(block=0, expert=e) for e in range(2)]}
    plan = make_plan([1, 1], ["gpu0", "cpu"], experts=experts, experts_per_block=4)
    with pytest.raises(UnsupportedByEngine) as info:
        export_plan(plan, "llamacpp")
    assert str(info.value) == (
        "llamacpp cannot run this plan: the routed experts of block 0 are split between stages "
        "[0, 1]; llama.cpp stores a block's experts as one tensor, so they can only move "
        "together; replan with every expert beside its block: stowplan plan llama3.1:8b "
        "--nodes FLEET --engine llamacpp --block-local --context 4096"
    )
