"""Per-stage tensor parallel inside nodes × pipeline across them, against an exact referee.

python benchmarks/tensor_parallel.py            # the README tables (≈ 4 min on 2 shared cores)
python benchmarks/tensor_parallel.py --quick    # smoke run (≈ 30 s)

The referee lives in ``tests/common/tp_referee.py`` (written from the first-order cost
model's formula alone; it calls neither stowplan's planner nor its cost model); this
script draws the fleets and prints the tables.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from stowplan import (
    Constraints,
    NodeDescriptor,
    PlanError,
    lookup,
    plan,
)
from stowplan.models.hf import from_hf_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.common.tp_referee import (
    NVLINK,
    PCIE,
    Kind,
    Objective,
    Outcome,
    Spec,
    allowed,
    broken_certificate,
    describe,
    descriptor,
    disagreement,
    draw,
    groups_of,
    layout_of,
    run_instance,
    score,
    solve_by_sequences,
)


def pct(values: Sequence[float], q: float) -> float:
    """The q-quantile by the nearest-rank rule (p10 of 200: the 20th smallest)."""
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def quality(instances: int, max_blocks: int) -> list[Outcome]:
    out: list[Outcome] = []
    for i in range(instances):
        for objective in ("latency", "throughput"):
            attempt = 0
            while True:  # redraw a fleet too small for its model
                got = run_instance(draw(i * 1000 + attempt, max_blocks), objective)
                if got is not None:
                    out.append(got)
                    break
                attempt += 1
    return out


def quality_table(outcomes: list[Outcome]) -> list[str]:
    subset = [o for o in outcomes if o.whole_legal]
    k = sum(1 for o in subset if o.objective == "latency")
    rows = [
        "| objective | layouts | median / optimum | p10 / optimum | min / optimum | no plan "
        f"| median, p10 on the {k} fleets whose nodes' GPU counts are legal degrees |",
        "|---|---|---|---|---|---|---|",
    ]
    names = {
        "stowplan": "stowplan (per-stage tp)",
        "adjacent": "a node's stages adjacent around the cycle (best such)",
        "whole": "every node one tp group (best such)",
        "uniform": "one tp for all stages (best such)",
    }
    for objective in ("latency", "throughput"):
        mine = [o for o in outcomes if o.objective == objective]
        for key, label in names.items():
            r = [o.ratios[key] for o in mine]
            none = sum(1 for x in r if x == 0.0)
            sub = [o.ratios[key] for o in mine if o.whole_legal] or [math.nan]
            rows.append(
                f"| {objective} | {label} | {statistics.median(r):.3f} | {pct(r, 0.1):.3f} | "
                f"{min(r):.3f} | {none} of {len(r)} | "
                f"{statistics.median(sub):.3f}, {pct(sub, 0.1):.3f} |"
            )
    return rows


# -- part 2: the HexGen case study ----------------------------------------------------------
LLAMA2_70B = {
    "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
    "vocab_size": 32000, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}  # fmt: skip
"""meta-llama/Llama-2-70b-hf's config.json (the known-model table has Llama 3.1 only)."""

CASE_KINDS = [
    (Kind("RTX A6000", 48, 768, 154.8, 31.5, 12), 4),
    (Kind("RTX A5000", 24, 768, 111.1, 31.5, 12), 2),
    (Kind("RTX A4000", 16, 448, 76.7, 31.5, 12), 2),
]
CASE_LINK_MBPS, CASE_LATENCY_MS = 1000.0, 0.1
CASE_WORKLOADS = [
    ("latency", 1, 4096),
    ("latency", 1, 65536),
    ("throughput", 16, 4096),
    ("throughput", 32, 4096),
]
"""(objective, batch, context tokens) of the case study."""


