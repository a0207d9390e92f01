"""Atomic writes: whole files only, with ordinary permissions."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stowplan.fileio import write_text_atomic


def test_new_file_gets_the_umask_mode_and_no_temp_file_is_left(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "a" / "plan.json", "{}\n")
    finally:
        os.umask(old)
    target = tmp_path / "a" / "plan.json"
    assert target.read_text() == "{}\n"
    assert target.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in target.parent.iterdir()] == ["plan.json"]


def test_existing_file_keeps_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    target.write_text("old")
    target.chmod(0o640)
    write_text_atomic(target, "new")
    assert target.read_text() == "new" and target.stat().st_mode & 0o777 == 0o640


def test_a_failed_write_leaves_the_old_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "plan.json"
    target.write_text("old")

    with pytest.raises(TypeError):
        write_text_atomic(target, 42)  # type: ignore[arg-type]
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]
