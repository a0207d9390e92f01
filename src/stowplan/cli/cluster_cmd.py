"""``stowplan validate``, ``stowplan cluster topology|resources|stop-local``."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Annotated

import typer

from stowplan.cli.app import app
from stowplan.cli.common import err_console, out_console
from stowplan.cluster.fleet import (
    ENV_GPUS_PER_NODE,
    ENV_NUM_NODES,
    ENV_PG_STRATEGY,
    ENV_ROLE,
    ENV_SEGMENT_SIZE,
    FleetSpec,
)
from stowplan.cluster.parallelism import GpuMemory, ParallelismSpec, validate_parallelism
from stowplan.cluster.topology import (
    UNKNOWN_DOMAIN,
    local_node_resources,
    node_resources,
    select_segment_nodes,
)
from stowplan.errors import InputError
from stowplan.files.fileio import FileKind, read_text_file
from stowplan.files.fleets import load_nodes
from stowplan.models import resolve_model
from stowplan.quantities.units import parse_bytes
from stowplan.text.shell import shell_comment, shell_quote
from stowplan.text.wording import plural

cluster_app = typer.Typer(
    help="Ray cluster: NVLink topology and node resources.", no_args_is_help=True
)
app.add_typer(cluster_app, name="cluster")


_DEPRECATED_COUNT = (
    "stowplan: note: validate --nodes N is deprecated; use --num-nodes N "
    "(--nodes takes a fleet file, as in plan)"
)


def _is_count(nodes: str) -> bool:
    return nodes.strip().isascii() and nodes.strip().isdigit()


def _fleet_shape(
    nodes: str, num_nodes: int | None, gpus_per_node: int | None
) -> tuple[int, int | None, int | None]:
    """``--nodes``: a count (deprecated spelling of ``--num-nodes``) or a fleet file, read as
    its node count, its GPUs per node (which must be the same on every node) and the
    memory of its smallest GPU (None for a count)."""
    if num_nodes is not None:
        raise InputError("--nodes", nodes, "and --num-nodes are the same count; pass one")
    if _is_count(nodes):
        return int(nodes), gpus_per_node, None
    fleet = load_nodes(nodes)
    counts = sorted({n.num_gpus for n in fleet})
    if gpus_per_node is None and len(counts) > 1:
        raise InputError(
            "--nodes",
            nodes,
            f"has nodes of {', '.join(map(str, counts))} GPUs; pass --gpus-per-node to "
            "validate against one size",
        )
    smallest = min(n.vram_bytes // n.num_gpus for n in fleet)
    return len(fleet), counts[0] if gpus_per_node is None else gpus_per_node, smallest


_MEMORY_UNCHECKED = (
    "note: whether a replica fits was not checked: pass --gpu-memory SIZE or a fleet file "
    "as --nodes"
)


def _memory(per_gpu: int | None, context: int | None, layout: object) -> GpuMemory | None:
    """The GPUs' memory for the fit check (None without a model or a memory figure)."""
    if context is not None and context < 0:
        raise InputError("--context", context, "must be >= 0 tokens (0: weights alone)")
    if layout is None or per_gpu is None:
        return None
    if per_gpu <= 0:
        raise InputError("--gpu-memory", per_gpu, "must be > 0 bytes, e.g. 24GiB")
    return GpuMemory(bytes_per_gpu=per_gpu, context_tokens=context)


