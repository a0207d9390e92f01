"""Calibrated vs first-order decode-speed predictions.

Part 1 (published): every batch-1 decode speed in ``published_decode.json``
(llama.cpp ``tg128`` on single and multi-GPU hosts, each with its source) is
predicted by the first-order model (weights / peak bandwidth + nothing else)
and by a calibrated model fitted *without that run* (leave-one-out: the
device's other runs when it has some, else every other device's runs).  The
table gives the median absolute error per GPU family.

The ``generic`` profile, the CLI's default when the engine is unknown, is fitted to
the runs of every engine; its rows in that table are the compiled-PyTorch runs
(gpt-fast, torchao), and a table of its own scores it on every run.

Serving engines (vLLM, TensorRT-LLM) get their own table: each run against the
first-order model, the engine's shipped profile, and a leave-one-out fit over the
engine's other runs where there are any.

Part 2 (this CPU): a numpy decode of block-shaped matrices.  The CPU's
figures are fitted from single-stage runs of one width; the prediction is
then checked against held-out runs (another width, pipelined splits with
hops).  Part 3 ranks candidate plans (stage counts and splits) by predicted
time per token and compares with the measured order.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/calibration.py
    .venv/bin/python benchmarks/calibration.py --write-profiles   # regenerate data/*.json
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from dataclasses import replace
from functools import cache
from pathlib import Path
from statistics import median

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
from stowplan.calibration.order import ordered_entry
from stowplan.calibration.profile import DeviceCalibration, Figure, Provenance

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibration_fit import (  # the fitting pipeline; re-exported for the tests
    DATA,
    DESCRIPTIONS,
    FITTED_ENGINES,
    Run,
    build_profile,
    held_out_entry,
    load_all_runs,
    load_runs,
    predict,
    table_prior,
    tensor_parallel,
)

Scored = list[tuple[Run, float, float]]
"""(run, first-order error, calibrated leave-one-out error) per run: :func:`leave_one_out`."""


def leave_one_out(runs: list[Run]) -> Scored:
    """(run, first-order error, calibrated error) with the run's engine's profile fitted
    without the run (:func:`calibration_fit.held_out_entry`; for ``generic`` runs, the
    every-engine default)."""
    out = []
    for i, r in enumerate(runs):
        entry = held_out_entry(str(r["engine"]), runs, i)
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
    """The entry the shipped profile of the run's engine gives its GPU, as the cost model
    applies it (in datasheet order, :func:`~stowplan.calibration.order.ordered_entry`)."""
    return ordered_entry(_shipped_profile(Engine(str(r["engine"]))), str(r["gpu_name"]))


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


def default_errors(runs: list[Run]) -> dict[str, list[tuple[float, float, float]]]:
    """Per engine, each fitted run's relative errors (predicted - measured) / measured of
    the first-order model, of the default profile (``generic``, what the CLI uses
    without ``--engine``) fitted without the run, and of the shipped default."""
    generic = _shipped_profile(Engine.GENERIC)
    rows: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for i, r in enumerate(runs):
        measured = float(r["tokens_per_s"])
        preds = (
            predict(r, None),
            predict(r, held_out_entry(Engine.GENERIC, runs, i)),
            predict(r, ordered_entry(generic, str(r["gpu_name"]))),
        )
        errs = tuple((p - measured) / measured for p in preds)
        rows[str(r["engine"])].append((errs[0], errs[1], errs[2]))
    return rows


def default_table(runs: list[Run]) -> list[str]:
    """Every fitted run predicted by the default profile (:func:`default_errors`): median
    abs errors per engine of the first-order model, of the default fitted without the
    run, and of the shipped default, and the median signed error of the held-out default
    (its sign: + optimistic, - pessimistic)."""
    rows = default_errors(runs)
    out = [
        "| runs of | runs | first-order median abs error | default, leave-one-out "
        "| default (shipped) | leave-one-out median signed error |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    order = {e.value: i for i, e in enumerate(FITTED_ENGINES)}
    every: list[tuple[float, float, float]] = []

    def cells(errs: list[tuple[float, float, float]]) -> str:
        meds = " | ".join(f"{median(abs(e[k]) for e in errs):.0%}" for k in range(3))
        return f"{len(errs)} | {meds} | {median(e[1] for e in errs):+.1%}"

    for engine in sorted(rows, key=lambda e: order.get(e, 99)):
        every += rows[engine]
        out.append(f"| {engine} | {cells(rows[engine])} |")
    out.append(f"| **all** | {cells(every)} |")
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
    prior = table_prior()
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
        from stowplan.files.fileio import write_text_atomic

        for engine in FITTED_ENGINES:
            target = DATA / f"{engine.value}.json"
            profile = build_profile(engine, load_all_runs(), DESCRIPTIONS[engine])
            write_text_atomic(target, calibration_to_json(profile))
            print(f"wrote {target}")
        return 0
    scored = leave_one_out(runs)
    print("## Published decode speeds (batch 1): leave-one-out median errors\n")
    print("\n".join(published_table(scored)))
    print("\n## The default profile (generic: every engine's runs)\n")
    print("\n".join(default_table(runs)))
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
