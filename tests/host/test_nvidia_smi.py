"""Every real nvidia-smi output in the fixtures parses to the values read from the files."""

from __future__ import annotations

import pytest

from stowplan.errors import InputError
from stowplan.host.nvidia_smi import parse_nvidia_smi, parse_query_csv, pcie_gbps
from stowplan.host.rocm_smi import parse_rocm_smi
from tests.common.host import SMI, capture_sections

# (file, format, driver, GPU count, name, total MiB, max PCIe gen) — read from the files.
FULL_REPORTS = [
    ("telegraf_xml/3090-v13.xml", "xml", "590.44.01", 1, "NVIDIA GeForce RTX 3090", 24576, 4),
    ("telegraf_xml/a100-sxm4-v12.xml", "xml", "535.54.03", 1, "NVIDIA A100-SXM4-80GB", 81920, 4),
    ("telegraf_xml/a10g.xml", "xml", "515.105.01", 1, "NVIDIA A10G", 23028, 4),
    ("telegraf_xml/dual_2080-v13.xml", "xml", "590.44.01", 2, "NVIDIA GeForce RTX 2080", 8192, 3),
    ("telegraf_xml/dual_a5000-v13.xml", "xml", "590.44.01", 2, "NVIDIA RTX A5000", 24564, 4),
    (
        "telegraf_xml/pro-6000-maxq-blackwell-v13.xml",
        "xml",
        "590.44.01",
        1,
        "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
        97887,
        4,
    ),
    ("telegraf_xml/rtx-3080-v13.xml", "xml", "595.58.03", 1, "NVIDIA GeForce RTX 3080", 10240, 4),
    ("telegraf_xml/rtx-3090-v12.xml", "xml", "525.147.05", 1, "NVIDIA GeForce RTX 3090", 24576, 4),
    (
        "telegraf_xml/rtx-4000-sff-ada-v13.xml",
        "xml",
        "595.84",
        1,
        "NVIDIA RTX 4000 SFF Ada Generation",
        20475,
        4,
    ),
    ("telegraf_xml/tesla-t4.xml", "xml", "515.105.01", 1, "Tesla T4", 15360, 3),
    (
        "thamada_nvsim/A100SXMx4_smi_-a.txt",
        "text",
        "555.42.02",
        4,
        "NVIDIA A100-SXM4-80GB",
        81920,
        4,
    ),
    ("thamada_nvsim/A40x10_smi_-a.txt", "text", "550.127.05", 10, "NVIDIA A40", 46068, 4),
    ("thamada_nvsim/H100NVLx2_smi_-a.txt", "text", "550.54.14", 2, "NVIDIA H100 NVL", 95830, 5),
    (
        "thamada_nvsim/H100SXMx8_smi_-a.txt",
        "text",
        "565.57.01",
        8,
        "NVIDIA H100 80GB HBM3",
        81559,
        5,
    ),
    ("thamada_nvsim/L40S_smi_-a.txt", "text", "550.127.05", 1, "NVIDIA L40S", 46068, 4),
    ("thamada_nvsim/L4_smi_-a.txt", "text", "550.90.07", 1, "NVIDIA L4", 23034, 4),
    (
        "thamada_nvsim/RTX2000Ada_smi_-a.txt",
        "text",
        "550.54.15",
        1,
        "NVIDIA RTX 2000 Ada Generation",
        16380,
        4,
    ),
    (
        "thamada_nvsim/RTX3090_smi_-a.txt",
        "text",
        "560.35.03",
        2,
        "NVIDIA GeForce RTX 3090",
        24576,
        4,
    ),
    (
        "thamada_nvsim/RTX4000Ada_smi_-a.txt",
        "text",
        "550.90.07",
        1,
        "NVIDIA RTX 4000 Ada Generation",
        20475,
        4,
    ),
    (
        "thamada_nvsim/RTX4060Ti_smi_-a.txt",
        "text",
        "550.54.14",
        2,
        "NVIDIA GeForce RTX 4060 Ti",
        16380,
        4,
    ),
    (
        "thamada_nvsim/RTX4090_smi_-a.txt",
        "text",
        "550.127.05",
        8,
        "NVIDIA GeForce RTX 4090",
        24564,
        4,
    ),
    (
        "thamada_nvsim/RTX6000Ada_x8_smi_-a.txt",
        "text",
        "550.127.05",
        8,
        "NVIDIA RTX 6000 Ada Generation",
        49140,
        4,
    ),
]


