"""The CUDA probe's pieces: UUID matching to torch devices, the decode-run fit, the run itself."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stowplan.circuits import Circuit, CircuitKind
from stowplan.errors import InputError
from stowplan.host.bench import DECODE_SHAPES, cuda_indices, decode_figures, settings_for
from stowplan.host.passport import Passport
from tests.common.host import cap, fixture_topology, matrix


def _gpu(i: int, uuid: str | None) -> Circuit:
    return Circuit(id=f"gpu{i}", kind=CircuitKind.DGPU, name="g", pool=f"vram:gpu{i}", uuid=uuid)


GPUS = [
    Circuit(id="cpu", kind=CircuitKind.CPU, name="c", pool="system"),
    _gpu(0, "GPU-aaaa-0001"),
    _gpu(1, "GPU-BBBB-0002"),
]


def test_torch_devices_are_matched_by_uuid_not_by_position() -> None:
    # CUDA_VISIBLE_DEVICES=1,0: torch's device 0 is NVML's gpu1.
    assert cuda_indices(GPUS, ["bbbb-0002", "aaaa-0001"]) == {"gpu0": 1, "gpu1": 0}
    # CUDA_VISIBLE_DEVICES=1: gpu0 is not visible, so it is not measured as device 0.
    assert cuda_indices(GPUS, ["bbbb-0002"]) == {"gpu1": 0}


def test_without_torch_uuids_the_index_is_used() -> None:
    assert cuda_indices(GPUS, [None, None]) == {"gpu0": 0, "gpu1": 1}
    assert cuda_indices(GPUS, [None]) == {"gpu0": 0}
    assert cuda_indices(GPUS, []) == {}


def test_decode_figures_take_bandwidth_from_the_large_run_and_the_rest_as_block_cost() -> None:
    big, small = 436e6, 6e6
    bw, c = 4.0e12, 25e-6
    got = decode_figures((big, big / bw), (small, small / bw + c))
    assert got == pytest.approx((bw, c))
    # Tiny blocks faster than the bandwidth (cache hits) give no negative cost.
    assert decode_figures((big, big / bw), (small, small / bw * 0.5))[1] == 0.0
    with pytest.raises(InputError, match="need positive bytes and times"):
        decode_figures((big, 0.0), (small, 1e-3))


def test_decode_figures_round_trip_through_the_passport() -> None:
    topo = fixture_topology("thamada_nvsim/RTX4090_smi_-a.txt")
    gpu = replace(cap("gpu0", 900.0, 25.0), decode_gbps=850.0, decode_block_s=3e-5)
    p = Passport.create(topo, matrix(gpu, cap("cpu", 20.0)))
    back = Passport.from_dict(p.to_dict())
    entry = back.matrix.get("gpu0")
    assert entry is not None and (entry.decode_gbps, entry.decode_block_s) == (850.0, 3e-5)
    plain = back.matrix.get("cpu")
    assert plain is not None and plain.decode_gbps is None
    assert "decode_gbps" not in p.to_dict()["matrix"]["entries"][1]


def test_the_decode_run_on_a_cuda_device() -> None:
    torch = pytest.importorskip("torch", reason="the decode run needs torch")
    if not torch.cuda.is_available():
        pytest.skip("the decode run needs a CUDA device; none is visible")
    from stowplan.host.bench import measure_cuda_decode

    gbps, per_block = measure_cuda_decode(0, settings_for(quick=True))
    hidden, ffn, kv = DECODE_SHAPES[0]
    assert 10.0 < gbps < 20_000.0  # between a PCIe card and any HBM part
    assert 0.0 <= per_block < 1e-3
    assert hidden > kv and ffn > hidden
