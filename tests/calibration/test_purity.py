"""The calibration layer is pure: importing it loads no numpy, device or network module."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.common.purity import FORBIDDEN, PROBE


def test_importing_calibration_loads_no_device_or_network_module() -> None:
    code = PROBE.format(module="stowplan.calibration", forbidden=sorted(FORBIDDEN))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout) == []
