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
)
from stowplan.calibration.profile import DeviceCalibration, Figure, Provenance

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "src" / "stowplan" / "calibration" / "data"


def load_runs() -> list[dict[str, object]]:
    runs: list[dict[str, object]] = json.loads((HERE / "published_decode.json").read_text())["runs"]
    return runs


def _measurement(r: dict[str, object]) -> Measurement:
    return Measurement(
        tokens_per_s=float(r["tokens_per_s"]),  # type: ignore[arg-type]
        read_bytes=int(r["read_bytes"]),  # type: ignore[call-overload]
        num_blocks=int(r["num_blocks"]),  # type: ignore[call-overload]
        dtype=str(r["dtype"]),
        hops=int(r["hops"]),  # type: ignore[call-overload]
        label=f"{r['family']} {r['model']} {r['dtype']}",
    )


def _fit(
    runs: list[dict[str, object]], prior: DeviceCalibration, device: str, source: str
) -> DeviceCalibration:
    """Fit one device entry; runs on different devices are normalised to their own bandwidth."""
    # Each run's bytes are rescaled to a common 1000 GB/s so one fit spans devices.
    ms = []
    for r in runs:
        m = _measurement(r)
        scale = 1000.0 / float(r["bandwidth_gbps"])  # type: ignore[arg-type]
        ms.append(
            Measurement(
                tokens_per_s=m.tokens_per_s,
                read_bytes=round(m.read_bytes * scale),
                num_blocks=m.num_blocks,
                dtype=m.dtype,
                hops=m.hops,
                label=m.label,
            )
        )
    return fit_device(ms, bandwidth_gbps=1000.0, prior=prior, device=device, source=source).device


def _predict(r: dict[str, object], entry: DeviceCalibration | None) -> float:
    from stowplan.calibration import stage_time_s

    t = stage_time_s(
        read_bytes=int(r["read_bytes"]),  # type: ignore[call-overload]
        params=0,
        num_blocks=int(r["num_blocks"]),  # type: ignore[call-overload]
        bandwidth_gbps=float(r["bandwidth_gbps"]),  # type: ignore[arg-type]
        tflops=0.0,
        dtype=str(r["dtype"]),
        hops=int(r["hops"]),  # type: ignore[call-overload]
        device=entry,
    )
    return 1.0 / t


def _sources(runs: list[dict[str, object]]) -> str:
    srcs = sorted({str(r["source"]).split(" (")[0].split(",")[0] for r in runs})
    rows = "; ".join(f"{r['dtype']} {float(r['tokens_per_s']):.2f} t/s" for r in runs)  # type: ignore[arg-type]
    return f"fitted to {len(runs)} llama-bench tg128 runs ({rows}) from: " + " | ".join(srcs)


def build_llamacpp_profile(runs: list[dict[str, object]]) -> Calibration:
    """The shipped llama.cpp profile: one entry per family, plus ``*`` over all runs."""
    prior = shipped_calibration(Engine.GENERIC).devices[0]
    lc = [r for r in runs if r["engine"] == "llamacpp"]
    star = _fit(lc, prior, "*", _sources(lc))
    entries = [star]
    by_family: dict[str, list[dict[str, object]]] = defaultdict(list)
    for r in lc:
        by_family[str(r["family"])].append(r)
    for fam, rs in sorted(by_family.items()):
        match = tuple(w for w in fam.split("-") if w not in {"apple", "tesla"})
        entries.append(
            DeviceCalibration(
                **{
                    **{
                        k: getattr(_fit(rs, star, fam, _sources(rs)), k)
                        for k in (
                            "bandwidth_fraction",
                            "block_overhead_s",
                            "hop_overhead_s",
                            "compute_efficiency",
                        )
                    },
                    "device": fam,
                    "match": match,
                }
            )
        )
    return Calibration(
        name="llamacpp-default",
        engine=Engine.LLAMACPP,
        description="llama.cpp (CUDA, Vulkan, Metal) batch-1 decode, fitted per GPU family to "
        "public llama-bench results (benchmarks/published_decode.json lists every run).",
        devices=tuple(entries),
    )


