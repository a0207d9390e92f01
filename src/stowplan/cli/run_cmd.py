"""``stowplan run``: a Hugging Face checkpoint planned, run stage by stage on Ray, checked."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from stowplan.cli.app import app
from stowplan.cli.common import err_console, out_console
from stowplan.cli.options import NODES_HELP, MaxStages, MinStages
from stowplan.errors import InputError
from stowplan.files.fleets import load_nodes
from stowplan.model import Constraints, NodeDescriptor
from stowplan.plan import plan_to_dict
from stowplan.quantities.checks import check_int, check_number
from stowplan.quantities.units import format_bytes
from stowplan.text.wording import plural

QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
"""Set for the command: no download, no progress bars on the terminal."""


@contextmanager
def _cluster(
    fleet: Sequence[NodeDescriptor] | None, timeout: float
) -> Iterator[list[NodeDescriptor]]:
    """The nodes to plan on, their ids Ray's: the ``RAY_ADDRESS`` cluster's, or a local
    cluster of one fake node per fleet node on 127.0.0.1 (stopped at the end)."""
    from stowplan.cluster.nodes import ray_node_descriptors
    from stowplan.cluster.ray_runtime import require_ray

    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray = require_ray()
        started = not ray.is_initialized()
        if started:
            ray.init(address=address, log_to_driver=False)
        try:
            yield ray_node_descriptors(timeout_s=timeout)
        finally:
            if started:
                ray.shutdown()
        return
    if fleet is None:
        raise InputError(
            "--nodes",
            None,
            "is needed without RAY_ADDRESS: a fleet file to start a local cluster of",
        )
    from stowplan.cluster.local import FakeNode, start_local_cluster

    fakes = [
        FakeNode(
            gpu_name="".join(c if not c.isspace() else "-" for c in n.gpu_name) or "GPU",
            vram_bytes=max(1, n.vram_bytes),
            num_gpus=n.num_gpus,
            num_cpus=max(2, n.num_gpus),
        )
        for n in fleet
    ]
    local = start_local_cluster(fakes)
    try:
        err_console.print(
            f"started a local Ray cluster at {local.address} with "
            f"{plural(len(fakes), 'fake GPU node')}"
        )
        yield [replace(n, id=local.node_id(h)) for n, h in zip(fleet, local.workers, strict=True)]
    finally:
        local.shutdown()


def _doc(report: Any, text: str, reference_text: str | None) -> dict[str, Any]:
    run = report.run
    first = run.generations[0]
    c = report.comparison
    return {
        "plan": plan_to_dict(report.plan),
        "prompt_tokens": list(report.prompt),
        "batch": report.batch,
        "tokens": list(first.tokens),
        "text": text,
        "stages": [
            {
                k: s[k]
                for k in (
                    "stage",
                    "node_id",
                    "block_range",
                    "owns_embed",
                    "owns_head",
                    "shards",
                    "header_bytes",
                    "tensor_bytes",
                    "bytes_read",
                    "load_s",
                    "device",
                    "steps",
                    "busy_s",
                )
            }
            for s in run.stages
        ],
        "measured": {
            "ttft_s": run.ttft_s,
            "tokens_per_s": run.decode_tokens_per_s,
            "wall_s": run.wall_s,
        },
        "predicted": {
            "ttft_s": report.predicted_ttft_s,
            "tokens_per_s": report.prediction.tokens_per_s,
        },
        "check": None
        if c is None
        else {
            "match": c.match,
            "first_difference": c.first_difference,
            "max_abs_logit_diff": c.max_abs_logit_diff,
            "tolerance": c.tolerance,
            "reference_text": reference_text,
        },
    }


def _render(doc: dict[str, Any], gpu: dict[str, str]) -> None:
    from rich.table import Table

    table = Table(title=f"{plural(len(doc['stages']), 'stage')}", title_justify="left")
    for col in ("stage", "gpu", "blocks", "owns", "shards", "read", "load", "device"):
        table.add_column(
            col, justify="left" if col in {"gpu", "blocks", "owns", "device"} else "right"
        )
    for s in doc["stages"]:
        owns = "+".join(w for w, f in (("embed", s["owns_embed"]), ("head", s["owns_head"])) if f)
        lo, hi = s["block_range"]
        table.add_row(
            str(s["stage"]),
            gpu.get(s["node_id"], "?")[:14],
            f"[{lo}, {hi})",
            owns or "-",
            str(len(s["shards"])),
            format_bytes(s["bytes_read"]),
            f"{s['load_s']:.2f} s",
            s["device"],
        )
    out_console.print(table)
    out_console.print(f"text: {doc['text']!r}", soft_wrap=True)
    m, p = doc["measured"], doc["predicted"]
    out_console.print(
        f"TTFT:   measured {m['ttft_s'] * 1e3:9.1f} ms   predicted {p['ttft_s'] * 1e3:9.3f} ms"
    )
    out_console.print(
        f"decode: measured {m['tokens_per_s']:9.1f} tok/s "
        f"predicted {p['tokens_per_s']:9.1f} tok/s (U={doc['batch']})"
    )
    c = doc["check"]
    if c is not None:
        n = len(doc["tokens"])
        if c["match"]:
            out_console.print(
                f"MATCH: {n}/{n} tokens equal one process; max |logit diff| "
                f"{c['max_abs_logit_diff']:.3g} "
                f"(tolerance {c['tolerance']:g})"
            )
        else:
            out_console.print(
                f"MISMATCH at position {c['first_difference']}: one process "
                f"gives {c['reference_text']!r}"
            )


@app.command("run")
def run_command(
    checkpoint: Annotated[
        Path,
        typer.Argument(
            help="Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer)."
        ),
    ],
    prompt: Annotated[
        str, typer.Option("--prompt", help="Prompt text (the checkpoint's tokenizer).")
    ],
    nodes: Annotated[
        Path | None,
        typer.Option(
            "--nodes",
            help=f"{NODES_HELP}: a local cluster of one fake node each "
            "is started on 127.0.0.1 (without RAY_ADDRESS).",
        ),
    ] = None,
    max_new_tokens: Annotated[
        int, typer.Option("--max-new-tokens", help="Tokens to generate.")
    ] = 16,
    batch: Annotated[
        int,
        typer.Option(
            "--batch", help="Concurrent copies of the prompt (U), run as the plan's microbatches."
        ),
    ] = 1,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Also run the whole model in one process; exit 1 "
            "unless every token and logit agrees.",
        ),
    ] = False,
    min_stages: MinStages = None,
    max_stages: MaxStages = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds to place the stages.")
    ] = 60.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Plan CHECKPOINT, run it with one stage actor per stage on Ray, print the text.

    Each stage reads only its own tensors; the table shows what it read and how long
    it took to load; TTFT and decode tokens/s are measured beside the cost model's
    prediction.  KV is reserved for the prompt plus the new tokens.
    """
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    check_int("--max-new-tokens", max_new_tokens, minimum=1)
    check_int("--batch", batch, minimum=1, maximum=4096)
    check_number("--timeout", timeout, positive=True, upper=86_400.0)
    from stowplan.runtime.run import detokenize, plan_checkpoint, run_checkpoint, tokenize

    ids = tokenize(checkpoint, prompt)
    constraints = Constraints(min_stages=min_stages, max_stages=max_stages)
    fleet = load_nodes(nodes) if nodes is not None else None
    if fleet is not None:  # a plan error shows before any cluster starts
        plan_checkpoint(
            checkpoint,
            fleet,
            prompt_tokens=len(ids),
            max_new_tokens=max_new_tokens,
            batch=batch,
            constraints=constraints,
        )
    with _cluster(fleet, timeout) as planned:
        report = run_checkpoint(
            checkpoint,
            planned,
            ids,
            max_new_tokens,
            batch=batch,
            constraints=constraints,
            check=check,
            timeout_s=timeout,
        )
        gpu = {n.id: n.gpu_name for n in planned}
    reference = None
    if report.comparison is not None and not report.comparison.match:
        from stowplan.runtime.generation import generate_reference

        reference = detokenize(
            checkpoint, generate_reference(checkpoint, ids, max_new_tokens).tokens
        )
    doc = _doc(report, detokenize(checkpoint, report.run.generations[0].tokens), reference)
    if as_json:
        out_console.file.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    else:
        _render(doc, gpu)
    if report.comparison is not None and not report.comparison.match:
        sys.stdout.flush()
        raise typer.Exit(1)