@pytest.mark.parametrize(("path", "fmt", "driver", "count", "name", "mib", "gen"), FULL_REPORTS)
def test_full_reports_parse_to_the_values_in_the_file(
    path: str, fmt: str, driver: str, count: int, name: str, mib: int, gen: int
) -> None:
    report = parse_nvidia_smi((SMI / path).read_text(encoding="utf-8"))
    assert report.format == fmt
    assert report.driver_version == driver
    assert len(report.gpus) == count
    assert {g.name for g in report.gpus} == {name}
    assert {g.memory_total_mib for g in report.gpus} == {mib}
    assert {g.pcie_gen_max for g in report.gpus} == {gen}
    assert all(g.uuid and g.uuid.startswith("GPU-") for g in report.gpus)


def test_mig_enabled_a100_reads_the_gpu_memory_not_the_mig_slices() -> None:
    report = parse_nvidia_smi((SMI / "telegraf_xml/a100-sxm4-v12.xml").read_text())
    (gpu,) = report.gpus
    assert gpu.memory_total_mib == 81920  # the MIG devices print 19968 MiB each
    assert gpu.uuid == "GPU-513536b6-7d19-9063-b049-1e69664bb298"


def test_h100_sxm_link_is_gen5_x16_and_uuids_are_distinct() -> None:
    report = parse_nvidia_smi((SMI / "thamada_nvsim/H100SXMx8_smi_-a.txt").read_text())
    assert report.gpus[0].uuid == "GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1"
    assert report.gpus[0].bus_id == "00000000:18:00.0"
    assert len({g.uuid for g in report.gpus}) == 8
    assert {(g.pcie_gen_max, g.pcie_width_max) for g in report.gpus} == {(5, 16)}
    assert report.gpus[0].bus_gbps == pcie_gbps(5, 16) == 63.008


def test_idle_gpu_reports_current_gen_below_max() -> None:
    report = parse_nvidia_smi((SMI / "telegraf_xml/a10g.xml").read_text())
    g = report.gpus[0]
    assert (g.pcie_gen_max, g.pcie_gen_current, g.pcie_width_max, g.pcie_width_current) == (
        4,
        1,
        16,
        8,
    )
    assert g.memory_free_mib == 22569


# (file, GPU count, name as printed, total MiB) of the default summary tables.
TABLES = [
    ("A100SXMx4_smi.txt", "555.42.02", 4, "NVIDIA A100-SXM4-80GB", 81920),
    ("A40x10_smi.txt", "550.127.05", 10, "NVIDIA A40", 46068),
    ("H100NVLx2_smi.txt", "550.54.14", 2, "NVIDIA H100 NVL", 95830),
    ("H100SXMx8_smi.txt", "565.57.01", 8, "NVIDIA H100 80GB HBM3", 81559),
    ("L40S_smi.txt", "550.127.05", 1, "NVIDIA L40S", 46068),
    ("L4_smi.txt", "550.90.07", 1, "NVIDIA L4", 23034),
    ("RTX2000Ada_smi.txt", "550.54.15", 1, "NVIDIA RTX 2000 Ada Gene...", 16380),
    ("RTX3090_smi.txt", "560.35.03", 2, "NVIDIA GeForce RTX 3090", 24576),
    ("RTX4000Ada_smi.txt", "550.90.07", 1, "NVIDIA RTX 4000 Ada Gene...", 20475),
    ("RTX4060Ti_smi.txt", "550.54.14", 2, "NVIDIA GeForce RTX 4060 Ti", 16380),
    ("RTX4090_smi.txt", "550.127.05", 8, "NVIDIA GeForce RTX 4090", 24564),
    ("RTX6000Ada_x8_smi.txt", "550.127.05", 8, "NVIDIA RTX 6000 Ada Gene...", 49140),
]


@pytest.mark.parametrize(("path", "driver", "count", "name", "mib"), TABLES)
def test_summary_tables_parse(path: str, driver: str, count: int, name: str, mib: int) -> None:
    report = parse_nvidia_smi((SMI / "thamada_nvsim" / path).read_text(encoding="utf-8"))
    assert report.format == "table"
    assert report.driver_version == driver
    assert [g.index for g in report.gpus] == list(range(count))
    assert {g.name for g in report.gpus} == {name}
    assert {g.memory_total_mib for g in report.gpus} == {mib}
    assert {g.pcie_gen_max for g in report.gpus} == {None}  # the table does not print it


