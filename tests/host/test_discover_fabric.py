"""Discovery fills each NVIDIA circuit's fabric facts (NVML values or nvidia-smi -q blocks)."""

from __future__ import annotations

from stowplan.circuits import HostTopology
from stowplan.host.discover import fabric_facts, topology_from_smi
from stowplan.host.fabric import GpuFabric, parse_fabric, parse_fabric_json_lines
from stowplan.host.nvidia_smi import parse_nvidia_smi
from stowplan.host.passport import Passport
from tests.common.host import SMI, cap, capture_sections, matrix

ZERO = "00000000-0000-0000-0000-000000000000"
SNIPPETS = (SMI / "issue_excerpts" / "gb200_fabric_q_snippets.txt").read_text()


def _topology(smi_text: str, fabrics: tuple[GpuFabric, ...]) -> HostTopology:
    return topology_from_smi(
        parse_nvidia_smi(smi_text),
        hostname="h",
        cpu_name="cpu",
        cpu_count=8,
        ram_bytes=2**36,
        ram_free_bytes=2**36,
        fabrics=fabrics,
    )


def _gpu_fabrics(topo: HostTopology) -> list[dict[str, str] | None]:
    return [c.fabric for c in topo.circuits if c.id.startswith("gpu")]


def test_h100_sxm_boxes_are_completed_with_a_zero_uuid_and_no_domain() -> None:
    text = (SMI / "thamada_nvsim" / "H100SXMx8_smi_-a.txt").read_text()
    topo = _topology(text, parse_fabric(text))
    facts = {"state": "Completed", "status": "Success", "clique_id": "0", "cluster_uuid": ZERO}
    assert _gpu_fabrics(topo) == [facts] * 8
    # It survives the passport's JSON round trip.
    passport = Passport.create(topo, matrix(cap("cpu", 10.0)))
    assert Passport.from_dict(passport.to_dict()).topology == topo


def test_a_single_h100_capture_matches_its_fabric_block_by_bus_id() -> None:
    sections = capture_sections(
        SMI / "utkuozdemir_captures" / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
    )
    q = sections["idle :: query (-q)"]
    topo = _topology(q, parse_fabric(q))
    (fabric,) = _gpu_fabrics(topo)
    assert fabric is not None and fabric["cluster_uuid"] == ZERO and "domain" not in fabric


def test_gb200_blocks_give_the_domain_of_a_healthy_gpu_and_none_of_a_failed_one() -> None:
    blocks = parse_fabric(SNIPPETS)
    assert len(blocks) == 3  # healthy GB200, failed registration, H100 contrast
    two_gpus = (SMI / "thamada_nvsim" / "H100NVLx2_smi_-a.txt").read_text()
    # The snippets carry no bus ids: one record per GPU pairs them by position.
    topo = _topology(two_gpus, blocks[:2])
    assert _gpu_fabrics(topo) == [
        {
            "state": "Completed",
            "status": "Success",
            "clique_id": "2",
            "cluster_uuid": "dc6e40c4-d722-4357-9ba6-5291dd461278",
            "domain": "dc6e40c4-d722-4357-9ba6-5291dd461278_2",
        },
        {
            "state": "Completed",
            "status": "Insufficient Resources",
            "clique_id": "0",
            "cluster_uuid": ZERO,
        },
    ]


def test_a_count_mismatch_without_bus_ids_fills_nothing() -> None:
    two_gpus = (SMI / "thamada_nvsim" / "H100NVLx2_smi_-a.txt").read_text()
    topo = _topology(two_gpus, parse_fabric(SNIPPETS))
    assert _gpu_fabrics(topo) == [None, None]


def test_nvml_values_give_the_same_facts_as_the_gpud_records() -> None:
    (gpud, _) = parse_fabric_json_lines(SNIPPETS.splitlines())
    nvml = GpuFabric.from_nvml(
        gpu="00000009:01:00.0",
        state=3,
        status=0,
        clique_id=4026,
        cluster_uuid=bytes.fromhex("9c6f5af353bf49b5a436b66766c413c3"),
    )
    assert (
        fabric_facts(nvml)
        == fabric_facts(gpud)
        == {
            "state": "Completed",
            "status": "Success",
            "clique_id": "4026",
            "cluster_uuid": "9c6f5af3-53bf-49b5-a436-b66766c413c3",
            "domain": "9c6f5af3-53bf-49b5-a436-b66766c413c3_4026",
        }
    )
