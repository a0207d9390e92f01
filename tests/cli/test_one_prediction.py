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


def _host_passport(tmp_path: Path, cache: Path) -> Path:
    """A probed RTX 4090 host (GPU 900 GB/s, CPU 20 GB/s), saved where ``launch`` reads it."""
    from stowplan.host.passport import Passport, save_passport
    from tests.common.host import cap, fixture_topology, matrix

    topo = fixture_topology("thamada_nvsim/RTX4090_smi_-a.txt")
    passport = Passport.create(topo, matrix(cap("gpu0", 900.0, 25.0), cap("cpu", 20.0)))
    cache.mkdir(parents=True, exist_ok=True)
    save_passport(passport, cache / "passport.json")
    return save_passport(passport, tmp_path / "host.json")


@pytest.mark.parametrize(
    ("model", "engine"),
    [("llama3.1:8b", None), ("llama3.1:8b-q4_0", "llamacpp"), ("gpt-oss:20b", "vllm")],
)
def test_residency_launch_and_plan_predict_one_time_per_token_on_one_host(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    model: str,
    engine: str | None,
) -> None:
    from stowplan.host.node import node_from_passport
    from stowplan.host.passport import read_passport

    cache = tmp_path / "cache"
    monkeypatch.setenv("STOWPLAN_CACHE_DIR", str(cache))
    path = _host_passport(tmp_path, cache)
    node = node_from_passport(read_passport(path))
    fleet = tmp_path / "host.yaml"
    fleet.write_text(
        f"nodes:\n  - {{id: '{node.id}', gpu_name: '{node.gpu_name}', "
        f"vram_bytes: {node.vram_bytes}, mem_bandwidth_gbps: {node.mem_bandwidth_gbps}, "
        f"labels: {{measured: bandwidth}}}}\n"
    )
    shared = ["--context", "4096"] + ([] if engine is None else ["--engine", engine])
    resident = _json(capsys, "residency", model, "--passport", str(path), *shared, "--json")
    launched = _json(capsys, "launch", model, "--plan-debug", "--json", *shared)["plan"]
    planned = _json(capsys, "plan", model, "--nodes", str(fleet), "--json", *shared)
    assert resident["protocol"] == "resident"
    assert [a["node_id"] for a in launched["assignments"]] == [node.id]
    t_launch = launched["rationale"]["prediction"]["time_per_token_s"]
    t_plan = planned["rationale"]["prediction"]["time_per_token_s"]
    assert resident["predicted_s_per_token"] == pytest.approx(t_launch, rel=1e-12)
    assert t_launch == pytest.approx(t_plan, rel=1e-12)
    # Never faster than reading the bytes a token reads at the measured rate; with the
    # default profile, dense bf16 decode stays memory-bound (the f32 GEMV rate taken as the
    # FLOPs made it compute-bound at exactly twice the memory time).
    first_order = resident["read_bytes"] / 900e9
    assert first_order <= t_launch
    if engine is None:
        assert t_launch < 1.5 * first_order
