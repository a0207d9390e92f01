"""GPU lookup: spellings, parts and their published figures."""

from __future__ import annotations

import pytest

from stowplan.gpus import lookup_gpu


@pytest.mark.parametrize(
    "name", ["NVIDIA GeForce RTX 4090", "RTX 4090", "rtx4090", "GeForce RTX 4090"]
)
def test_gpu_lookup_tolerates_spellings(name):
    spec = lookup_gpu(name)
    assert spec is not None and spec.mem_bandwidth_gbps == 1008 and spec.bf16_tflops == 165.2


def test_h100_hbm3_is_the_sxm_part():
    spec = lookup_gpu("H100 80GB HBM3")
    assert spec is not None and spec.mem_bandwidth_gbps == 3350


def test_unknown_gpu_is_none():
    assert lookup_gpu("Voodoo 2") is None


@pytest.mark.parametrize(
    ("name", "base", "part"),
    [
        ("NVIDIA GeForce RTX 4080 SUPER", "RTX 4080", "RTX 4080 Super"),
        ("NVIDIA GeForce RTX 3090 Ti", "RTX 3090", "RTX 3090 Ti"),
        ("NVIDIA GeForce RTX 4060 Ti", "RTX 4060", "RTX 4060 Ti 8GB"),
    ],
)
def test_a_ti_super_or_laptop_part_is_not_its_base_part(name, base, part):
    spec = lookup_gpu(name)
    assert spec is not None and spec.name == part != base


def test_a_bare_a100_is_the_lower_bandwidth_40gb_part():
    spec = lookup_gpu("A100")
    assert spec is not None and spec.mem_bandwidth_gbps == 1555
