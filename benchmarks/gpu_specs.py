"""Prediction error on the published decode runs when the GPU's figures come from its name.

Every run in ``published_decode.json`` records its GPU's datasheet bandwidth; a plan
does not have it, only the GPU's name, and takes the bandwidth from the spec lookup.
This benchmark predicts each run's tokens/s from the bandwidth the lookup gives for the
run's GPU name, before (the 17-row table of commit f4d556d, unknown names defaulting to
500 GB/s) and after (the curated table, then the GPU database), and reports the median
absolute error split by where the figure now comes from.  Predictions are first-order
(weights / bandwidth) and with the engine's shipped calibration profile.

    .venv/bin/python benchmarks/gpu_specs.py
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import types
from collections import defaultdict
from pathlib import Path
from statistics import median
from typing import Any

from stowplan.cost import DEFAULT_BANDWIDTH_GBPS
from stowplan.gpus import lookup_gpu

HERE = Path(__file__).resolve().parent
BEFORE_COMMIT = "f4d556d"
"""The last commit with the 17-row table."""


def _calibration_bench() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("calibration_bench", HERE / "calibration.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _before_lookup() -> Any:
    """``lookup_gpu`` of the table at :data:`BEFORE_COMMIT` (read from git)."""
    src = subprocess.run(
        ["git", "show", f"{BEFORE_COMMIT}:src/stowplan/gpus.py"],
        capture_output=True,
        text=True,
        check=True,
        cwd=HERE,
    ).stdout
    mod = types.ModuleType("gpus_before")
    sys.modules[mod.__name__] = mod  # dataclasses look their module up
    exec(compile(src, "gpus_before.py", "exec"), mod.__dict__)
    return mod.lookup_gpu


def lookup_name(run: dict[str, Any]) -> tuple[str, int | None]:
    """The GPU name as a tool would give it (the run's comments and GPU counts dropped),
    and the memory its comment reports, if any."""
    raw = str(run["gpu_name"])
    mem = re.search(r"memory (\d+)MB", raw)
    name = re.sub(r"\((\d+ ?GB)\)", r" \1", raw)  # "A100(80GB)" keeps its memory
    name = re.sub(r"\s*\([^)]*\)", "", name)
    name = re.sub(r"^\d+\s*[x*]\s*", "", name).strip()
    return name, int(mem.group(1)) * 2**20 if mem else None


def main() -> int:
    bench = _calibration_bench()
    before_lookup = _before_lookup()
    rows: dict[str, list[tuple[float, float, float, float]]] = defaultdict(list)
    lines = [
        "| run GPU (as looked up) | runs | datasheet GB/s | before GB/s | after GB/s | from |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    per_gpu: dict[tuple[str, float, float, float, str], int] = defaultdict(int)
    for r in bench.load_runs():
        name, memory = lookup_name(r)
        old = before_lookup(name)
        new = lookup_gpu(name, memory)
        bw_before = old.mem_bandwidth_gbps if old is not None else DEFAULT_BANDWIDTH_GBPS
        bw_after = new.mem_bandwidth_gbps if new is not None else DEFAULT_BANDWIDTH_GBPS
        group = new.origin.value if new is not None else "unknown"
        entry = bench.shipped_entry(r)
        measured = float(r["tokens_per_s"])
        errs = []
        for bw in (bw_before, bw_after):
            run = {**r, "bandwidth_gbps": bw}
            errs += [(bench.predict(run, e) - measured) / measured for e in (None, entry)]
        rows[group].append((errs[0], errs[1], errs[2], errs[3]))
        per_gpu[name, float(r["bandwidth_gbps"]), bw_before, bw_after, group] += 1
    for (name, sheet, b, a, group), n in sorted(per_gpu.items()):
        lines.append(f"| {name} | {n} | {sheet:g} | {b:g} | {a:g} | {group} |")
    print("## GPU figures by name: bandwidth looked up per published run\n")
    print("\n".join(lines))
    print("\n## Median absolute prediction error, before and after\n")
    print(
        "| GPU figure from (after) | runs | first-order before | first-order after "
        "| shipped profile before | shipped profile after |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    every: list[tuple[float, float, float, float]] = []
    for group in ("curated", "database", "unknown"):
        errs = rows.get(group, [])
        every += errs
        if errs:
            print(f"| {group} | {len(errs)} | " + _cells(errs) + " |")
    print(f"| **all** | {len(every)} | " + _cells(every) + " |")
    return 0


def _cells(errs: list[tuple[float, float, float, float]]) -> str:
    # columns: first-order before, after; shipped before, after
    order = (0, 2, 1, 3)
    return " | ".join(f"{median(abs(e[i]) for e in errs):.0%}" for i in order)


if __name__ == "__main__":
    sys.exit(main())
