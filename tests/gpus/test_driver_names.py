"""The NVIDIA driver's naming rule: nvidia-smi names PCIe boards ``… PCIe``, so a driver
name without it is the SXM part; a bare name a person typed stays conservative."""

from __future__ import annotations

import pytest

from stowplan.errors import InputError
from stowplan.gpus import resolve_gpu

GIB = 2**30


@pytest.mark.parametrize(
    ("name", "part", "gbps"),
    [
        ("NVIDIA H800", "H800 SXM5", 3350),  # nvidia-smi's name of the SXM board
        ("NVIDIA H800 PCIe", "H800 PCIe", 2000),
        ("NVIDIA H100", "H100 SXM5", 3350),
        ("NVIDIA H100 PCIe", "H100 PCIe", 2000),
        ("NVIDIA A100-PCIE-40GB", "A100 40GB PCIe", 1555),
    ],
)
def test_a_driver_name_without_pcie_is_not_a_pcie_board(name: str, part: str, gbps: int) -> None:
    match = resolve_gpu(name, 80 * GIB if "40GB" not in name else 40 * GIB)
    assert match is not None
    assert (match.spec.name, match.spec.mem_bandwidth_gbps) == (part, gbps)
    assert match.assumption is None


def test_a_bare_name_stays_conservative_and_says_so() -> None:
    match = resolve_gpu("H800", 80 * GIB)
    assert match is not None
    assert (match.spec.name, match.spec.mem_bandwidth_gbps) == ("H800 PCIe", 2000)
    assert match.assumption is not None and "H800 SXM5" in match.assumption


@pytest.mark.parametrize("memory", ["80GB", 2.5, True, -1, 2**63, 10**400, [1]])
def test_memory_of_the_wrong_type_or_size_is_an_input_error(memory: object) -> None:
    with pytest.raises(InputError) as info:
        resolve_gpu("RTX 4090", memory)  # type: ignore[arg-type]
    assert info.value.field == "memory_bytes"
