"""Atomic writes (whole files only, ordinary permissions); reads that fail as input errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stowplan.errors import InputError
from stowplan.fileio import read_json_file, read_text_file, write_text_atomic


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


def test_a_missing_file_is_one_input_error_naming_the_flag(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(InputError) as info:
        read_json_file(missing, field="--nodes")
    assert str(info.value) == f"--nodes='{missing}': cannot be read (No such file or directory)"


def test_binary_bytes_are_input_errors_not_decode_tracebacks(tmp_path: Path) -> None:
    blob = tmp_path / "blob"
    blob.write_bytes(b"\xff\xfe{")
    with pytest.raises(InputError, match=r"^PLAN='.*blob': is not UTF-8 text \("):
        read_text_file(blob, field="PLAN")
    with pytest.raises(InputError, match=r"^PLAN='.*blob': is not valid JSON \("):
        read_json_file(blob, field="PLAN")
    assert read_text_file(blob, field="PLAN", errors="replace") == "\ufffd\ufffd{"


def test_json_is_parsed_and_malformed_json_named(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text('{"a": [1, 2]}')
    bad.write_text("{")
    assert read_json_file(good, field="f") == {"a": [1, 2]}
    with pytest.raises(InputError) as info:
        read_json_file(bad, field="f")
    assert str(info.value) == (
        f"f='{bad}': is not valid JSON (Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1))"
    )
