"""The compute a prompt's prefill reaches on each node: calibrated where published runs say.

Prefill is compute-bound, and engines reach a share of a GPU's datasheet peak on it
that differs from decode's.  With a calibration whose engine is llama.cpp, or the
generic profile (fitted on llama.cpp runs), a node computes a prompt at the share of
its 16-bit peak :func:`~stowplan.calibration.prefill.prefill_efficiency` gives for its
GPU — fitted from the device's own published runs, or scaled from other devices'
outside the data — applied to the node's FLOPs (stated, or the spec table's), per GPU
times the GPUs that compute at once (all of them tensor parallel, one when the engine
splits layers over them); a GPU without a peak in the table computes at the fitted
TFLOP/s.  Elsewhere the decode rate stands.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

from stowplan.calibration.prefill import PrefillEfficiency, prefill_efficiency
from stowplan.calibration.profile import Calibration, Engine
from stowplan.model import NodeDescriptor

__all__ = ["PREFILL_ENGINES", "node_prefill", "prefill_notes", "prefill_rates"]

PREFILL_ENGINES = {Engine.LLAMACPP: "llamacpp", Engine.GENERIC: "llamacpp"}
"""The published prefill runs each calibrated engine reads (the runs are llama.cpp's)."""

_SLOWEST = 1e30


@lru_cache(maxsize=256)
def _efficiency(gpu_name: str, engine: str) -> PrefillEfficiency | None:
    return prefill_efficiency(gpu_name, engine)


def node_prefill(node: NodeDescriptor, calibration: Calibration | None) -> PrefillEfficiency | None:
    """The calibrated prefill compute of one GPU of ``node`` (None: the decode rate
    stands — first order, or an engine without published prefill runs)."""
    if calibration is None:
        return None
    runs = PREFILL_ENGINES.get(calibration.engine)
    if runs is None:
        return None
    return _efficiency(node.gpu_name, runs)


def prefill_rates(
    nodes: Sequence[NodeDescriptor],
    flops_per_s: Sequence[float],
    inv_flops: Sequence[float],
    calibration: Calibration | None,
    layers: bool,
) -> tuple[tuple[float, ...], tuple[str | None, ...]]:
    """Each node's seconds per prefill FLOP and the source of that figure (None: the
    decode rate ``inv_flops`` stands).  ``flops_per_s``: each node's first-order FLOP/s
    (all its GPUs; stated or from the spec table); the calibrated share of the 16-bit
    peak applies to it, or, for a GPU without a peak in the table, the fitted TFLOP/s.
    ``layers``: the engine splits layers over a node's GPUs (one computes at a time)."""
    rates: list[float] = []
    sources: list[str | None] = []
    for node, flops, inv in zip(nodes, flops_per_s, inv_flops, strict=True):
        eff = node_prefill(node, calibration)
        gpus = 1 if layers else node.num_gpus
        if eff is None or eff.tflops <= 0:
            rates.append(inv)
            sources.append(None)
            continue
        if eff.efficiency is not None and 0 < flops < math.inf:
            reach = flops / node.num_gpus * gpus * eff.efficiency
        else:
            reach = eff.tflops * 1e12 * gpus
        rates.append(min(1.0 / reach, _SLOWEST))
        sources.append(eff.source)
    return tuple(rates), tuple(sources)


def prefill_notes(calibration: Calibration | None, nodes: Sequence[NodeDescriptor]) -> list[str]:
    """One line per GPU kind of ``nodes`` saying what compute a prompt's prefill is
    predicted at, its range and where it comes from (nothing when first order).  The
    share of the peak is what applies to a node's own FLOPs figure."""
    if calibration is None:
        return []
    out: list[str] = []
    seen: set[str] = set()
    for node in nodes:
        if node.gpu_name in seen:
            continue
        seen.add(node.gpu_name)
        eff = node_prefill(node, calibration)
        if eff is None:
            out.append(
                f"prefill on {node.gpu_name}: the decode compute rate (no published "
                f"{calibration.engine.value} prefill runs to calibrate it)"
            )
            continue
        share = "" if eff.efficiency is None else f" ({eff.efficiency:.0%} of the 16-bit peak)"
        out.append(
            f"prefill on {node.gpu_name}: {eff.tflops:.3g} TFLOP/s a GPU{share}, range "
            f"{eff.low_tflops:.3g}–{eff.high_tflops:.3g}; {eff.source}"
        )
    return out