# capture file -> (driver, name, total MiB, max PCIe gen, width), read from the files
CAPTURES = {
    "linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05.txt": (
        "595.71.05",
        "NVIDIA GeForce RTX 2080 SUPER",
        8192,
        3,
    ),
    "linux-x86_64__nvidia-geforce-rtx-2080-super__610.57.04.txt": (
        "610.57.04",
        "NVIDIA GeForce RTX 2080 SUPER",
        8192,
        3,
    ),
    "linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05.txt": (
        "595.71.05",
        "NVIDIA GeForce RTX 4080 SUPER",
        16376,
        4,
    ),
    "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt": (
        "590.48.01",
        "NVIDIA H100 80GB HBM3",
        81559,
        5,
    ),
    "linux-x86_64__nvidia-h100-mig__590.48.01.txt": (
        "590.48.01",
        "NVIDIA H100 80GB HBM3",
        81559,
        5,
    ),
    "linux-x86_64__nvidia-h200-mig__590.48.01.txt": ("590.48.01", "NVIDIA H200", 143771, 5),
    "linux-x86_64__nvidia-h200__590.48.01.txt": ("590.48.01", "NVIDIA H200", 143771, 5),
    "linux-x86_64__nvidia-l40s__595.80.txt": ("595.80", "NVIDIA L40S", 46068, 4),
    "windows-x86_64__nvidia-geforce-rtx-2080-super__591.86.txt": (
        "591.86",
        "NVIDIA GeForce RTX 2080 SUPER",
        8192,
        3,
    ),
    "windows-x86_64__nvidia-geforce-rtx-2080-super__610.62.txt": (
        "610.62",
        "NVIDIA GeForce RTX 2080 SUPER",
        8192,
        3,
    ),
}


@pytest.mark.parametrize("phase", ["idle", "load"])
@pytest.mark.parametrize("path", sorted(CAPTURES))
def test_capture_q_and_csv_and_table_agree_with_the_file(path: str, phase: str) -> None:
    driver, name, mib, gen = CAPTURES[path]
    sections = capture_sections(SMI / "utkuozdemir_captures" / path)
    q = parse_nvidia_smi(sections[f"{phase} :: query (-q)"])
    csv = parse_nvidia_smi(sections[f"{phase} :: query-gpu (csv, what the exporter parses)"])
    table = parse_nvidia_smi(sections[f"{phase} :: nvidia-smi (default table)"])
    assert (q.format, csv.format, table.format) == ("text", "csv", "table")
    for report in (q, csv, table):
        assert report.driver_version == driver
        assert len(report.gpus) == 1
        assert report.gpus[0].memory_total_mib == mib
    for report in (q, csv):
        (g,) = report.gpus
        assert (g.name, g.pcie_gen_max, g.pcie_width_max) == (name, gen, 16)
        assert g.uuid == "GPU-00000000-0000-0000-0000-000000000000"  # masked in the source
    assert name.startswith(table.gpus[0].name.removesuffix("..."))


def test_csv_with_nounits_and_na_values() -> None:
    text = (
        "name, uuid, memory.total, pcie.link.gen.max, pcie.link.width.max\n"
        "NVIDIA L4, GPU-1, 23034, 4, 16\n"
        "NVIDIA L4, [N/A], N/A, [N/A], 16\n"
    )
    report = parse_query_csv(text)
    assert [(g.uuid, g.memory_total_mib, g.pcie_gen_max) for g in report.gpus] == [
        ("GPU-1", 23034, 4),
        (None, None, None),
    ]


def test_csv_without_header_is_refused_with_the_rule() -> None:
    with pytest.raises(InputError) as err:
        parse_query_csv("NVIDIA L4, 23034\n")
    assert str(err.value) == (
        "nvidia-smi --query-gpu=['NVIDIA L4', '23034']: needs a header row with 'name' or 'uuid'"
    )


@pytest.mark.parametrize(
    ("path", "count", "name"),
    [
        ("MI300X_smi.txt", 1, "AMD Instinct MI300X"),
        ("MI300X_x4_smi.txt", 4, "AMD Instinct MI300X"),
        ("MI300X_x4_smi_-a.txt", 4, "AMD Instinct MI300X OAM"),
    ],
)
def test_rocm_smi_outputs_list_their_gpus(path: str, count: int, name: str) -> None:
    gpus = parse_rocm_smi((SMI / "thamada_nvsim" / path).read_text(encoding="utf-8"))
    assert [g.index for g in gpus] == list(range(count))
    assert {g.name for g in gpus} == {name}


def test_rocm_smi_reads_vram_when_shown() -> None:
    text = (
        "GPU[0]\t\t: Card series: \t\tAMD Instinct MI300X OAM\n"
        "GPU[0]\t\t: VRAM Total Memory (B): 206141652992\n"
        "GPU[0]\t\t: VRAM Total Used Memory (B): 1024\n"
    )
    (g,) = parse_rocm_smi(text)
    assert (g.memory_total_bytes, g.memory_used_bytes) == (206141652992, 1024)