def published_table(runs: list[dict[str, object]]) -> list[str]:
    """Leave-one-out table over the llama.cpp runs (other engines: ``engine_table``)."""
    runs = [r for r in runs if r["engine"] == "llamacpp"]
    prior = shipped_calibration(Engine.GENERIC).devices[0]
    rows: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for i, r in enumerate(runs):
        rest = [o for j, o in enumerate(runs) if j != i]
        same = [o for o in rest if o["family"] == r["family"]]
        pool = [o for o in rest if o["family"] != r["family"]]
        star = _fit(pool, prior, "*", "loo")
        entry = _fit(same, star, str(r["family"]), "loo") if same else star
        measured = float(r["tokens_per_s"])  # type: ignore[arg-type]
        first = _predict(r, None)
        cal = _predict(r, entry)
        key = f"{r['family']} ({'multi' if int(r['num_gpus']) > 1 else 'single'}-GPU)"  # type: ignore[call-overload]
        rows[key].append(((first - measured) / measured, (cal - measured) / measured))
    out = [
        "| GPU family | runs | first-order median abs error | calibrated (leave-one-out) median abs error |",
        "| --- | ---: | ---: | ---: |",
    ]
    all_first, all_cal = [], []
    for key in sorted(rows):
        f = [abs(a) for a, _ in rows[key]]
        c = [abs(b) for _, b in rows[key]]
        all_first += f
        all_cal += c
        out.append(f"| {key} | {len(f)} | {median(f):.0%} | {median(c):.0%} |")
    out.append(f"| **all** | {len(all_first)} | {median(all_first):.0%} | {median(all_cal):.0%} |")
    return out


def engine_table(runs: list[dict[str, object]]) -> list[str]:
    """Runs of serving engines (vLLM, TensorRT-LLM): first-order, the shipped profile, and a
    leave-one-out fit over the engine's other runs where it has any."""
    rows = [
        "| engine | GPU family | model, dtype | measured tok/s | first-order | error "
        "| shipped profile | error | fitted (leave-one-out) | error |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    others = [r for r in runs if r["engine"] != "llamacpp"]
    for i, r in enumerate(runs):
        if r["engine"] == "llamacpp":
            continue
        engine = Engine(str(r["engine"]))
        shipped = shipped_calibration(engine).for_device(str(r["gpu_name"]))
        measured = float(r["tokens_per_s"])  # type: ignore[arg-type]
        first = _predict(r, None)
        table = _predict(r, shipped)
        rest = [o for o in others if o["engine"] == r["engine"] and o is not runs[i]]
        if rest and shipped is not None:
            fit = _predict(r, _fit(rest, shipped, str(r["family"]), "loo"))
            fitted = f"{fit:.1f} | {(fit - measured) / measured:+.0%}"
        else:
            fitted = "n/a (the engine's only run) | n/a"
        rows.append(
            f"| {r['engine']} | {r['family']} | {r['model']}, {r['dtype']} | {measured:.1f} "
            f"| {first:.1f} | {(first - measured) / measured:+.0%} "
            f"| {table:.1f} | {(table - measured) / measured:+.0%} | {fitted} |"
        )
    return rows


def cpu_section(quick: bool) -> list[str]:
    from stowplan.calibration import stage_time_s
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

        def t(dev: DeviceCalibration | None, k: int = k) -> float:
            return stage_time_s(
                read_bytes=k * block_bytes(hidden, 4),
                params=0,
                num_blocks=k,
                bandwidth_gbps=bw,
                tflops=0.0,
                hops=1,
                device=dev and fitted["f32"],
            ) + stage_time_s(
                read_bytes=(8 - k) * block_bytes(hidden, 8),
                params=0,
                num_blocks=8 - k,
                bandwidth_gbps=bw,
                tflops=0.0,
                hops=1,
                device=dev and fitted["f64"],
            )

        first, cal = 1 / t(None), 1 / t(prior)
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

        write_text_atomic(DATA / "llamacpp.json", calibration_to_json(build_llamacpp_profile(runs)))
        print(f"wrote {DATA / 'llamacpp.json'}")
        return 0
    print("## Published decode speeds (llama.cpp tg128, batch 1)\n")
    print("\n".join(published_table(runs)))
    print("\n## Published decode speeds (serving engines, one request at a time)\n")
    print("\n".join(engine_table(runs)))
    if not args.skip_cpu:
        print("\n## This CPU (numpy decode)\n")
        print("\n".join(cpu_section(args.quick)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
