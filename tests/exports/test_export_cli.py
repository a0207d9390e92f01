"""``stowplan export`` through the real entry point."""

from __future__ import annotations

import json

from stowplan.cli import main
from stowplan.plan import plan_to_json
from tests.common.plans import make_plan


def test_export_json_round_trips_the_block_counts(tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_text(plan_to_json(make_plan([12, 20])))
    for engine in ("vllm", "sglang", "llamacpp", "accelerate"):
        assert main(["export", str(path), "--to", engine, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["engine"] == engine
        assert out["block_counts"] == [12, 20]
    assert main(["export", str(path), "--to", "vllm"]) == 0
    text = capsys.readouterr().out
    # vLLM serves the Hugging Face id the model table gives llama3.1:8b.
    assert (
        "VLLM_PP_LAYER_PARTITION=12,20 vllm serve meta-llama/Llama-3.1-8B "
        "--pipeline-parallel-size 2"
    ) in text


def test_export_errors_are_one_line(tmp_path, capsys):
    assert main(["export", str(tmp_path / "missing.json"), "--to", "vllm"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stowplan: error: PLAN=") and err.count("\n") == 1
