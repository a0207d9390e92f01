"""stage-env --format shell can be sourced and gives exactly the worker's environment."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from stowplan.cli import main
from stowplan.cli.stage_env_render import render_stage_env
from stowplan.errors import InputError
from stowplan.plan import plan_from_json
from stowplan.stages.worker import CONTRACT_KEYS, stage_env
from tests.common.paths import FIXTURES

PLAN = FIXTURES / "plans" / "llama3_1_70b__mixed-consumer__39.json"


def _sourced(script: str) -> dict[str, str]:
    """The contract variables after a POSIX shell sources ``script``."""
    keys = " ".join(sorted(CONTRACT_KEYS))
    done = subprocess.run(
        ["sh", "-c", f'eval "$1"; for k in {keys}; do printf "%s\\0" "$k=$(printenv $k)"; done',
         "sh", script],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return dict(item.split("=", 1) for item in done.stdout.split("\0") if item)


@pytest.mark.parametrize("stage", [0, 3, 5])
def test_a_sourced_stage_has_exactly_the_workers_environment(
    stage: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["stage-env", str(PLAN), "--format", "shell", "--stage", str(stage)]) == 0
    expected = stage_env(plan_from_json(PLAN.read_text()))[stage]
    assert _sourced(capsys.readouterr().out) == expected


def test_quotes_and_spaces_in_values_survive_the_shell() -> None:
    env = {"STAGE": "0", "PLAN_JSON": """{"id": "it's a \\"node\\" $HOME `x`"}"""}
    script = render_stage_env([env], ["n'1"], "shell", 0)
    assert _sourced(script)["PLAN_JSON"] == env["PLAN_JSON"]


def test_json_format_is_the_json_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stage-env", str(PLAN), "--json"]) == 0
    as_flag = json.loads(capsys.readouterr().out)
    assert main(["stage-env", str(PLAN), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == as_flag
    assert main(["stage-env", str(PLAN), "--format", "json", "--stage", "2"]) == 0
    assert json.loads(capsys.readouterr().out) == as_flag[2]


@pytest.mark.parametrize(
    ("fmt", "stage", "message"),
    [
        ("xml", None, "--format='xml': must be one of text, shell, json"),
        ("shell", 6, "--stage=6: must be an integer in [0, 5]"),
        ("text", -1, "--stage=-1: must be an integer in [0, 5]"),
    ],
)
def test_a_bad_format_or_stage_is_an_input_error(fmt: str, stage: int | None, message: str) -> None:
    envs = stage_env(plan_from_json(PLAN.read_text()))
    with pytest.raises(InputError) as info:
        render_stage_env(envs, ["n"] * len(envs), fmt, stage)
    assert str(info.value) == message
