"""How fast hostile inputs are refused (/dev/zero, a FIFO, an alias bomb, deep JSON, huge
numbers) and large valid ones read (a 2 MB expert plan).

python benchmarks/bounded_reads.py --repeats 5

Library rows call the reader in this process (median wall time of the refusal);
CLI rows run the installed ``stowplan`` console script in a fresh process
(median wall time including interpreter start-up) and report its exit code
and the number of lines it wrote on stderr. Each input must be refused with
an InputError (exit 2, one line); a row whose input is accepted or raises
anything else says so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from stowplan.errors import InputError
from stowplan.files.fleets import load_nodes
from stowplan.files.safeload import parse_json, parse_yaml
from stowplan.plan import plan_from_json

STOWPLAN = str(Path(sys.executable).with_name("stowplan"))


def _alias_bomb() -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    return "\n".join(lines) + "\n"


def _two_megabyte_plan() -> str:
    """A valid 2-stage plan of 64 blocks whose stages own every one of 4096 experts per block:
    stage 0 as expert masks, stage 1 as the objects earlier plans wrote (> 2 MB in all)."""
    masks = [[b, "f" * 1024] for b in range(64)]
    objects = [{"block": b, "expert": e} for b in range(24) for e in range(3000)]
    stages = [
        {
            "stage": i,
            "node_id": f"n{i}",
            "block_range": [32 * i, 32 * (i + 1)],
            "owns_embed": i == 0,
            "owns_head": i == 1,
            "estimated_vram_bytes": 1,
            "owned_experts": owned,
        }
        for i, owned in enumerate((masks, objects))
    ]
    doc = {
        "schema_version": 1,
        "topology": {"kind": "PipelineWithExperts", "num_stages": 2, "experts_per_layer": 4096},
        "assignments": stages,
        "rationale": {"strategy": "bench"},
        "num_blocks": 64,
    }
    return json.dumps(doc)


def _library(
    label: str, call: Callable[[], object], repeats: int, accepted: str = "ACCEPTED"
) -> str:
    times, outcome = [], ""
    for _ in range(repeats):
        t0 = time.perf_counter()
        try:
            call()
            outcome = accepted
        except InputError as exc:
            outcome = f"InputError: {exc.rule[:48]}"
        except Exception as exc:  # reported, not hidden: the row then shows the failure
            outcome = f"{type(exc).__name__} (not refused as input)"
        times.append((time.perf_counter() - t0) * 1e3)
    return f"| library | {label} | {statistics.median(times):.2f} | {outcome} |"


def _cli(label: str, argv: list[str], repeats: int) -> str:
    times, outcome = [], ""
    for _ in range(repeats):
        t0 = time.perf_counter()
        proc = subprocess.run(
            [STOWPLAN, *argv], capture_output=True, text=True, timeout=60, check=False
        )
        times.append((time.perf_counter() - t0) * 1e3)
        outcome = f"exit {proc.returncode}, {proc.stderr.count(chr(10))} stderr line(s)"
    return f"| CLI | {label} | {statistics.median(times):.0f} | {outcome} |"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fifo = Path(tmp) / "fleet.yaml"
        os.mkfifo(fifo)
        bomb = _alias_bomb()
        deep = "[" * 1_000_000
        digits = "[" + "9" * 5000 + "]"
        big_plan = _two_megabyte_plan()
        rows = [
            _library("load_nodes('/dev/zero')", lambda: load_nodes("/dev/zero"), args.repeats),
            _library("load_nodes(FIFO)", lambda: load_nodes(fifo), args.repeats),
            _library(
                f"YAML alias bomb ({len(bomb)} bytes)",
                lambda: parse_yaml(bomb, field="f", source="bomb"),
                args.repeats,
            ),
            _library(
                "JSON nested 1,000,000 deep",
                lambda: parse_json(deep, field="f", source="deep"),
                args.repeats,
            ),
            _library(
                "JSON 5,000-digit integer",
                lambda: parse_json(digits, field="f", source="digits"),
                args.repeats,
            ),
            _library(
                f"expert plan of {len(big_plan) / 1e6:.1f} MB (loads, not refused)",
                lambda: plan_from_json(big_plan),
                args.repeats,
                accepted="loaded",
            ),
            _cli(
                "plan llama3.1:8b --nodes /dev/zero",
                ["plan", "llama3.1:8b", "--nodes", "/dev/zero"],
                args.repeats,
            ),
            _cli("stage-env FIFO", ["stage-env", str(fifo)], args.repeats),
            _cli(
                "residency llama3.1:8b --passport /dev/zero",
                ["residency", "llama3.1:8b", "--passport", "/dev/zero"],
                args.repeats,
            ),
        ]
    print("| where | input | median ms | outcome |")
    print("|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
