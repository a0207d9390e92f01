"""Predicted vs published single-user decode speeds of the MoE models in the calibration data.

Every published batch-1 run of a mixture-of-experts model in ``published_decode.json``
(the fitted ones and the kept-out DeepSeek-R1 run) is predicted as ``stowplan plan``
predicts it: the model, in the run's dtype, planned on one node of the run's GPU with
the run's tensor-parallel degree (one stage, experts beside their blocks), by

* the first-order model (``--engine first-order``);
* the default profile (``generic``, fitted to every engine's runs: what ``stowplan
  plan`` uses without ``--engine``), and the same profile fitted with the run held out;
* the run's own engine's profile (``--engine ENGINE``).

A run whose model or dtype stowplan cannot plan as published (DeepSeek-R1 in NVIDIA's
nvfp4 mix) is predicted by the same cost model on the bytes its record says a token
reads ("record" in the table).  The last column is the default profile's coverage
verdict for the run's setup and, outside its data, the range it gives and whether the
published figure lies in it.

    .venv/bin/python benchmarks/moe_single_user.py
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from statistics import median

from stowplan.calibration import (
    Calibration,
    Engine,
    PlanKind,
    assess_coverage,
    dtype_class,
    shipped_calibration,
)
from stowplan.errors import InputError
from stowplan.model import Constraints, ModelLayout, NodeDescriptor
from stowplan.models import lookup, resolve_model
from stowplan.planner import plan as plan_model
from stowplan.planner.experts import ExpertInputs, ExpertPlacement
from stowplan.report.calibration import range_text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibration_fit import (
    Run,
    held_out_entry,
    is_moe,
    load_all_runs,
    predict,
    tensor_parallel,
)


def layout_of(r: Run) -> ModelLayout | None:
    """The run's model in its dtype, or None when stowplan cannot plan it as published."""
    known = lookup(str(r["model"]))
    if known is None:
        return None
    if dtype_class(known.dtype) == dtype_class(str(r["dtype"])):
        return known
    try:
        return resolve_model(known.name, dtype=str(r["dtype"]))
    except InputError:
        return None


def short_dtype(r: Run) -> str:
    """The run's dtype without its parenthesised note: ``mixed: nvfp4 MoE+dense FFN, …``."""
    return str(r["dtype"]).split(" (")[0]


def _node(r: Run) -> NodeDescriptor:
    tp = tensor_parallel(r)
    return NodeDescriptor(
        id="host",
        gpu_name=str(r["gpu_name"]),
        vram_bytes=10**13,
        flops_estimate=1000.0 * tp,
        link_mbps=100_000.0,
        num_gpus=tp,
        mem_bandwidth_gbps=float(r["bandwidth_gbps"]) * tp,
    )


def planned(r: Run, layout: ModelLayout, cal: Calibration | None) -> float:
    """One stream's tokens/s of the run's setup as planned with ``cal``."""
    tp = tensor_parallel(r)
    constraints = Constraints(calibration=cal, tensor_parallel=tp, max_stages=1)
    block_local = ExpertInputs(placement=ExpertPlacement.BLOCK_LOCAL)
    plan = plan_model(layout, [_node(r)], constraints, experts=block_local)
    assert plan.rationale.prediction is not None
    return 1.0 / plan.rationale.prediction.time_per_token_s


def _star(cal: Calibration) -> Calibration:
    """A one-entry profile that applies ``cal``'s first entry to any GPU."""
    return replace(cal, devices=(replace(cal.devices[0], device="*", match=()),), runs=())


def rows() -> list[tuple[Run, str, dict[str, float], str, bool | None]]:
    """Per MoE run: how it was predicted, the predictions, the coverage verdict text and
    whether the published figure lies in its range (None inside the data)."""
    generic = shipped_calibration(Engine.GENERIC)
    every = load_all_runs()
    fitted = [o for o in every if not o.get("excluded")]
    out = []
    for r in every:
        if not is_moe(r):
            continue
        i = next((k for k, o in enumerate(fitted) if o is r), None)
        if i is None:  # kept out of the fits: the shipped profile never saw it
            held = generic
        else:
            entry = held_out_entry(Engine.GENERIC, fitted, i)
            held = _star(replace(generic, devices=(entry,)))
        own = shipped_calibration(str(r["engine"]))
        layout = layout_of(r)
        if layout is not None:
            how = "plan"
            preds = {
                "first-order": planned(r, layout, None),
                "default": planned(r, layout, generic),
                "held out": planned(r, layout, held),
                "engine": planned(r, layout, own),
            }
        else:
            how = "record"
            gpu = str(r["gpu_name"])
            preds = {
                "first-order": predict(r, None),
                "default": predict(r, generic.for_device(gpu)),
                "held out": predict(r, held.for_device(gpu)),
                "engine": predict(r, own.for_device(gpu)),
            }
        kind = PlanKind(
            gpu_names=(str(r["gpu_name"]),),
            dtype=short_dtype(r),
            tensor_parallel=(tensor_parallel(r),),
            moe=True,
            mla=r.get("attention") == "mla",
            expert_parallel=int(r.get("expert_parallel", 1)) > 1,
        )
        verdict = assess_coverage(generic, kind, preds["default"])
        span = range_text(verdict)
        if span is None:
            out.append((r, how, preds, "inside", None))
            continue
        low, high = verdict.low_tokens_per_s, verdict.high_tokens_per_s
        assert low is not None and high is not None
        # Against the range as it is shown (whole tokens/s): a run whose own ratio sets
        # an end of the range lands on that end, give or take the last digit.
        hit = round(low) <= float(r["tokens_per_s"]) <= round(high)
        text = f"outside ({', '.join(verdict.outside)}): {span}"
        out.append((r, how, preds, text, hit))
    return out


KEYS = ("first-order", "default", "held out", "engine")


def table(scored: list[tuple[Run, str, dict[str, float], str, bool | None]]) -> list[str]:
    lines = [
        "| engine | GPUs | model, dtype | from | published tok/s | first-order | default "
        "| default, run held out | engine profile | default profile's coverage |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    errors: dict[str, list[float]] = {k: [] for k in KEYS}
    for r, how, preds, verdict, hit in scored:
        measured = float(r["tokens_per_s"])
        cells = []
        for k in KEYS:
            err = (preds[k] - measured) / measured
            errors[k].append(abs(err))
            cells.append(f"{preds[k]:.0f} ({err:+.0%})")
        mark = "" if hit is None else (" (published inside)" if hit else " (published outside)")
        gpus = f"{tensor_parallel(r)}× {r['family']}"
        kept = " (kept out of the fits)" if r.get("excluded") else ""
        lines.append(
            f"| {r['engine']} | {gpus} | {r['model']}, {short_dtype(r)}{kept} | {how} "
            f"| {measured:.1f} | {' | '.join(cells)} | {verdict}{mark} |"
        )
    meds = " | ".join(f"{median(errors[k]):.0%}" for k in KEYS)
    lines.append(f"| **median abs error** | | {len(scored)} runs | | | {meds} | |")
    return lines


def main() -> int:
    print("\n".join(table(rows())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
