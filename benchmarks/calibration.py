"""Calibrated vs first-order decode-speed predictions.

Part 1 (published): every batch-1 decode speed in ``published_decode.json``
(llama.cpp ``tg128`` on single and multi-GPU hosts, each with its source) is
predicted by the first-order model (weights / peak bandwidth + nothing else)
and by a calibrated model fitted *without that run* (leave-one-out: the
device's other runs when it has some, else every other device's runs).  The
table gives the median absolute error per GPU family.

Serving engines (vLLM, TensorRT-LLM) get their own table: each run against the
first-order model, the engine's shipped profile, and a leave-one-out fit over the
engine's other runs where there are any.

Part 2 (this CPU): a numpy decode of block-shaped matrices.  The CPU's
figures are fitted from single-stage runs of one width; the prediction is
then checked against held-out runs (another width, pipelined splits with
hops).  Part 3 ranks candidate plans (stage counts and splits) by predicted
time per token and compares with the measured order.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/calibration.py
    .venv/bin/python benchmarks/calibration.py --write-profiles   # regenerate data/llamacpp.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from dataclasses import replace
from functools import cache
from pathlib import Path
from statistics import median
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from stowplan.calibration import (
    Calibration,
    Engine,
    Measurement,
    calibration_to_json,
    fit_device,
    shipped_calibration,
    stage_time_s,
)
from stowplan.calibration.profile import DeviceCalibration, Figure, Provenance

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "src" / "stowplan" / "calibration" / "data"

Run = dict[str, Any]

# Engines whose shipped profile is fitted from the published runs, in table order.
FITTED_ENGINES = (
    Engine.LLAMACPP,
    Engine.VLLM,
    Engine.TRTLLM,
    Engine.SGLANG,
    Engine.GENERIC,
    Engine.TRANSFORMERS,
)


def load_all_runs() -> list[Run]:
    """Every published run, the excluded ones (an ``excluded`` reason) included."""
    runs: list[Run] = json.loads((HERE / "published_decode.json").read_text())["runs"]
    return runs


def load_runs() -> list[Run]:
    """The runs the profiles are fitted to and the tables score."""
    return [r for r in load_all_runs() if not r.get("excluded")]


def tensor_parallel(r: Run) -> int:
    """GPUs every block of the run is split over (1: one GPU, or a layer split)."""
    return int(r.get("tensor_parallel", 1))


def read_bytes(r: Run) -> int:
    """Bytes one decoded token reads: the weights less the input embedding table, of which
    a step reads one row (what the cost model counts: blocks and head)."""
    return int(r["read_bytes"]) - int(r.get("embed_bytes", 0))


def _fit(runs: list[Run], prior: DeviceCalibration, device: str, source: str) -> DeviceCalibration:
    """Fit one device entry; runs on different devices are normalised to their own bandwidth.

    Every run is on a GPU, so no fraction exceeds 1.  The ``*`` entry pools families,
    so its collective cost is never fitted: a tensor-parallel family against other
    families' single-GPU runs would credit it with every difference between them.
    """
    # Each run's bytes are rescaled to a common 1000 GB/s per GPU so one fit spans devices.
    ms = [
        Measurement(
            tokens_per_s=float(r["tokens_per_s"]),
            read_bytes=round(read_bytes(r) * 1000.0 / float(r["bandwidth_gbps"])),
            num_blocks=int(r["num_blocks"]),
            dtype=str(r["dtype"]),
            hops=int(r["hops"]),
            tensor_parallel=tensor_parallel(r),
            label=f"{r['family']} {r['model']} {r['dtype']}",
        )
        for r in runs
    ]
    return fit_device(
        ms,
        bandwidth_gbps=1000.0,
        prior=prior,
        device=device,
        source=source,
        max_fraction=1.0,
        fit_collective=False if device == "*" else None,
    ).device


def predict(r: Run, entry: DeviceCalibration | None) -> float:
    """Predicted tokens/s of run ``r`` (first-order when ``entry`` is None)."""
    tp = tensor_parallel(r)
    t = stage_time_s(
        read_bytes=read_bytes(r),
        params=0,
        num_blocks=int(r["num_blocks"]),
        bandwidth_gbps=float(r["bandwidth_gbps"]) * tp,
        tflops=0.0,
        dtype=str(r["dtype"]),
        hops=int(r["hops"]),
        tensor_parallel=tp,
        device=entry,
    )
    return 1.0 / t


def _label(r: Run) -> str:
    tp, hops = tensor_parallel(r), int(r["hops"])
    layout = f" TP{tp}" if tp > 1 else (f" {hops + 1} stages" if hops else "")
    return f"{r['dtype']}{layout} {float(r['tokens_per_s']):.2f} t/s"


def _sources(runs: list[Run]) -> str:
    srcs = sorted({str(r["source"]).split(" (")[0].split(",")[0] for r in runs})
    rows = "; ".join(_label(r) for r in runs)
    return f"fitted to {len(runs)} published batch-1 decode runs ({rows}) from: " + " | ".join(srcs)


def _base_prior() -> DeviceCalibration:
    """The table defaults every fit starts from (the generic profile's ``*`` entry)."""
    return (
        shipped_calibration(Engine.GENERIC).for_device("*")
        or shipped_calibration(Engine.GENERIC).devices[-1]
    )


_NOISE = {"apple", "tesla", "sxm"}


def family_match(family: str) -> tuple[str, ...]:
    """Tokens a GPU name must hold to match a family key: ``a100-80gb`` → a100, 80gb.

    ``sxm`` is dropped (nvidia-smi calls an H100 SXM ``NVIDIA H100 80GB HBM3``); ``pcie``
    is kept, so a PCIe card's entry needs the word and wins over the SXM one when it has it.
    """
    return tuple(w for w in family.split("-") if w not in _NOISE)


def build_profile(engine: Engine, runs: list[Run], description: str) -> Calibration:
    """A shipped profile: one entry per GPU family, plus ``*`` fitted over all the engine's
    runs (the generic profile, and an engine without runs, keep the table ``*``: it is
    every fit's prior)."""
    base = _base_prior()
    mine = [r for r in runs if r["engine"] == engine.value]
    fit_star = mine and engine is not Engine.GENERIC
    star = _fit(mine, base, "*", _sources(mine)) if fit_star else base
    by_family: dict[str, list[Run]] = defaultdict(list)
    for r in mine:
        by_family[str(r["family"])].append(r)
    entries = [
        replace(_fit(rs, star, fam, _sources(rs)), match=family_match(fam))
        for fam, rs in sorted(by_family.items())
    ]
    return Calibration(
        name=f"{engine.value}-default",
        engine=engine,
        description=description,
        devices=(*entries, star),
    )


DESCRIPTIONS = {
    Engine.LLAMACPP: "llama.cpp (CUDA, Vulkan, Metal) batch-1 decode, fitted per GPU family to "
    "public llama-bench results (benchmarks/published_decode.json lists every run).",
    Engine.VLLM: "vLLM, one request at a time, fitted per GPU family to published decode "
    "speeds (benchmarks/published_decode.json lists every run); '*' (any other GPU) is fitted "
    "over all of them.",
    Engine.TRTLLM: "TensorRT-LLM, one request at a time, fitted per GPU family to published "
    "decode speeds (benchmarks/published_decode.json lists every run); '*' (any other GPU) is "
    "fitted over all of them.",
    Engine.SGLANG: "SGLang, one request at a time, fitted per GPU family to published decode "
    "speeds (benchmarks/published_decode.json lists every run); '*' (any other GPU) is fitted "
    "over all of them.",
    Engine.GENERIC: "Engine-agnostic: '*' holds NVIDIA's cost-model defaults (use when the "
    "engine is unknown); family entries are fitted to published compiled-PyTorch decode "
    "speeds (gpt-fast, torchao; benchmarks/published_decode.json).",
    Engine.TRANSFORMERS: "Hugging Face transformers eager generate (what an Accelerate "
    "device_map runs), fitted per GPU family to published decode speeds "
    "(benchmarks/published_decode.json); '*' is fitted over all of them.",
}


Scored = list[tuple[Run, float, float]]
"""(run, first-order error, calibrated leave-one-out error) per run: :func:`leave_one_out`."""


def leave_one_out(runs: list[Run]) -> Scored:
    """(run, first-order error, calibrated error) with the calibration fitted without the run.

    The run's engine and family other runs give the entry when there are any; its prior
    (and the entry when there are none) is the engine's other families' fit, or the table
    defaults when the engine has no other family.
    """
    base = _base_prior()
    out = []
    for i, r in enumerate(runs):
        rest = [o for j, o in enumerate(runs) if j != i and o["engine"] == r["engine"]]
        same = [o for o in rest if o["family"] == r["family"]]
        pool = [o for o in rest if o["family"] != r["family"]]
        star = _fit(pool, base, "*", "loo") if pool and r["engine"] != "generic" else base
        entry = _fit(same, star, str(r["family"]), "loo") if same else star
        measured = float(r["tokens_per_s"])
        first, cal = predict(r, None), predict(r, entry)
        out.append((r, (first - measured) / measured, (cal - measured) / measured))
    return out


def _layout_key(r: Run) -> str:
    if tensor_parallel(r) > 1:
        return "tensor parallel"
    return "multi-GPU layers" if int(r["num_gpus"]) > 1 else "single GPU"


@cache
def _shipped_profile(engine: Engine) -> Calibration:
    return shipped_calibration(engine)


def shipped_entry(r: Run) -> DeviceCalibration | None:
    """The entry the shipped profile of the run's engine has for its GPU."""
    return _shipped_profile(Engine(str(r["engine"]))).for_device(str(r["gpu_name"]))


def published_table(scored: Scored) -> list[str]:
    """Median errors per engine, GPU family and layout, and overall: first-order, the
    calibration fitted without the run (``scored``, from :func:`leave_one_out`), and the
    shipped profile."""
    rows: dict[tuple[str, str, str], list[tuple[float, float, float]]] = defaultdict(list)
    for r, first, cal in scored:
        measured = float(r["tokens_per_s"])
        ship = (predict(r, shipped_entry(r)) - measured) / measured
        rows[str(r["engine"]), str(r["family"]), _layout_key(r)].append((first, cal, ship))
    out = [
        "| engine | GPU family | layout | runs | first-order median abs error "
        "| calibrated, leave-one-out | shipped profile |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]

    def cells(errs: list[tuple[float, float, float]]) -> str:
        meds = (median(abs(e[i]) for e in errs) for i in range(3))
        return f"{len(errs)} | " + " | ".join(f"{m:.0%}" for m in meds)

    order = {e.value: i for i, e in enumerate(FITTED_ENGINES)}
    by_engine: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for key in sorted(rows, key=lambda k: (order.get(k[0], 99), k[1], k[2])):
        by_engine[key[0]] += rows[key]
        out.append(f"| {key[0]} | {key[1]} | {key[2]} | {cells(rows[key])} |")
    every: list[tuple[float, float, float]] = []
    for engine in sorted(by_engine, key=lambda e: order.get(e, 99)):
        every += by_engine[engine]
        out.append(f"| **{engine}** | all | | {cells(by_engine[engine])} |")
    out.append(f"| **all** | | | {cells(every)} |")
    return out


def excluded_table(all_runs: list[Run]) -> list[str]:
    """Runs kept in the data but out of the fits, with why and how far off they are."""
    rows = [
        "| engine | GPU | model, dtype | measured tok/s | first-order | shipped profile | why left out |",
        "| --- | --- | --- | ---: | ---: | ---: | --- |",
    ]
    for r in all_runs:
        if not r.get("excluded"):
            continue
        measured = float(r["tokens_per_s"])
        first = predict(r, None)
        table = predict(r, shipped_entry(r))
        rows.append(
            f"| {r['engine']} | {r['family']} | {r['model']}, {r['dtype']} | {measured:.1f} "
            f"| {(first - measured) / measured:+.0%} | {(table - measured) / measured:+.0%} "
            f"| {r['excluded']} |"
        )
    return rows


def runs_table(scored: Scored) -> list[str]:
    """Every non-llama.cpp run: measured, first-order, shipped profile, leave-one-out fit
    (``scored``, from :func:`leave_one_out`)."""
    rows = [
        "| engine | GPU | layout | model, dtype | measured tok/s | first-order | error "
        "| shipped profile | error | leave-one-out | error |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r, first_err, cal_err in scored:
        if r["engine"] == "llamacpp":
            continue
        measured = float(r["tokens_per_s"])
        table = predict(r, shipped_entry(r))
        tp = tensor_parallel(r)
        layout = (
            f"TP{tp}"
            if tp > 1
            else ("1 GPU" if int(r["num_gpus"]) == 1 else f"{r['num_gpus']} GPUs")
        )
        rows.append(
            f"| {r['engine']} | {r['family']} | {layout} | {r['model']}, {r['dtype']} "
            f"| {measured:.1f} | {measured * (1 + first_err):.1f} | {first_err:+.0%} "
            f"| {table:.1f} | {(table - measured) / measured:+.0%} "
            f"| {measured * (1 + cal_err):.1f} | {cal_err:+.0%} |"
        )
    return rows


def cpu_section(quick: bool) -> list[str]:
    from stowplan.calibration.numpy_decode import (
        block_bytes,
        make_blocks,
        measure_read_bandwidth_gbps,
        run_pipeline,
        time_decode,
    )

    hidden = 256
    # The bandwidth probe reads an array the size of the model's weights (f32 + f64 copies).
    bw = measure_read_bandwidth_gbps(8 * block_bytes(hidden, 12), repeats=30)
    prior = shipped_calibration(Engine.GENERIC).devices[0]
    # Two emulated devices: float32 blocks (fast) and float64 blocks (twice the bytes).
    devices = {
        "f32": (make_blocks(8, hidden), 4),
        "f64": (make_blocks(8, hidden, seed=1, dtype="float64"), 8),
    }
    # Step 1: fit each device from its own single-stage runs (2, 4, 8 blocks). Every
    # configuration is measured in round-robin rounds and keeps its fastest step: the CPU
    # is shared, interference only ever adds time, and rounds spread it over all configs.
    rounds = 3 if quick else 9
    singles = {(name, n): float("inf") for name in devices for n in (2, 4, 8)}
    plans = (7, 6, 4, 2, 1)
    piped = dict.fromkeys(plans, float("inf"))
    f32_blocks, f64_blocks = devices["f32"][0], devices["f64"][0]
    same_device = float("inf")  # two stages, both on the f32 device: what a hop costs here
    for _ in range(rounds):
        for name, n in singles:
            blocks = devices[name][0]
            singles[name, n] = min(singles[name, n], time_decode(blocks[:n], tokens=4, repeats=1))
        run = run_pipeline(f32_blocks, (0, 4, 8), tokens=6, microbatches=1)
        same_device = min(same_device, run.time_per_token_s)
        for k in plans:
            run = run_pipeline(f32_blocks[:k] + f64_blocks[k:], (0, k, 8), tokens=6, microbatches=1)
            piped[k] = min(piped[k], run.time_per_token_s)
    fitted = {}
    for name, (_, itemsize) in devices.items():
        runs = [
            Measurement(
                tokens_per_s=1 / singles[name, n],
                read_bytes=n * block_bytes(hidden, itemsize),
                num_blocks=n,
            )
            for n in (2, 4, 8)
        ]
        fitted[name] = fit_device(runs, bandwidth_gbps=bw, prior=prior, device=name).device
    # Step 1b: the hop. Single-stage runs cannot show it; a two-stage run on one device
    # differs from them only by its two hops (stage 0 -> 1, and the token back to 0).
    half = stage_time_s(
        read_bytes=4 * block_bytes(hidden, 4),
        params=0,
        num_blocks=4,
        bandwidth_gbps=bw,
        tflops=0.0,
        hops=0,
        device=fitted["f32"],
    )
    hop = Figure(
        value=max((same_device - 2 * half) / 2, 0.0),
        provenance=Provenance.FITTED,
        source="two-stage run with both stages on the f32 device",
    )
    fitted = {name: replace(d, hop_overhead_s=hop) for name, d in fitted.items()}
    lines = [
        f"CPU read bandwidth (numpy sum over the weights' size, best of 30): {bw:.1f} GB/s; "
        f"hidden {hidden}; "
        + "; ".join(
            f"{n}: fraction {d.fraction(None).value:.2f}, block "
            f"{d.block_overhead_s.value * 1e6:.0f} us"
            for n, d in fitted.items()
        )
        + f"; hop {hop.value * 1e6:.0f} us (fitted from a same-device two-stage run)",
        "",
        "| plan: blocks on f32 / f64 device | measured tok/s | first-order | error "
        "| calibrated | error |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    # Step 2: held-out two-stage pipelines over both devices.
    measured, predicted = {}, {}
    errors_first, errors_cal = [], []
    for k in plans:
        meas = 1 / piped[k]

        def t(f32: DeviceCalibration | None, f64: DeviceCalibration | None, k: int = k) -> float:
            return stage_time_s(
                read_bytes=k * block_bytes(hidden, 4),
                params=0,
                num_blocks=k,
                bandwidth_gbps=bw,
                tflops=0.0,
                hops=1,
                device=f32,
            ) + stage_time_s(
                read_bytes=(8 - k) * block_bytes(hidden, 8),
                params=0,
                num_blocks=8 - k,
                bandwidth_gbps=bw,
                tflops=0.0,
                hops=1,
                device=f64,
            )

        first, cal = 1 / t(None, None), 1 / t(fitted["f32"], fitted["f64"])
        measured[k], predicted[k] = meas, cal
        errors_first.append(abs(first - meas) / meas)
        errors_cal.append(abs(cal - meas) / meas)
        lines.append(
            f"| {k} / {8 - k} | {meas:.1f} | {first:.1f} | {(first - meas) / meas:+.0%} "
            f"| {cal:.1f} | {(cal - meas) / meas:+.0%} |"
        )
    lines.append(
        f"| **median abs error** | | | {median(errors_first):.0%} | | {median(errors_cal):.0%} |"
    )
    m_rank = sorted(measured, key=lambda k: -measured[k])
    p_rank = sorted(predicted, key=lambda k: -predicted[k])
    pairs = [(a, b) for i, a in enumerate(plans) for b in plans[i + 1 :]]
    agree = sum((measured[a] > measured[b]) == (predicted[a] > predicted[b]) for a, b in pairs)
    lines += [
        "",
        f"Ranking check (fastest first, by blocks on the f32 device): measured {m_rank}, "
        f"predicted {p_rank}: {'match' if m_rank == p_rank else 'differs'}; "
        f"{agree}/{len(pairs)} plan pairs in the measured order",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write-profiles", action="store_true")
    ap.add_argument("--quick", action="store_true", help="small CPU sizes (seconds)")
    ap.add_argument("--skip-cpu", action="store_true")
    args = ap.parse_args(argv)
    runs = load_runs()
    if args.write_profiles:
        from stowplan.fileio import write_text_atomic

        for engine in FITTED_ENGINES:
            target = DATA / f"{engine.value}.json"
            profile = build_profile(engine, runs, DESCRIPTIONS[engine])
            write_text_atomic(target, calibration_to_json(profile))
            print(f"wrote {target}")
        return 0
    scored = leave_one_out(runs)
    print("## Published decode speeds (batch 1): leave-one-out median errors\n")
    print("\n".join(published_table(scored)))
    print("\n## Every run outside llama.cpp\n")
    print("\n".join(runs_table(scored)))
    print("\n## Runs left out of the fits\n")
    print("\n".join(excluded_table(load_all_runs())))
    if not args.skip_cpu:
        print("\n## This CPU (numpy decode)\n")
        print("\n".join(cpu_section(args.quick)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
