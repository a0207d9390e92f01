"""One prediction per host and plan: ``launch --plan-debug`` predicts with the same
calibrated model, sequences and engine as ``plan``, and a CPU stage sees no GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stowplan.cli import main
from stowplan.cluster.realise import stage_actor_env
from stowplan.model import NodeDescriptor
from stowplan.plan import with_inputs
from tests.common.plans import make_plan

FLEET = """\
nodes:
  - {id: a, gpu_name: RTX 4090, vram_bytes: 24GiB, link_mbps: 1000}
  - {id: b, gpu_name: RTX 3090, vram_bytes: 24GiB, link_mbps: 1000}
"""


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(list(args)) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("engine", "batch"), [(None, 1), ("vllm", 2), ("llamacpp", 1), ("first-order", 4)]
)
def test_launch_plan_debug_predicts_what_plan_predicts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], engine: str | None, batch: int
) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    options = ["--nodes", str(fleet), "--batch", str(batch), "--json"]
    options += [] if engine is None else ["--engine", engine]
    launched = _json(capsys, "launch", "llama3.1:8b", "--plan-debug", *options)["plan"]
    planned = _json(capsys, "plan", "llama3.1:8b", *options)
    ours, theirs = launched["rationale"]["prediction"], planned["rationale"]["prediction"]
    assert ours["batch"] == batch
    assert ours["time_per_token_s"] == theirs["time_per_token_s"] > 0
    assert ours["stage_time_s"] == theirs["stage_time_s"]
    assert ours["calibration"] == theirs["calibration"]
    if engine == "first-order":
        assert ours["calibration"] is None
    else:
        assert ours["calibration"].startswith(f"engine {engine or 'generic'}")
    assert [a["block_range"] for a in launched["assignments"]] == [
        a["block_range"] for a in planned["assignments"]
    ]


def test_a_cpu_stage_gets_no_gpu_ids() -> None:
    plan = make_plan([20, 12], ["gpu0", "host-cpu"])
    nodes = [
        NodeDescriptor(id="gpu0", gpu_name="RTX 4090", vram_bytes="24GiB"),
        NodeDescriptor(
            id="host-cpu", gpu_name="AMD EPYC", vram_bytes="64GiB", labels={"kind": "cpu"}
        ),
    ]
    envs = stage_actor_env(with_inputs(plan, model_source=None, nodes=nodes))
    assert envs[0]["CUDA_VISIBLE_DEVICES"] == "0"
    assert envs[1]["CUDA_VISIBLE_DEVICES"] == ""
    # Without the nodes' descriptors nothing says the stage is the CPU: GPU 0, as before.
    assert stage_actor_env(plan)[1]["CUDA_VISIBLE_DEVICES"] == "0"
