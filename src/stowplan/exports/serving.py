"""A serve plan as engine settings: every replica's export, sized for its U* requests.

Each replica is exported as its plan is (:func:`~stowplan.exports.export_plan`), then
told how many requests it runs at once and how long each is:

* vLLM: ``--max-num-seqs U*`` and ``--max-model-len P+O``;
* SGLang: ``--max-running-requests U*`` and ``--context-length P+O``;
* llama.cpp: ``-np U*`` slots and ``-c U*·(P+O)`` (llama-server gives each slot
  ``-c / -np`` tokens);
* Accelerate: the plan's device map (a batch size is the caller's loop).

Identical replicas (the same blocks per stage on alike nodes, the same U*) are one
vLLM instance with ``--data-parallel-size N`` or one SGLang instance with
``--dp-size N``; the export adds that command and says so (with all of their GPUs
when they sit side by side on one node).  Replicas side by side on one node serve on
the engine's default port plus their rank on it.  Unlike replicas are
separate engine instances.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from stowplan.exports.result import Engine, EngineExport
from stowplan.model import NodeDescriptor
from stowplan.quantities.checks import check_choice
from stowplan.serve_plan import ReplicaPlan, ServePlan

__all__ = ["ServeExport", "export_serve_plan"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeExport:
    """Every replica's :class:`EngineExport`, and the data-parallel commands."""

    engine: Engine
    replicas: tuple[EngineExport, ...]
    node_ids: tuple[tuple[str, ...], ...]
    """Per replica, the nodes it runs on."""
    commands: tuple[str, ...] = ()
    """One instance for a group of identical replicas (vLLM, SGLang data parallel)."""
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-compatible data."""
        return {
            "engine": self.engine.value,
            "replicas": [
                {"nodes": list(ids), **e.to_dict()}
                for ids, e in zip(self.node_ids, self.replicas, strict=True)
            ],
            "commands": list(self.commands),
            "notes": list(self.notes),
        }

    def render_text(self) -> str:
        """Each replica's text under a header naming its nodes; then the data-parallel
        commands and the notes."""
        parts = []
        for i, (ids, e) in enumerate(zip(self.node_ids, self.replicas, strict=True)):
            parts.append(f"# replica {i} on {' '.join(ids)}\n{e.render_text()}")
        tail = [f"# {n}" for n in self.notes] + list(self.commands)
        if tail:
            parts.append("\n".join(tail) + "\n")
        return "\n".join(parts)


def _set_flag(line: str, flag: str, value: str) -> str:
    """``line`` with ``flag value`` (replacing the flag's value when present)."""
    pattern = re.compile(rf"(?<=\s){re.escape(flag)}\s+\S+")
    if pattern.search(line):
        return pattern.sub(f"{flag} {value}", line, count=1)
    return f"{line} {flag} {value}"


_LAUNCH = {
    Engine.VLLM: ("vllm serve", (("--max-num-seqs", "users"), ("--max-model-len", "context"))),
    Engine.SGLANG: (
        "sglang.launch_server",
        (("--max-running-requests", "users"), ("--context-length", "context")),
    ),
    Engine.LLAMACPP: ("llama-server", (("-np", "users"), ("-c", "cache"))),
}
"""Per engine: the words of its serving command, and the flags sized per replica."""

_DATA_PARALLEL = {Engine.VLLM: "--data-parallel-size", Engine.SGLANG: "--dp-size"}


def _sized(e: EngineExport, r: ReplicaPlan, context: int) -> EngineExport:
    launch = _LAUNCH.get(e.engine)
    if launch is None:
        return e
    words, flags = launch
    values = {"users": r.users, "context": context, "cache": r.users * context}
    commands = []
    for line in e.commands:
        if words in line:
            for flag, key in flags:
                line = _set_flag(line, flag, str(values[key]))
        commands.append(line)
    note = f"sized for U* = {r.users} requests of {context} tokens at once"
    return replace(e, commands=tuple(commands), notes=(*e.notes, note))


_PORTS = {Engine.VLLM: 8000, Engine.SGLANG: 30000, Engine.LLAMACPP: 8080}
"""Each engine's default serving port; replicas side by side on one node take the next."""


def _side_by_side(replicas: Sequence[ReplicaPlan], i: int) -> int:
    """How many replicas before ``i`` run on the first node of replica ``i``."""
    first = replicas[i].node_ids[0]
    return sum(1 for r in replicas[:i] if first in r.node_ids)


def _ported(e: EngineExport, k: int) -> EngineExport:
    """``e`` serving on its engine's default port plus ``k`` (unchanged for ``k`` = 0)."""
    base = _PORTS.get(e.engine)
    launch = _LAUNCH.get(e.engine)
    if k == 0 or base is None or launch is None:
        return e
    port = base + k
    commands = tuple(
        _set_flag(line, "--port", str(port)) if launch[0] in line else line for line in e.commands
    )
    note = f"port {port}: another replica serves on this node too"
    return replace(e, commands=commands, notes=(*e.notes, note))


def _one_node_gpus(replicas: Sequence[ReplicaPlan]) -> str | None:
    """The GPUs ``replicas`` use, comma-separated, when they all run on one node and each
    names its GPUs; else None."""
    nodes = {a.node_id for r in replicas for a in r.plan.assignments}
    if len(nodes) != 1 or any(not a.gpu_indices for r in replicas for a in r.plan.assignments):
        return None
    gpus = sorted({g for r in replicas for a in r.plan.assignments for g in a.gpu_indices})
    return ",".join(map(str, gpus))


def _alike_key(r: ReplicaPlan, by_id: dict[str, NodeDescriptor]) -> tuple[object, ...]:
    def node_key(nid: str) -> tuple[object, ...]:
        n = by_id.get(nid)
        if n is None:
            return (nid,)
        return (n.gpu_name, n.vram_bytes, n.num_gpus, n.mem_bandwidth_gbps, n.flops_estimate)

    stages = tuple(
        (a.block_range, a.tensor_parallel, node_key(a.node_id)) for a in r.plan.assignments
    )
    return (r.users, stages)


def export_serve_plan(
    sp: ServePlan,
    to: Engine | str,
    *,
    nodes: Sequence[NodeDescriptor] | None = None,
    model: str | None = None,
) -> ServeExport:
    """Every replica of ``sp`` as engine ``to`` runs it (see the module).

    ``nodes`` and ``model`` are as :func:`~stowplan.exports.export_plan` takes them
    (default: the descriptors each replica's plan recorded, and its model name).
    Raises what :func:`~stowplan.exports.export_plan` raises for a replica.
    """
    from stowplan.exports import export_plan

    engine = check_choice("--to", to, Engine, normalise=lambda v: v.strip().lower())
    context = sp.workload.context_tokens
    all_nodes = list(nodes or ()) or [n for r in sp.replicas for n in r.plan.nodes]
    by_id = {n.id: n for n in all_nodes}
    exports = tuple(
        _ported(
            _sized(export_plan(r.plan, engine, nodes=nodes or None, model=model), r, context),
            _side_by_side(sp.replicas, i),
        )
        for i, r in enumerate(sp.replicas)
    )
    groups: dict[tuple[object, ...], list[int]] = {}
    for i, r in enumerate(sp.replicas):
        groups.setdefault(_alike_key(r, by_id), []).append(i)
    commands: list[str] = []
    notes: list[str] = []
    flag = _DATA_PARALLEL.get(engine)
    for members in groups.values():
        if len(members) < 2:
            continue
        names = ", ".join(str(i) for i in members)
        if flag is None:
            notes.append(
                f"replicas {names} are identical: {engine.value} runs each as an instance "
                "of its own (it has no data parallelism)"
            )
            continue
        first = exports[members[0]]
        words = _LAUNCH[engine][0]
        dp = [_set_flag(c, flag, str(len(members))) for c in first.commands if words in c]
        shared = _one_node_gpus([sp.replicas[i] for i in members])
        if shared is not None:
            # Side by side on one node: the one instance gets all of their GPUs, on the
            # first replica's port.
            dp = [
                re.sub(r"CUDA_VISIBLE_DEVICES=\S+", f"CUDA_VISIBLE_DEVICES={shared}", c) for c in dp
            ]
        notes.append(
            f"replicas {names} are identical: one {engine.value} instance with {flag} "
            f"{len(members)} runs them all (instead of their own commands; start its ranks "
            "on their nodes as the engine's data-parallel deployment describes)"
        )
        commands += dp
    if len(groups) > 1:
        notes.append("unlike replicas run as separate engine instances")
    return ServeExport(
        engine=engine,
        replicas=exports,
        node_ids=tuple(r.node_ids for r in sp.replicas),
        commands=tuple(commands),
        notes=tuple(notes),
    )
