"""One verb: ``stowplan.plan`` plans every model as ``stowplan plan`` does, experts included."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

import stowplan
from stowplan import (
    Constraints,
    ExpertInputs,
    ExpertLoad,
    ExpertPlacement,
    InputError,
    StowplanError,
    Topology,
    load_nodes,
    lookup,
    plan,
    plan_to_json,
)
from stowplan.calibration.store import resolve_calibration
from stowplan.cli import main
from stowplan.models import known_names, model_source
from stowplan.moe.stats import CoActivation, zipf_load
from stowplan.plan import with_inputs
from stowplan.planner import plan_blocks
from stowplan.planner.context import default_context_tokens, plan_within_context
from tests.common.paths import EXAMPLES

FLEETS = ("two-h100-nodes", "mixed-consumer")


@pytest.mark.parametrize("fleet", FLEETS)
@pytest.mark.parametrize("name", known_names())
def test_the_library_and_the_cli_give_the_same_plan(
    name: str,
    fleet: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STOWPLAN_HOME", str(tmp_path / "home"))  # no user-fitted entries
    path = EXAMPLES / "fleets" / f"{fleet}.yaml"
    model = lookup(name)
    assert model is not None
    nodes = load_nodes(path)
    c = Constraints(  # what the command line asks for by default
        context_tokens=default_context_tokens(model),
        calibration=resolve_calibration("generic"),
    )
    try:
        # The command line records what the plan was made from (the model an engine loads,
        # the nodes' descriptors); the plan itself is the library's.
        made = with_inputs(plan(model, nodes, c), model_source=model_source(name), nodes=nodes)
        expected: dict[str, Any] | str = _without_notes(plan_to_json(made))
    except StowplanError:  # the CLI says why in one line (with the context's numbers), exits 2
        with pytest.raises(StowplanError) as exc:
            plan_within_context(model, nodes, c)
        expected = f"stowplan: error: {exc.value}\n"
    code = main(["plan", name, "--nodes", str(path), "--json"])
    captured = capsys.readouterr()
    if isinstance(expected, str):
        assert (code, captured.err.splitlines(keepends=True)[-1]) == (2, expected)
    else:
        assert (code, _without_notes(captured.out)) == (0, expected)


def _without_notes(text: str) -> dict[str, Any]:
    """A plan's JSON without its notes: the command line words the notes with its reading of
    the calibration (the engine named, the range outside its data); all else is the plan."""
    doc: dict[str, Any] = json.loads(text)
    assert doc["rationale"].pop("notes")
    return doc


def test_a_moe_model_gets_every_expert_placed() -> None:
    model = lookup("mixtral:8x7b")
    assert model is not None and model.experts is not None
    p = plan(model, load_nodes(EXAMPLES / "fleets" / "mixed-consumer.yaml"))
    assert p.topology == Topology.PipelineWithExperts(p.num_stages, 8)
    owned = {(x.block, x.expert) for a in p.assignments for x in a.owned_experts}
    assert owned == {(b, e) for b in model.experts.moe_blocks for e in range(8)}
    blocks_only = plan_blocks(model, load_nodes(EXAMPLES / "fleets" / "mixed-consumer.yaml"))
    assert blocks_only.topology.kind == "PipelineChain"
    assert all(a.owned_experts == () for a in blocks_only.assignments)


def test_a_dense_model_gets_the_block_planners_plan_with_or_without_inputs() -> None:
    model = lookup("llama3.1:8b")
    assert model is not None
    nodes = load_nodes(EXAMPLES / "fleets" / "mixed-consumer.yaml")
    expected = plan_to_json(plan_blocks(model, nodes))
    assert plan_to_json(plan(model, nodes)) == expected
    forced = ExpertInputs(placement=ExpertPlacement.EXPERT_PARALLEL)
    assert plan_to_json(plan(model, nodes, experts=forced)) == expected


@pytest.mark.parametrize("expert_parallel", [None, True, False])
def test_plan_with_experts_warns_and_gives_the_same_plan(expert_parallel: bool | None) -> None:
    model = lookup("qwen3:30b-a3b")
    assert model is not None and model.experts is not None
    ex = model.experts
    nodes = load_nodes(EXAMPLES / "fleets" / "mixed-consumer.yaml")
    load = zipf_load(len(ex.moe_blocks), ex.num_experts, exponent=1.1, seed=3)
    co = CoActivation(rows=tuple(((0, 1, 500.0), (2, 3, 400.0)) for _ in ex.moe_blocks))
    cons = Constraints(batch=8)
    with pytest.warns(DeprecationWarning, match="plan_with_experts is deprecated"):
        old = stowplan.plan_with_experts(
            model, nodes, cons, load, co, redundant_per_block=2, expert_parallel=expert_parallel
        )
    inputs = ExpertInputs(
        load=load,
        coactivation=co,
        redundant_per_block=2,
        placement=ExpertPlacement.from_flag(expert_parallel),
    )
    assert plan_to_json(old) == plan_to_json(plan(model, nodes, cons, experts=inputs))


def test_the_placement_flag_maps_to_the_enum() -> None:
    assert ExpertPlacement.from_flag(None) is ExpertPlacement.AUTO
    assert ExpertPlacement.from_flag(True) is ExpertPlacement.EXPERT_PARALLEL
    assert ExpertPlacement.from_flag(False) is ExpertPlacement.BLOCK_LOCAL
    assert ExpertInputs(placement="block-local").placement is ExpertPlacement.BLOCK_LOCAL  # type: ignore[arg-type]
    assert ExpertInputs().placement is ExpertPlacement.AUTO


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"placement": "spread"},
            "placement='spread': must be one of auto, block-local, expert-parallel",
        ),
        ({"redundant_per_block": -1}, "redundant_per_block=-1: must be an integer >= 0"),
        ({"redundant_per_block": 1.5}, "redundant_per_block=1.5: must be an integer >= 0"),
        ({"locality_tolerance": -0.1}, "locality_tolerance=-0.1: must be a finite number >= 0"),
        ({"load": [[1.0, 2.0]]}, "load='list': must be an ExpertLoad or None"),
        ({"coactivation": {}}, "coactivation='dict': must be a CoActivation or None"),
    ],
)
def test_bad_expert_inputs_are_refused_at_construction(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(InputError) as exc:
        ExpertInputs(**kwargs)  # type: ignore[arg-type]
    assert str(exc.value) == message


def test_statistics_for_a_dense_model_and_a_wrong_experts_value_are_input_errors() -> None:
    model = lookup("llama3.1:8b")
    assert model is not None
    nodes = load_nodes(EXAMPLES / "fleets" / "mixed-consumer.yaml")
    with pytest.raises(InputError) as exc:
        plan(model, nodes, experts=ExpertInputs(load=ExpertLoad(rows=((1.0, 2.0),))))
    assert str(exc.value) == "--expert-load='llama3.1:8b': is only for mixture-of-experts models"
    with pytest.raises(InputError) as exc:
        plan(model, nodes, experts="auto")  # type: ignore[arg-type]
    assert str(exc.value) == "experts='str': must be an ExpertInputs or None"


def test_plan_itself_raises_no_deprecation_warning() -> None:
    model = lookup("mixtral:8x7b")
    assert model is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan(model, load_nodes(EXAMPLES / "fleets" / "two-h100-nodes.yaml"))
