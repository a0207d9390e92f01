"""The fitting pipeline behind the shipped calibration profiles.

Reads ``published_decode.json`` (the published batch-1 decode runs, each with its
source) and the table priors of ``calibration_table.json``, and builds each engine's
profile: one entry per GPU family and ``*``, every fit starting from the table
figures, the profile recording the runs behind it with the prediction its fitting
makes for each when that run is held out (``stowplan.calibration.runs``).  The
``generic`` profile, the CLI's default, is fitted to the runs of every engine.  The
families' figures are held in datasheet order (``stowplan.calibration.order``): a
family whose GPU has at least another's bandwidth and FLOP/s never gets figures that
predict it slower.

``calibration.py --write-profiles`` writes them to ``src/stowplan/calibration/data``;
``calibration.py`` and ``moe_single_user.py`` score them.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

from stowplan.calibration import (
    Calibration,
    Engine,
    Measurement,
    fit_device,
    load_calibration_file,
    stage_time_s,
)
from stowplan.calibration.order import ordered_entry, runs_datasheet, settle_in_order
from stowplan.calibration.ordered_fit import DeviceRuns, fit_in_order
from stowplan.calibration.profile import DeviceCalibration, dtype_class
from stowplan.calibration.runs import PublishedRun

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


def measurements(runs: list[Run]) -> tuple[Measurement, ...]:
    """The runs as fit measurements, each run's bytes rescaled to a common 1000 GB/s per
    GPU so that one fit spans devices."""
    return tuple(
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
    )


def fit_entry(
    runs: list[Run],
    prior: DeviceCalibration,
    device: str,
    source: str,
    fixed: Mapping[str, float] | None = None,
) -> DeviceCalibration:
    """Fit one device entry; runs on different devices are normalised to their own bandwidth.

    Every run is on a GPU, so no fraction exceeds 1.  The ``*`` entry pools families,
    so its collective cost is never fitted: a tensor-parallel family against other
    families' single-GPU runs would credit it with every difference between them.
    ``fixed`` holds figures at given values (see :func:`fit_device`).
    """
    return fit_device(
        measurements(runs),
        bandwidth_gbps=1000.0,
        prior=prior,
        device=device,
        source=source,
        max_fraction=1.0,
        fit_collective=False if device == "*" else None,
        label_assumed=False,  # the table's figures stay "table" in a shipped profile
        fixed=fixed,
    ).device


def _weights(runs: list[Run]) -> dict[str, float]:
    """How many of a family's runs determine each figure (what pooling weighs it by)."""
    tps = {tensor_parallel(r) > 1 for r in runs}
    out: dict[str, float] = {
        "block": float(len(runs)),
        "hop": float(sum(int(r["hops"]) > 0 for r in runs)),
        "collective": float(sum(tensor_parallel(r) > 1 for r in runs)) if len(tps) > 1 else 0.0,
    }
    for r in runs:
        c = dtype_class(str(r["dtype"]))
        out[c] = out.get(c, 0.0) + 1.0
    return out


def family_entries(runs: list[Run], star: DeviceCalibration) -> list[DeviceCalibration]:
    """One entry per GPU family of ``runs``, each fitted from ``star``, all together with
    their figures in datasheet order (:func:`~stowplan.calibration.ordered_fit.fit_in_order`,
    then :func:`~stowplan.calibration.order.settle_in_order`), in family order."""
    by_family: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        by_family[str(r["family"])].append(r)
    families = sorted(by_family.items())
    sheets = [
        runs_datasheet([str(r["gpu_name"]) for r in rs], [float(r["bandwidth_gbps"]) for r in rs])
        for _, rs in families
    ]
    held = fit_in_order(
        [
            DeviceRuns(
                measurements=measurements(rs), bandwidth_gbps=1000.0, prior=star, max_fraction=1.0
            )
            for _, rs in families
        ],
        sheets,
    )
    entries = [
        replace(fit_entry(rs, star, fam, _sources(rs), held[i] or None), match=family_match(fam))
        for i, (fam, rs) in enumerate(families)
    ]
    return list(settle_in_order(entries, sheets, [_weights(rs) for _, rs in families]))


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


LISTED_RUNS = 12
"""A figure's source lists its runs and their sources up to this many runs; beyond, it
names the engines and points to the profile's ``runs``, which record each one."""


def _sources(runs: list[Run]) -> str:
    if len(runs) > LISTED_RUNS:
        engines = ", ".join(sorted({str(r["engine"]) for r in runs}))
        return (
            f"fitted to {len(runs)} published batch-1 decode runs ({engines}); the profile's "
            "runs list each with its source"
        )
    srcs = sorted({str(r["source"]).split(" (")[0].split(",")[0] for r in runs})
    rows = "; ".join(_label(r) for r in runs)
    return f"fitted to {len(runs)} published batch-1 decode runs ({rows}) from: " + " | ".join(srcs)


TABLE = HERE / "calibration_table.json"
"""The table figures every fit starts from, each citing its source."""


@cache
def table_prior() -> DeviceCalibration:
    """The table defaults every fit starts from (``calibration_table.json``'s ``*`` entry)."""
    return load_calibration_file(TABLE).devices[0]


def pool(engine: Engine | str, runs: list[Run]) -> list[Run]:
    """The runs a profile of ``engine`` is fitted to: the engine's own, or for ``generic``
    (the default when the engine is unknown) every engine's."""
    if Engine(engine) is Engine.GENERIC:
        return list(runs)
    return [r for r in runs if r["engine"] == Engine(engine).value]


