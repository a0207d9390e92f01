"""Atomic writes (whole files only, ordinary permissions); bounded reads that fail as input errors."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from stowplan.errors import InputError
from stowplan.files.fileio import (
    MAX_BYTES,
    FileKind,
    read_document_file,
    read_json_file,
    read_text_file,
    write_text_atomic,
)


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
    with pytest.raises(InputError, match=r"^PLAN='.*blob': is not UTF-8 text \("):
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


def test_dev_zero_is_refused_before_a_byte_is_read() -> None:
    with pytest.raises(InputError) as info:
        read_text_file("/dev/zero", field="--nodes")
    assert str(info.value) == "--nodes='/dev/zero': is a character device; give a regular file"


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "plan.json"
    os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(InputError) as info:
        read_json_file(fifo, field="PLAN")
    assert time.monotonic() - started < 1.0
    assert str(info.value) == f"PLAN='{fifo}': is a FIFO (named pipe); give a regular file"


def test_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        read_text_file(tmp_path, field="--calibration")
    assert str(info.value) == f"--calibration='{tmp_path}': is a folder; give a regular file"


def test_a_file_over_its_kinds_limit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(MAX_BYTES, FileKind.FLEET, 2 * 2**20)
    big = tmp_path / "fleet.json"
    big.write_bytes(b" " * (2 * 2**20 + 1))
    with pytest.raises(InputError) as info:
        read_json_file(big, field="file", kind=FileKind.FLEET)
    assert str(info.value) == f"file='{big}': is larger than 2 MiB, the most a fleet file may be"
    big.write_bytes(b"[" + b" " * (2 * 2**20 - 2) + b"]")
    assert read_json_file(big, field="file", kind=FileKind.FLEET) == []


def test_every_kind_states_its_limit() -> None:
    assert set(MAX_BYTES) == set(FileKind)
    assert all(2**20 <= limit <= 256 * 2**20 for limit in MAX_BYTES.values())


def test_a_symlink_to_a_regular_file_is_read_and_one_to_a_device_refused(tmp_path: Path) -> None:
    target = tmp_path / "a.json"
    target.write_text("[1]")
    (tmp_path / "link.json").symlink_to(target)
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    assert read_json_file(tmp_path / "link.json", field="f") == [1]
    with pytest.raises(InputError, match="is a character device"):
        read_json_file(tmp_path / "zero.json", field="f")


def test_yaml_and_json_documents_are_chosen_by_suffix(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("a: [1, 2]\n")
    (tmp_path / "a.json").write_text('{"a": [1, 2]}')
    assert read_document_file(tmp_path / "a.yaml", field="f") == {"a": [1, 2]}
    assert read_document_file(tmp_path / "a.json", field="f") == {"a": [1, 2]}


def test_crlf_text_reads_as_newlines(tmp_path: Path) -> None:
    path = tmp_path / "bench.md"
    path.write_bytes(b"a\r\nb\rc\n")
    assert read_text_file(path, field="f") == "a\nb\nc\n"
