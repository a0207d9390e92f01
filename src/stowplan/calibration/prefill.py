"""Calibrated prefill: the compute a device reaches on a prompt, fitted from published runs.

Prefill is compute-bound: one prompt of ``P`` tokens through a model of ``N`` parameters
and ``L`` blocks of attention width ``A`` costs, per token, ``2·N + 2·L·P·A`` FLOPs (the
weights' multiply-adds plus attention over the prompt; the cost model's prefill term
``2·params·P + 2·k·P²·A`` divided by ``P``).  A published ``ppP`` run (tokens/s of one
``P``-token prompt) therefore measures the FLOP/s the device reached,
``tokens_per_s × (2·N + 2·L·P·A)``.

:func:`prefill_efficiency` gives, for a device and an engine, that achieved compute
(TFLOP/s), its share of the datasheet's dense 16-bit peak when the spec table has one,
the range of the runs and where it comes from:

* **fitted**: the median of the device's own runs on that engine (range: their min–max);
* **outside the data**: the median ratio of the engine's runs on other devices of the
  same kind (Apple unified memory or discrete GPUs) to their datasheet figure — the
  16-bit peak where both have one, else the memory bandwidth — applied to this device's
  figure, with the range of those ratios;
* None when the device has neither figure or the engine no runs.

The runs are ``data/prefill_runs.json``: each names its source thread and table.
:func:`leave_one_out` predicts every run from the others (the fidelity table of
``docs/calibration.md``).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources

from stowplan.calibration.device import device_key
from stowplan.gpus import lookup_gpu

__all__ = [
    "PrefillEfficiency",
    "PrefillRun",
    "leave_one_out",
    "prefill_efficiency",
    "published_prefill_runs",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefillRun:
    """One published prompt-processing measurement."""

    engine: str
    gpu_name: str
    model: str
    quant: str
    params: int
    """Parameters of the model (what llama-bench prints)."""
    blocks: int
    attention_width: int
    """Attention heads × head dimension."""
    prompt_tokens: int
    tokens_per_s: float
    source: str

    @property
    def flops_per_token(self) -> float:
        """``2·N + 2·L·P·A``: FLOPs one prompt token costs."""
        return 2 * self.params + 2 * self.blocks * self.prompt_tokens * self.attention_width

    @property
    def achieved_tflops(self) -> float:
        return self.tokens_per_s * self.flops_per_token / 1e12


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefillEfficiency:
    """The prefill compute of one device on one engine."""

    tflops: float
    """Achieved dense compute on a prompt, TFLOP/s."""
    low_tflops: float
    high_tflops: float
    """The range the runs behind it span."""
    efficiency: float | None
    """``tflops`` over the datasheet's 16-bit peak (None: the spec table has none)."""
    fitted: bool
    """True: the device's own runs; False: outside the data, from other devices."""
    source: str
    """Where the figure comes from, in words."""


@cache
def published_prefill_runs() -> tuple[PrefillRun, ...]:
    """The shipped runs (``data/prefill_runs.json``)."""
    text = (
        resources.files("stowplan.calibration")
        .joinpath("data/prefill_runs.json")
        .read_text(encoding="utf-8")
    )
    fields = set(PrefillRun.__dataclass_fields__)
    return tuple(
        PrefillRun(**{k: v for k, v in row.items() if k in fields})
        for row in json.loads(text)["runs"]
    )


def _is_apple(gpu_name: str) -> bool:
    return gpu_name.lower().startswith("apple")


def _figure(gpu_name: str) -> tuple[str, float] | None:
    """The datasheet figure prefill compute scales with: 16-bit peak, else bandwidth."""
    spec = lookup_gpu(gpu_name)
    if spec is None:
        return None
    if spec.bf16_tflops:
        return "peak", spec.bf16_tflops
    return "bandwidth", spec.mem_bandwidth_gbps


def prefill_efficiency(
    gpu_name: str, engine: str = "llamacpp", runs: Sequence[PrefillRun] | None = None
) -> PrefillEfficiency | None:
    """The prefill compute ``gpu_name`` reaches on ``engine`` (see the module).

    ``runs`` default to the shipped ones.  None when neither the device's runs nor a
    datasheet figure to scale other devices' runs by exist."""
    runs = published_prefill_runs() if runs is None else runs
    key = device_key(gpu_name)
    spec = lookup_gpu(gpu_name)
    peak = spec.bf16_tflops if spec is not None else None
    own = [r.achieved_tflops for r in runs if r.engine == engine and device_key(r.gpu_name) == key]
    if own:
        value = statistics.median(own)
        return PrefillEfficiency(
            tflops=value,
            low_tflops=min(own),
            high_tflops=max(own),
            efficiency=value / peak if peak else None,
            fitted=True,
            source=f"fitted: median of {len(own)} published {engine} prefill runs on {key}",
        )
    figure = _figure(gpu_name)
    if figure is None:
        return None
    kind, value = figure
    apple = _is_apple(gpu_name)
    ratios = [
        r.achieved_tflops / other[1]
        for r in runs
        if r.engine == engine
        and _is_apple(r.gpu_name) == apple
        and (other := _figure(r.gpu_name)) is not None
        and other[0] == kind
    ]
    if not ratios:
        return None
    mid = statistics.median(ratios)
    unit = "of the 16-bit peak" if kind == "peak" else "TFLOP/s per GB/s of bandwidth"
    return PrefillEfficiency(
        tflops=mid * value,
        low_tflops=min(ratios) * value,
        high_tflops=max(ratios) * value,
        efficiency=mid * value / peak if peak else None,
        fitted=False,
        source=(
            f"outside the data: {key} has no published {engine} prefill run; median "
            f"{mid:.3g} {unit} of {len(ratios)} runs on other devices"
        ),
    )


def leave_one_out(
    runs: Sequence[PrefillRun] | None = None,
) -> list[tuple[PrefillRun, float | None]]:
    """Each run with the tokens/s the others predict for it (None: no prediction)."""
    runs = list(published_prefill_runs() if runs is None else runs)
    out: list[tuple[PrefillRun, float | None]] = []
    for i, run in enumerate(runs):
        fit = prefill_efficiency(run.gpu_name, run.engine, runs[:i] + runs[i + 1 :])
        out.append((run, None if fit is None else fit.tflops * 1e12 / run.flops_per_token))
    return out
