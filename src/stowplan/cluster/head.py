"""The local Ray head shared by every process with the same device set.

:func:`~stowplan.cluster.bootstrap.init_ray` without ``RAY_ADDRESS`` starts a
*detached* head with Ray's own ``ray start --head``: bound to 127.0.0.1, no
dashboard, a Ray temp dir of its own, and the custom resource
``stowplan_devices_<ids>`` (the device tag).  The head outlives the process
that started it; its address is recorded in a small state file keyed by the
tag, ``<cache dir>/ray-local/<tag>.json`` (the cache dir of
:func:`stowplan.host.passport.cache_dir`: ``$STOWPLAN_CACHE_DIR``, else
``$XDG_CACHE_HOME/stowplan``, else ``~/.cache/stowplan``), written atomically.

A later process with the same device set reads the file and attaches when the
recorded head answers on its port within a bounded time and still carries the
tag; a stale file (the head is gone, or the port now belongs to something
else) is replaced by a fresh head, never waited on.  Starting and attaching
hold a lock file next to the state file, so two processes starting at once
share one head.

:func:`stop_local_head` (``stowplan cluster stop-local``) ends the head's
processes — found by the temp dir on their command lines, so no other Ray on
the machine is touched — and removes the state file and the temp dir.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from stowplan.cluster.ray_runtime import LOCAL_START_ENV, OBJECT_STORE_BYTES
from stowplan.errors import HeadStartError
from stowplan.files.fileio import FileKind, read_json_file, write_text_atomic
from stowplan.host.passport import cache_dir

__all__ = [
    "HeadStartError",
    "LocalHead",
    "discard_local_head",
    "head_alive",
    "head_lock",
    "head_processes",
    "read_local_head",
    "start_local_head",
    "state_path",
    "stop_local_head",
]

log = logging.getLogger("stowplan.cluster")

STATE_DIR = "ray-local"
STATE_SCHEMA = 1
CONNECT_TIMEOUT_S = 2.0
"""How long a recorded head may take to accept a TCP connection before it is stale."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalHead:
    """One detached local head, as recorded in its state file."""

    device_tag: str
    address: str
    """GCS address, ``127.0.0.1:<port>``."""
    temp_dir: str
    """``RAY_TMPDIR`` of the head: every one of its processes names it."""
    started_at: float
    """Unix time of the start, seconds."""

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])


def state_path(tag: str) -> Path:
    """``<cache dir>/ray-local/<tag>.json``."""
    return cache_dir() / STATE_DIR / f"{tag}.json"


def read_local_head(tag: str) -> LocalHead | None:
    """The recorded head of ``tag``, or None when there is no readable state file."""
    path = state_path(tag)
    try:
        data = read_json_file(path, field="state", kind=FileKind.TEXT)
        if data.get("schema") != STATE_SCHEMA or data.get("device_tag") != tag:
            return None
        return LocalHead(
            device_tag=str(data["device_tag"]),
            address=str(data["address"]),
            temp_dir=str(data["temp_dir"]),
            started_at=float(data["started_at"]),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # InputError: a ValueError
        return None


def _write_state(head: LocalHead) -> None:
    doc = {"schema": STATE_SCHEMA, **asdict(head)}
    write_text_atomic(state_path(head.device_tag), json.dumps(doc, indent=2, sort_keys=True))


@contextlib.contextmanager
def head_lock(tag: str) -> Iterator[None]:
    """Hold ``<tag>.lock`` next to the state file (one starter at a time per tag)."""
    path = state_path(tag).with_suffix(".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def head_alive(head: LocalHead, timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    """Whether the head's GCS port accepts a connection on 127.0.0.1 within ``timeout_s``
    and some process of the head is still running."""
    import socket  # lazily: importing stowplan.cluster loads no network module

    if not head_processes(head):
        return False
    try:
        with socket.create_connection(("127.0.0.1", head.port), timeout=timeout_s):
            return True
    except OSError:
        return False


def head_processes(head: LocalHead) -> list[int]:
    """Ids of the running processes whose command line names the head's temp dir."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if any(head.temp_dir in part for part in cmdline):
            found.append(int(proc.info["pid"]))
    return sorted(found)


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ray_executable() -> str:
    sibling = Path(sys.executable).with_name("ray")
    return str(sibling) if sibling.exists() else (shutil.which("ray") or "ray")


def start_local_head(
    tag: str,
    *,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    object_store_memory: int | None = None,
    timeout_s: float = 180.0,
) -> LocalHead:
    """Start a detached ``ray start --head`` on 127.0.0.1 carrying ``tag`` and record it.

    Raises :class:`HeadStartError` with the end of Ray's output when it fails.
    """
    temp_dir = tempfile.mkdtemp(prefix="stowplan-head-")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    for key, value in LOCAL_START_ENV.items():
        env.setdefault(key, value)
    env["RAY_TMPDIR"] = temp_dir
    args = [
        _ray_executable(),
        "start",
        "--head",
        "--node-ip-address=127.0.0.1",
        f"--port={port}",
        "--include-dashboard=false",
        f"--dashboard-port={_free_port()}",
        "--disable-usage-stats",
        f"--resources={json.dumps({tag: 1.0})}",
        f"--object-store-memory={object_store_memory or OBJECT_STORE_BYTES}",
    ]
    if num_cpus is not None:
        args.append(f"--num-cpus={num_cpus}")
    if num_gpus is not None:
        args.append(f"--num-gpus={num_gpus}")
    head = LocalHead(
        device_tag=tag, address=f"127.0.0.1:{port}", temp_dir=temp_dir, started_at=time.time()
    )
    try:
        done = subprocess.run(
            args,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:
        _stop_processes(head)
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise HeadStartError(f"ray start --head did not finish within {timeout_s:g} s") from None
    if done.returncode != 0:
        _stop_processes(head)
        shutil.rmtree(temp_dir, ignore_errors=True)
        tail = (done.stdout + done.stderr).strip()[-800:]
        raise HeadStartError(f"ray start --head failed (exit {done.returncode}): {tail}")
    _write_state(head)
    log.info("started a detached local Ray head %s at %s", tag, head.address)
    return head


def _stop_processes(head: LocalHead, grace_s: float = 5.0) -> list[int]:
    """Terminate (then kill) the head's processes; return their ids."""
    import psutil

    procs = []
    for pid in head_processes(head):
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    return [p.pid for p in procs]


def stop_local_head(tag: str) -> LocalHead | None:
    """Stop the recorded head of ``tag`` and remove its state file and temp dir.

    Returns the head that was recorded (None when there was none).  Processes
    are found by the head's temp dir, so no other Ray on the machine is touched.
    """
    with head_lock(tag):
        head = read_local_head(tag)
        if head is None:
            state_path(tag).unlink(missing_ok=True)
            return None
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():  # this process may be a driver of it
            with contextlib.suppress(Exception):
                if ray.get_runtime_context().gcs_address == head.address:
                    ray.shutdown()
        stopped = discard_local_head(head)
    log.info("stopped the local Ray head %s (%d processes)", tag, len(stopped))
    return head


def discard_local_head(head: LocalHead) -> list[int]:
    """Remove what is left of a head: its processes, state file and temp dir.

    Returns the ids of the processes it stopped.
    """
    stopped = _stop_processes(head)
    state_path(head.device_tag).unlink(missing_ok=True)
    shutil.rmtree(head.temp_dir, ignore_errors=True)
    return stopped
