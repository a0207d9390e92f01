"""The probe runs for real on this machine (quick mode) and gives a sane matrix."""

from __future__ import annotations

import math

from stowplan.host.bench import BenchSettings, measure, measure_cpu
from stowplan.host.discover import _nvml, discover
from stowplan.host.topology import CircuitKind, PoolKind


def test_discovery_without_an_nvidia_driver_is_a_cpu_topology_not_an_error() -> None:
    report, note = _nvml()
    if report is None:  # this machine: no NVIDIA driver
        assert note.startswith(("NVML unavailable", "nvidia-ml-py is not installed"))
    topo = discover()
    cpu = topo.circuit("cpu")
    assert cpu.kind is CircuitKind.CPU
    assert topo.pool(cpu.pool).kind is PoolKind.SYSTEM
    assert topo.ram_bytes > 2**30
    assert topo.cpu_count >= 1
    if report is None:
        assert topo.source == "none"
        assert [c.kind for c in topo.circuits if c.kind is CircuitKind.DGPU] == []


def test_quick_probe_gives_positive_finite_ordered_figures() -> None:
    topo = discover()
    matrix, _ = measure(topo, quick=True)
    assert matrix.quick
    assert matrix.order[0] in {c.id for c in topo.circuits}
    rates = [e.compute_bytes_per_s for e in matrix.entries]
    assert all(math.isfinite(r) and r > 1e8 for r in rates)  # > 0.1 GB/s
    assert rates == sorted(rates, reverse=True)
    cpu = matrix.get("cpu")
    assert cpu is not None and cpu.in_pool and cpu.backend == "numpy"
    assert cpu.repeats == 5 and cpu.gemv_n == 4096
    assert 0 <= cpu.ms_spread < 10
    assert cpu.compute_bytes_per_s == 4 * 4096**2 / (cpu.ms_per_gemv / 1e3)


def test_progress_is_reported_for_every_pass() -> None:
    seen: list[tuple[str, int, int]] = []
    settings = BenchSettings(gemv_n=512, ring_bytes=4 << 20, warmup=2, repeats=3)
    measure_cpu(settings, lambda label, done, total: seen.append((label, done, total)))
    assert seen == [("cpu", i, 5) for i in range(1, 6)]
