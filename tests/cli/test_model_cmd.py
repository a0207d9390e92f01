"""``stowplan model inspect`` and ``stowplan plan`` with model files, through the entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stowplan.cli import main
from tests.common.paths import EXAMPLES, FIXTURES

CONFIGS = FIXTURES / "hf-configs"


def test_inspect_known_model_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "inspect", "qwen3:30b-a3b", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["total_params"] == 30_532_122_624
    assert data["active_params"] == 3_353_032_704
    assert data["experts"]["num_experts"] == 128
    assert data["experts"]["experts_per_token"] == 8
    assert data["layer_kinds"] == ["moe+gqa"] * 48
    assert data["kv_bytes_per_token"] == [2 * 4 * 128 * 2] * 48


@pytest.mark.parametrize("config", sorted(p.name for p in CONFIGS.glob("*.json")))
def test_inspect_every_fixture_config(config: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "inspect", str(CONFIGS / config)]) == 0
    out = capsys.readouterr().out
    assert "params total" in out and "KV per token" in out and "layer kinds" in out


def test_inspect_table_shows_components(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "inspect", "deepseek-v3"]) == 0
    out = capsys.readouterr().out
    assert "routed expert" in out and "shared experts" in out and "MTP layers" in out
    assert "3×dense+mla, 58×moe+mla" in out
    assert "params total   671,026,404,352 (671.03B)" in out


def test_inspect_dtype_override(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "inspect", "llama3.1:8b", "--dtype", "q4_k_m", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["dtype"] == "q4_k_m"
    assert data["weight_bytes"] < 16_060_522_496 / 3


def test_inspect_unknown_model_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "inspect", "nope:1b"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stowplan: error: MODEL='nope:1b': is not a known model")
    assert err.count("\n") == 1


def test_plan_accepts_a_config_path(capsys: pytest.CaptureFixture[str]) -> None:
    fleet = EXAMPLES / "fleets" / "mixed-consumer.yaml"
    path: Path = CONFIGS / "Mistral-7B-v0.3.json"
    assert main(["plan", str(path), "--nodes", str(fleet), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["model_name"] == "Mistral-7B-v0.3"


@pytest.mark.parametrize("command", ["plan", "residency", "launch"])
def test_model_argument_help_says_paths_are_accepted(command, capsys):
    assert main([command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "config.json, checkpoint folder" in text
    assert ".gguf file" in text
