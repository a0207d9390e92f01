"""``stowplan plan`` with --expert-load / --coactivation, through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stowplan import lookup
from stowplan.cli import main
from tests.common.paths import EXAMPLES

FLEET = EXAMPLES / "fleets" / "mixed-consumer.yaml"


def test_expert_load_on_a_dense_model_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    load = tmp_path / "load.json"
    load.write_text("[[1, 2]]")
    code = main(["plan", "llama3.1:8b", "--nodes", str(FLEET), "--expert-load", str(load)])
    assert code == 2
    assert capsys.readouterr().err == (
        "stowplan: error: --expert-load='llama3.1:8b': is only for mixture-of-experts models\n"
    )


def test_dense_plan_output_is_unchanged_by_the_new_options(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "llama3.1:8b", "--nodes", str(FLEET), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["topology"]["kind"] == "PipelineChain"


def test_moe_plan_shows_experts_per_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = lookup("qwen3:30b-a3b")
    assert model is not None and model.experts is not None
    n = model.experts.num_experts
    rows = [[1.0 / (e + 1) for e in range(n)] for _ in model.experts.moe_blocks]
    load = tmp_path / "load.json"
    load.write_text(json.dumps(rows))
    argv = ["plan", "qwen3:30b-a3b", "--nodes", str(FLEET), "--expert-load", str(load)]
    code = main([*argv, "--expert-parallel"])
    out = capsys.readouterr().out
    assert code == 0
    assert "experts owned (per block)" in out
    assert "cross-node expert transfers per token" in out


def test_moe_plan_by_default_keeps_experts_local_over_wan(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "qwen3:30b-a3b", "--nodes", str(FLEET)]) == 0
    out = capsys.readouterr().out
    assert "the layout engines run; expert-parallel" in out
    assert "block-local: every MoE block's experts run on its own stage's node" in out
