"""Device entries from the host probe's measured matrix (a hardware passport).

The calibration layer sits below the host layer, so it reads a passport
through the structural protocols here (:class:`PassportReading` and the
shapes inside it) rather than importing :mod:`stowplan.host`; the host's
``Passport`` satisfies them as it is.  Pure: no file is read here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from stowplan.calibration.device import device_key, device_match, spec_bandwidth_gbps
from stowplan.calibration.profile import (
    MAX_BANDWIDTH_FRACTION,
    Calibration,
    DeviceCalibration,
    Figure,
    Provenance,
    assumed,
)

__all__ = ["PassportReading", "ProbeCapability", "probe_entries"]


class ProbeCapability(Protocol):
    """What the probe measured on one circuit (the host's ``CircuitCapability``)."""

    @property
    def circuit(self) -> str:
        """Id of the circuit in the passport's topology."""

    @property
    def backend(self) -> str:
        """The GEMV's backend (``numpy``, ``torch-cuda``)."""

    @property
    def gemv_n(self) -> int:
        """Side of the square f32 GEMV matrix."""

    @property
    def ms_per_gemv(self) -> float:
        """Median milliseconds per GEMV."""

    @property
    def repeats(self) -> int:
        """GEMVs the median is taken over."""

    @property
    def compute_bytes_per_s(self) -> float:
        """Bytes the GEMV streams per second."""

    @property
    def decode_gbps(self) -> float | None:
        """GB/s of the f16 decode-shaped run, None when not measured."""

    @property
    def decode_block_s(self) -> float | None:
        """Fixed seconds per block of that run, None when not measured."""


class ProbeCircuit(Protocol):
    """A circuit of the passport's topology (only its name is read)."""

    @property
    def name(self) -> str:
        """The device's name, e.g. ``NVIDIA GeForce RTX 4090`` or a CPU's model."""


class ProbeTopology(Protocol):
    """The passport's topology: circuits by id."""

    def circuit(self, circuit_id: str) -> ProbeCircuit:
        """The circuit with ``circuit_id``."""


class ProbeMatrix(Protocol):
    """The passport's measured matrix."""

    @property
    def entries(self) -> Sequence[ProbeCapability]:
        """One measurement per benchmarked circuit."""


class PassportReading(Protocol):
    """A hardware passport as :func:`probe_entries` reads it."""

    @property
    def fingerprint(self) -> str:
        """Hash of the host's topology."""

    @property
    def topology(self) -> ProbeTopology:
        """The host's circuits."""

    @property
    def matrix(self) -> ProbeMatrix:
        """What the probe measured."""


def probe_entries(passport: PassportReading, prior: Calibration) -> tuple[DeviceCalibration, ...]:
    """One device entry per circuit the host probe measured (its GEMV streaming rate).

    A circuit whose name is in the GPU spec table gets ``measured rate / spec
    peak`` as its f32 bandwidth fraction, the baseline of nodes described by
    name; any other circuit (a CPU) gets 1.0: its nodes take the measured rate
    itself as their bandwidth.  When the passport holds a decode run, a GPU
    also gets its f16 fraction and its measured per-block cost.  Every other
    figure is kept from ``prior``'s entry for that device (else its last entry) and
    labelled ``assumed``.
    Fractions are capped at ``MAX_BANDWIDTH_FRACTION`` and rounded to 4 places.
    """
    entries = []
    for cap in passport.matrix.entries:
        name = passport.topology.circuit(cap.circuit).name
        measured_gbps = cap.compute_bytes_per_s / 1e9
        spec_gbps = spec_bandwidth_gbps(name)
        where = (
            f"stowplan probe: {cap.backend} f32 GEMV {cap.gemv_n}x{cap.gemv_n}, "
            f"{cap.ms_per_gemv:.3f} ms median of {cap.repeats}, {measured_gbps:.1f} GB/s, "
            f"passport {passport.fingerprint[:12]}"
        )
        if spec_gbps:
            value, source = measured_gbps / spec_gbps, f"{where} / spec {spec_gbps:g} GB/s"
        else:
            value, source = 1.0, f"{where}; no spec peak: the measured rate is the bandwidth"
        base = prior.for_device(name) or prior.devices[-1]
        # What the probe did not measure is the prior's figure, labelled assumed.
        fractions = {c: assumed(f) for c, f in base.bandwidth_fraction.items()}
        fractions["f32"] = Figure(
            value=round(min(value, MAX_BANDWIDTH_FRACTION), 4),
            provenance=Provenance.MEASURED,
            source=source,
        )
        block = assumed(base.block_overhead_s)
        if cap.decode_gbps is not None and cap.decode_block_s is not None:
            run = (
                f"stowplan probe decode run: f16 block GEMVs, {cap.decode_gbps:.1f} GB/s, "
                f"{cap.decode_block_s * 1e6:.1f} us/block, passport {passport.fingerprint[:12]}"
            )
            if spec_gbps:
                fractions["f16"] = Figure(
                    value=round(min(cap.decode_gbps / spec_gbps, MAX_BANDWIDTH_FRACTION), 4),
                    provenance=Provenance.MEASURED,
                    source=f"{run} / spec {spec_gbps:g} GB/s",
                )
            block = Figure(value=cap.decode_block_s, provenance=Provenance.MEASURED, source=run)
        entries.append(
            DeviceCalibration(
                device=device_key(name),
                match=device_match(name),
                bandwidth_fraction=fractions,
                block_overhead_s=block,
                hop_overhead_s=assumed(base.hop_overhead_s),
                collective_overhead_s=assumed(base.collective_overhead_s),
                compute_efficiency=assumed(base.compute_efficiency),
            )
        )
    return tuple(entries)