@app.command("validate")
def validate_command(
    tensor_parallel: Annotated[int, typer.Option("--tp", help="Tensor-parallel size.")] = 1,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline-parallel size.")] = 1,
    dp: Annotated[int, typer.Option("--dp", help="Data-parallel size (replicas).")] = 1,
    ep: Annotated[int, typer.Option("--ep", help="Expert-parallel size.")] = 1,
    model: Annotated[
        str | None, typer.Option("--model", help="Known model: checks heads and experts.")
    ] = None,
    role: Annotated[
        str | None,
        typer.Option(help=f"Fleet role: trainer, inference or sandbox (else ${ENV_ROLE})."),
    ] = None,
    num_nodes: Annotated[
        int | None, typer.Option("--num-nodes", help=f"Number of nodes (else ${ENV_NUM_NODES}).")
    ] = None,
    nodes: Annotated[
        str | None,
        typer.Option(
            "--nodes",
            help="Fleet file, as for plan --nodes: its node count and GPUs per node "
            "(a number here is read as --num-nodes, deprecated).",
        ),
    ] = None,
    gpus_per_node: Annotated[
        int | None, typer.Option(help=f"GPUs per node (else ${ENV_GPUS_PER_NODE}).")
    ] = None,
    strategy: Annotated[
        str | None, typer.Option(help=f"SPREAD, PACK or STRICT_PACK (else ${ENV_PG_STRATEGY}).")
    ] = None,
    segment_size: Annotated[
        int | None, typer.Option(help=f"Nodes per NVLink segment (else ${ENV_SEGMENT_SIZE}).")
    ] = None,
    gpu_memory: Annotated[
        str | None,
        typer.Option(
            "--gpu-memory",
            help="Memory of one GPU, e.g. 24GiB or 80GB (default: the smallest GPU of the "
            "--nodes fleet file): with --model, checks that one replica fits.",
        ),
    ] = None,
    context: Annotated[
        int | None,
        typer.Option(
            "--context",
            help="Tokens of KV cache one sequence needs in the fit check (default: 8192, "
            "or the model's maximum if smaller; 0: weights alone).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Check parallel degrees against the fleet before any placement group exists.

    With --model and the GPUs' memory (--gpu-memory, or a fleet file as --nodes) it also
    checks that one replica's weights and one sequence's KV cache fit its GPUs.
    """
    env = dict(os.environ)
    per_gpu = None if gpu_memory is None else parse_bytes(gpu_memory, field="--gpu-memory")
    if nodes is not None:
        num_nodes, gpus_per_node, from_file = _fleet_shape(nodes, num_nodes, gpus_per_node)
        per_gpu = from_file if per_gpu is None else per_gpu
    for key, flag, value in (
        (ENV_ROLE, "--role trainer, inference or sandbox", role),
        (ENV_NUM_NODES, "--num-nodes N (or --nodes FLEET_FILE)", num_nodes),
        (ENV_GPUS_PER_NODE, "--gpus-per-node N", gpus_per_node),
    ):
        sandbox = (role or env.get(ENV_ROLE, "")).strip().lower() == "sandbox"
        if value is None and not env.get(key) and not (sandbox and key == ENV_GPUS_PER_NODE):
            raise InputError(flag.split()[0], None, f"is required: pass {flag} or set ${key}")
    for key, value in (
        (ENV_ROLE, role),
        (ENV_NUM_NODES, num_nodes),
        (ENV_GPUS_PER_NODE, gpus_per_node),
        (ENV_PG_STRATEGY, strategy),
        (ENV_SEGMENT_SIZE, segment_size),
    ):
        if value is not None:
            env[key] = str(value)
    fleet = FleetSpec.from_env(env)
    layout = None if model is None else resolve_model(model)
    memory = _memory(per_gpu, context, layout)
    check = validate_parallelism(
        ParallelismSpec(tensor_parallel=tensor_parallel, pipeline=pp, data=dp, expert=ep),
        fleet,
        layout,
        memory,
    )
    if nodes is not None and _is_count(nodes):
        # Said once the check passed: an error stays the one line it is.
        err_console.print(_DEPRECATED_COUNT, soft_wrap=True)
    for warning in check.warnings:
        err_console.print(f"warning: {warning}", soft_wrap=True)
    if layout is not None and memory is None:
        err_console.print(_MEMORY_UNCHECKED, soft_wrap=True)
    if as_json:
        doc = {
            "ok": True,
            "replica_gpus": check.replica_gpus,
            "world_size": check.world_size,
            "fleet_gpus": check.fleet_gpus,
            "unified_group": check.unified_group,
            "nodes_per_replica": check.nodes_per_replica,
            "strategy": fleet.strategy.value,
            "bytes_per_gpu": check.bytes_per_gpu,
            "usable_bytes_per_gpu": check.usable_bytes_per_gpu,
            "notes": list(check.notes),
            "warnings": list(check.warnings),
        }
        out_console.file.write(json.dumps(doc, indent=2) + "\n")
        return
    out_console.file.write(
        f"ok: tp×pp×dp = {tensor_parallel}×{pp}×{dp} = {check.world_size} of "
        f"{check.fleet_gpus} GPUs "
        f"({fleet.role.value}, {plural(fleet.num_nodes, 'node')} × {fleet.gpus_per_node}), "
        f"ep={ep}\n"
    )
    for note in check.notes:
        out_console.file.write(f"  {note}\n")


@cluster_app.command("resources")
def resources_command(
    nvidia_smi: Annotated[
        Path | None,
        typer.Option("--nvidia-smi", help="Saved `nvidia-smi -q` output (default: run it)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the resources as JSON.")] = False,
) -> None:
    """Print the custom resources this node should register at `ray start`."""
    if nvidia_smi is None:
        found = local_node_resources(os.environ)
    else:
        text = read_text_file(
            nvidia_smi, field="--nvidia-smi", kind=FileKind.TOOL_OUTPUT, errors="replace"
        )
        found = node_resources(text, os.environ, socket.gethostname())
    resources = {k: int(v) for k, v in found.as_resources().items()}
    payload = json.dumps(resources, sort_keys=True)
    if as_json:
        out_console.file.write(payload + "\n")
        return
    out_console.file.write(f"ray start --resources={shell_quote(payload)}\n")
    domain = found.domain or "none (no multi-node NVLink fabric)"
    out_console.file.write(shell_comment(f"nvlink domain: {domain}") + "\n")
    rank = f"topo_rank {found.topo_rank} from {found.topo_rank_source}"
    out_console.file.write(shell_comment(rank) + "\n")


@cluster_app.command("topology")
def topology_command(
    address: Annotated[
        str | None, typer.Option(help="Ray cluster address (else $RAY_ADDRESS).")
    ] = None,
    segment_size: Annotated[
        int | None, typer.Option(help="Also select segments of this many nodes.")
    ] = None,
    num_nodes: Annotated[int | None, typer.Option(help="Nodes to select in segments.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show the live cluster's NVLink domains, ranks and (optionally) segments."""
    from stowplan.cluster.bootstrap import init_ray
    from stowplan.cluster.topology import get_ray_cluster_topology

    env = dict(os.environ)
    if address is not None:
        env["RAY_ADDRESS"] = address
    if not env.get("RAY_ADDRESS"):
        raise InputError("--address", None, "give a Ray cluster address or set RAY_ADDRESS")
    init_ray(env)
    topology = get_ray_cluster_topology()
    selection = None
    if segment_size is not None:
        selection = select_segment_nodes(
            topology, segment_size, num_nodes if num_nodes is not None else segment_size
        )
    if as_json:
        doc: dict[str, object] = {
            "nodes": [
                {"node_id": n, "domain": d, "topo_rank": r}
                for n, (d, r) in sorted(topology.items(), key=lambda kv: kv[0])
            ]
        }
        if selection is not None:
            doc["segments"] = [
                {"domain": d, "nodes": list(s)}
                for d, s in zip(selection.domains, selection.segments, strict=True)
            ]
            doc["remainder"] = list(selection.remainder)
        out_console.file.write(json.dumps(doc, indent=2) + "\n")
        return
    from rich.table import Table

    table = Table("node", "nvlink domain", "topo_rank")
    for node, (domain, rank) in sorted(
        topology.items(), key=lambda kv: (kv[1][0] == UNKNOWN_DOMAIN, kv[1][0], kv[1][1] or 0)
    ):
        table.add_row(node, domain, "-" if rank is None else str(rank))
    out_console.print(table)
    if selection is not None:
        for i, (domain, seg) in enumerate(zip(selection.domains, selection.segments, strict=True)):
            out_console.print(f"segment {i} ({domain}): {', '.join(seg)}")
        out_console.print(f"remainder: {', '.join(selection.remainder) or '-'}")


@cluster_app.command("stop-local")
def stop_local_command(
    devices: Annotated[
        str | None,
        typer.Option(
            "--devices", help="Device list of the head to stop (else $CUDA_VISIBLE_DEVICES)."
        ),
    ] = None,
) -> None:
    """Stop the detached local Ray head of this device set and forget it."""
    from stowplan.cluster.bootstrap import device_tag
    from stowplan.cluster.head import stop_local_head

    visible = devices if devices is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
    tag = device_tag(visible)
    head = stop_local_head(tag)
    if head is None:
        out_console.file.write(f"no local Ray head recorded for {tag}\n")
        return
    out_console.file.write(f"stopped the local Ray head {tag} at {head.address}\n")
