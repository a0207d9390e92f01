"""Fit a device's calibration figures from measured decode speeds.

Every measurement is one decode run at batch 1: tokens/s for a model that
reads ``read_bytes`` per token through ``num_blocks`` blocks and ``hops``
stage hops, on ``tensor_parallel`` GPUs that split every block.  Its time per
token is linear in the unknowns::

    1 / tokens_per_s = (read_bytes / (BW * tp)) * u[dtype] + num_blocks * c_block
                       + hops * c_hop + [tp > 1] * num_blocks * c_collective

with ``u = 1 / bandwidth_fraction``.  The fit minimises the squared relative
error of the time per token plus a small pull towards the prior profile (so a
dtype seen once, or a single model size, still gives a sane split between the
fraction and the fixed cost), keeps the fixed costs >= 0 and every fraction
in (0, MAX_BANDWIDTH_FRACTION].  Figures may be held at given values (``fixed``): the
rest are fitted around them (:mod:`.order` holds devices' figures in datasheet order
that way).  Pure Python: the systems have a handful of unknowns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import median

from stowplan.calibration.apply import stage_time_s
from stowplan.calibration.profile import (
    MAX_BANDWIDTH_FRACTION,
    DeviceCalibration,
    Figure,
    Provenance,
    assumed,
    dtype_class,
)
from stowplan.errors import InputError

__all__ = [
    "DeviceSystem",
    "FitResult",
    "Measurement",
    "device_system",
    "fit_device",
    "least_squares",
    "prior_row_weight",
]

_MAX_FRACTION = MAX_BANDWIDTH_FRACTION
_FIGURES = ("block", "hop", "collective")
"""Names of the fixed costs ``fixed`` may hold (anything else is a dtype class)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """One measured decode run."""

    tokens_per_s: float
    read_bytes: int
    """Bytes one token reads (the weights, for a dense model at batch 1)."""
    num_blocks: int
    dtype: str | None = None
    hops: int = 0
    tensor_parallel: int = 1
    """GPUs every block is split over (their bandwidths add up)."""
    label: str = ""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.tokens_per_s) and self.tokens_per_s > 0):
            raise InputError(
                f"{self.label or 'measurement'}.tokens_per_s",
                self.tokens_per_s,
                "must be a finite number > 0",
            )
        if self.read_bytes <= 0:
            raise InputError(
                f"{self.label or 'measurement'}.read_bytes", self.read_bytes, "must be > 0"
            )
        if self.num_blocks < 0 or self.hops < 0:
            raise InputError(
                f"{self.label or 'measurement'}.num_blocks",
                (self.num_blocks, self.hops),
                "num_blocks and hops must be >= 0",
            )
        if self.tensor_parallel < 1:
            raise InputError(
                f"{self.label or 'measurement'}.tensor_parallel",
                self.tensor_parallel,
                "must be >= 1",
            )

    @property
    def collective_blocks(self) -> int:
        """Blocks that pay a tensor-parallel collective (0 on one GPU)."""
        return self.num_blocks if self.tensor_parallel > 1 else 0


@dataclass(frozen=True, slots=True, kw_only=True)
class FitResult:
    """The fitted device entry and how well it explains the measurements."""

    device: DeviceCalibration
    predicted_tokens_per_s: tuple[float, ...]
    relative_errors: tuple[float, ...]
    """(predicted - measured) / measured, per measurement."""

    @property
    def median_abs_error(self) -> float:
        return median(abs(e) for e in self.relative_errors)


