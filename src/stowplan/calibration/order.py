"""Calibrated figures in datasheet order: a faster device is never predicted slower.

A device *dominates* another when its datasheet has at least the other's memory
bandwidth and at least its dense 16-bit FLOP/s (both known).  For every workload to run
no slower on the dominating device, its figures must be at least as good, figure by
figure: effective bandwidth (peak × bandwidth fraction, per dtype class) and effective
FLOP/s (peak × compute efficiency) no smaller, fixed costs per block, per hop and per
collective no larger.  Per-device fits do not promise that (a device with one published
run can come out with a large block cost), so:

* fitting (:func:`~stowplan.calibration.ordered_fit.fit_in_order`): the devices are
  fitted jointly, by least squares under the order as linear constraints, and
  :func:`settle_in_order` pools any figure a rounding step out of order (weighted
  isotonic regression over the dominance order, :func:`pool_in_order`);
* applying (:func:`ordered_entry`): a device's figures are kept between those of the
  known datasheets that dominate it and those it dominates (the *anchors*: each device
  entry at the datasheet of the GPU its runs measured, and every GPU of the curated
  spec table with the figures its entry gives it, pooled into order).  For a profile
  whose entries are in order this leaves each entry's own GPU as fitted, and the
  result is monotone over every pair of GPUs of the spec table.

A GPU's bandwidth fraction is also kept at most 1: a prediction never beats reading the
bytes at the datasheet peak.

Pure: datasheets come from the GPU spec table (:func:`stowplan.gpus.lookup_gpu`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import median

from stowplan.calibration.profile import Calibration, DeviceCalibration, Figure
from stowplan.gpus import GPU_SPECS, lookup_gpu

__all__ = [
    "COSTS",
    "Datasheet",
    "cost_figure",
    "datasheet",
    "dominance_pairs",
    "dominates",
    "entry_datasheet",
    "in_order_violations",
    "ordered_entry",
    "pool_in_order",
    "runs_datasheet",
    "settle_in_order",
]

COSTS = ("block", "hop", "collective")
"""The fixed costs, in seconds: a dominating device's are no larger."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Datasheet:
    """The peak figures dominance compares."""

    bandwidth_gbps: float
    tflops: float


def datasheet(gpu_name: str) -> Datasheet | None:
    """``gpu_name``'s peak bandwidth and dense 16-bit TFLOP/s; None unless both are known."""
    spec = lookup_gpu(gpu_name)
    if spec is None or not spec.bf16_tflops or spec.mem_bandwidth_gbps <= 0:
        return None
    return Datasheet(bandwidth_gbps=spec.mem_bandwidth_gbps, tflops=spec.bf16_tflops)


def dominates(a: Datasheet, b: Datasheet) -> bool:
    """Whether ``a`` has at least ``b``'s bandwidth and FLOP/s (equal sheets dominate each
    other)."""
    return a.bandwidth_gbps >= b.bandwidth_gbps and a.tflops >= b.tflops


def runs_datasheet(gpu_names: Sequence[str], bandwidths_gbps: Sequence[float]) -> Datasheet | None:
    """The datasheet a device's runs measured: the median of their bandwidths (the figure
    each fit was relative to) and the FLOP/s of the first GPU name the spec table knows."""
    for name in gpu_names:
        sheet = datasheet(name)
        if sheet is not None:
            bw = median(bandwidths_gbps) if bandwidths_gbps else sheet.bandwidth_gbps
            return Datasheet(bandwidth_gbps=bw, tflops=sheet.tflops)
    return None


def entry_datasheet(calibration: Calibration, entry: DeviceCalibration) -> Datasheet | None:
    """The datasheet of ``entry``'s fitted runs in ``calibration`` (its key's words when
    it records none); None for ``*`` and for devices the spec table does not rate."""
    if entry.device == "*":
        return None
    runs = [r for r in calibration.fitted_runs if r.family == entry.device]
    if runs:
        return runs_datasheet([r.gpu_name for r in runs], [r.bandwidth_gbps for r in runs])
    return datasheet(" ".join(entry.match))