def is_moe(r: Run) -> bool:
    """A mixture-of-experts run: a token reads fewer parameters than the model holds."""
    return "active_params" in r and int(r["active_params"]) < int(r["params"])


def kind(r: Run) -> tuple[bool, bool, bool]:
    """(MoE, MLA, expert-parallel) of run ``r``: what coverage tells runs apart by."""
    return is_moe(r), r.get("attention") == "mla", int(r.get("expert_parallel", 1)) > 1


def published_run(r: Run, held_out: float | None = None) -> PublishedRun:
    """The record a profile carries of run ``r`` (bytes as the cost model counts them) and
    ``held_out``, what the profile's fitting predicts for it without it."""
    return PublishedRun(
        engine=str(r["engine"]),
        family=str(r["family"]),
        gpu_name=str(r["gpu_name"]),
        model=str(r["model"]),
        dtype=str(r["dtype"]),
        tokens_per_s=float(r["tokens_per_s"]),
        read_bytes=read_bytes(r),
        num_blocks=int(r["num_blocks"]),
        hops=int(r["hops"]),
        tensor_parallel=tensor_parallel(r),
        expert_parallel=int(r.get("expert_parallel", 1)),
        moe=is_moe(r),
        attention=str(r.get("attention", "gqa")),
        batch=int(r["batch"]),
        bandwidth_gbps=float(r["bandwidth_gbps"]),
        held_out_tokens_per_s=None if held_out is None else round(held_out, 4),
        source=str(r["source"]),
        excluded=str(r.get("excluded", "")),
    )


_NOISE = {"apple", "tesla", "sxm"}


def family_match(family: str) -> tuple[str, ...]:
    """Tokens a GPU name must hold to match a family key: ``a100-80gb`` → a100, 80gb.

    ``sxm`` is dropped (nvidia-smi calls an H100 SXM ``NVIDIA H100 80GB HBM3``); ``pcie``
    is kept, so a PCIe card's entry needs the word and wins over the SXM one when it has it.
    """
    return tuple(w for w in family.split("-") if w not in _NOISE)


def build_profile(engine: Engine, runs: list[Run], description: str) -> Calibration:
    """A shipped profile: one entry per GPU family, plus ``*`` fitted over all the runs of
    its :func:`pool` (``generic``: every engine's), every fit starting from the table
    defaults.  ``runs`` may hold runs kept out of the fits (an ``excluded`` reason): the
    profile records its pool's with the fitted ones, and those of any engine whose kind
    (:func:`kind`) no fitted run of any engine has, and fits only the others."""
    base = table_prior()
    mine = [r for r in pool(engine, runs) if not r.get("excluded")]
    # Kept-out runs of the engine, and of any engine those of a kind no published run fitted
    # has: the evidence of how far off the model is where it has no term for the kind
    # (stowplan.calibration.coverage reads them).
    kinds = {kind(r) for r in runs if not r.get("excluded")}
    on_record = [
        r for r in runs if r in pool(engine, runs) or (r.get("excluded") and kind(r) not in kinds)
    ]
    star = fit_entry(mine, base, "*", _sources(mine)) if mine else base
    held_out = {id(r): predict(r, held_out_entry(engine, mine, i)) for i, r in enumerate(mine)}
    entries = family_entries(mine, star)
    profile = Calibration(
        name=f"{engine.value}-default",
        engine=engine,
        description=description,
        devices=(*entries, star),
    )
    # A kept-out run was never fitted: the profile itself predicts it without it.
    records = tuple(published_run(r) for r in on_record)
    profile = replace(profile, runs=records)
    records = tuple(
        published_run(
            r, held_out.get(id(r)) or predict(r, ordered_entry(profile, str(r["gpu_name"])))
        )
        for r in on_record
    )
    return replace(profile, runs=records)


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
    Engine.GENERIC: "The default when the engine is unknown: fitted per GPU family to the "
    "published decode speeds of every engine (llama.cpp, vLLM, TensorRT-LLM, SGLang, "
    "transformers and compiled PyTorch: gpt-fast, torchao; benchmarks/published_decode.json "
    "lists every run); '*' (any other GPU) is fitted over all of them.",
    Engine.TRANSFORMERS: "Hugging Face transformers eager generate (what an Accelerate "
    "device_map runs), fitted per GPU family to published decode speeds "
    "(benchmarks/published_decode.json); '*' is fitted over all of them.",
}


def held_out_entry(engine: Engine | str, runs: list[Run], i: int) -> DeviceCalibration:
    """The entry ``engine``'s profile would give run ``runs[i]`` if fitted without it, as
    the cost model applies it (:func:`~stowplan.calibration.order.ordered_entry`).

    The :func:`pool`'s other runs give one entry per GPU family, held in datasheet order
    (:func:`family_entries`), their prior the fit over the pool's families other than
    the run's (the table defaults when there is none), which is also the ``*`` entry:
    the run's GPU gets its family's entry when the family has other runs, else ``*``.
    """
    r = runs[i]
    rest = pool(engine, [o for j, o in enumerate(runs) if j != i])
    others = [o for o in rest if o["family"] != r["family"]]
    star = fit_entry(others, table_prior(), "*", "loo") if others else table_prior()
    profile = Calibration(
        name="loo",
        engine=Engine(engine),
        devices=(*family_entries(rest, star), replace(star, device="*", match=())),
        runs=tuple(published_run(o) for o in rest),
    )
    entry = ordered_entry(profile, str(r["gpu_name"]))
    assert entry is not None  # "*" matches every GPU
    return entry
