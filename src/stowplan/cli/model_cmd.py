"""``stowplan model inspect NAME|PATH``: bytes per component, params, KV cache, layer kinds."""

from __future__ import annotations

import json
from collections import Counter
from typing import Annotated, Any

import typer
from rich.table import Table

from stowplan.cli.app import app
from stowplan.cli.common import out_console
from stowplan.models import ModelReport, inspect_model
from stowplan.quantities.units import format_bytes

model_app = typer.Typer(help="Inspect model layouts.", no_args_is_help=True)
app.add_typer(model_app, name="model")


def report_to_dict(report: ModelReport) -> dict[str, Any]:
    """The JSON form of a report (bytes as integers)."""
    m = report.layout
    e = m.experts
    return {
        "name": m.name,
        "source": report.source,
        "exact": report.exact,
        "family": m.family,
        "dtype": m.dtype,
        "num_blocks": m.num_blocks,
        "hidden_dim": m.hidden_dim,
        "num_attention_heads": m.num_attention_heads,
        "num_kv_heads": m.num_kv_heads,
        "head_dim": m.head_dim,
        "tied_embeddings": m.tied_embeddings,
        "total_params": m.total_params,
        "active_params": m.active_params,
        "weight_bytes": m.weight_bytes,
        "embed_bytes": m.embed_params_bytes,
        "head_bytes": m.head_params_bytes,
        "block_bytes": list(m.block_sizes()),
        "block_read_bytes": list(m.block_read_sizes()),
        "kv_bytes_per_token": list(m.kv_bytes_per_token) if m.kv_bytes_per_token else None,
        "kv_window_tokens": list(m.kv_window_tokens) if m.kv_window_tokens else None,
        "experts": None
        if e is None
        else {
            "num_experts": e.num_experts,
            "experts_per_token": e.experts_per_token,
            "expert_bytes": e.expert_params_bytes,
            "num_shared_experts": e.num_shared_experts,
            "shared_expert_bytes": e.shared_expert_params_bytes,
            "moe_blocks": list(e.moe_blocks),
        },
        "layer_kinds": list(report.layer_kinds),
        "stored_bytes": report.stored_bytes,
        "stored_params": report.stored_params,
        "mtp_bytes": report.mtp_bytes,
        "mtp_params": report.mtp_params,
        "other_tensors": list(report.other_tensors),
        "other_bytes": report.other_bytes,
        "notes": list(report.notes),
    }


def _params(n: int | None) -> str:
    return "-" if n is None else f"{n:,} ({n / 1e9:.2f}B)"


def render_report(report: ModelReport) -> None:
    """Print a report as tables."""
    m = report.layout
    title = f"{m.name}: {m.family}, {m.dtype}, {'exact' if report.exact else 'estimate'}"
    t = Table("component", "bytes", "count", title=title, title_justify="left")
    t.add_row("embed", format_bytes(m.embed_params_bytes), "1")
    sizes = Counter(m.block_sizes())
    for size, count in sorted(sizes.items()):
        t.add_row("block", format_bytes(size), str(count))
    if m.experts is not None:
        e = m.experts
        t.add_row("  routed expert", format_bytes(e.expert_params_bytes), f"{e.num_experts}/block")
        if e.num_shared_experts:
            t.add_row("  shared experts", format_bytes(e.shared_expert_params_bytes), "1/block")
    head = "head (final norm + lm_head" + (", tied copy)" if m.tied_embeddings else ")")
    t.add_row(head, format_bytes(m.head_params_bytes), "1")
    t.add_row("weights (all stages)", format_bytes(m.weight_bytes), "")
    if report.mtp_bytes:
        t.add_row("MTP layers (not placed)", format_bytes(report.mtp_bytes), "")
    if report.other_tensors:
        t.add_row(
            "other tensors (not placed)",
            format_bytes(report.other_bytes),
            str(len(report.other_tensors)),
        )
    out_console.print(t)
    read = sum(m.block_read_sizes()) + m.embed_params_bytes + m.head_params_bytes
    out_console.print(f"params total   {_params(m.total_params)}")
    out_console.print(f"params active  {_params(m.active_params)}")
    out_console.print(
        f"stored         {_params(report.stored_params)} in {format_bytes(report.stored_bytes)}"
    )
    out_console.print(f"read per token {format_bytes(read)}")
    if m.kv_bytes_per_token:
        kv = Counter(
            zip(m.kv_bytes_per_token, m.kv_window_tokens or (None,) * m.num_blocks, strict=True)
        )
        parts = [
            f"{count}×{b} B" + (f" (window {w})" if w is not None else "")
            for (b, w), count in sorted(kv.items(), key=lambda x: (x[0][0], x[0][1] or 0))
        ]
        out_console.print(f"KV per token   {sum(m.kv_bytes_per_token):,} B: " + ", ".join(parts))
    kinds = Counter(report.layer_kinds)
    out_console.print("layer kinds    " + ", ".join(f"{c}×{k}" for k, c in kinds.items()))
    for note in report.notes:
        out_console.print(f"note: {note}")
    for name in report.other_tensors[:10]:
        out_console.print(f"not placed: {name}")
    if len(report.other_tensors) > 10:
        out_console.print(f"not placed: … and {len(report.other_tensors) - 10} more")


@model_app.command("inspect")
def inspect_command(
    model: Annotated[
        str, typer.Argument(help="Known name, HF id, config.json, checkpoint folder or .gguf.")
    ],
    dtype: Annotated[
        str | None, typer.Option("--dtype", help="Storage override: bf16, fp8, int4, q4_k_m …")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show a model's bytes per component, parameters, KV cache and layer kinds."""
    report = inspect_model(model, dtype=dtype)
    if as_json:
        out_console.file.write(json.dumps(report_to_dict(report), indent=2) + "\n")
        return
    render_report(report)
