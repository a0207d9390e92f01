"""Fabric-block parsing on every real nvidia-smi fixture."""

from __future__ import annotations

from pathlib import Path

import pytest

from stowplan.errors import InputError
from stowplan.host.fabric import (
    GpuFabric,
    domain_resource,
    node_domain,
    parse_fabric,
    parse_fabric_json_lines,
)
from tests.common.paths import FIXTURES

SMI = FIXTURES / "nvidia-smi"
SNIPPETS = SMI / "issue_excerpts" / "gb200_fabric_q_snippets.txt"


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def _section(number: int) -> str:
    """Section ``## <number>)`` of the GB200 snippet file."""
    text = _read(SNIPPETS)
    start = text.index(f"## {number})")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


ALL_DUMPS = sorted(
    p for p in SMI.rglob("*") if p.suffix in {".txt", ".xml"} and p.name != "SOURCES.md"
)
# Files that carry per-GPU Fabric blocks and how many (one per GPU per -q run).
FABRIC_COUNTS = {
    "H100SXMx8_smi_-a.txt": 8,
    "RTX4090_smi_-a.txt": 8,
    "A40x10_smi_-a.txt": 10,
    "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt": 2,
    "pro-6000-maxq-blackwell-v13.xml": 1,
    "dual_a5000-v13.xml": 2,
}


@pytest.mark.parametrize("path", [p for p in ALL_DUMPS if p != SNIPPETS], ids=lambda p: p.name)
def test_no_single_node_fixture_is_in_an_nvlink_domain(path: Path) -> None:
    gpus = parse_fabric(_read(path))
    assert [g.domain for g in gpus] == [None] * len(gpus)
    assert node_domain(gpus) is None


@pytest.mark.parametrize(("name", "count"), sorted(FABRIC_COUNTS.items()))
def test_every_gpu_fabric_block_is_found(name: str, count: int) -> None:
    (path,) = [p for p in ALL_DUMPS if p.name == name]
    assert len(parse_fabric(_read(path))) == count


def test_h100_hgx_reports_completed_success_with_a_zero_uuid_and_no_domain() -> None:
    gpus = parse_fabric(_read(SMI / "thamada_nvsim" / "H100SXMx8_smi_-a.txt"))
    assert gpus[0] == GpuFabric(
        gpu="00000000:18:00.0",
        state="Completed",
        status="Success",
        clique_id="0",
        cluster_uuid="00000000-0000-0000-0000-000000000000",
    )
    assert gpus[-1].gpu == "00000000:DB:00.0"
    assert {g.domain for g in gpus} == {None}


def test_gb200_healthy_clique_gives_uuid_and_clique_key() -> None:
    (gpu,) = parse_fabric(_section(1))
    assert gpu.domain == "dc6e40c4-d722-4357-9ba6-5291dd461278_2"
    assert node_domain([gpu]) == gpu.domain
    assert domain_resource(gpu.domain) == "nvlink_domain_dc6e40c4-d722-4357-9ba6-5291dd461278_2"


def test_failed_fabric_registration_is_no_domain() -> None:
    (gpu,) = parse_fabric(_section(2))
    assert (gpu.state, gpu.status) == ("Completed", "Insufficient Resources")
    assert gpu.domain is None


def test_nvml_records_of_one_clique_agree_on_the_domain() -> None:
    gpus = parse_fabric_json_lines(_section(3).splitlines())
    assert len(gpus) == 2
    assert node_domain(gpus) == "9c6f5af3-53bf-49b5-a436-b66766c413c3_4026"


def test_nvml_values_map_to_the_same_key_as_the_text() -> None:
    raw = bytes.fromhex("dc6e40c4d72243579ba65291dd461278")
    gpu = GpuFabric.from_nvml(gpu="0", state=3, status=0, clique_id=2, cluster_uuid=raw)
    assert gpu.domain == "dc6e40c4-d722-4357-9ba6-5291dd461278_2"
    pending = GpuFabric.from_nvml(gpu="0", state=2, status=0, clique_id=2, cluster_uuid=raw)
    assert pending.domain is None


@pytest.mark.parametrize(
    ("state", "status", "clique", "uuid"),
    [
        ("In Progress", "Success", "2", "dc6e40c4-d722-4357-9ba6-5291dd461278"),
        ("Completed", "N/A", "2", "dc6e40c4-d722-4357-9ba6-5291dd461278"),
        ("Completed", "Success", "N/A", "dc6e40c4-d722-4357-9ba6-5291dd461278"),
        ("Completed", "Success", "2", "N/A"),
        ("Completed", "Success", "2", ""),
        ("Completed", "Success", "2", "00000000-0000-0000-0000-000000000000"),
        ("N/A", "N/A", "N/A", "N/A"),
    ],
)
def test_incomplete_or_blank_fabric_is_no_domain(
    state: str, status: str, clique: str, uuid: str
) -> None:
    gpu = GpuFabric(gpu="0", state=state, status=status, clique_id=clique, cluster_uuid=uuid)
    assert gpu.domain is None


def test_gpus_that_disagree_make_the_node_an_error() -> None:
    good = parse_fabric(_section(1))[0]
    bad = parse_fabric(_section(2))[0]
    with pytest.raises(InputError) as info:
        node_domain([good, GpuFabric(gpu="1", **_fields(bad))])
    assert str(info.value) == (
        "Fabric='2 domains': all GPUs of one node must report the same NVLink domain; "
        "got 0=dc6e40c4-d722-4357-9ba6-5291dd461278_2, 1=none"
    )


def _fields(g: GpuFabric) -> dict[str, str | None]:
    return {
        "state": g.state,
        "status": g.status,
        "clique_id": g.clique_id,
        "cluster_uuid": g.cluster_uuid,
    }


def test_output_without_fabric_blocks_gives_nothing() -> None:
    assert parse_fabric(_read(SMI / "thamada_nvsim" / "RTX4090_smi.txt")) == ()
    assert node_domain(()) is None
