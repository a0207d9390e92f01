"""The suite runs in a session home: what the CLI writes lands there, never in the
user's home (see tests/conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stowplan.calibration import shipped_calibration
from stowplan.calibration.store import user_calibration_path, write_calibration
from stowplan.cli import main
from stowplan.host.passport import cache_dir, default_passport_path


def _state(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder``: (size, mtime in ns); empty when it is absent."""
    if not folder.is_dir():
        return {}
    return {
        str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()
    }


def test_home_and_caches_point_into_the_session_home() -> None:
    home = Path(os.environ["STOWPLAN_TEST_SESSION_HOME"])
    assert Path.home() == home
    assert Path(os.environ["STOWPLAN_TEST_REAL_HOME"]) != home
    assert cache_dir().is_relative_to(home)
    assert user_calibration_path("llamacpp").is_relative_to(home)


def test_a_probe_and_a_calibration_land_in_the_session_home_not_the_users(
    capsys: pytest.CaptureFixture[str],
) -> None:
    real = Path(os.environ["STOWPLAN_TEST_REAL_HOME"])
    watched = [real / ".stowplan", real / ".cache" / "stowplan"]
    before = [_state(f) for f in watched]
    assert main(["probe", "--quick", "--json"]) == 0
    capsys.readouterr()
    cal_path = user_calibration_path("llamacpp")
    write_calibration(shipped_calibration("llamacpp"), cal_path)
    home = Path(os.environ["STOWPLAN_TEST_SESSION_HOME"])
    assert default_passport_path().is_relative_to(home) and default_passport_path().is_file()
    assert cal_path.is_relative_to(home) and cal_path.is_file()
    assert [_state(f) for f in watched] == before