# -- the figures as one number each, "smaller is faster" ----------------------------------


def _classes(entries: Sequence[DeviceCalibration]) -> list[str]:
    return sorted({c for e in entries for c in e.bandwidth_fraction})


def cost_figure(entry: DeviceCalibration, name: str) -> float:
    """Seconds of ``entry``'s fixed cost ``name`` (``block``, ``hop`` or ``collective``)."""
    figure = {
        "block": entry.block_overhead_s,
        "hop": entry.hop_overhead_s,
        "collective": entry.collective_overhead_s,
    }[name]
    return figure.value


def _keyed(entry: DeviceCalibration, sheet: Datasheet, name: str) -> float:
    """Figure ``name`` of ``entry`` on ``sheet`` such that smaller is faster: a cost, or
    minus an effective bandwidth (GB/s) or FLOP/s (TFLOP/s, ``compute``)."""
    if name in COSTS:
        return cost_figure(entry, name)
    if name == "compute":
        return -sheet.tflops * entry.compute_efficiency.value
    return -sheet.bandwidth_gbps * entry.fraction(name).value


def _with(
    entry: DeviceCalibration, sheet: Datasheet, values: Mapping[str, float]
) -> DeviceCalibration:
    """``entry`` with the keyed figures ``values`` (as :func:`_keyed` gives them) set."""

    def set_(figure: Figure, value: float) -> Figure:
        return figure if value == figure.value else replace(figure, value=value)

    fractions = dict(entry.bandwidth_fraction)
    for name, v in values.items():
        if name not in (*COSTS, "compute"):
            fractions[name] = set_(entry.fraction(name), -v / sheet.bandwidth_gbps)
    out = replace(entry, bandwidth_fraction=fractions)
    if "block" in values:
        out = replace(out, block_overhead_s=set_(entry.block_overhead_s, values["block"]))
    if "hop" in values:
        out = replace(out, hop_overhead_s=set_(entry.hop_overhead_s, values["hop"]))
    if "collective" in values:
        out = replace(
            out, collective_overhead_s=set_(entry.collective_overhead_s, values["collective"])
        )
    if "compute" in values:
        eff = set_(entry.compute_efficiency, -values["compute"] / sheet.tflops)
        out = replace(out, compute_efficiency=eff)
    return out


# -- fitting --------------------------------------------------------------------------------


def pool_in_order(
    values: Sequence[float],
    weights: Sequence[float],
    pairs: Sequence[tuple[int, int]],
    rel: float = 1e-12,
) -> list[float]:
    """Weighted isotonic regression over a partial order, by pooling violators.

    ``pairs`` (i, j) ask ``values[i] <= values[j]``.  While some pair is violated, the
    groups of its two ends (the most violated pair first) are merged into one holding
    their weighted mean.  The result meets every pair to within ``rel`` of the largest
    value; on a chain it is the least-squares isotonic fit (pool adjacent violators).
    Weights below 1e-3 count as 1e-3.
    """
    group = list(range(len(values)))
    value = [float(v) for v in values]
    weight = [max(float(w), 1e-3) for w in weights]
    scale = max((abs(v) for v in value), default=0.0)
    while True:
        worst, pair = rel * scale, None
        for i, j in pairs:
            gi, gj = group[i], group[j]
            if gi != gj and value[gi] - value[gj] > worst:
                worst, pair = value[gi] - value[gj], (gi, gj)
        if pair is None:
            return [value[group[i]] for i in range(len(values))]
        keep, gone = pair
        total = weight[keep] + weight[gone]
        value[keep] = (value[keep] * weight[keep] + value[gone] * weight[gone]) / total
        weight[keep] = total
        group = [keep if g == gone else g for g in group]


