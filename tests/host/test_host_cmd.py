"""``stowplan probe`` and ``stowplan residency`` through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stowplan.cli import main
from stowplan.host.passport import Passport, save_passport
from tests.common.host import cap, fixture_topology, matrix


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("STOWPLAN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _fixture_passport(tmp_path: Path) -> Path:
    topo = fixture_topology("thamada_nvsim/RTX4090_smi_-a.txt")
    m = matrix(cap("gpu0", 900.0, upload_gbps=25.0), cap("cpu", 20.0))
    return save_passport(Passport.create(topo, m), tmp_path / "4090.json")


def test_probe_quick_json_writes_then_reuses_the_passport(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["probe", "--quick", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["matrix"]["quick"] is True
    assert first["matrix"]["entries"][0]["compute_bytes_per_s"] > 0
    assert (cache / "passport.json").exists()
    assert main(["probe", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "cached passport" in out and first["created_at"] in out.replace("\n", "")
    assert main(["probe", "--quick", "--refresh"]) == 0
    assert "fresh probe" in capsys.readouterr().out


def test_residency_on_a_fixture_host_prints_the_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _fixture_passport(tmp_path)
    assert main(["residency", "llama3.1:70b", "--passport", str(path), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["protocol"] == "streaming"  # 25 GB/s bus beats a 20 GB/s CPU
    assert plan["primary"] == "gpu0"
    assert {e["protocol"] for e in plan["estimates"]} == {"streaming", "heterogeneous-overflow"}
    assert main(["residency", "llama3.1:8b-q4_0", "--passport", str(path)]) == 0
    out = capsys.readouterr().out
    assert "resident" in out and "s/token" in out


def test_residency_with_an_unreadable_passport_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["residency", "llama3.1:8b", "--passport", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"stowplan: error: --passport='{bad}': {bad}: not valid JSON")
    assert err.count("\n") == 1


def test_residency_of_an_unknown_model_names_the_choices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _fixture_passport(tmp_path)
    assert main(["residency", "no-such-model", "--passport", str(path)]) == 2
    assert capsys.readouterr().err.startswith(
        "stowplan: error: MODEL='no-such-model': is not a known model; known: "
    )


def test_residency_without_passport_probes_this_host_quickly(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["residency", "llama3.2:1b", "--quick", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["protocol"] == "resident"
    assert (cache / "passport.json").exists()


def test_probe_with_a_thread_count_measures_afresh_and_records_it(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["probe", "--quick", "--json"]) == 0
    capsys.readouterr()
    assert main(["probe", "--quick", "--threads", "1", "--json"]) == 0
    entry = json.loads(capsys.readouterr().out)["matrix"]["entries"][-1]
    assert entry["circuit"] == "cpu" and "1 thread" in entry["backend"]
