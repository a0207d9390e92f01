"""An expert-parallel plan an engine cannot run is refused with the line that replans it."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from stowplan import Constraints, ExpertInputs, ExpertPlacement, plan
from stowplan.cli import main
from stowplan.errors import StowplanError
from stowplan.exports import export_plan
from stowplan.files.fleets import load_nodes
from stowplan.models.known import lookup

FLEET = Path(__file__).resolve().parents[2] / "examples" / "fleets" / "mixed-consumer.yaml"


@pytest.mark.parametrize("engine", ["vllm", "llamacpp"])
def test_the_refusal_names_a_block_local_replan_that_the_engine_runs(
    engine: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = lookup("mixtral:8x7b")
    assert model is not None
    nodes = load_nodes(FLEET)
    spread = plan(
        model, nodes, Constraints(), experts=ExpertInputs(placement=ExpertPlacement.EXPERT_PARALLEL)
    )
    with pytest.raises(StowplanError) as err:
        export_plan(spread, engine, nodes=nodes, nodes_file=str(FLEET))
    message = str(err.value)
    assert "replan with every expert beside its block: " in message
    command = shlex.split(message.split("replan with every expert beside its block: ")[1])
    assert command[:2] == ["stowplan", "plan"] and "--block-local" in command
    assert command[command.index("--engine") + 1] == engine
    # The command, run through the CLI, gives a plan the engine exports.
    assert main([*command[1:], "--json"]) == 0
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(capsys.readouterr().out)
    assert main(["export", str(plan_path), "--to", engine, "--nodes", str(FLEET)]) == 0


TWO_H100 = FLEET.parent / "two-h100-nodes.yaml"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_default_moe_plan_is_one_the_engine_runs_and_names_the_faster_alternative(
    engine: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """deepseek-v3 on two 8 × H100 nodes: expert-parallel predicts faster, but only a
    custom stage worker runs it; the default plan is block-local, exports unedited, and
    its notes give the alternative's figure and the gap."""
    model = lookup("deepseek-v3")
    assert model is not None
    nodes = load_nodes(TWO_H100)
    default = plan(model, nodes, Constraints())
    local = plan(model, nodes, Constraints(), experts=ExpertInputs(placement="block-local"))
    spread = plan(model, nodes, Constraints(), experts=ExpertInputs(placement="expert-parallel"))
    assert default.assignments == local.assignments
    t_local = local.rationale.prediction.time_per_token_s  # type: ignore[union-attr]
    t_spread = spread.rationale.prediction.time_per_token_s  # type: ignore[union-attr]
    assert t_spread < t_local  # the alternative is faster, and said so
    gain = t_local / t_spread - 1
    (note,) = [n for n in default.rationale.notes if "the layout engines run" in n]
    assert note.endswith(f"{t_spread * 1e3:.4g} ms/token, {gain:.0%} faster")
    assert main(["plan", "deepseek-v3", "--nodes", str(TWO_H100), "--json"]) == 0
    path = tmp_path / "plan.json"
    path.write_text(capsys.readouterr().out)
    assert main(["export", str(path), "--to", engine, "--nodes", str(TWO_H100)]) == 0
    assert "PP_LAYER_PARTITION" in capsys.readouterr().out
