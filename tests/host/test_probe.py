"""The probe runs for real on this machine (quick mode) and gives a sane matrix."""

from __future__ import annotations

import math

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from stowplan.circuits import CircuitKind, PoolKind
from stowplan.errors import InputError
from stowplan.host.bench import BenchSettings, blas_threads, measure, measure_cpu
from stowplan.host.discover import _nvml, discover


def test_discovery_without_an_nvidia_driver_is_a_cpu_topology_not_an_error() -> None:
    report, note, _fabrics = _nvml()
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
    assert cpu is not None and cpu.in_pool and cpu.backend.startswith("numpy (")
    assert cpu.repeats == 5 and cpu.gemv_n == 4096
    assert 0 <= cpu.ms_spread < 10
    assert cpu.compute_bytes_per_s == 4 * 4096**2 / (cpu.ms_per_gemv / 1e3)


def test_progress_is_reported_for_every_pass() -> None:
    seen: list[tuple[str, int, int]] = []
    settings = BenchSettings(gemv_n=512, ring_bytes=4 << 20, warmup=2, repeats=3)
    measure_cpu(settings, lambda label, done, total: seen.append((label, done, total)))
    assert seen == [("cpu", i, 5) for i in range(1, 6)]


def _blas_threads_now() -> list[int]:
    return [int(i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas"]


def test_a_probe_at_one_blas_thread_records_it_and_leaves_the_blas_as_it_was() -> None:
    before = _blas_threads_now()
    cpu = measure_cpu(BenchSettings(gemv_n=512, ring_bytes=4 << 20, warmup=1, repeats=2, threads=1))
    assert cpu.backend.startswith("numpy (") and cpu.backend.endswith(", 1 thread)")
    assert math.isfinite(cpu.compute_bytes_per_s) and cpu.compute_bytes_per_s > 0
    assert _blas_threads_now() == before


def test_blas_threads_limits_only_inside_the_block() -> None:
    np.ones(4) @ np.ones(4)  # numpy's BLAS is loaded
    before = _blas_threads_now()
    with blas_threads(1) as label:
        assert _blas_threads_now() == [1] * len(before)
        assert label.endswith(", 1 thread)")
    assert _blas_threads_now() == before
    with blas_threads(None) as label:
        plural = "" if before[0] == 1 else "s"
        assert label.startswith("numpy (") and label.endswith(f", {before[0]} thread{plural})")


@pytest.mark.parametrize("threads", [0, -2, True, 1.5])
def test_the_probe_thread_count_must_be_a_positive_integer(threads: object) -> None:
    with pytest.raises(InputError) as e:
        BenchSettings(threads=threads)  # type: ignore[arg-type]
    assert str(e.value) == f"threads={threads!r}: must be an integer >= 1, or None"


def test_on_an_nvidia_host_every_gpu_circuit_carries_its_fabric_facts() -> None:
    report, _note, fabrics = _nvml()
    if report is None or not report.gpus:
        pytest.skip("no NVIDIA GPU visible through NVML on this machine")
    topo = discover()
    gpus = [c for c in topo.circuits if c.id.startswith("gpu")]
    assert gpus and all(c.fabric is not None and "state" in c.fabric for c in gpus)
    assert len(fabrics) in (0, len(gpus))
