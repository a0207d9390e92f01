"""Helpers shared by the exporters: node kinds, expert ownership, the model argument,
GPU lists and the replanning command a refusal names."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from stowplan.errors import InputError
from stowplan.files.fileio import path_exists
from stowplan.model import ModelLayout, NodeDescriptor
from stowplan.models import hf_id, lookup, parse_dtype, resolve_model
from stowplan.models.known import known_model, known_with_dtype
from stowplan.plan import Plan, StageAssignment
from stowplan.text.shell import shell_quote

__all__ = [
    "ADDRESS_LABELS",
    "ONE_HOST",
    "expert_owners",
    "is_cpu_node",
    "model_argument",
    "model_spec",
    "node_address",
    "node_devices",
    "nodes_by_id",
    "replan_command",
    "resolve_layout",
    "stage_degree",
]

ADDRESS_LABELS = ("address", "host")
"""Node labels read, in this order, as the node's network address."""

ONE_HOST = "this engine runs on one host: every node of the plan must be a device of it"

_CPU_WORDS = {"cpu", "host", "system ram", "ram"}


def nodes_by_id(nodes: Sequence[NodeDescriptor] | None) -> dict[str, NodeDescriptor]:
    return {n.id: n for n in nodes or ()}


def node_address(node: NodeDescriptor | None) -> str | None:
    """The node's ``address`` (or ``host``) label, or None."""
    labels = dict(node.labels) if node is not None else {}
    for key in ADDRESS_LABELS:
        if labels.get(key, "").strip():
            return labels[key].strip()
    return None


def is_cpu_node(node_id: str, nodes: dict[str, NodeDescriptor]) -> bool:
    """A stage runs on the host CPU when its node says so.

    With a descriptor: its ``gpu_name`` is ``CPU`` or a label ``kind=cpu`` is set.
    Without one: the node id is ``cpu`` or starts with ``cpu`` (``cpu``, ``cpu0``).
    """
    node = nodes.get(node_id)
    if node is not None:
        labels = dict(node.labels)
        if labels.get("kind", "").lower() == "cpu":
            return True
        return node.gpu_name.strip().lower() in _CPU_WORDS
    return node_id.lower().startswith("cpu")


def resolve_layout(
    plan: Plan, layout: ModelLayout | None, model: str | None = None
) -> ModelLayout | None:
    """The given layout, else the model file ``model`` (or the plan's
    :attr:`~stowplan.plan.Plan.model_source`) points at, else the known model named by
    the plan, else None.

    A path counts when it exists (config.json, checkpoint folder, safetensors index or
    .gguf): the plan's name of a file is only its short name, so the export reads the
    family from the file again.
    """
    if layout is not None:
        return layout
    for given in (model, plan.model_source):
        if given and path_exists(Path(given).expanduser()):
            return resolve_model(given)
    return lookup(plan.model_name) if plan.model_name else None


def expert_owners(plan: Plan) -> dict[int, dict[int, int]]:
    """Per MoE block, how many of its experts each stage owns: ``{block: {stage: count}}``."""
    owners: dict[int, dict[int, int]] = {}
    for a in plan.assignments:
        for e in a.owned_experts:
            per_block = owners.setdefault(e.block, {})
            per_block[a.stage] = per_block.get(a.stage, 0) + 1
    return owners


def stage_of_block(plan: Plan, block: int) -> StageAssignment:
    for a in plan.assignments:
        if a.block_range[0] <= block < a.block_range[1]:
            return a
    return plan.assignments[-1]


