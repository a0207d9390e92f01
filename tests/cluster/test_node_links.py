"""A Ray node's descriptor takes the GPU link its probe read, when it read the node's GPUs."""

from __future__ import annotations

from stowplan.cluster.nodes import GpuReport, describe

LABELS = {"gpu_name": "H100-SXM", "vram_bytes": "320GiB"}
SOURCE = "nvidia-smi topo -m: weakest pair GPU0-GPU1 NV18 (18 NVLinks × 25 GB/s: 450 GB/s)"


def _report(gpus: int) -> GpuReport:
    return GpuReport(
        node_id="n",
        intra_link_gbps=450.0,
        intra_link_latency_us=3.0,
        intra_link_source=SOURCE,
        intra_link_gpus=gpus,
    )


def test_the_probed_link_of_the_nodes_gpus_is_recorded_as_measured() -> None:
    node = describe("n", LABELS, {"GPU": 4.0}, _report(4))
    assert (node.num_gpus, node.intra_link_gbps, node.intra_link_latency_us) == (4, 450.0, 3.0)
    labels = dict(node.labels)
    assert (labels["measured"], labels["intra_link"]) == ("intra_link", SOURCE)


def test_a_matrix_of_another_gpu_count_is_not_used() -> None:
    node = describe("n", LABELS, {"GPU": 4.0}, _report(8))
    assert node.intra_link_gbps is None and node.intra_link_latency_us is None
    assert "measured" not in dict(node.labels) and "intra_link" not in dict(node.labels)


def test_the_passports_link_has_no_count_and_is_used() -> None:
    node = describe("n", LABELS, {"GPU": 2.0}, _report(0))
    assert node.intra_link_gbps == 450.0


def test_nvml_and_the_link_are_listed_together() -> None:
    report = GpuReport(
        node_id="n",
        gpu_names=("NVIDIA H100 80GB HBM3",) * 2,
        gpu_memory_bytes=(80 << 30,) * 2,
        intra_link_gbps=450.0,
        intra_link_latency_us=3.0,
        intra_link_source=SOURCE,
        intra_link_gpus=2,
    )
    assert dict(describe("n", {}, {"GPU": 2.0}, report).labels)["measured"] == "nvml,intra_link"
