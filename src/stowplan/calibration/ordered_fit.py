"""Fit several devices at once, their figures held in datasheet order.

Each device alone is fitted by least squares (:func:`~stowplan.calibration.fit.fit_device`:
the relative time error of its runs, a small pull towards the prior).  Fitted one by
one, a device whose datasheet dominates another's (:mod:`.order`) can come out with a
worse figure, say a larger block cost from a build that paid more per kernel launch.
Here every device's system is solved together, as one least-squares problem, with the
order as linear constraints for every dominating pair (i, j) and figure:

* a dtype class's effective bandwidth: ``bw_i / u_i >= bw_j / u_j`` (``u = 1 / fraction``,
  ``bw`` the datasheet's), i.e. ``u_i / bw_i - u_j / bw_j <= 0``;
* a fixed cost (block, hop, collective): ``c_i <= c_j``.

The order costs the fit only where it binds, and then the figures that give way are the
ones the runs determine least (a figure a device has no run for moves freely: only its
prior row weighs against it), rather than every violating figure going to its pair's
mean.  The result is, per device, the figures the order moved from that device's own fit;
:func:`~stowplan.calibration.fit.fit_device` with them ``fixed`` gives the device's entry.

The problem (a few hundred unknowns) is solved exactly as a least-squares problem with
linear inequality constraints, by one nonnegative least squares (bounded-variable least
squares, ``scipy.optimize.lsq_linear``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stowplan.calibration.fit import Measurement, device_system, least_squares, prior_row_weight
from stowplan.calibration.order import Datasheet, cost_figure, dominance_pairs
from stowplan.calibration.profile import MAX_BANDWIDTH_FRACTION, DeviceCalibration
from stowplan.errors import DependencyError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["DeviceRuns", "fit_in_order"]

_COSTS = ("block", "hop", "collective")
_BVLS_STEPS = 10_000
"""Most iterations of the bounded-variable least squares (a few hundred unknowns)."""

_MOVED = 1e-6
"""A figure moved by the order when it differs from the device's own fit by more than
this, relative (below: solver noise)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceRuns:
    """One device's runs and how :func:`~stowplan.calibration.fit.fit_device` fits them."""

    measurements: tuple[Measurement, ...]
    bandwidth_gbps: float
    """The bandwidth the measurements are relative to (one GPU's), GB/s."""
    prior: DeviceCalibration
    max_fraction: float = MAX_BANDWIDTH_FRACTION
    fit_collective: bool | None = None


def _own_fit(a: list[list[float]], b: list[float], lower: list[float]) -> list[float]:
    """Least squares with lower bounds, as fit_device clamps: pin what leaves its range."""
    n = len(lower)
    pinned: dict[int, float] = {}
    x = [0.0] * n
    for _ in range(n + 1):
        free = [i for i in range(n) if i not in pinned]
        rhs = [
            bi - sum(row[i] * v for i, v in pinned.items()) for row, bi in zip(a, b, strict=True)
        ]
        sol = least_squares([[row[i] for i in free] for row in a], rhs) if free else []
        x = [0.0] * n
        for i, v in pinned.items():
            x[i] = v
        for i, v in zip(free, sol, strict=True):
            x[i] = v
        bad = [i for i in free if x[i] < lower[i]]
        if not bad:
            break
        pinned.update({i: lower[i] for i in bad})
    return x


