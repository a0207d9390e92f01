"""``nvidia-smi topo -m`` from real machines: the GPU pairs' paths and the node's link figures."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from stowplan.errors import InputError
from stowplan.host.discover import with_intra_link
from stowplan.host.node import node_from_passport
from stowplan.host.nvidia_topo import (
    GpuPairLink,
    LinkKind,
    nvlink_gbps_per_link_for,
    parse_topo_matrix,
    probed_intra_link,
)
from stowplan.host.passport import Passport
from tests.common.host import SMI, cap, capture_sections, fixture_topology, matrix

TOPO = SMI / "topo"
H100 = TOPO / "8xH100-SXM_NV18_topo-m.txt"
A100 = TOPO / "8xA100-SXM4_DGX-A100_NV12_topo-m.txt"
DGX1 = TOPO / "8xGPU_DGX-1_topo-mp_PCIe-only-view.txt"
EXCERPTS = SMI / "issue_excerpts"


def _text(path) -> str:
    return path.read_text(encoding="utf-8")


# (file, GPU count, per-link name, figures: gbps, latency µs, kind, weakest pair, its path)
FIXTURES = [
    (H100, 8, "NVIDIA H100 80GB HBM3", 450.0, 3.0, "nvlink", (0, 1), "NV18"),
    (A100, 8, "NVIDIA A100-SXM4-80GB", 300.0, 3.0, "nvlink", (0, 1), "NV12"),
    (DGX1, 8, "Tesla V100-SXM2-16GB", 31.5, 12.0, "pcie", (0, 4), "SYS"),
]


@pytest.mark.parametrize(("path", "gpus", "name", "gbps", "us", "kind", "pair", "link"), FIXTURES)
def test_every_fixture_gives_the_weakest_pair_figures(
    path, gpus, name, gbps, us, kind, pair, link
) -> None:
    topology = parse_topo_matrix(_text(path))
    assert topology.num_gpus == gpus
    found = probed_intra_link(topology, gpu_name=name)
    assert found is not None
    assert (found.gbps, found.latency_us, found.kind, found.weakest, found.link) == (
        gbps,
        us,
        kind,
        pair,
        link,
    )


def test_nvlink_boards_link_every_pair_alike() -> None:
    for path, links in ((H100, 18), (A100, 12)):
        topology = parse_topo_matrix(_text(path))
        seen = {link for _, _, link in topology.pairs()}
        assert seen == {GpuPairLink(kind=LinkKind.NVLINK, nvlinks=links)}
        assert len(list(topology.pairs())) == 28


def test_pcie_view_reads_each_path_by_its_bridges() -> None:
    topology = parse_topo_matrix(_text(DGX1))
    assert [topology.link(0, b).label for b in range(1, 8)] == [
        "PIX", "PHB", "PHB", "SYS", "SYS", "SYS", "SYS"
    ]  # fmt: skip
    assert topology.link(4, 5).kind is LinkKind.PIX and topology.link(6, 4).kind is LinkKind.PHB


def test_pcie_pairs_take_the_host_link_when_known_and_say_when_assumed() -> None:
    topology = parse_topo_matrix(_text(DGX1))
    known = probed_intra_link(topology, pcie_gbps=15.75)
    assumed = probed_intra_link(topology)
    assert known is not None and assumed is not None
    assert known.gbps == 15.75 and "the GPUs' host link" in known.source
    assert assumed.source == (
        "nvidia-smi topo -m: weakest pair GPU0-GPU4 SYS (PCIe, gen 4 ×16 assumed: 31.5 GB/s)"
    )


def test_a_subset_of_gpus_is_judged_by_its_own_pairs() -> None:
    topology = parse_topo_matrix(_text(DGX1))
    pair = probed_intra_link(topology, gpus=(0, 1), pcie_gbps=15.75)
    socket = probed_intra_link(topology, gpus=(0, 1, 2, 3), pcie_gbps=15.75)
    assert pair is not None and socket is not None
    assert (pair.link, socket.link, socket.weakest) == ("PIX", "PHB", (0, 2))
    assert probed_intra_link(topology, gpus=(3,)) is None
    with pytest.raises(InputError) as info:
        probed_intra_link(topology, gpus=(0, 8))
    assert str(info.value) == "gpus=[0, 8]: must be GPU indices in [0, 7]"


def test_nvlink_5_parts_count_50_gbps_per_link() -> None:
    topology = parse_topo_matrix(_text(EXCERPTS / "gb200_4gpu_topo_sglang-11208.txt"))
    assert topology.num_gpus == 4  # space-separated, cut after GPU3's GPU cells
    gb200 = probed_intra_link(topology, gpu_name="NVIDIA GB200")
    assert gb200 is not None and (gb200.gbps, gb200.link) == (900.0, "NV18")
    assert [nvlink_gbps_per_link_for(n) for n in ("NVIDIA B200", "H100 SXM5", "")] == [
        50.0,
        25.0,
        25.0,
    ]


def test_a_single_gpu_matrix_printed_for_a_terminal_has_no_pair() -> None:
    path = SMI / "utkuozdemir_captures" / "linux-x86_64__nvidia-h200__590.48.01.txt"
    text = capture_sections(path)["capabilities :: topo -m"]
    assert "\x1b[4m" in text  # the header is underlined
    topology = parse_topo_matrix(text)
    assert topology.num_gpus == 1 and list(topology.pairs()) == []
    assert probed_intra_link(topology) is None


def test_a_truncated_paste_names_the_missing_rows() -> None:
    with pytest.raises(InputError) as info:
        parse_topo_matrix(_text(EXCERPTS / "dgx-a100-40gb_topo_nccl-1505.txt"))
    assert str(info.value) == (
        "nvidia-smi topo -m=['GPU5', 'GPU6', 'GPU7']: has no row for these of its 8 GPU columns"
    )


def test_rows_without_a_header_are_refused() -> None:
    with pytest.raises(InputError) as info:
        parse_topo_matrix(_text(EXCERPTS / "b200_8gpu_topo_gpu2-not-on-nvlink_vllm-16336.txt"))
    assert "has no header row of GPU columns (GPU0 GPU1 …)" in str(info.value)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (
            "GPU0\t X \tNV4\nGPU1\tQPI\t X \n",
            "nvidia-smi topo -m GPU1->GPU0='QPI': must be one of X (self), NV# (NVLinks), "
            "PIX, PXB, PHB, NODE or SYS",
        ),
        (
            "GPU0\tPIX\tNV4\nGPU1\tNV4\t X \n",
            "nvidia-smi topo -m GPU0->GPU0='PIX': must be X (the GPU itself)",
        ),
        (
            "GPU0\t X \tNV4\nGPU1\tNV2\t X \n",
            "nvidia-smi topo -m GPU0<->GPU1=('NV4', 'NV2'): must be the same path both ways",
        ),
        (
            "GPU0\t X \tNV4\nGPU1\tNV4\n",
            "nvidia-smi topo -m=['GPU1']: rows must hold a cell for each of the 2 GPU columns",
        ),
    ],
)
def test_bad_cells_name_the_pair_the_value_and_the_vocabulary(rows: str, message: str) -> None:
    with pytest.raises(InputError) as info:
        parse_topo_matrix("\tGPU0\tGPU1\tCPU Affinity\n" + rows)
    assert str(info.value) == message


def test_older_drivers_soc_reads_as_sys_and_fewer_nvlinks_is_weaker() -> None:
    text = "\tGPU0\tGPU1\tGPU2\nGPU0\t X \tNV2\tSOC\nGPU1\tNV2\t X \tNV1\nGPU2\tSOC\tNV1\t X \n"
    topology = parse_topo_matrix(text)
    assert topology.link(0, 2).kind is LinkKind.SYS
    nvlinked = probed_intra_link(topology, gpus=(0, 1, 2)[1:])
    assert nvlinked is not None and (nvlinked.gbps, nvlinked.link) == (25.0, "NV1")
    everything = probed_intra_link(topology, pcie_gbps=15.75)
    assert everything is not None
    assert (everything.gbps, everything.latency_us, everything.link) == (15.75, 12.0, "SYS")


# -- host discovery and the passport --------------------------------------------------------
def _h100_host():
    return fixture_topology("thamada_nvsim/H100SXMx8_smi_-a.txt")


def test_discovery_records_the_probed_link_of_a_multi_gpu_host() -> None:
    topo = with_intra_link(_h100_host(), _text(H100))
    assert (topo.intra_link_gbps, topo.intra_link_latency_us) == (450.0, 3.0)
    assert topo.intra_link_source == (
        "nvidia-smi topo -m: weakest pair GPU0-GPU1 NV18 (18 NVLinks × 25 GB/s: 450 GB/s)"
    )


def test_discovery_takes_pcie_pairs_at_the_gpus_host_link() -> None:
    host = _h100_host()  # PCIe gen 5 ×16 host links
    topo = with_intra_link(host, _text(DGX1))
    gen5 = {c.bus_gbps for c in host.circuits if c.id.startswith("gpu")}
    assert len(gen5) == 1 and topo.intra_link_gbps == gen5.pop()
    assert topo.intra_link_latency_us == 12.0


def test_discovery_notes_a_matrix_it_cannot_use_and_keeps_no_figures() -> None:
    host = fixture_topology("thamada_nvsim/RTX3090_smi_-a.txt")  # two GPUs
    wrong = with_intra_link(host, _text(H100))
    assert wrong.intra_link_gbps is None
    assert wrong.notes[-1] == (
        "GPU links not probed: nvidia-smi topo -m lists 8 GPUs, discovery found 2"
    )
    broken = with_intra_link(host, "no matrix here")
    assert broken.intra_link_gbps is None and broken.notes[-1].startswith("GPU links not probed")
    assert with_intra_link(host, None) == host


def test_the_passport_keeps_the_link_and_the_node_carries_it_as_measured() -> None:
    topo = with_intra_link(_h100_host(), _text(H100))
    passport = Passport.create(topo, matrix(cap("gpu0", 3000.0), cap("cpu", 100.0)))
    again = Passport.from_dict(json.loads(passport.to_json()))
    assert again.topology == topo
    node = node_from_passport(again)
    assert (node.intra_link_gbps, node.intra_link_latency_us) == (450.0, 3.0)
    labels = dict(node.labels)
    assert labels["measured"] == "bandwidth,intra_link"
    assert labels["intra_link"] == topo.intra_link_source
    plain = node_from_passport(replace(passport, topology=_h100_host()))
    assert plain.intra_link_gbps is None and dict(plain.labels)["measured"] == "bandwidth"


def test_a_passport_without_the_link_fields_still_loads() -> None:
    passport = Passport.create(_h100_host(), matrix(cap("gpu0", 3000.0)))
    text = passport.to_json()
    assert "intra_link" not in text
    assert Passport.from_dict(json.loads(text)).topology.intra_link_gbps is None
