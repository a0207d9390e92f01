"""The plan's KV cache as the engines take it: the context, the sequences in flight, the
memory fraction (1 − headroom), and the refusal of a plan that cannot hold its context."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stowplan import Constraints, Plan, lookup, plan
from stowplan.errors import Infeasible
from stowplan.exports import export_plan
from stowplan.files.fleets import load_nodes
from stowplan.plan import plan_to_json
from tests.common.paths import EXAMPLES
from tests.common.plans import make_plan

CASE_C = load_nodes(EXAMPLES / "fleets" / "case-c.yaml")


def _plan(batch: int = 4, context: int | None = 4096, headroom: float = 0.15) -> Plan:
    model = lookup("llama3.1:8b")
    assert model is not None
    c = Constraints(batch=batch, context_tokens=context, vram_headroom_frac=headroom, min_stages=4)
    return plan(model, CASE_C, c)


def test_vllm_gets_the_context_and_one_minus_the_headroom() -> None:
    p = _plan()
    assert p.num_stages == 4
    args = export_plan(p, "vllm", nodes=CASE_C, model="m").args
    assert args == (
        "--pipeline-parallel-size", "4", "--tensor-parallel-size", "1",
        "--distributed-executor-backend", "ray",
        "--max-model-len", "4096", "--gpu-memory-utilization", "0.85",
    )  # fmt: skip


def test_sglang_gets_the_context_length_and_the_static_memory_fraction() -> None:
    args = export_plan(_plan(headroom=0.1), "sglang", nodes=CASE_C, model="m").args
    assert args == (
        "--pp-size", "4", "--tp-size", "1",
        "--context-length", "4096", "--mem-fraction-static", "0.9",
    )  # fmt: skip


def test_llamacpp_total_context_is_the_context_times_the_slots() -> None:
    result = export_plan(_plan(), "llamacpp", nodes=CASE_C, model="m")
    # case-c's nodes are separate hosts: llama-server joins the others over --rpc.
    assert result.args[:2] == ("-m", "m") and "--rpc" in result.args
    assert result.args[-4:] == ("-c", "16384", "-np", "4")
    assert (
        "-c 16384 is the KV cache of all 4 slots (-np 4) together: llama-server gives each "
        "slot -c / -np = 4096 tokens"
    ) in result.notes


def test_llamacpp_one_sequence_takes_the_context_in_one_slot() -> None:
    # -np 1 always: llama-server's default opens several slots sharing one KV pool.
    args = export_plan(_plan(batch=1), "llamacpp", nodes=CASE_C, model="m").args
    assert args[-4:] == ("-c", "4096", "-np", "1")


def test_without_the_fleet_the_default_headroom_is_assumed_and_said() -> None:
    result = export_plan(_plan(), "vllm", model="m")
    assert result.args[-2:] == ("--gpu-memory-utilization", "0.8")
    assert (
        "the memory fraction 0.8 assumes the default 20% headroom: pass --nodes FLEET to read "
        "the plan's own"
    ) in result.notes


def test_a_fleet_smaller_than_the_plan_is_not_read_for_the_fraction() -> None:
    small = [replace(n, vram_bytes=n.vram_bytes // 4) for n in CASE_C]
    result = export_plan(_plan(), "vllm", nodes=small, model="m")
    assert result.args[-2:] == ("--gpu-memory-utilization", "0.8")
    assert any("the fleet gives a stage less VRAM than the plan uses" in n for n in result.notes)


@pytest.mark.parametrize("context", [None, 0])
def test_no_context_leaves_the_length_to_the_engine(context: int | None) -> None:
    p = _plan(batch=1, context=context)
    assert "--max-model-len" not in export_plan(p, "vllm", nodes=CASE_C).args
    assert "--context-length" not in export_plan(p, "sglang", nodes=CASE_C).args
    llama = export_plan(p, "llamacpp", nodes=CASE_C)
    assert "-c" not in llama.args
    assert "the plan reserves no KV cache: llama.cpp uses the model's trained context" in (
        llama.notes
    )


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llamacpp", "accelerate"])
def test_a_stored_plan_that_cannot_hold_its_context_is_refused_with_the_numbers(
    engine: str,
) -> None:
    edited = replace(_plan(), context_tokens=500_000)  # as if its JSON were edited
    with pytest.raises(Infeasible) as info:
        export_plan(edited, engine, nodes=CASE_C, nodes_file="fleet.yaml")
    assert str(info.value) == (
        "constraints unsatisfiable: the plan's stage 0 on c24a cannot hold the KV cache of its "
        "context: weights 5.9 GiB + KV 91.6 GiB (48.0 KiB/token × 500,000 tokens × 4 sequences) "
        "= 97.4 GiB > usable VRAM 19.0 GiB; replan with the largest context that fits: "
        "stowplan plan llama3.1:8b --nodes fleet.yaml --batch 4 --context max"
    )


def test_without_the_models_layout_a_short_capacity_is_a_note() -> None:
    edited = replace(_plan(), context_tokens=500_000, model_name="mystery")
    notes = export_plan(edited, "vllm").notes
    assert notes[-1] == (
        "the plan's KV capacity (225,531 tokens) is below its context × sequences "
        "(500,000 × 4); pass the model (--model) to check it against the model's own KV "
        "figures, or replan: stowplan plan mystery --nodes FLEET --batch 4 --context max"
    )


def test_without_the_layout_a_stage_over_its_usable_vram_is_refused() -> None:
    p = make_plan([16, 16], model_name="mystery")
    bad = replace(
        p, assignments=(p.assignments[0], replace(p.assignments[1], estimated_vram_bytes=21 << 30))
    )
    with pytest.raises(Infeasible, match=r"stage 1 on gpu1 cannot hold the KV cache"):
        export_plan(bad, "vllm")


def test_the_cli_refuses_the_stored_plan_in_one_line(tmp_path, capsys) -> None:
    from stowplan.cli import main

    path = tmp_path / "plan.json"
    path.write_text(plan_to_json(replace(_plan(), context_tokens=500_000)))
    assert main(["export", str(path), "--to", "vllm"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("stowplan: error: constraints unsatisfiable: the plan's stage 0 on c24a")