def least_squares(a: list[list[float]], b: list[float]) -> list[float]:
    """Least squares ``min |A x - b|`` by the normal equations (small, well-scaled systems)."""
    n = len(a[0])
    m = [[sum(r[i] * r[j] for r in a) for j in range(n)] for i in range(n)]
    v = [sum(r[i] * bi for r, bi in zip(a, b, strict=True)) for i in range(n)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-300:
            raise InputError("measurements", f"<{len(a)} rows>", "do not determine the figures")
        m[col], m[piv] = m[piv], m[col]
        v[col], v[piv] = v[piv], v[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
                v[r] -= f * v[col]
    return [v[i] / m[i][i] for i in range(n)]


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceSystem:
    """The least-squares system :func:`fit_device` solves for one device.

    Unknowns ``x``, by ``names``: one per dtype class (``1 / bandwidth_fraction``), then
    ``block`` and, where fitted, ``hop`` and ``collective`` (each in units of ``t_ref``
    seconds).  ``rows`` · x ≈ ``rhs``: first one row per measurement (its relative time
    error), then one prior row per unknown (the pull towards ``prior_x``).  ``lower``
    bounds each unknown (a fraction at most the cap, a cost at least 0).
    """

    classes: tuple[str, ...]
    names: tuple[str, ...]
    rows: tuple[tuple[float, ...], ...]
    rhs: tuple[float, ...]
    prior_x: tuple[float, ...]
    lower: tuple[float, ...]
    t_ref: float
    """The median measured time per token, seconds: the unit of the fixed costs in ``x``."""


def device_system(
    measurements: Sequence[Measurement],
    *,
    bandwidth_gbps: float,
    prior: DeviceCalibration,
    prior_weight: float = 0.01,
    max_fraction: float = MAX_BANDWIDTH_FRACTION,
    fit_collective: bool | None = None,
) -> DeviceSystem:
    """The system :func:`fit_device` solves (see there for the arguments and errors)."""
    if not measurements:
        raise InputError("measurements", 0, "need at least one decode measurement")
    if not (math.isfinite(bandwidth_gbps) and bandwidth_gbps > 0):
        raise InputError("bandwidth_gbps", bandwidth_gbps, "must be a finite number > 0")
    if not (math.isfinite(max_fraction) and 0 < max_fraction <= _MAX_FRACTION):
        raise InputError("max_fraction", max_fraction, f"must be in (0, {_MAX_FRACTION}]")
    bw = bandwidth_gbps * 1e9
    times = [1.0 / m.tokens_per_s for m in measurements]
    t_ref = median(times)
    classes = sorted({dtype_class(m.dtype) for m in measurements})
    fit_hops = any(m.hops > 0 for m in measurements)
    split = {m.tensor_parallel > 1 for m in measurements}
    fit_coll = (
        split == {True, False} if fit_collective is None else fit_collective and True in split
    )
    # Step 1: unknown vector x = [u_class..., c_block / t_ref, (c_hop / t_ref), (c_coll / t_ref)].
    names = [
        *classes,
        "block",
        *(["hop"] if fit_hops else []),
        *(["collective"] if fit_coll else []),
    ]
    i_block = len(classes)
    i_hop = i_block + 1 if fit_hops else -1
    i_coll = len(names) - 1 if fit_coll else -1
    prior_x = [1.0 / prior.fraction(c).value for c in classes]
    prior_x.append(prior.block_overhead_s.value / t_ref)
    if fit_hops:
        prior_x.append(prior.hop_overhead_s.value / t_ref)
    if fit_coll:
        prior_x.append(prior.collective_overhead_s.value / t_ref)
    # Step 2: rows scaled by 1/t_i (relative error), then prior rows.
    rows: list[tuple[float, ...]] = []
    rhs: list[float] = []
    for m, t in zip(measurements, times, strict=True):
        row = [0.0] * len(names)
        row[classes.index(dtype_class(m.dtype))] = m.read_bytes / (bw * m.tensor_parallel) / t
        row[i_block] = m.num_blocks * t_ref / t
        if fit_hops:
            row[i_hop] = m.hops * t_ref / t
        # A collective kept from the prior still costs its time: it leaves the rest to fit.
        kept = 0.0
        if fit_coll:
            row[i_coll] = m.collective_blocks * t_ref / t
        else:
            kept = m.collective_blocks * prior.collective_overhead_s.value
        rows.append(tuple(row))
        rhs.append(1.0 - kept / t)
    for i, p in enumerate(prior_x):
        row = [0.0] * len(names)
        row[i] = prior_row_weight(names[i], p, prior_weight)
        rows.append(tuple(row))
        rhs.append(row[i] * p)
    return DeviceSystem(
        classes=tuple(classes),
        names=tuple(names),
        rows=tuple(rows),
        rhs=tuple(rhs),
        prior_x=tuple(prior_x),
        lower=tuple(1.0 / max_fraction if i < len(classes) else 0.0 for i in range(len(names))),
        t_ref=t_ref,
    )


def prior_row_weight(name: str, prior_x: float, prior_weight: float = 0.01) -> float:
    """The weight of the prior row of unknown ``name`` (a dtype class or a fixed cost) at
    ``prior_x`` in :class:`DeviceSystem` units: relative for a fraction, per ``t_ref`` for a
    cost."""
    lam = math.sqrt(prior_weight)
    return lam * 10.0 if name in _FIGURES else lam / max(abs(prior_x), 1e-3)


def _same(figure: Figure) -> Figure:
    return figure


def fit_device(
    measurements: Sequence[Measurement],
    *,
    bandwidth_gbps: float,
    prior: DeviceCalibration,
    device: str,
    match: Sequence[str] = (),
    prior_weight: float = 0.01,
    source: str = "",
    max_fraction: float = MAX_BANDWIDTH_FRACTION,
    fit_collective: bool | None = None,
    label_assumed: bool = True,
    fixed: Mapping[str, float] | None = None,
) -> FitResult:
    """Fit ``device``'s bandwidth fraction per dtype class, block, hop and collective costs.

    ``bandwidth_gbps`` is one GPU's; a run on several GPUs streams through all of
    them.  The hop cost is fitted only when some run has hops.  The collective
    cost is fitted only when runs on one GPU and on several are both present
    (``fit_collective`` None), or when ``fit_collective`` says so: with only
    tensor-parallel runs it cannot be told from the block cost, so the prior's
    figure is kept and the block cost takes the rest.  ``max_fraction`` caps
    the bandwidth fractions (1.0 for a GPU, whose datasheet peak is a ceiling;
    the default allows a CPU's cache-served working set).

    ``prior`` supplies the starting figures and every figure the data cannot
    determine (the compute efficiency always: batch-1 decode is memory-bound); those
    are labelled ``assumed`` (:func:`~stowplan.calibration.profile.assumed`), the
    fitted ones ``fitted``.  ``label_assumed=False`` keeps the prior's labels instead
    (a shipped profile fitted on top of its own table).
    ``prior_weight`` is the weight of each prior row relative to one
    measurement's relative error.  ``fixed`` holds figures at given values and fits the
    rest around them: ``block``, ``hop``, ``collective`` (seconds) or a dtype class
    (its bandwidth fraction); a held figure the runs do not determine is set as given.
    Raises :class:`InputError` when there are no measurements or the bandwidth is not
    positive.
    """
    system = device_system(
        measurements,
        bandwidth_gbps=bandwidth_gbps,
        prior=prior,
        prior_weight=prior_weight,
        max_fraction=max_fraction,
        fit_collective=fit_collective,
    )
    classes, names, t_ref = system.classes, system.names, system.t_ref
    fit_hops, fit_coll = "hop" in names, "collective" in names
    i_block = names.index("block")
    i_hop = names.index("hop") if fit_hops else -1
    i_coll = names.index("collective") if fit_coll else -1
    held = dict(fixed or {})
    pinned: dict[int, float] = {
        i: (1.0 / held[n] if i < len(classes) else held[n] / t_ref)
        for i, n in enumerate(names)
        if n in held
    }
    rows, rhs = system.rows, system.rhs
    for _ in range(len(names) + 1):
        free = [i for i in range(len(names)) if i not in pinned]
        b = [
            r - sum(row[i] * v for i, v in pinned.items()) for row, r in zip(rows, rhs, strict=True)
        ]
        sol = least_squares([[row[i] for i in free] for row in rows], b) if free else []
        x = [0.0] * len(names)
        for i, v in pinned.items():
            x[i] = v
        for i, v in zip(free, sol, strict=True):
            x[i] = v
        # Step 3: clamp what left its range and refit the rest.
        bad = [i for i in free if x[i] < system.lower[i]]
        if not bad:
            break
        for i in bad:
            pinned[i] = system.lower[i]
    note = source or f"least squares on {len(measurements)} decode runs"
    fitted = Provenance.FITTED
    # What the runs did not determine is the prior's figure, labelled assumed.
    carry = assumed if label_assumed else _same
    fractions = {c: carry(f) for c, f in prior.bandwidth_fraction.items()}
    for i, c in enumerate(classes):
        fractions[c] = Figure(value=round(1.0 / x[i], 4), provenance=fitted, source=note)
    block = Figure(value=round(x[i_block] * t_ref, 9), provenance=fitted, source=note)
    hop = (
        Figure(value=round(x[i_hop] * t_ref, 9), provenance=fitted, source=note)
        if fit_hops
        else carry(prior.hop_overhead_s)
    )
    collective = (
        Figure(value=round(x[i_coll] * t_ref, 9), provenance=fitted, source=note)
        if fit_coll
        else carry(prior.collective_overhead_s)
    )
    if held:
        # A held figure keeps the fit's label; its source says it was held in order.
        note = f"{note}; held in order with other devices' figures"

        def hold(name: str, figure: Figure) -> Figure:
            if name not in held:
                return figure
            digits = 9 if name in _FIGURES else 6
            return Figure(value=round(held[name], digits), provenance=fitted, source=note)

        extra = {c for c in held if c not in _FIGURES}
        fractions = {
            c: hold(c, fractions.get(c, fractions["default"])) for c in {*fractions, *extra}
        }
        block, hop = hold("block", block), hold("hop", hop)
        collective = hold("collective", collective)
    entry = DeviceCalibration(
        device=device,
        match=tuple(match),
        bandwidth_fraction=fractions,
        block_overhead_s=block,
        hop_overhead_s=hop,
        collective_overhead_s=collective,
        compute_efficiency=carry(prior.compute_efficiency),
    )
    # Predict each run as the cost model times it: the fitted entry through stage_time_s.
    predicted = [
        1.0
        / stage_time_s(
            read_bytes=m.read_bytes,
            params=0,
            num_blocks=m.num_blocks,
            bandwidth_gbps=bandwidth_gbps * m.tensor_parallel,
            tflops=0.0,
            dtype=m.dtype,
            hops=m.hops,
            tensor_parallel=m.tensor_parallel,
            device=entry,
        )
        for m in measurements
    ]
    errors = tuple(
        (p - m.tokens_per_s) / m.tokens_per_s for p, m in zip(predicted, measurements, strict=True)
    )
    return FitResult(device=entry, predicted_tokens_per_s=tuple(predicted), relative_errors=errors)
