"""The hardware passport: round trip, fingerprint mismatch, damaged files, concurrent writers."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from stowplan.circuits import HostTopology
from stowplan.host.passport import (
    PASSPORT_SCHEMA_VERSION,
    Passport,
    cache_dir,
    default_passport_path,
    fingerprint,
    load_passport,
    obtain_passport,
    read_passport,
    save_passport,
)
from tests.common.host import GIB, cap, fixture_topology, matrix
from tests.common.paths import ROOT


def _passport(topo: HostTopology | None = None) -> Passport:
    topo = topo or fixture_topology("thamada_nvsim/H100NVLx2_smi_-a.txt")
    m = matrix(cap("gpu0", 3000.0, upload_gbps=50.0), cap("gpu1", 2900.0, 50.0), cap("cpu", 80.0))
    return Passport.create(topo, m, ("note",))


class _Prober:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, topo: HostTopology) -> Passport:
        self.calls += 1
        return _passport(topo)


def test_cache_dir_honours_override_then_xdg(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("STOWPLAN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "stowplan"
    monkeypatch.setenv("STOWPLAN_CACHE_DIR", str(tmp_path / "mine"))
    assert default_passport_path() == tmp_path / "mine" / "passport.json"


def test_round_trip_is_equal_and_byte_identical(tmp_path: Path) -> None:
    p = _passport()
    path = save_passport(p, tmp_path / "p.json")
    back = read_passport(path)
    assert back == p
    assert back.to_json() == path.read_text()
    data = json.loads(path.read_text())
    assert data["schema_version"] == PASSPORT_SCHEMA_VERSION
    assert data["matrix"]["entries"][2]["upload_gbps"] is None  # in pool: a JSON null


def test_fingerprint_covers_hostname_uuids_driver_and_ram() -> None:
    topo = fixture_topology("thamada_nvsim/H100NVLx2_smi_-a.txt")
    base = fingerprint(topo)
    assert fingerprint(topo) == base
    assert fingerprint(replace(topo, hostname="other")) != base
    assert fingerprint(replace(topo, driver_version="999.1")) != base
    assert fingerprint(replace(topo, circuits=topo.circuits[:2])) != base  # one GPU gone
    bigger = fixture_topology("thamada_nvsim/H100NVLx2_smi_-a.txt", ram=512 * GIB)
    assert fingerprint(bigger) != base


def test_matching_passport_is_reused_and_a_mismatch_reprobes(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    topo = fixture_topology("thamada_nvsim/H100NVLx2_smi_-a.txt")
    probe = _Prober()
    first, reused = obtain_passport(current=topo, probe=probe, path=path)
    assert (reused, probe.calls) == (False, 1)
    again, reused = obtain_passport(current=topo, probe=probe, path=path)
    assert (reused, probe.calls, again) == (True, 1, first)
    moved = replace(topo, driver_version="560.1")
    fresh, reused = obtain_passport(current=moved, probe=probe, path=path)
    assert (reused, probe.calls) == (False, 2)
    assert fresh.fingerprint == fingerprint(moved) == read_passport(path).fingerprint
    _, reused = obtain_passport(current=moved, probe=probe, path=path, refresh=True)
    assert (reused, probe.calls) == (False, 3)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda text: text[: len(text) // 2], "not valid JSON"),
        (
            lambda text: text.replace('"schema_version": 1', '"schema_version": 99'),
            "schema_version=99",
        ),
        (lambda text: '{"schema_version": 1}', "invalid: fingerprint=None: must be a string"),
        (lambda text: "\xff\xfe", "not valid JSON"),
    ],
)
def test_unreadable_passport_warns_and_reprobes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: object, reason: str
) -> None:
    path = tmp_path / "p.json"
    p = _passport()
    save_passport(p, path)
    path.write_text(damage(path.read_text()))  # type: ignore[operator]
    probe = _Prober()
    with caplog.at_level(logging.WARNING, logger="stowplan.host"):
        got, reused = obtain_passport(current=p.topology, probe=probe, path=path)
    assert (reused, probe.calls) == (False, 1)
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert record.getMessage().startswith(f"hardware passport ignored, will re-probe: {path}: ")
    assert reason in record.getMessage()
    assert read_passport(path) == got


def test_missing_passport_is_none_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert load_passport(tmp_path / "absent.json") is None
    assert caplog.records == []


_WRITER = """
import sys
from dataclasses import replace
from stowplan.host.passport import read_passport, save_passport
src = read_passport(sys.argv[1])
for i in range(40):
    save_passport(replace(src, created_at=f"{sys.argv[3]}-{i}", notes=("x" * 20000,)), sys.argv[2])
"""


def test_concurrent_writers_never_leave_a_broken_file(tmp_path: Path) -> None:
    seed = save_passport(_passport(), tmp_path / "seed.json")
    target = tmp_path / "shared.json"
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(seed), str(target), f"w{k}"], cwd=ROOT)
        for k in range(3)
    ]
    reads = 0
    while any(p.poll() is None for p in procs):
        if target.exists():
            read_passport(target)  # raises when a half-written file is visible
            reads += 1
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]
    final = read_passport(target)
    assert final.created_at in {f"w{k}-39" for k in range(3)}
    assert not [f for f in tmp_path.iterdir() if f.name.endswith(".tmp")]
