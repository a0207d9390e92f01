"""CPU time of one plan() on large fleets of H100 nodes and single-GPU nodes, medians after a warm-up.

python benchmarks/planning_speed.py --repeats 3            # every case but the slow ones
python benchmarks/planning_speed.py --repeats 3 --slow     # also the slow MoE cases
python benchmarks/planning_speed.py --repeats 3 --refusals # requests that cannot be met
python benchmarks/planning_speed.py --repeats 3 --growth   # time against fleet size
python benchmarks/planning_speed.py --repeats 3 --every-model  # every known model, against the goals
python benchmarks/planning_speed.py --slow --only deepseek  # only the cases naming deepseek
python benchmarks/planning_speed.py --every-model --only kimi  # every-model, those models only
python benchmarks/planning_speed.py --engine generic       # calibrated as the command line plans

CPU time is ``time.process_time`` around one ``plan()`` call; each case is planned once
as a warm-up, then ``--repeats`` times, and the median is printed as a markdown table
with a digest of the plan's JSON (or of the refusal's message): the same digest before
and after a change means the same plan.
The fleets are identical nodes: 8 × H100 SXM5 nodes (NVLink, 100 Gbit/s links) or
single-GPU nodes drawn from a fixed seed (``_clusters.cluster``, LAN links).

``--refusals`` times requests that cannot be met instead, as the command line makes
them (:func:`stowplan.plan_within_context`, which names the largest context and batch
that fit): more sequences than the memory holds at the default 8,192-token context, and
throughput targets (``objective="cost"``, the H100 nodes priced at $2/GPU-hour) beyond
what the fleet reaches.

``--engine NAME`` plans every case with that engine's calibration profile, as ``stowplan
plan --engine NAME`` does (the command line's default is ``generic``); without it the
cases use the uncalibrated first-order model.

``--growth`` times nested fleets instead — the first 64, 128, …, 1,024 of the
single-GPU nodes and 2, 4, 8, 16, 32, 64 of the H100 nodes (llama3.1:405b at one stream
and 16 sequences, deepseek-v3 at 16 sequences) — and fits the exponent ``k`` of
``ms ∝ nodes^k`` by least squares on the logarithms; it also says whether any fleet
planned slower than a larger one holding it.

``--every-model`` times every model ``stowplan models`` knows on the 1,024 single-GPU
nodes (one stream, 16 sequences) and the 64 H100 nodes (one stream, 16 and 64
sequences), one row per model, and marks each time above its goal (``*``): 100 ms on
the single-GPU nodes; on the H100 nodes 50 ms for a dense model and 150 ms for a MoE
model (its experts placed).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _clusters import cluster
from stowplan import (
    Constraints,
    ModelLayout,
    NodeDescriptor,
    Objective,
    PlanError,
    lookup,
    plan,
    plan_within_context,
)
from stowplan.calibration import resolve_calibration
from stowplan.models import known_names
from stowplan.plan import plan_to_json

H100_GB = 80


def h100_nodes(n: int, price_per_hour: float | None = None) -> list[NodeDescriptor]:
    """``n`` nodes of 8 × H100 SXM5, each with a 100 Gbit/s, 0.05 ms link."""
    return [
        NodeDescriptor(
            id=f"h{i:03d}",
            gpu_name="H100 SXM5",
            vram_bytes=8 * H100_GB * 10**9,
            num_gpus=8,
            link_mbps=100_000.0,
            link_latency_ms=0.05,
            price_per_hour=price_per_hour,
        )
        for i in range(n)
    ]


def single_gpu_nodes(n: int) -> list[NodeDescriptor]:
    return cluster(random.Random(f"issue26-{n}"), n, wan=False)


Case = tuple[str, str, str, Callable[[], list[NodeDescriptor]], Constraints, bool]


def cases() -> list[Case]:
    """(fleet, model, objective, nodes, constraints, slow)."""
    one, sixteen, sixty_four = Constraints(batch=1), Constraints(batch=16), Constraints(batch=64)
    # As the command line plans it: plan llama3.1:405b --engine sglang --batch 64.
    sglang = Constraints(batch=64, calibration=resolve_calibration("sglang"))
    return [
        ("64 × 8 H100", "llama3.1:405b", "one stream", lambda: h100_nodes(64), one, False),
        ("64 × 8 H100", "llama3.1:405b", "16 sequences", lambda: h100_nodes(64), sixteen, False),
        (
            "16 × 8 H100",
            "llama3.1:405b",
            "64 sequences, sglang",
            lambda: h100_nodes(16),
            sglang,
            False,
        ),
        ("4 × 8 H100", "llama3.1:405b", "16 sequences", lambda: h100_nodes(4), sixteen, False),
        ("16 × 8 H100", "deepseek-v3", "one stream", lambda: h100_nodes(16), one, False),
        ("64 × 8 H100", "deepseek-v3", "one stream", lambda: h100_nodes(64), one, False),
        ("16 × 8 H100", "deepseek-v3", "16 sequences", lambda: h100_nodes(16), sixteen, True),
        ("64 × 8 H100", "deepseek-v3", "16 sequences", lambda: h100_nodes(64), sixteen, True),
        ("64 × 8 H100", "llama3.1:405b", "64 sequences", lambda: h100_nodes(64), sixty_four, False),
        ("64 × 8 H100", "deepseek-v3", "64 sequences", lambda: h100_nodes(64), sixty_four, True),
        *(
            ("1,024 × 1 GPU", m, "throughput", lambda: single_gpu_nodes(1024), sixteen, False)
            for m in ("llama3.1:8b", "llama3.1:70b", "llama3.1:405b-q4_0")
        ),
        *(
            ("1,024 × 1 GPU", m, "one stream", lambda: single_gpu_nodes(1024), one, False)
            for m in ("llama3.1:70b", "llama3.1:405b-q4_0")
        ),
        ("1,024 × 1 GPU", "deepseek-v3", "one stream", lambda: single_gpu_nodes(1024), one, True),
        ("1,024 × 1 GPU", "deepseek-v3", "throughput", lambda: single_gpu_nodes(1024), sixteen,
         True),
        ("1,024 × 1 GPU", "qwen3:235b-a22b", "throughput", lambda: single_gpu_nodes(1024),
         sixteen, True),
    ]  # fmt: skip


def refusals() -> list[Case]:
    """Requests that cannot be met: (fleet, model, request, nodes, constraints, False)."""

    def sequences(batch: int) -> Constraints:
        return Constraints(batch=batch, context_tokens=8192)

    def target(rate: float) -> Constraints:
        return Constraints(batch=16, objective=Objective.COST, target_tokens_per_s=rate)

    return [
        ("16 × 8 H100", "llama3.1:405b", "4,096 × 8,192 tokens", lambda: h100_nodes(16),
         sequences(4096), False),
        ("64 × 8 H100", "llama3.1:405b", "16,384 × 8,192 tokens", lambda: h100_nodes(64),
         sequences(16384), False),
        ("1,024 × 1 GPU", "llama3.1:70b", "4,096 × 8,192 tokens",
         lambda: single_gpu_nodes(1024), sequences(4096), False),
        ("16 × 8 H100", "llama3.1:405b", "16 sequences, target 1e6 tok/s",
         lambda: h100_nodes(16, 16.0), target(1e6), False),
        ("1,024 × 1 GPU", "llama3.1:8b", "16 sequences, target 1e7 tok/s",
         lambda: single_gpu_nodes(1024), target(1e7), False),
    ]  # fmt: skip


def cpu_ms(model: ModelLayout, nodes: list[NodeDescriptor], c: Constraints) -> tuple[float, str]:
    """CPU ms of one plan() (with :func:`stowplan.plan_within_context` when the constraints
    reserve a context, as the command line plans) and its outcome: ``plan <digest>`` or
    ``refused (<error>) <digest>``."""
    t0 = time.process_time()
    try:
        result = (
            plan(model, nodes, c)
            if c.context_tokens is None
            else plan_within_context(model, nodes, c)
        )
    except PlanError as e:
        ms = (time.process_time() - t0) * 1e3
        text, outcome = str(e), f"refused ({type(e).__name__})"
    else:
        ms = (time.process_time() - t0) * 1e3
        text, outcome = plan_to_json(result), "plan"
    return ms, f"{outcome} {hashlib.sha256(text.encode()).hexdigest()[:12]}"


def growth(repeats: int, calibrated: Callable[[Constraints], Constraints]) -> None:
    """Median CPU ms on nested fleets of growing size, and the fitted exponent."""
    single = single_gpu_nodes(1024)
    one, sixteen = calibrated(Constraints(batch=1)), calibrated(Constraints(batch=16))
    series = [
        *(
            ("1 GPU", m, "16 sequences", (64, 128, 256, 512, 1024), single, sixteen)
            for m in ("llama3.1:8b", "llama3.1:70b", "llama3.1:405b-q4_0")
        ),
        ("8 × H100", "llama3.1:405b", "one stream", (2, 4, 8, 16, 32, 64), h100_nodes(64), one),
        *(
            ("8 × H100", m, "16 sequences", (2, 4, 8, 16, 32, 64), h100_nodes(64), sixteen)
            for m in ("llama3.1:405b", "deepseek-v3")
        ),
    ]
    # The process's first plans pay one-off costs (imports, caches) that one warm-up per
    # fleet size does not absorb: the first series' smallest fleet is planned a few times.
    _, first_model, _, first_sizes, first_nodes, first_c = series[0]
    for _ in range(5):
        cpu_ms(lookup(first_model), first_nodes[: first_sizes[0]], first_c)
    print("| nodes of | model | objective | CPU ms by fleet size | exponent | smaller slower |")
    print("| --- | --- | --- | --- | ---: | --- |")
    for kind, name, objective, sizes, nodes, c in series:
        model = lookup(name)
        assert model is not None, name
        ms = []
        for n in sizes:
            cpu_ms(model, nodes[:n], c)  # warm-up
            ms.append(statistics.median(cpu_ms(model, nodes[:n], c)[0] for _ in range(repeats)))
        xs, ys = [math.log(n) for n in sizes], [math.log(max(t, 1e-3)) for t in ms]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        k = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
            (x - mx) ** 2 for x in xs
        )
        # Slower on a smaller fleet by more than a quarter (the noise of shared cores).
        slower = any(a > 1.25 * b for a, b in pairwise(ms))
        shown = " / ".join(f"{n}: {t:.0f}" for n, t in zip(sizes, ms, strict=True))
        print(
            f"| {kind} | {name} | {objective} | {shown} | {k:.2f} | {'yes' if slower else 'no'} |",
            flush=True,
        )


SINGLE_GPU_GOAL_MS = 100.0
"""Goal on the 1,024 single-GPU nodes, every model and objective."""
DENSE_GOAL_MS, MOE_GOAL_MS = 50.0, 150.0
"""Goals on the 64 H100 nodes: dense models, MoE models."""


def every_model(
    repeats: int, calibrated: Callable[[Constraints], Constraints], only: str = ""
) -> None:
    """Median CPU ms of every known model (whose name holds ``only``) on both large
    fleets, each marked ``*`` above its goal, and how many are."""
    single, h100 = single_gpu_nodes(1024), h100_nodes(64)
    columns = [
        (single, 1, "1,024 × 1 GPU, one stream"),
        (single, 16, "1,024 × 1 GPU, 16 sequences"),
        (h100, 1, "64 × 8 H100, one stream"),
        (h100, 16, "64 × 8 H100, 16 sequences"),
        (h100, 64, "64 × 8 H100, 64 sequences"),
    ]
    print("| model | " + " | ".join(title for _, _, title in columns) + " |")
    print("| --- |" + " ---: |" * len(columns))
    over = total = 0
    for name in known_names():
        if only not in name:
            continue
        model = lookup(name)
        assert model is not None, name
        moe = model.experts is not None
        cells = []
        for nodes, batch, _ in columns:
            c = calibrated(Constraints(batch=batch))
            cpu_ms(model, nodes, c)  # warm-up
            median = statistics.median(cpu_ms(model, nodes, c)[0] for _ in range(repeats))
            goal = (
                SINGLE_GPU_GOAL_MS if nodes is single else (MOE_GOAL_MS if moe else DENSE_GOAL_MS)
            )
            above = median > goal
            over += above
            total += 1
            cells.append(f"{median:.0f}{' *' if above else ''}")
        label = f"{name} (MoE)" if moe else name
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)
    print(f"\n{over} of {total} above their goal (*)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--slow", action="store_true", help="also the slow MoE cases (seconds each)")
    ap.add_argument(
        "--refusals", action="store_true", help="time requests that cannot be met instead"
    )
    ap.add_argument("--growth", action="store_true", help="time nested fleets, fit the exponent")
    ap.add_argument(
        "--every-model",
        action="store_true",
        help="every known model on both large fleets, against the goals",
    )
    ap.add_argument(
        "--only", default="", help="only the cases whose fleet, model or objective holds this"
    )
    ap.add_argument(
        "--engine", default=None, help="plan with this engine's calibration (e.g. generic)"
    )
    args = ap.parse_args()
    profile = None if args.engine is None else resolve_calibration(args.engine)

    def calibrated(c: Constraints) -> Constraints:
        """``c`` with the engine's profile, unless it names one of its own."""
        return (
            c if profile is None or c.calibration is not None else replace(c, calibration=profile)
        )

    if args.growth:
        growth(args.repeats, calibrated)
        return
    if args.every_model:
        every_model(args.repeats, calibrated, args.only)
        return
    print("| fleet | model | objective | CPU ms (median) | outcome |")
    print("| --- | --- | --- | ---: | --- |")
    for fleet, name, objective, make, c, slow in refusals() if args.refusals else cases():
        if slow and not args.slow:
            continue
        if args.only and not any(args.only in field for field in (fleet, name, objective)):
            continue
        model = lookup(name)
        assert model is not None, name
        nodes = make()
        c = calibrated(c)
        cpu_ms(model, nodes, c)  # warm-up
        runs = [cpu_ms(model, nodes, c) for _ in range(args.repeats)]
        median = statistics.median(t for t, _ in runs)
        print(f"| {fleet} | {name} | {objective} | {median:.0f} | {runs[0][1]} |", flush=True)


if __name__ == "__main__":
    main()