def fit_in_order(
    devices: Sequence[DeviceRuns],
    sheets: Sequence[Datasheet | None],
    *,
    prior_weight: float = 0.01,
) -> list[dict[str, float]]:
    """The figures of each of ``devices`` that their datasheet order (``sheets``, None:
    out of the order) moves from the device's own fit, by name: ``block``, ``hop``,
    ``collective`` in seconds, a dtype class as its bandwidth fraction.

    Step 1 builds each device's least-squares system (:func:`device_system`), widened to
    every figure any device has (a figure a device's runs do not determine: its prior
    row only).  Step 2 solves them jointly under the order constraints (see the module
    text), from each device's own fit.  Step 3 reports what moved.  Raises
    :class:`~stowplan.errors.DependencyError` without scipy.
    """
    try:
        import numpy as np
    except ImportError:
        raise DependencyError("scipy", "exact") from None
    # Step 1: one block of unknowns per device, over every figure of any device.
    systems = [
        device_system(
            d.measurements,
            bandwidth_gbps=d.bandwidth_gbps,
            prior=d.prior,
            prior_weight=prior_weight,
            max_fraction=d.max_fraction,
            fit_collective=d.fit_collective,
        )
        for d in devices
    ]
    classes = sorted({c for s in systems for c in s.classes})
    names = [*classes, *_COSTS]
    width = len(names)
    rows: list[np.ndarray] = []
    rhs: list[float] = []
    lower = np.zeros(len(devices) * width)
    own = np.zeros(len(devices) * width)
    for k, (d, s) in enumerate(zip(devices, systems, strict=True)):
        base = k * width
        col = {n: base + names.index(n) for n in s.names}
        extra = [n for n in names if n not in s.names]
        for row, r in zip(s.rows, s.rhs, strict=True):
            full = np.zeros(len(devices) * width)
            for n, v in zip(s.names, row, strict=True):
                full[col[n]] = v
            rows.append(full)
            rhs.append(r)
        for n in extra:
            p = (
                1.0 / d.prior.fraction(n).value
                if n in classes
                else cost_figure(d.prior, n) / s.t_ref
            )
            w = prior_row_weight(n, p, prior_weight)
            full = np.zeros(len(devices) * width)
            full[base + names.index(n)] = w
            rows.append(full)
            rhs.append(w * p)
        lo = [*s.lower]
        x = _own_fit([list(r) for r in s.rows], list(s.rhs), lo)
        for n, v, lb in zip(s.names, x, lo, strict=True):
            own[col[n]], lower[col[n]] = v, lb
        for n in extra:
            j = base + names.index(n)
            if n in classes:
                own[j] = 1.0 / d.prior.fraction(n).value
                lower[j] = 1.0 / d.max_fraction
            else:
                own[j] = cost_figure(d.prior, n) / s.t_ref
    # Step 2: the order as linear constraints, c · x <= 0 per pair and figure.
    constraints = []
    for i, j in dominance_pairs(sheets):
        si, sj = sheets[i], sheets[j]
        assert si is not None and sj is not None
        for n in names:
            c = np.zeros(len(devices) * width)
            a, b = i * width + names.index(n), j * width + names.index(n)
            if n in classes:
                c[a], c[b] = 1.0 / si.bandwidth_gbps, -1.0 / sj.bandwidth_gbps
            else:
                c[a], c[b] = systems[i].t_ref, -systems[j].t_ref
            constraints.append(c)
    moved: list[dict[str, float]] = [{} for _ in devices]
    if not constraints or all(float(c @ own) <= 1e-12 for c in constraints):
        return moved  # the devices' own fits are in order
    # Unknowns scaled to their own fit's size (a cost is a few 1e-3 of t_ref, a u near 1).
    scale = np.maximum(np.abs(own), np.where(lower > 0, lower, 1e-3))
    cons = np.array(constraints) * scale
    cons /= np.abs(cons).max(axis=1, keepdims=True)
    solved = scale * _least_squares_above(
        np.array(rows) * scale,
        np.array(rhs),
        np.vstack([-cons, np.eye(len(lower))]),
        np.concatenate([np.zeros(len(cons)), lower / scale]),
    )
    # Step 3: what moved, in profile units.
    for k, s in enumerate(systems):
        for n in names:
            j = k * width + names.index(n)
            v, o = float(solved[j]), float(own[j])
            if abs(v - o) <= _MOVED * max(abs(o), 1e-3):
                continue
            moved[k][n] = 1.0 / v if n in classes else max(v, 0.0) * s.t_ref
    return moved


def _least_squares_above(e: np.ndarray, f: np.ndarray, g: np.ndarray, h: np.ndarray) -> np.ndarray:
    """``argmin |e x - f|`` subject to ``g x >= h`` (``e`` of full column rank), by Lawson
    and Hanson's reduction (*Solving Least Squares Problems*, ch. 23) to a least distance
    problem and that to one nonnegative least squares, solved by bounded-variable least
    squares (``scipy.optimize.lsq_linear``, BVLS).  Not ``scipy.optimize.nnls``: on some
    CPUs it returned, for the published runs' fit, a vector whose residual was not the one
    it reported, and the fit a collective cost of 7.9 s."""
    import numpy as np
    from scipy.optimize import lsq_linear

    # Step 1: e = q r; with z = r x - q' f the objective is |z| (plus a constant).
    q, r = np.linalg.qr(e)
    f1 = q.T @ f
    g_r = np.linalg.solve(r.T, g.T).T  # g r^-1
    h_z = h - g_r @ f1
    # Step 2: min |z| s.t. g_r z >= h_z, from the nonnegative u nearest [g_r'; h_z'] u = e_n+1.
    n = e.shape[1]
    lhs = np.vstack([g_r.T, h_z[None, :]])
    rhs = np.zeros(n + 1)
    rhs[n] = 1.0
    u = lsq_linear(lhs, rhs, bounds=(0.0, np.inf), method="bvls", tol=1e-14, max_iter=_BVLS_STEPS).x
    resid = lhs @ u - rhs
    if abs(resid[n]) < 1e-12:
        raise ValueError("datasheet-order constraints are infeasible")  # pragma: no cover
    z = -resid[:n] / resid[n]
    # Step 3: back to x.
    return np.asarray(np.linalg.solve(r, z + f1))
