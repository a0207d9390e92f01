"""The detached local head: loopback in a clean process, reuse across processes, stop-local.

Every process here starts from a clean environment: no ``RAY_*`` variable, a
fresh ``HOME`` and ``RAY_TMPDIR``, the cache dir of this module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stowplan.cli import main
from stowplan.cluster.head import LocalHead, head_processes, read_local_head, state_path

pytestmark = pytest.mark.ray

TAG = "stowplan_devices_5_7"
PROBE = """
import json
from stowplan.cluster import init_ray
r = init_ray()
print("RESULT " + json.dumps({"mode": r.mode.value, "address": r.address, "tag": r.device_tag}))
"""


@pytest.fixture(scope="module")
def clean_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    root = tmp_path_factory.mktemp("head")
    (root / "home").mkdir()
    (root / "raytmp").mkdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(root / "home"),
        "RAY_TMPDIR": str(root / "raytmp"),
        "STOWPLAN_CACHE_DIR": str(root / "cache"),
        "CUDA_VISIBLE_DEVICES": "7,5",
    }
    yield env
    _stop(env)


def _stop(env: dict[str, str]) -> None:
    """``stowplan cluster stop-local`` in a process with the module's environment."""
    subprocess.run(
        [sys.executable, "-m", "stowplan.cli", "cluster", "stop-local"],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )


def _init(env: dict[str, str]) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result: dict[str, str] = json.loads(line.removeprefix("RESULT "))
    return result


def test_second_process_reuses_the_head_and_stop_local_ends_it(
    clean_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _init(clean_env)
    assert first["mode"] == "started"
    assert first["tag"] == TAG
    # Loopback only, and no auth token although no RAY_* variable was set.
    assert first["address"].startswith("127.0.0.1:")
    assert not (Path(clean_env["HOME"]) / ".ray" / "auth_token").exists()

    monkeypatch.setenv("STOWPLAN_CACHE_DIR", clean_env["STOWPLAN_CACHE_DIR"])
    head = read_local_head(TAG)
    assert head is not None and head.address == first["address"]
    assert head_processes(head)

    start = time.monotonic()
    second = _init(clean_env)
    assert (second["mode"], second["address"]) == ("reused", first["address"])
    assert time.monotonic() - start < 30  # no cold start

    assert main(["cluster", "stop-local", "--devices", "5,7"]) == 0
    assert capsys.readouterr().out == (f"stopped the local Ray head {TAG} at {first['address']}\n")
    assert head_processes(head) == []
    assert not state_path(TAG).exists()
    assert not Path(head.temp_dir).exists()
    assert main(["cluster", "stop-local", "--devices", "5,7"]) == 0
    assert capsys.readouterr().out == f"no local Ray head recorded for {TAG}\n"


def test_a_stale_state_file_starts_a_new_head_without_waiting(
    clean_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("STOWPLAN_CACHE_DIR", clean_env["STOWPLAN_CACHE_DIR"])
    stale = LocalHead(
        device_tag=TAG, address="127.0.0.1:9", temp_dir=str(tmp_path / "gone"), started_at=0.0
    )
    path = state_path(TAG)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"schema": 1, "device_tag": TAG, "address": stale.address, "temp_dir": stale.temp_dir}
    path.write_text(json.dumps(doc | {"started_at": 0.0}))
    try:
        fresh = _init(clean_env)
        assert fresh["mode"] == "started"
        assert fresh["address"] != stale.address
        recorded = read_local_head(TAG)
        assert recorded is not None and recorded.address == fresh["address"]
    finally:
        _stop(clean_env)
    assert read_local_head(TAG) is None
