"""What the pure core must not load, and the probe that lists what an import loaded."""

from __future__ import annotations

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
