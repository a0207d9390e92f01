"""The pure core imports nothing that touches a device or the network."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Top-level packages and exact modules that mean device or network access.
FORBIDDEN = {
    "ray", "pynvml", "torch", "psutil", "numpy", "socket", "ssl", "http",
    "urllib.request", "requests", "grpc", "aiohttp",
}  # fmt: skip
PROBE = (
    "import sys, json; import {module}; forbidden = {forbidden!r}; "
    "print(json.dumps(sorted(m for m in sys.modules "
    "if m in forbidden or m.split('.')[0] in forbidden)))"
)


@pytest.mark.parametrize(
    "module", ["stowplan", "stowplan.planner", "stowplan.models", "stowplan.worker"]
)
def test_importing_the_core_loads_no_device_or_network_module(module: str) -> None:
    code = PROBE.format(module=module, forbidden=sorted(FORBIDDEN))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout) == []