def _planned(
    spec: Spec, objective: Objective, c: Constraints, optimum: float
) -> tuple[float | None, str]:
    """stowplan's plan under ``c`` scored by the referee (None: no plan), and its layout
    (with whatever the referee finds wrong: legality, prediction, a certificate beaten by
    ``optimum``, the referee's least cycle under ``c``'s rule, or by the least cycle on
    the plan's own GPU groups)."""
    try:
        p = plan(spec.model, spec.descriptors, c)
    except PlanError:
        return None, "no plan"
    layout, bad = layout_of(spec, p)
    s = score(spec, layout)
    gap = disagreement(spec, p.rationale.prediction, s)
    note = ("(" + "; ".join(bad) + ") ") if bad else ""
    note += f"(prediction differs by {gap:.1e}) " if gap > 1e-9 else ""
    beaten = broken_certificate(p, objective, optimum, spec.batch)
    note += f"(certificate: {beaten}) " if beaten else ""
    if not bad and not beaten:
        degrees, counts = groups_of(spec, layout)
        own = solve_by_sequences(spec, degrees, counts=counts)
        cert = own and broken_certificate(p, objective, own[0], spec.batch)
        if cert:
            note += f"(certificate: {cert}, on the plan's own GPU groups) "
    return (None if bad else s.cycle_s), note + describe(spec, layout)


def case_study() -> tuple[list[str], list[str]]:
    """The case-study table, and the layouts behind it (one line per workload)."""
    model = lookup("llama2:70b") or from_hf_config(LLAMA2_70B, name="llama2:70b")
    nodes = [
        descriptor(k, k.name.split()[-1].lower(), g, CASE_LINK_MBPS, CASE_LATENCY_MS)
        for k, g in CASE_KINDS
    ]
    degrees = sorted({t for n in nodes for t in range(1, n.num_gpus + 1)})
    spec0 = Spec(model, nodes, 1, None)
    degrees = [t for t in degrees if any(t in spec0.degrees(d) for d in range(len(nodes)))]
    rows = [
        "| workload | optimum (referee) | stowplan | "
        + " | ".join(f"best uniform tp {t}" for t in degrees)
        + " | best whole nodes |",
        "|---|---|---|" + "---|" * len(degrees) + "---|",
    ]
    details = []
    for objective, batch_size, ctx in CASE_WORKLOADS:
        spec = Spec(model, nodes, batch_size, ctx)
        c = Constraints(batch=batch_size, context_tokens=ctx)
        opt = solve_by_sequences(spec, allowed(spec, "free"))
        assert opt is not None

        ours, ours_text = _planned(spec, objective, c, opt[0])

        def shown(
            value: float | None,
            objective: str = objective,
            best: float = opt[0],
            b: int = batch_size,
            more: str = "",
        ) -> str:
            if value is None:
                return "does not fit"
            if objective == "latency":
                return f"{value * 1e3:.1f} ms ({best / value:.3f}{more})"
            return f"{b / value:.1f} tok/s ({best / value:.3f}{more})"

        cells = [shown(opt[0]), shown(ours)]
        for t in degrees:
            got = solve_by_sequences(spec, allowed(spec, "uniform", t))
            fixed, fixed_text = _planned(
                spec, objective, replace(c, tensor_parallel=t), got[0] if got else math.inf
            )
            if "(" in fixed_text:  # a broken rule, prediction or certificate
                details.append(f"{objective}, batch {batch_size}, tp {t}: stowplan {fixed_text}")
            theirs = "no plan" if fixed is None else f"{opt[0] / fixed:.3f}"
            cells.append(shown(got[0], more=f"; stowplan {theirs}") if got else shown(None))
        whole = solve_by_sequences(spec, allowed(spec, "whole"))
        cells.append(shown(whole[0] if whole else None))
        label = f"{objective}, batch {batch_size}, context {ctx}"
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
        details.append(f"{label}: optimum {describe(spec, opt[1])}; stowplan {ours_text}")
    return rows, details


