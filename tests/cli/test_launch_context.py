"""launch reserves KV cache as plan does: the default context unless --context says."""

from __future__ import annotations

import json

import pytest

from stowplan.cli import main
from tests.common.paths import EXAMPLES

FLEET = str(EXAMPLES / "fleets" / "case-c.yaml")


def _context(capsys: pytest.CaptureFixture[str], *args: str) -> object:
    assert main(["launch", *args, "--plan-debug", "--json"]) == 0
    return json.loads(capsys.readouterr().out)["plan"]["context_tokens"]


def test_launch_reserves_plans_default_context(capsys: pytest.CaptureFixture[str]) -> None:
    assert _context(capsys, "llama3.1:8b", "--nodes", FLEET) == 8192
    assert _context(capsys, "llama3.1:8b", "--nodes", FLEET, "--context", "1024") == 1024
    assert _context(capsys, "llama3.1:8b", "--nodes", FLEET, "--context", "0") is None


def test_the_demo_reserves_its_own_longest_sequence(capsys: pytest.CaptureFixture[str]) -> None:
    assert _context(capsys, "demo") == 64  # DemoConfig.max_seq_len


def test_launch_context_max_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["launch", "demo", "--plan-debug", "--context", "max"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stowplan plan --context max" in err