def dominance_pairs(sheets: Sequence[Datasheet | None]) -> list[tuple[int, int]]:
    """(i, j) where sheet i dominates sheet j: both ways between equal sheets, and of the
    strict ones only those with no sheet strictly between (the rest follow from them)."""
    rated = [i for i, s in enumerate(sheets) if s is not None]
    key = {i: (sheets[i].bandwidth_gbps, sheets[i].tflops) for i in rated}  # type: ignore[union-attr]
    equal = [(i, j) for i in rated for j in rated if i != j and key[i] == key[j]]
    below = {
        i: {j for j in rated if key[i] != key[j] and dominates(sheets[i], sheets[j])}  # type: ignore[arg-type]
        for i in rated
    }
    covers = []
    for i in rated:
        beneath: set[int] = set()
        for k in below[i]:
            beneath |= below[k]
        covers += [(i, j) for j in sorted(below[i] - beneath)]
    return equal + covers


def in_order_violations(
    entries: Sequence[DeviceCalibration], sheets: Sequence[Datasheet | None], rel: float = 1e-6
) -> list[str]:
    """Each figure of a dominating device worse than the dominated one's, as text
    (``h200 block 1.4e-04 > h100-sxm 0.0e+00``); empty when the entries are in order."""
    out = []
    names = [*COSTS, "compute", *_classes(entries)]
    every = [
        (i, j)
        for i, a in enumerate(sheets)
        for j, b in enumerate(sheets)
        if i != j and a is not None and b is not None and dominates(a, b)
    ]
    for i, j in every:
        a, b, sa, sb = entries[i], entries[j], sheets[i], sheets[j]
        assert sa is not None and sb is not None
        for name in names:
            va, vb = _keyed(a, sa, name), _keyed(b, sb, name)
            if va - vb > rel * max(abs(va), abs(vb), 1e-9):
                out.append(f"{a.device} {name} {va:.3e} > {b.device} {vb:.3e}")
    return out


def _moved_by_pooling(
    entries: Sequence[DeviceCalibration],
    sheets: Sequence[Datasheet | None],
    weights: Sequence[Mapping[str, float]],
) -> list[dict[str, float]]:
    """Per entry, the keyed figures (:func:`_keyed`) that pooling over the dominance order
    (:func:`pool_in_order`, weighted by ``weights[i][name]``) moves, with their pooled
    values."""
    pairs = dominance_pairs(sheets)
    moved: list[dict[str, float]] = [{} for _ in entries]
    idx = [i for i, s in enumerate(sheets) if s is not None]
    pos = {i: k for k, i in enumerate(idx)}
    for name in [*COSTS, "compute", *_classes(entries)]:
        vals = [_keyed(entries[i], sheets[i], name) for i in idx]  # type: ignore[arg-type]
        ws = [weights[i].get(name, 0.0) for i in idx]
        # Figures are stored rounded (fractions to 6 digits): smaller gaps are left to
        # ordered_entry, which keeps the order exactly where the profile is applied.
        out = pool_in_order(vals, ws, [(pos[i], pos[j]) for i, j in pairs], rel=1e-5)
        for k, i in enumerate(idx):
            if abs(out[k] - vals[k]) > 1e-5 * max(abs(vals[k]), 1e-12):
                moved[i][name] = out[k]
    return moved


def settle_in_order(
    entries: Sequence[DeviceCalibration],
    sheets: Sequence[Datasheet | None],
    weights: Sequence[Mapping[str, float]],
) -> tuple[DeviceCalibration, ...]:
    """``entries`` with any figure still out of datasheet order pooled into it
    (:func:`pool_in_order`, weighted by ``weights[i][name]``) and set as pooled, without
    refitting the rest: the last step after a fit in order
    (:func:`~stowplan.calibration.ordered_fit.fit_in_order`), whose figures, rounded as
    a profile stores them, can be a rounding step out."""
    moved = _moved_by_pooling(entries, sheets, weights)
    return tuple(
        _with(e, s, m) if m and s is not None else e
        for e, s, m in zip(entries, sheets, moved, strict=True)
    )


# -- applying -------------------------------------------------------------------------------

