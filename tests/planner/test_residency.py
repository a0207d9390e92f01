"""The residency planner (seed 004, D31) on synthetic profiles: each protocol, the boundaries."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stowplan.errors import InputError, InsufficientVram
from stowplan.planner.residency import (
    DEFAULT_RESIDENCY_HEADROOM_FRAC,
    PlacementRole,
    ResidencyProtocol,
    employment_from_json,
    employment_to_json,
    plan_employment,
)
from tests.common.host import GIB, cap, fixture_topology, host, matrix


def test_model_that_fits_the_primary_is_resident() -> None:
    topo = host(vram=24 * GIB)
    m = matrix(cap("gpu0", 1000.0, upload_gbps=25.0), cap("cpu", 50.0))
    p = plan_employment(topo, m, 10 * GIB)
    assert p.protocol is ResidencyProtocol.RESIDENT
    assert (p.primary, p.resident_bytes, p.overflow_bytes) == ("gpu0", 10 * GIB, 0)
    assert p.priority == ("gpu0", "cpu")
    assert p.estimates == ()
    assert p.predicted_s_per_token == pytest.approx(10 * GIB / 1e12)
    assert [(pl.circuit, pl.role) for pl in p.placements] == [
        ("gpu0", PlacementRole.PRIMARY),
        ("cpu", PlacementRole.IDLE),
    ]


def test_exact_fit_is_resident_and_one_more_byte_overflows() -> None:
    topo = host(vram=20 * GIB)
    m = matrix(cap("gpu0", 1000.0, upload_gbps=25.0), cap("cpu", 50.0))
    budget = math.floor(20 * GIB * (1 - DEFAULT_RESIDENCY_HEADROOM_FRAC))
    assert plan_employment(topo, m, budget).protocol is ResidencyProtocol.RESIDENT
    over = plan_employment(topo, m, budget + 1)
    assert over.protocol is not ResidencyProtocol.RESIDENT
    assert (over.resident_bytes, over.overflow_bytes) == (budget, 1)


def test_fast_but_far_loses_to_slower_but_in_place() -> None:
    # dGPU 1000 GB/s behind a 16 GB/s bus; iGPU 40 GB/s reading RAM in place.
    topo = host(vram=8 * GIB, igpu=True)
    m = matrix(cap("gpu0", 1000.0, upload_gbps=16.0), cap("igpu0", 40.0), cap("cpu", 20.0))
    p = plan_employment(topo, m, 20 * GIB, vram_headroom_frac=0.0)
    overflow = 12 * GIB
    stream = overflow / 1e12 + overflow / 16e9
    igpu = overflow / 40e9
    assert igpu < stream
    assert p.protocol is ResidencyProtocol.HETEROGENEOUS_OVERFLOW
    by = {(e.protocol, e.circuit): e.total_s for e in p.estimates}
    assert by[(ResidencyProtocol.HETEROGENEOUS_OVERFLOW, "igpu0")] == pytest.approx(igpu)
    assert by[(ResidencyProtocol.STREAMING, "gpu0")] == pytest.approx(stream)
    assert by[(ResidencyProtocol.HETEROGENEOUS_OVERFLOW, "cpu")] == pytest.approx(overflow / 20e9)
    assert p.estimates[0].circuit == "igpu0"
    assert p.predicted_s_per_token == pytest.approx(8 * GIB / 1e12 + igpu)
    roles = {(pl.circuit, pl.role): pl.weight_bytes for pl in p.placements}
    assert roles[("gpu0", PlacementRole.PRIMARY)] == 8 * GIB
    assert roles[("igpu0", PlacementRole.OVERFLOW)] == overflow
    assert roles[("cpu", PlacementRole.IDLE)] == 0
    text = "\n".join(p.rationale)
    assert "heterogeneous-overflow on igpu0" in text and "streaming on gpu0" in text


def test_fast_bus_makes_streaming_win() -> None:
    topo = host(vram=8 * GIB)
    m = matrix(cap("gpu0", 1000.0, upload_gbps=64.0), cap("cpu", 10.0))
    p = plan_employment(topo, m, 20 * GIB, vram_headroom_frac=0.0)
    assert p.protocol is ResidencyProtocol.STREAMING
    assert p.estimates[0].transfer_s == pytest.approx(12 * GIB / 64e9)
    assert [pl.role for pl in p.placements] == [
        PlacementRole.PRIMARY,
        PlacementRole.IDLE,
        PlacementRole.STREAM_SOURCE,
    ]
    assert p.placements[-1].pool == "system"
    assert p.placements[-1].weight_bytes == 12 * GIB


def test_tie_between_in_place_and_streaming_goes_in_place() -> None:
    # stream: O/10e9 + O/10e9 ; CPU in place: O/5e9 — equal to the last bit.
    topo = host(vram=8 * GIB)
    m = matrix(cap("gpu0", 10.0, upload_gbps=10.0), cap("cpu", 5.0))
    p = plan_employment(topo, m, 16 * GIB, vram_headroom_frac=0.0)
    assert p.estimates[0].total_s == p.estimates[1].total_s
    assert p.protocol is ResidencyProtocol.HETEROGENEOUS_OVERFLOW


def test_tie_between_two_in_place_circuits_goes_to_the_better_ranked() -> None:
    topo = host(vram=8 * GIB, igpu=True)
    m = matrix(cap("gpu0", 1000.0, upload_gbps=1.0), cap("igpu0", 30.0), cap("cpu", 30.0))
    p = plan_employment(topo, m, 16 * GIB, vram_headroom_frac=0.0)
    assert p.priority == ("gpu0", "cpu", "igpu0")  # equal throughput: ids break the tie
    assert p.estimates[0].total_s == p.estimates[1].total_s
    assert p.estimates[0].circuit == "cpu"


def test_priority_follows_measurement_not_kind() -> None:
    # A weak dGPU measured slower than the CPU is not the primary.
    topo = host(vram=8 * GIB)
    m = matrix(cap("gpu0", 5.0, upload_gbps=8.0), cap("cpu", 40.0))
    p = plan_employment(topo, m, 4 * GIB)
    assert p.primary == "cpu"
    assert p.protocol is ResidencyProtocol.RESIDENT


def test_cpu_only_host_too_small_raises_insufficient_vram() -> None:
    topo = host(ram=16 * GIB)
    with pytest.raises(InsufficientVram) as err:
        plan_employment(topo, matrix(cap("cpu", 20.0)), 32 * GIB)
    budget = math.floor(16 * GIB * 0.9)
    assert str(err.value) == (
        f"model does not fit: needs {32 * GIB} bytes, total available {budget}; "
        "weights 32.0 GiB + KV 0.0 GiB + headroom 1.6 GiB (vram_headroom_frac 0.1) on cpu's 16.0 GiB "
        "leave 17.6 GiB of weights over, and no other pool holds it (largest other: none); "
        "needs weights of at most 14.4 GiB (a smaller --dtype or model), or a lower --headroom"
    )


def test_real_fixture_host_8x4090_streams_a_70b_model() -> None:
    topo = fixture_topology("thamada_nvsim/RTX4090_smi_-a.txt", ram=512 * GIB)
    assert [c.id for c in topo.circuits][:3] == ["cpu", "gpu0", "gpu1"]
    m = matrix(cap("gpu0", 900.0, upload_gbps=25.0), cap("cpu", 60.0))
    p = plan_employment(topo, m, 140 * GIB)
    assert p.primary == "gpu0"
    assert p.resident_bytes == math.floor(24564 * 2**20 * 0.9)
    assert p.protocol is ResidencyProtocol.HETEROGENEOUS_OVERFLOW  # 60 GB/s in place > 25 GB/s bus


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model_bytes": 0}, "model_bytes=0: must be an integer in [1, 9223372036854775807]"),
        ({"model_bytes": 1.5}, "model_bytes=1.5: must be an integer in [1, 9223372036854775807]"),
        (
            {"model_bytes": 1, "vram_headroom_frac": 1.0},
            "vram_headroom_frac=1.0: must be a fraction in [0, 1)",
        ),
        (
            {"model_bytes": 1, "vram_headroom_frac": -0.1},
            "vram_headroom_frac=-0.1: must be a fraction in [0, 1)",
        ),
        (
            {"model_bytes": 10, "read_bytes": 0},
            "read_bytes=0: must be an integer in [1, 9223372036854775807]",
        ),
        ({"model_bytes": 10, "read_bytes": 11}, "read_bytes=11: must be at most model_bytes (10)"),
        (
            {"model_bytes": 10, "kv_bytes": -1},
            "kv_bytes=-1: must be an integer in [0, 9223372036854775807]",
        ),
    ],
)
def test_bad_arguments_are_refused_with_exact_messages(kwargs: dict, message: str) -> None:
    with pytest.raises(InputError) as err:
        plan_employment(host(), matrix(cap("cpu", 20.0)), **kwargs)
    assert str(err.value) == message


def test_matrix_of_another_host_is_refused() -> None:
    with pytest.raises(InputError) as err:
        plan_employment(host(), matrix(cap("gpu7", 20.0)), 10)
    assert str(err.value) == "matrix=('gpu7',): measures no circuit of this topology"


def test_plan_json_round_trips_byte_identically() -> None:
    topo = host(vram=8 * GIB, igpu=True)
    m = matrix(cap("gpu0", 1000.0, upload_gbps=16.0), cap("igpu0", 40.0), cap("cpu", 20.0))
    p = plan_employment(topo, m, 20 * GIB)
    text = employment_to_json(p)
    assert employment_from_json(text) == p
    assert employment_to_json(employment_from_json(text)) == text


gbps = st.floats(min_value=1.0, max_value=5000.0)


@given(
    vram_gib=st.integers(1, 96),
    model_gib=st.floats(0.5, 100.0),
    gpu=gbps,
    bus=st.floats(1.0, 128.0),
    igpu=gbps,
    cpu=gbps,
    reserve=st.floats(0.0, 0.5),
)
def test_chosen_protocol_is_the_argmin_of_the_estimates_and_bytes_add_up(
    vram_gib: int, model_gib: float, gpu: float, bus: float, igpu: float, cpu: float, reserve: float
) -> None:
    topo = host(vram=vram_gib * GIB, ram=256 * GIB, igpu=True)
    m = matrix(cap("gpu0", gpu, upload_gbps=bus), cap("igpu0", igpu), cap("cpu", cpu))
    model = int(model_gib * GIB)
    p = plan_employment(topo, m, model, vram_headroom_frac=reserve)
    assert p.resident_bytes + p.overflow_bytes == model
    assert p.priority == m.order
    held = sum(pl.weight_bytes for pl in p.placements)
    assert held == model
    if p.protocol is ResidencyProtocol.RESIDENT:
        assert p.overflow_bytes == 0
        return
    best = min(e.total_s for e in p.estimates)
    assert p.estimates[0].total_s == best
    assert p.estimates[0].protocol is p.protocol
    top = m.entries[0]
    assert p.predicted_s_per_token == pytest.approx(
        p.resident_bytes / top.compute_bytes_per_s + best
    )


def test_the_planner_imports_no_device_library() -> None:
    code = (
        "import sys, stowplan.planner.residency, stowplan.host.route, stowplan.host.passport;"
        "bad = {'numpy', 'pynvml', 'torch', 'psutil', 'ray'} & set(sys.modules);"
        "print(sorted(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