# -- part 3: planning time -----------------------------------------------------------------
def big_fleet(rng: random.Random, n: int) -> list[NodeDescriptor]:
    kinds = rng.sample([*NVLINK, *PCIE[:3]], k=4)
    return [
        descriptor(
            rng.choice(kinds),
            f"n{i:04d}",
            8,
            round(rng.uniform(10_000, 100_000), 1),
            round(rng.uniform(0.05, 0.5), 3),
        )
        for i in range(n)
    ]


def planning_time(sizes: Sequence[int], repeats: int) -> list[str]:
    """plan() wall and CPU time per fleet size and objective (fleet r of size n seeded by
    (n, objective, r), so no plan reuses what another one of the same fleet remembered)."""
    model = lookup("llama3.1:70b")
    assert model is not None
    plan(model, big_fleet(random.Random("warm-up"), 8), Constraints())  # imports
    rows = [
        f"| nodes × GPUs | objective | plan() median ms ({repeats} fleet{'s' * (repeats != 1)}) "
        "| max ms "
        "| median CPU ms |",
        "|---|---|---|---|---|",
    ]
    for n in sizes:
        for objective, batch in (("latency", 1), ("throughput", 16)):
            wall, cpu = [], []
            for r in range(repeats):
                nodes = big_fleet(random.Random(f"{n}-{objective}-{r}"), n)
                t0, c0 = time.perf_counter(), time.process_time()
                plan(model, nodes, Constraints(batch=batch))
                wall.append((time.perf_counter() - t0) * 1e3)
                cpu.append((time.process_time() - c0) * 1e3)
            rows.append(
                f"| {n} × 8 | {objective} | {statistics.median(wall):.1f} | {max(wall):.1f} "
                f"| {statistics.median(cpu):.1f} |"
            )
    return rows


