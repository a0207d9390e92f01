"""launch without --ray: only the demo gets the fake cluster; --plan-debug starts nothing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from stowplan.cli import main


def test_launch_of_a_real_model_without_ray_says_what_to_pass(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["launch", "llama3.1:8b"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("stowplan: error: --ray=None: is needed to launch llama3.1:8b: ")
    assert "--ray ADDRESS" in err and "--plan-debug" in err and "launch demo" in err
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()


def test_plan_debug_of_the_demo_plans_on_the_fake_nodes_without_ray(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["launch", "demo", "--plan-debug", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {a["node_id"] for a in doc["plan"]["assignments"]} <= {f"fake-{i}" for i in range(4)}
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()


def test_plan_debug_on_this_host_needs_its_passport(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STOWPLAN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert main(["launch", "llama3.1:8b", "--plan-debug"]) == 2
    err = capsys.readouterr().err
    assert "run `stowplan probe` first, or pass --nodes FLEET_FILE or --ray ADDRESS" in err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_plan_debug_without_a_fleet_plans_on_this_host_from_its_passport(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from stowplan.host.passport import Passport, save_passport
    from tests.common.host import cap, fixture_topology, matrix

    monkeypatch.setenv("STOWPLAN_CACHE_DIR", str(tmp_path))
    topo = fixture_topology("thamada_nvsim/RTX4090_smi_-a.txt")
    m = matrix(cap("gpu0", 900.0, upload_gbps=25.0), cap("cpu", 20.0))
    save_passport(Passport.create(topo, m), tmp_path / "passport.json")
    assert main(["launch", "llama3.1:8b", "--plan-debug", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [a["node_id"] for a in doc["plan"]["assignments"]] == [f"{topo.hostname}:gpu0"]
