"""``stowplan plan --dtype``: the model is planned in the storage dtype asked for."""

from __future__ import annotations

import pytest

from stowplan import plan_from_json
from stowplan.cli import main
from tests.common.paths import EXAMPLES

FLEET = str(EXAMPLES / "fleets" / "mixed-consumer.yaml")


def _weights(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[str, int]:
    assert main(["plan", "llama3.1:70b", "--nodes", FLEET, "--json", *extra]) == 0
    p = plan_from_json(capsys.readouterr().out)
    return p.model_name, sum(a.estimated_vram_bytes for a in p.assignments)


def test_plan_dtype_int4_plans_the_four_bit_layout(capsys: pytest.CaptureFixture[str]) -> None:
    name, int4 = _weights(capsys, "--dtype", "int4")
    assert name == "llama3.1:70b@int4"
    _, bf16 = _weights(capsys, "--dtype", "bf16")
    # 4-bit weights (with group scales) take a bit over a quarter of bf16's bytes.
    assert 0.25 < int4 / bf16 < 0.32


def test_plan_unknown_dtype_is_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "llama3.1:70b", "--nodes", FLEET, "--dtype", "fp3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stowplan: error: --dtype='fp3': is not a known dtype; use one of bf16,")
    assert err.count("\n") == 1