# -- main -----------------------------------------------------------------------------------
def report(outcomes: list[Outcome], worst: int) -> list[str]:
    lines = []
    gaps = [o for o in outcomes if o.disagreement is not None and o.disagreement > 1e-9]
    lines.append(
        f"referee vs stowplan's own prediction: {len(gaps)} of {len(outcomes)} plans differ "
        f"by more than 1e-9 (relative)"
        + (f"; largest {max(o.disagreement or 0 for o in gaps):.2e}" if gaps else "")
    )
    for o in gaps[:worst]:
        lines.append(f"  seed {o.seed} {o.objective}: {o.disagreement:.2e}: {o.ours}")
    again = [o for o in outcomes if o.repredicted is not None and o.repredicted > 1e-9]
    lines.append(
        f"referee vs stowplan.cost.predict(model, nodes, constraints, plan): {len(again)} of "
        f"{len(outcomes)} plans differ by more than 1e-9"
        + (f"; largest {max(o.repredicted or 0 for o in again):.2e}" if again else "")
    )
    for o in again[:worst]:
        lines.append(f"  seed {o.seed} {o.objective}: {o.repredicted:.2e}: {o.ours}")
    certs = [o for o in outcomes if o.certificate]
    lines.append(
        f"certificates whose bound the referee's optimum beats: {len(certs)} of {len(outcomes)} "
        f"({sum(1 for o in certs if o.certificate and o.certificate.startswith('optimum'))} "
        "claim an exact optimum)"
    )
    for o in certs[:worst]:
        lines.append(f"  seed {o.seed} {o.objective}: {o.certificate}")
    own = [o for o in outcomes if o.own_certificate]
    lines.append(
        f"... beaten even on the GPU groups the plan itself uses: {len(own)} of {len(outcomes)}"
    )
    for o in own[:worst]:
        lines.append(f"  seed {o.seed} {o.objective}: {o.own_certificate}; stowplan {o.ours}")
    for objective in ("latency", "throughput"):
        r = [o.own_groups for o in outcomes if o.objective == objective and o.own_groups]
        lines.append(
            f"{objective}: stowplan / the referee's optimum on the plan's own GPU groups: "
            f"below 1 on {sum(1 for x in r if x < 1 - 1e-9)} of {len(r)}, min {min(r, default=1):.3f}"
        )
    bad = [o for o in outcomes if o.illegal]
    lines.append(f"illegal or missing plans: {len(bad)} ({len({o.seed for o in bad})} fleets)")
    if bad:
        lines[-1] += (
            ", though the referee found a legal pipeline for every one (with a node's stages "
            f"adjacent around the cycle: {sum(1 for o in bad if o.ratios['adjacent'] > 0)})"
        )
    for o in bad[:worst]:
        lines.append(f"  seed {o.seed} {o.objective}: {'; '.join(o.illegal)}: {o.ours}")
    for objective in ("latency", "throughput"):
        mine = [o for o in outcomes if o.objective == objective and not o.illegal]
        below = sorted(
            (o for o in mine if o.ratios["stowplan"] < 1 - 1e-9), key=lambda o: o.ratios["stowplan"]
        )
        inside = sum(1 for o in below if o.ratios["stowplan"] < o.ratios["adjacent"] - 1e-9)
        lines.append(
            f"{objective}: legal plans below the optimum: {len(below)} of {len(mine)} "
            f"({inside} below the best pipeline with a node's stages adjacent around the cycle, "
            f"{len(below) - inside} at or above it: the optimum interleaves nodes)"
        )
        for o in below[:worst]:
            claim = (
                "no certificate"
                if o.claimed_gap is None
                else f"certificate gap {o.claimed_gap:.4f}"
            )
            lines.append(
                f"  seed {o.seed}: {o.ratios['stowplan']:.4f} of the optimum ({claim}); {o.text}\n"
                f"    stowplan: {o.ours}\n    optimum:  {o.best}"
            )
    return lines


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--instances", type=int, default=200, help="random fleets per objective")
    ap.add_argument("--max-blocks", type=int, default=8)
    ap.add_argument("--sizes", type=int, nargs="+", default=[8, 64, 256])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--worst", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smoke run: 10 fleets, 8 and 64 nodes")
    ap.add_argument("--skip", nargs="*", default=[], choices=["quality", "case", "speed"])
    args = ap.parse_args(argv)
    if args.quick:
        args.instances, args.sizes, args.repeats = 10, [8, 64], 1
    t0 = time.perf_counter()
    if "quality" not in args.skip:
        outcomes = quality(args.instances, args.max_blocks)
        out(
            f"\n{args.instances} random fleets per objective (2–3 nodes of 1–8 GPUs, NVLink or "
            f"PCIe; 3–{args.max_blocks} blocks) against the referee's optimum:\n"
        )
        for row in quality_table(outcomes):
            out(row)
        out("")
        for line in report(outcomes, args.worst):
            out(line)
        ref = [o.seconds["referee"] for o in outcomes]
        pl = [o.seconds["plan"] for o in outcomes]
        out(
            f"referee (free rule) median {statistics.median(ref) * 1e3:.1f} ms, max "
            f"{max(ref):.2f} s; plan() median {statistics.median(pl) * 1e3:.1f} ms, max "
            f"{max(pl) * 1e3:.0f} ms"
        )
    if "case" not in args.skip:
        out(
            f"\nLlama-2-70B (bf16) on 4 × RTX A6000 + 2 × RTX A5000 + 2 × RTX A4000 (one node "
            f"per kind, PCIe 4 inside: 31.5 GB/s, 12 µs; {CASE_LINK_MBPS / 1000:g} Gbit/s and "
            f"{CASE_LATENCY_MS:g} ms between nodes); value (value / optimum; for a uniform "
            "degree t also stowplan's plan with tensor_parallel=t / optimum):\n"
        )
        rows, details = case_study()
        for row in rows:
            out(row)
        out("")
        for line in details:
            out(line)
    if "speed" not in args.skip:
        out("\nplan() time, llama3.1:70b, nodes of 8 GPUs (4 kinds per fleet):\n")
        for row in planning_time(args.sizes, args.repeats):
            out(row)
    out(f"\n(total {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
