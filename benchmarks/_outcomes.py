"""The command line of the benchmarks that write one checkout's outcomes and compare two:
``--seed S --cases N --out FILE`` or ``--compare A B``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path


def run(
    cases: Callable[[int, int], object],
    compare: Callable[[str, str], None],
    *,
    seed: int,
    count: int,
) -> None:
    """Parse the command line: write ``cases(seed, count)`` as JSON, or ``compare`` two
    such files."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=seed)
    ap.add_argument("--cases", type=int, default=count)
    ap.add_argument("--out", help="write the outcomes here (JSON)")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two outputs")
    args = ap.parse_args()
    if args.compare:
        compare(*args.compare)
        return
    if not args.out:
        raise SystemExit("--out FILE or --compare A B")
    Path(args.out).write_text(json.dumps(cases(args.seed, args.cases)))


def loaded(a_path: str, b_path: str) -> tuple[list, list]:
    """The outcomes two runs wrote, checked to hold the same number of draws."""
    a, b = json.loads(Path(a_path).read_text()), json.loads(Path(b_path).read_text())
    if len(a) != len(b):
        raise SystemExit("the two files hold different draws (--seed and --cases)")
    return a, b
