"""Certificate gaps of plans on multi-GPU nodes, calibrated as the command line plans them.

python benchmarks/group_certificates.py                 # the generic calibration
python benchmarks/group_certificates.py --first-order   # the uncalibrated model

Each case is one ``plan()`` on identical 8 × H100 SXM5 nodes (100 Gbit/s, 0.05 ms),
as ``stowplan plan MODEL --nodes FLEET --batch U`` plans it; the table gives the plan's
tokens/s, the certificate's bound and its gap, and the CPU time.  Under a calibration
every tensor-parallel block pays its measured collective cost, so a plan of few large
groups can be far from the least slowest stage over every stage count (many small
groups): the gap shows how well each stage count's own slowest stage is bounded.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from planning_speed import h100_nodes
from stowplan import Constraints, lookup, plan
from stowplan.calibration import resolve_calibration

CASES = [
    (4, "llama3.1:70b", 8),
    (4, "llama3.1:70b", 64),
    (4, "llama3.1:405b", 8),
    (4, "llama3.1:405b", 64),
    (4, "mixtral:8x7b", 8),
    (4, "mixtral:8x7b", 64),
    (4, "qwen3:235b-a22b", 8),
    (4, "qwen3:235b-a22b", 64),
    (16, "deepseek-v3", 16),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--first-order", action="store_true", help="plan without a calibration")
    args = ap.parse_args()
    cal = None if args.first_order else resolve_calibration("generic")
    print("| nodes | model | sequences | tokens/s | bound | gap | CPU ms |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for n, name, batch in CASES:
        model = lookup(name)
        assert model is not None, name
        start = time.process_time()
        got = plan(model, h100_nodes(n), Constraints(batch=batch, calibration=cal))
        ms = (time.process_time() - start) * 1000
        cert = got.rationale.certificate
        assert cert is not None
        print(
            f"| {n} × 8 | {name} | {batch} | {cert.value:,.1f} | {cert.bound:,.1f} "
            f"| {cert.gap:.2%} | {ms:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
