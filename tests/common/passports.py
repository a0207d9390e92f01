"""A CONSTRUCTED stand-in for a hardware passport, in the shape the calibration layer reads.

The calibration layer never imports the host layer: it reads a passport through
:class:`stowplan.calibration.PassportReading`, which this stand-in satisfies;
the numbers are chosen by the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

N = 50_000
"""GEMV side: 4 * N**2 = 1e10 bytes, so a GEMV of ``1e4 / gbps`` ms streams ``gbps`` GB/s."""


@dataclass(frozen=True)
class Cap:
    """One circuit's probe result streaming ``gbps`` GB/s through its GEMV."""

    circuit: str
    gbps: float
    decode_gbps: float | None = None
    decode_block_s: float | None = None
    backend: str = "synthetic"
    gemv_n: int = N
    repeats: int = 5

    @property
    def ms_per_gemv(self) -> float:
        return 1e4 / self.gbps

    @property
    def compute_bytes_per_s(self) -> float:
        return 4.0 * self.gemv_n**2 / (self.ms_per_gemv / 1e3)


@dataclass(frozen=True)
class Circuit:
    name: str


@dataclass(frozen=True)
class Topology:
    names: dict[str, str]

    def circuit(self, circuit_id: str) -> Circuit:
        return Circuit(self.names[circuit_id])


@dataclass(frozen=True)
class Matrix:
    entries: tuple[Cap, ...]


@dataclass(frozen=True)
class Passport:
    topology: Topology
    matrix: Matrix
    fingerprint: str = "0123456789abcdef"


def passport(*caps: Cap) -> Passport:
    """A passport of an RTX 4090 (``gpu0``) and a Ryzen CPU (``cpu``) measuring ``caps``."""
    names = {"gpu0": "NVIDIA GeForce RTX 4090", "cpu": "AMD Ryzen 9 7950X"}
    return Passport(topology=Topology(names), matrix=Matrix(caps))
