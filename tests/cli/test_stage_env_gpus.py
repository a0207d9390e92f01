"""stage-env and launch --plan-debug show each stage's tensor-parallel size and GPUs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from stowplan.cli import main
from stowplan.plan import plan_to_json
from stowplan.stages.worker import CONTRACT_KEYS, VISIBLE_DEVICES, stage_env
from tests.common.paths import EXAMPLES
from tests.common.plans import make_tp_plan

TWO_H100 = str(EXAMPLES / "fleets" / "two-h100-nodes.yaml")
PLAN = make_tp_plan([("n0", (0, 1, 2, 3), 20), ("n0", (4, 5, 6, 7), 10), ("n1", (), 2)])


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(plan_to_json(PLAN))
    return path


def test_text_heads_each_stage_with_its_gpus_and_lists_tp_size_and_devices(
    plan_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["stage-env", str(plan_file)]) == 0
    out = capsys.readouterr().out
    stages = out.split("# stage ")[1:]
    assert [s.splitlines()[0] for s in stages] == [
        "0 on n0 gpu0-3 tp4",
        "1 on n0 gpu4-7 tp4",
        "2 on n1",
    ]
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3\n" in stages[0] and "PLAN_TP_SIZE=4\n" in stages[0]
    assert "CUDA_VISIBLE_DEVICES=4,5,6,7\n" in stages[1]
    assert "CUDA_VISIBLE_DEVICES" not in stages[2] and "PLAN_TP_SIZE=1\n" in stages[2]


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_a_sourced_stage_sets_its_devices_and_leaves_a_whole_nodes_alone(
    stage: int, plan_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["stage-env", str(plan_file), "--format", "shell", "--stage", str(stage)]) == 0
    script = capsys.readouterr().out
    keys = " ".join([*CONTRACT_KEYS, VISIBLE_DEVICES])
    done = subprocess.run(
        ["sh", "-c", f'eval "$1"; for k in {keys}; do printf "%s=%s\\0" "$k" "$(printenv $k)"; done',
         "sh", script],
        capture_output=True, text=True, check=True, env={"CUDA_VISIBLE_DEVICES": "7"},
    )  # fmt: skip
    sourced = dict(item.split("=", 1) for item in done.stdout.split("\0") if item)
    expected = stage_env(PLAN)[stage]
    assert sourced == {**expected, VISIBLE_DEVICES: expected.get(VISIBLE_DEVICES, "7")}


def test_plan_debug_prints_the_tp_size_and_devices_of_every_stage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["launch", "llama3.1:405b", "--nodes", TWO_H100, "--plan-debug"]) == 0
    out = capsys.readouterr().out
    assert "# stage 0 on n0 gpu0-7 tp8\n" in out and "# stage 1 on n1 gpu0-7 tp8\n" in out
    assert out.count("PLAN_TP_SIZE=8\n") == 2
    assert out.count("CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7\n") == 2
    assert main(["launch", "llama3.1:405b", "--nodes", TWO_H100, "--plan-debug", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [e["PLAN_TP_SIZE"] for e in doc["stage_env"]] == ["8", "8"]