_Anchors = tuple[tuple[Datasheet, dict[str, float]], ...]
_ANCHORS: dict[int, tuple[Calibration, _Anchors]] = {}
_ORDERED: dict[tuple[int, str], tuple[Calibration, DeviceCalibration | None]] = {}
_MEASURED_WEIGHT = 1e6
"""Weight of a device entry at the datasheet its runs measured, per run, against 1 for
another GPU of the spec table that the profile resolves (to that entry or another)."""


def _anchors(calibration: Calibration) -> _Anchors:
    """The profile's figures at known datasheets, in order: each device entry at the
    datasheet its runs measured, and every GPU of the curated spec table at its own, with
    the figures its entry gives it; pooled over the dominance order (:func:`pool_in_order`,
    an entry at its measured datasheet outweighing the rest), so that they are in order
    even where the table's GPUs fall between the profile's devices."""
    hit = _ANCHORS.get(id(calibration))
    if hit is not None and hit[0] is calibration:
        return hit[1]
    rows: list[tuple[DeviceCalibration, Datasheet, float]] = []
    for entry in calibration.devices:
        sheet = entry_datasheet(calibration, entry)
        if sheet is not None:
            runs = sum(r.family == entry.device for r in calibration.fitted_runs)
            rows.append((entry, sheet, _MEASURED_WEIGHT * max(runs, 1)))
    for spec in GPU_SPECS:
        sheet = datasheet(spec.name)
        rated = calibration.for_device(spec.name)
        if sheet is not None and rated is not None:
            rows.append((rated, sheet, 1.0))
    sheets = [s for _, s, _ in rows]
    pairs = dominance_pairs(sheets)
    pooled: list[dict[str, float]] = [{} for _ in rows]
    for name in [*COSTS, "compute", *_classes([e for e, _, _ in rows])]:
        values = [_keyed(e, s, name) for e, s, _ in rows]
        for k, v in enumerate(pool_in_order(values, [w for _, _, w in rows], pairs)):
            pooled[k][name] = v
    found = tuple(zip(sheets, pooled, strict=True))
    if len(_ANCHORS) > 256:
        _ANCHORS.clear()
    _ANCHORS[id(calibration)] = (calibration, found)
    return found


def _clamp(value: float, lo: float, hi: float) -> float:
    return min(max(value, lo), hi)


def ordered_entry(calibration: Calibration, gpu_name: str) -> DeviceCalibration | None:
    """``calibration``'s entry for ``gpu_name`` (:meth:`Calibration.for_device`) with its
    figures kept between those of the profile's devices that dominate the GPU and those
    it dominates, and its bandwidth fractions at most 1 (see the module text); the entry
    as it is for a GPU the spec table does not rate, None when no entry matches."""
    key = (id(calibration), gpu_name)
    hit = _ORDERED.get(key)
    if hit is not None and hit[0] is calibration:
        return hit[1]
    entry = calibration.for_device(gpu_name)
    sheet = datasheet(gpu_name)
    result = entry
    if entry is not None and sheet is not None:
        anchors = _anchors(calibration)
        above = [v for s, v in anchors if dominates(s, sheet)]
        below = [v for s, v in anchors if dominates(sheet, s)]
        names = {*COSTS, "compute", *entry.bandwidth_fraction, *(n for _, v in anchors for n in v)}
        values = {}
        for name in sorted(names):
            own = _keyed(entry, sheet, name)
            lo = max((v.get(name, -math.inf) for v in above), default=-math.inf)
            hi = min((v.get(name, math.inf) for v in below), default=math.inf)
            if name not in (*COSTS, "compute"):
                lo = max(lo, -sheet.bandwidth_gbps)  # a fraction of at most 1
            values[name] = _clamp(own, lo, hi)
        changed = {n: v for n, v in values.items() if v != _keyed(entry, sheet, n)}
        result = _with(entry, sheet, changed) if changed else entry
    if len(_ORDERED) > 4096:
        _ORDERED.clear()
    _ORDERED[key] = (calibration, result)
    return result