def model_argument(plan: Plan, model: str | None) -> tuple[str, tuple[str, ...]]:
    """The model path or id to put on the command line, and a note when it is a stand-in.

    ``model`` when given; else the plan's :attr:`~stowplan.plan.Plan.model_source` (the
    file it was made from, or the known model's Hugging Face id); else the Hugging Face
    id the model table gives the plan's name; else the name, with a note.
    """
    if model:
        return model, ()
    name = plan.model_name or "MODEL"
    source = plan.model_source
    if source and Path(source).is_absolute():
        return source, ()
    known = source or hf_id(name)
    if known is not None:
        priced = _priced_dtype(name)
        return known, () if priced is None else (
            f"the plan prices the weights as {priced}; {known} is the checkpoint as published: "
            f"pass --model a checkpoint stored as {priced}",
        )
    if "/" in name:
        return name, ()
    return name, (
        f"'{name}' is stowplan's short name: replace it with the model's path or "
        "Hugging Face id (or pass --model)",
    )


def _priced_dtype(name: str) -> str | None:
    """The storage the plan's model name prices that differs from the published
    checkpoint's (``llama3.1:8b-q4_0``, ``llama3.1:8b@fp8``), or None."""
    base, _, tag = name.partition("@")
    row = known_model(base)
    priced = tag or (row.dtype if row is not None else None)
    if row is None and (tagged := known_with_dtype(base)) is not None:
        row, priced = tagged[0], priced or tagged[1]
    if row is None or priced is None:
        return priced
    published = row.config.get("torch_dtype")
    try:
        same = published is not None and parse_dtype(published) == parse_dtype(priced)
    except InputError:
        same = False
    return None if same else priced


def model_spec(plan: Plan) -> list[str]:
    """The words that name the plan's model to ``stowplan plan`` again: the file it was
    made from, else its known name (a priced dtype as ``--dtype``), else its name."""
    source = plan.model_source
    if source and Path(source).is_absolute():
        return [source]
    name = plan.model_name or source or "MODEL"
    base, _, tag = name.partition("@")
    if tag and lookup(base) is not None:
        return [base, "--dtype", tag]
    if lookup(name) is not None or known_with_dtype(name) is not None:
        return [name]
    return [source or name]


def stage_degree(a: StageAssignment, nodes: dict[str, NodeDescriptor]) -> int:
    """The GPUs that split ``a``'s blocks: its ``tensor_parallel`` when it lists GPUs or
    a degree above 1, else every GPU of its node (a whole node), else 1."""
    if a.gpu_indices or a.tensor_parallel > 1:
        return a.tensor_parallel
    node = nodes.get(a.node_id)
    return node.num_gpus if node is not None else 1


def node_devices(
    stages: Sequence[StageAssignment], nodes: dict[str, NodeDescriptor], *, ordered: bool
) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for one node's ``stages``: their GPUs in stage order (or
    ascending when not ``ordered``), or None when the list would change nothing (no stage
    lists GPUs, or they are all of the node's GPUs in their own order, as its fleet entry
    says)."""
    gpus = [g for a in stages for g in a.gpu_indices]
    if not gpus:
        return None
    if not ordered:
        gpus.sort()
    node = nodes.get(stages[0].node_id)
    if node is not None and gpus == list(range(node.num_gpus)):
        return None
    return ",".join(str(g) for g in gpus)


def replan_command(
    plan: Plan,
    engine: str | None,
    nodes_file: str | None = None,
    *extra: str,
    context: str | None = None,
) -> str:
    """The ``stowplan plan`` line that plans the same model for ``engine``'s rule (and the
    ``extra`` options, e.g. ``--block-local``).

    ``nodes_file`` is the fleet file (``FLEET`` when unknown); the plan's sequences
    (``--batch``) and context are kept, or the context is ``context`` when given (``max``).
    """
    words = ["stowplan", "plan", *model_spec(plan), "--nodes", nodes_file or "FLEET"]
    if engine is not None:
        words += ["--engine", engine]
    words += extra
    prediction = plan.rationale.prediction
    if prediction is not None and prediction.batch > 1:
        words += ["--batch", str(prediction.batch)]
    if context is not None:
        words += ["--context", context]
    elif plan.context_tokens is not None:
        words += ["--context", str(plan.context_tokens)]
    return " ".join(shell_quote(w) for w in words)
