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
