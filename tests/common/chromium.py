"""Headless Chromium for the HTML report tests (skipped where it is not installed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

__all__ = ["CHROMIUM", "FLAGS", "chromium"]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--enable-logging=stderr",
    "--v=0",
    "--window-size=1366,1900",
]


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run Chromium with ``args`` and a fresh profile under ``tmp_path``."""
    assert CHROMIUM is not None
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
