"""The passport file's edges: killed writers' temp files cleaned up, modes without umask
changes, and every corrupt cache a warning and a new probe (never a raw error)."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from stowplan.circuits import HostTopology
from stowplan.files.fileio import STALE_TEMP_S, remove_stale_temps, write_text_atomic
from stowplan.host import route
from stowplan.host.passport import Passport, load_passport, obtain_passport, save_passport
from tests.common.host import cap, fixture_topology, matrix
from tests.common.paths import ROOT


def _passport() -> Passport:
    topo = fixture_topology("thamada_nvsim/RTX4090_smi_-a.txt")
    return Passport.create(topo, matrix(cap("gpu0", 900.0, upload_gbps=25.0), cap("cpu", 20.0)))


class _Prober:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, topo: HostTopology) -> Passport:
        self.calls += 1
        return Passport.create(topo, _passport().matrix)


def _dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)


def test_a_killed_writers_temp_file_is_removed_when_the_cache_is_next_used(
    tmp_path: Path,
) -> None:
    path = tmp_path / "passport.json"
    p = _passport()
    save_passport(p, path)
    left = tmp_path / f".passport.json.{_dead_pid()}.0a1b2c.tmp"
    left.write_text('{"half": ')
    probe = _Prober()
    obtain_passport(current=p.topology, probe=probe, path=path)
    assert probe.calls == 0 and not left.exists()


def test_only_this_targets_stale_temp_files_are_removed(tmp_path: Path) -> None:
    target = tmp_path / "passport.json"
    dead = _dead_pid()
    stale = tmp_path / f".passport.json.{dead}.ab.tmp"
    live = tmp_path / f".passport.json.{os.getppid()}.cd.tmp"  # a running writer's
    old_live = tmp_path / f".passport.json.{os.getppid()}.ef.tmp"
    other = tmp_path / f".plan.json.{dead}.ab.tmp"
    kept = [tmp_path / "passport.json.bak", tmp_path / f"passport.json.{dead}.ab.tmp", live, other]
    for f in [stale, old_live, *kept]:
        f.write_text("x")
    old = time.time() - STALE_TEMP_S - 60
    os.utime(old_live, (old, old))
    assert remove_stale_temps(target) == 2
    assert not stale.exists() and not old_live.exists()
    assert all(f.exists() for f in kept)


_KILLED_WRITER = """
import os, signal, sys
from stowplan.files import fileio
real = os.replace
def die(*args):
    os.kill(os.getpid(), signal.SIGKILL)
os.replace = die
fileio.write_text_atomic(sys.argv[1], "new")
"""


def test_a_writer_killed_before_its_rename_leaves_the_old_file_and_a_temp_the_next_write_removes(
    tmp_path: Path,
) -> None:
    target = tmp_path / "passport.json"
    target.write_text("old")
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_WRITER, str(target)], cwd=ROOT, check=False
    )
    assert proc.returncode == -signal.SIGKILL
    leftovers = [f for f in tmp_path.iterdir() if f.name.endswith(".tmp")]
    assert target.read_text() == "old" and len(leftovers) == 1
    write_text_atomic(target, "newer")
    assert sorted(f.name for f in tmp_path.iterdir()) == ["passport.json"]
    assert target.read_text() == "newer"


def test_files_are_created_with_their_mode_and_the_umask_is_never_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    umask = os.umask(0o022)
    os.umask(umask)

    def refuse(_mask: int) -> int:
        raise AssertionError("os.umask was called")

    monkeypatch.setattr(os, "umask", refuse)
    write_text_atomic(tmp_path / "new.json", "{}")
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o666 & ~umask
    write_text_atomic(tmp_path / "secret.json", "{}", mode=0o600)
    assert stat.S_IMODE((tmp_path / "secret.json").stat().st_mode) == 0o600
    (tmp_path / "kept.json").write_text("x")
    (tmp_path / "kept.json").chmod(0o640)
    write_text_atomic(tmp_path / "kept.json", "y")
    assert stat.S_IMODE((tmp_path / "kept.json").stat().st_mode) == 0o640
    save_passport(_passport(), tmp_path / "passport.json")
    assert stat.S_IMODE((tmp_path / "passport.json").stat().st_mode) == 0o666 & ~umask


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


CORRUPT: list[tuple[str, Callable[[Path], None]]] = [
    ("nested 100,000 deep", lambda p: p.write_text("[" * 100_000 + "]" * 100_000)),
    ("a 5000-digit number", lambda p: p.write_text('{"schema_version": ' + "9" * 5000 + "}")),
    ("a number beyond a float", lambda p: p.write_text('{"schema_version": 1e400}')),
    ("a FIFO", _fifo),
    ("a link to /dev/zero", _dev_zero),
    ("binary", lambda p: p.write_bytes(b"\x00\xff" * 100)),
    ("empty", lambda p: p.write_text("")),
    ("truncated", lambda p: p.write_text(p.read_text()[: len(p.read_text()) // 2])),
    ("a list", lambda p: p.write_text("[1, 2]")),
    ("a string version", lambda p: p.write_text('{"schema_version": "1"}')),
    ("too large", lambda p: p.write_bytes(b" " * (4 * 2**20 + 1))),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("damage", [d for _, d in CORRUPT], ids=[n for n, _ in CORRUPT])
def test_every_corrupt_cache_is_a_warning_and_a_new_probe(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    damage: Callable[[Path], None],
) -> None:
    path = tmp_path / "passport.json"
    p = _passport()
    save_passport(p, path)
    damage(path)
    monkeypatch.setenv(route.ROUTE_ENV, "1")
    with caplog.at_level(logging.WARNING, logger="stowplan.host"):
        assert load_passport(path) is None
        assert route.route_employment_from_passport(10**9, path=path) is None
        probe = _Prober()
        got, reused = obtain_passport(current=p.topology, probe=probe, path=path)
    assert (reused, probe.calls) == (False, 1)
    assert got.fingerprint == p.fingerprint
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3 and all(str(path) in w for w in warnings)
    assert load_passport(path) == got  # the new probe replaced the corrupt file


def test_an_in_pool_upload_rate_is_a_json_null_and_the_older_inf_string_still_reads(
    tmp_path: Path,
) -> None:
    path = save_passport(_passport(), tmp_path / "passport.json")
    text = path.read_text()
    assert '"inf"' not in text and "Infinity" not in text
    data = json.loads(text)
    entry = next(e for e in data["matrix"]["entries"] if e["circuit"] == "cpu")
    assert entry["upload_gbps"] is None
    entry["upload_gbps"] = "inf"
    path.write_text(json.dumps(data))
    assert load_passport(path) == _passport().__class__.from_dict(data)
    assert math.isinf(load_passport(path).matrix.entries[1].upload_gbps)  # type: ignore[union-attr]


def test_a_host_without_gpus_is_described_in_words(capsys: pytest.CaptureFixture[str]) -> None:
    from stowplan.cli.host_cmd import _render_passport
    from tests.common.host import host

    cpu_only = Passport.create(host(), matrix(cap("cpu", 20.0)))
    _render_passport(cpu_only, reused=False)
    first = capsys.readouterr().out.splitlines()[0]
    assert ": 1 circuit, " in first and "no GPU found" in first and "via none" not in first
