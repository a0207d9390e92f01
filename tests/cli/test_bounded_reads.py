"""Every flag that names a user file refuses /dev/zero and a FIFO at once: one line, exit 2."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from stowplan.cli import main
from tests.common.paths import EXAMPLES

FLEET = str(EXAMPLES / "fleets" / "case-a.yaml")

# Each command with the placeholder BAD where a user file goes.
INVOCATIONS = [
    ["plan", "llama3.1:8b", "--nodes", "BAD"],
    ["plan", "llama3.1:8b", "--offers", "BAD"],
    ["plan", "llama3.1:8b", "--nodes", FLEET, "--calibration", "BAD"],
    ["plan", "mixtral:8x7b", "--nodes", FLEET, "--expert-load", "BAD"],
    ["plan", "mixtral:8x7b", "--nodes", FLEET, "--coactivation", "BAD"],
    ["plan", "BAD", "--nodes", FLEET],
    ["model", "inspect", "BAD"],
    ["stage-env", "BAD"],
    ["export", "BAD", "--to", "vllm"],
    ["residency", "llama3.1:8b", "--passport", "BAD"],
    ["calibrate", "--from-llama-bench", "BAD"],
    ["calibrate", "--from-serving-bench", "BAD"],
    ["calibrate", "--from-probe", "--passport", "BAD"],
    ["cluster", "resources", "--nvidia-smi", "BAD"],
    ["launch", "llama3.1:8b", "--nodes", "BAD", "--plan-debug"],
]


def _run(argv: list[str], bad: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, float]:
    started = time.monotonic()
    code = main([bad if a == "BAD" else a for a in argv])
    return code, capsys.readouterr().err, time.monotonic() - started


@pytest.mark.timeout(30)
@pytest.mark.parametrize("argv", INVOCATIONS, ids=lambda a: " ".join(a[:2]) + " " + a[-1])
def test_dev_zero_is_refused_in_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, err, took = _run(argv, "/dev/zero", capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and "/dev/zero" in err, err
    assert "character device" in err, err
    assert took < 5.0


@pytest.mark.timeout(30)
@pytest.mark.parametrize("argv", INVOCATIONS, ids=lambda a: " ".join(a[:2]) + " " + a[-1])
def test_a_fifo_is_refused_without_blocking(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "input.json"
    os.mkfifo(fifo)
    code, err, took = _run(argv, str(fifo), capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and "FIFO" in err, err
    assert took < 5.0
