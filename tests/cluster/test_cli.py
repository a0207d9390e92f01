"""`stowplan validate` and `stowplan cluster resources` through the real entry point."""

from __future__ import annotations

import json

import pytest

from stowplan.cli import main
from tests.common.paths import FIXTURES

FLEET_ENV = {
    "STOWPLAN_FLEET_ROLE": "inference",
    "STOWPLAN_NUM_NODES": "2",
    "STOWPLAN_GPUS_PER_NODE": "8",
}


@pytest.fixture
def fleet_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("STOWPLAN_PG_STRATEGY", "STOWPLAN_SEGMENT_SIZE", "SLURM_TOPOLOGY_ADDR"):
        monkeypatch.delenv(key, raising=False)
    for key, value in FLEET_ENV.items():
        monkeypatch.setenv(key, value)


def test_validate_catches_the_seed_example_before_any_group(
    fleet_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", "--tp", "4", "--dp", "2", "--ep", "6"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "stowplan: error: ep=6: must be a multiple of tp=4 (6 % 4 = 2); nearest valid: 4, 8\n"
    )


def test_validate_reports_a_unified_group(
    fleet_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", "--tp", "4", "--pp", "4", "--ep", "8"]) == 0
    assert capsys.readouterr().out == (
        "ok: tp×pp×dp = 4×4×1 = 16 of 16 GPUs (inference, 2 nodes × 8), ep=8\n"
        "  replica tp×pp = 16 GPUs > 8 GPUs per node: one unified PACK group per replica "
        "over 2 nodes\n"
    )


def test_validate_flags_override_the_environment(
    fleet_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["validate", "--tp", "8", "--dp", "4", "--num-nodes", "4", "--role", "trainer", "--json"]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["world_size"] == doc["fleet_gpus"] == 32
    assert doc["strategy"] == "SPREAD"
    assert doc["unified_group"] is False


def test_validate_suggests_a_dp_that_then_passes(
    fleet_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    base = [
        "validate",
        "--role",
        "trainer",
        "--num-nodes",
        "2",
        "--gpus-per-node",
        "8",
        "--tp",
        "3",
    ]
    assert main([*base, "--dp", "6"]) == 2
    assert capsys.readouterr().err.endswith("; the largest dp that fits is 4\n")
    assert main([*base, "--dp", "4"]) == 0
    assert capsys.readouterr().out.startswith("ok: tp×pp×dp = 3×1×4 = 12 of 16 GPUs")


def test_validate_accepts_tp_8_for_an_mla_model(
    fleet_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", "--tp", "8", "--model", "deepseek-v3"]) == 0
    assert capsys.readouterr().out.startswith("ok: tp×pp×dp = 8×1×1 = 8 of 16 GPUs")


def test_validate_checks_the_model_heads(
    fleet_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", "--tp", "3", "--model", "llama3.1:8b"]) == 2
    assert (
        "tensor_parallel=3: must divide num_attention_heads=32 of llama3.1:8b"
        in capsys.readouterr().err
    )


def test_validate_without_a_fleet_names_the_flag_and_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("STOWPLAN_FLEET_ROLE", raising=False)
    assert main(["validate", "--tp", "2"]) == 2
    assert capsys.readouterr().err == (
        "stowplan: error: --role=None: is required: pass --role trainer, inference or "
        "sandbox or set $STOWPLAN_FLEET_ROLE\n"
    )


def test_validate_counts_nodes_with_num_nodes_and_reads_a_fleet_file_with_nodes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key in ("STOWPLAN_FLEET_ROLE", "STOWPLAN_NUM_NODES", "STOWPLAN_GPUS_PER_NODE"):
        monkeypatch.delenv(key, raising=False)
    base = ["validate", "--role", "inference", "--tp", "2", "--json"]
    assert main([*base, "--num-nodes", "2", "--gpus-per-node", "8"]) == 0
    assert json.loads(capsys.readouterr().out)["fleet_gpus"] == 16
    assert main([*base, "--nodes", "examples/fleets/mixed-consumer.yaml"]) == 0
    assert json.loads(capsys.readouterr().out)["fleet_gpus"] == 6
    assert main([*base, "--nodes", "2", "--gpus-per-node", "8"]) == 0  # the old spelling
    out = capsys.readouterr()
    assert json.loads(out.out)["fleet_gpus"] == 16
    assert out.err == (
        "stowplan: note: validate --nodes N is deprecated; use --num-nodes N "
        "(--nodes takes a fleet file, as in plan)\n"
    )
    assert main([*base, "--gpus-per-node", "8"]) == 2
    assert capsys.readouterr().err == (
        "stowplan: error: --num-nodes=None: is required: pass --num-nodes N (or --nodes "
        "FLEET_FILE) or set $STOWPLAN_NUM_NODES\n"
    )


def test_resources_prints_what_ray_start_needs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SLURM_TOPOLOGY_ADDR", "sw2.node9")
    snippets = FIXTURES / "nvidia-smi" / "issue_excerpts" / "gb200_fabric_q_snippets.txt"
    text = snippets.read_text()
    path = tmp_path / "q.txt"  # type: ignore[operator]
    path.write_text(text[text.index("## 1)") : text.index("## 2)")])
    assert main(["cluster", "resources", "--nvidia-smi", str(path)]) == 0
    assert capsys.readouterr().out == (
        'ray start --resources=\'{"nvlink_domain_dc6e40c4-d722-4357-9ba6-5291dd461278_2": 1, '
        '"topo_rank": 20010}\'\n'
        "# nvlink domain: dc6e40c4-d722-4357-9ba6-5291dd461278_2\n"
        "# topo_rank 20010 from SLURM_TOPOLOGY_ADDR\n"
    )


def test_resources_of_an_h100_box_has_no_domain(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SLURM_TOPOLOGY_ADDR", raising=False)
    monkeypatch.setenv("SLURM_PROCID", "2")
    path = FIXTURES / "nvidia-smi" / "thamada_nvsim" / "H100SXMx8_smi_-a.txt"
    assert main(["cluster", "resources", "--nvidia-smi", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"topo_rank": 3}


def test_topology_needs_an_address(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main(["cluster", "topology"]) == 2
    assert capsys.readouterr().err == (
        "stowplan: error: --address=None: give a Ray cluster address or set RAY_ADDRESS\n"
    )
