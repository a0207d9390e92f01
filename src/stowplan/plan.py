"""The planner's output: a frozen, serialisable ``Plan`` (seed 000 §5.2, extended).

A plan is data: :func:`plan_to_json` gives byte-identical JSON for equal
plans, :func:`plan_from_json` validates and rejects unknown schema versions
and malformed input with an :class:`~stowplan.errors.InputError`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from itertools import pairwise
from typing import Any, ClassVar

from stowplan.errors import InputError
from stowplan.model import ExpertId, Metric, NodeDescriptor
from stowplan.quantities.checks import check_choice, check_id, check_int
from stowplan.quantities.limits import (
    MAX_BATCH,
    MAX_BLOCKS,
    MAX_CONTEXT_TOKENS,
    MAX_EXPERTS,
    MAX_GPUS_PER_NODE,
    MAX_NODES,
    MAX_OWNED_EXPERTS,
)

__all__ = [
    "SCHEMA_VERSION",
    "Certificate",
    "Plan",
    "PlanRationale",
    "Prediction",
    "StageAssignment",
    "Topology",
    "TopologyKind",
    "plan_from_dict",
    "plan_from_json",
    "plan_to_dict",
    "plan_to_json",
    "with_inputs",
]

SCHEMA_VERSION = 2
"""Version 2 adds ``tensor_parallel`` and ``gpu_indices`` per stage.  A plan that uses
neither (every stage on a whole single-GPU node) is written as version 1, byte for byte
what version-1 writers wrote; both versions load."""
_SUPPORTED_VERSIONS = (1, 2)
_FORBID: dict[str, Any] = {"extra": "forbid"}
_OLD_EXPERTS_KEY = "experts_per_layer"
"""What plan JSON called :attr:`Topology.experts_per_block` before; still read."""


class TopologyKind(StrEnum):
    PIPELINE_CHAIN = "PipelineChain"
    """Stage i sends activations to i+1; stage N-1 sends the next token back to stage 0."""
    PIPELINE_WITH_EXPERTS = "PipelineWithExperts"
    """A pipeline whose MoE experts are spread over the stages' nodes (seed §11)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Topology:
    """Shape of the plan: ``Topology.PipelineChain(4)``."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _FORBID

    kind: TopologyKind
    num_stages: int
    experts_per_block: int | None = None
    """Routed experts of each MoE block (set exactly for ``PipelineWithExperts``).

    Plan JSON of earlier versions names it ``experts_per_layer``; both names load, and a
    plan without experts is still written with ``"experts_per_layer": null``, byte for
    byte as before."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", TopologyKind(self.kind))
        check_int("topology.num_stages", self.num_stages, minimum=1, maximum=MAX_NODES)
        if self.experts_per_block is not None:
            check_int(
                "topology.experts_per_block", self.experts_per_block, minimum=1, maximum=MAX_EXPERTS
            )
        if (self.kind is TopologyKind.PIPELINE_WITH_EXPERTS) != (
            self.experts_per_block is not None
        ):
            raise InputError(
                "topology.experts_per_block",
                self.experts_per_block,
                "is set exactly when kind is PipelineWithExperts",
            )

    @classmethod
    def PipelineChain(cls, num_stages: int) -> Topology:
        return cls(kind=TopologyKind.PIPELINE_CHAIN, num_stages=num_stages)

    @classmethod
    def PipelineWithExperts(cls, num_stages: int, experts_per_block: int) -> Topology:
        return cls(
            kind=TopologyKind.PIPELINE_WITH_EXPERTS,
            num_stages=num_stages,
            experts_per_block=experts_per_block,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class StageAssignment:
    """One stage: a contiguous half-open block range on one node."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _FORBID

    stage: int
    node_id: str
    block_range: tuple[int, int]
    owns_embed: bool
    owns_head: bool
    estimated_vram_bytes: int
    """Weights + KV reserve this stage holds on its node."""
    owned_experts: tuple[ExpertId, ...] = ()
    kv_reserve_bytes: int = 0
    """Bytes of KV cache reserved on this stage: its blocks' KV for ``context_tokens`` of
    each of the ``batch`` sequences (0: no context asked for).  A byte count the plan
    fills, unlike the headroom (:attr:`Constraints.vram_headroom_frac
    <stowplan.model.Constraints.vram_headroom_frac>`), which no weight or KV may use."""
    usable_vram_bytes: int | None = None
    """The VRAM after headroom of the GPUs this stage runs on: the budget
    ``estimated_vram_bytes`` must respect."""
    tensor_parallel: int = 1
    """GPUs of the node that split every block of this stage (tensor parallel)."""
    gpu_indices: tuple[int, ...] = ()
    """Which GPUs of the node the stage runs on (empty: the whole node, a single-GPU node's
    spelling); ``tensor_parallel`` of them, disjoint from other stages on the same node."""

    def __post_init__(self) -> None:
        lo, hi = self.block_range
        object.__setattr__(self, "block_range", (lo, hi))
        object.__setattr__(self, "owned_experts", tuple(self.owned_experts))
        object.__setattr__(self, "gpu_indices", tuple(self.gpu_indices))
        where = f"assignments[{self.stage}]"
        check_id(f"{where}.node_id", self.node_id)
        check_int(
            f"{where}.tensor_parallel", self.tensor_parallel, minimum=1, maximum=MAX_GPUS_PER_NODE
        )
        for g in self.gpu_indices:
            check_int(f"{where}.gpu_indices[]", g, maximum=MAX_GPUS_PER_NODE - 1)
        if len(set(self.gpu_indices)) != len(self.gpu_indices):
            raise InputError(f"{where}.gpu_indices", self.gpu_indices, "must not repeat a GPU")
        if self.gpu_indices and len(self.gpu_indices) != self.tensor_parallel:
            raise InputError(
                f"{where}.gpu_indices",
                self.gpu_indices,
                f"must list tensor_parallel={self.tensor_parallel} GPUs (or none: the whole node)",
            )
        if not 0 <= lo <= hi <= MAX_BLOCKS:
            raise InputError(
                f"{where}.block_range", (lo, hi), f"must satisfy 0 <= lo <= hi <= {MAX_BLOCKS}"
            )
        for name in ("estimated_vram_bytes", "kv_reserve_bytes"):
            check_int(f"{where}.{name}", getattr(self, name))
        if self.usable_vram_bytes is not None:
            check_int(f"{where}.usable_vram_bytes", self.usable_vram_bytes)

    @property
    def num_blocks(self) -> int:
        return self.block_range[1] - self.block_range[0]

    @property
    def uses_tensor_parallel_fields(self) -> bool:
        """Whether this stage needs schema version 2 to be written."""
        return self.tensor_parallel != 1 or bool(self.gpu_indices)


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """What the cost model predicts for a plan (see :mod:`stowplan.cost`)."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _FORBID

    batch: int
    """Concurrent sequences U; on S stages they form m = min(U, S) microbatches."""
    tokens_per_s: float
    """Decode throughput of all U sequences: U / cycle, where cycle = max(Σ stage times +
    hops, m × slowest stage time) is the time between two tokens of one sequence."""
    time_per_token_s: float
    """Per-sequence time per token: the cycle (at U = 1, every stage in turn plus every
    hop's latency)."""
    stage_time_s: tuple[float, ...]
    """Per stage, per microbatch of ⌈U / m⌉ sequences: compute (or memory) time plus its
    outbound transfer time."""
    bottleneck_stage: int
    kv_capacity_tokens: int | None = None
    """Tokens of KV cache the tightest stage can hold (None: the layout has no KV figure)."""
    cost_per_hour: float | None = None
    usd_per_million_tokens: float | None = None
    assumed: tuple[str, ...] = ()
    """Inputs taken from the spec table rather than given or measured."""
    calibration: str | None = None
    """Name of the calibration profile applied, if any."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Certificate:
    """How close the plan is to the optimum of its objective."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _FORBID

    objective: Metric
    """What ``value`` and ``bound`` measure: :attr:`Metric.LATENCY` (seconds per token,
    lower is better) or :attr:`Metric.THROUGHPUT` (tokens/s); written to JSON as the
    string ``"latency"`` or ``"throughput"``."""
    value: float
    """The plan's value of the objective."""
    bound: float
    """The optimum (``exact``) or a valid bound on it."""
    exact: bool
    gap: float
    """Relative distance to the bound: 0.0 means provably optimal."""
    method: str
    """How the bound was obtained."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "objective", check_choice("objective", self.objective, Metric))


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanRationale:
    """Why the planner chose this plan."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _FORBID

    strategy: str
    notes: tuple[str, ...] = ()
    prediction: Prediction | None = None
    certificate: Certificate | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "notes", tuple(self.notes))


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """Seed 000 §5.2: topology, one assignment per stage in stage order, rationale."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _FORBID

    topology: Topology
    assignments: tuple[StageAssignment, ...]
    rationale: PlanRationale
    model_name: str | None = None
    num_blocks: int | None = None
    context_tokens: int | None = None
    schema_version: int = field(default=SCHEMA_VERSION)
    model_source: str | None = None
    """The model as an engine loads it: the absolute path of the file or folder the plan
    was made from, or the Hugging Face id of a known model; None: not recorded (plans
    written before it, or made by the library without :func:`with_inputs`)."""
    nodes: tuple[NodeDescriptor, ...] = ()
    """The descriptors of the nodes the stages use, in stage order (their addresses, GPU
    counts and kinds), so that an export needs no fleet file; empty: not recorded."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "assignments", tuple(self.assignments))
        object.__setattr__(self, "nodes", tuple(self.nodes))
        if self.schema_version not in _SUPPORTED_VERSIONS:
            raise InputError(
                "schema_version",
                self.schema_version,
                f"must be one of {', '.join(map(str, _SUPPORTED_VERSIONS))}",
            )
        if self.model_name is not None:
            check_id("model_name", self.model_name)
        if self.num_blocks is not None:
            check_int("num_blocks", self.num_blocks, minimum=1, maximum=MAX_BLOCKS)
        if self.context_tokens is not None:
            check_int("context_tokens", self.context_tokens, maximum=MAX_CONTEXT_TOKENS)
        prediction = self.rationale.prediction
        if prediction is not None:
            check_int("rationale.prediction.batch", prediction.batch, minimum=1, maximum=MAX_BATCH)
        n = self.topology.num_stages
        if len(self.assignments) != n:
            raise InputError(
                "assignments", f"<{len(self.assignments)} stages>", f"must have num_stages={n}"
            )
        cursor = 0
        for i, a in enumerate(self.assignments):
            if a.stage != i:
                raise InputError(f"assignments[{i}].stage", a.stage, f"must be {i}")
            if a.block_range[0] != cursor:
                raise InputError(
                    f"assignments[{i}].block_range",
                    a.block_range,
                    f"must start at {cursor} (ranges are contiguous and in order)",
                )
            cursor = a.block_range[1]
            if a.owns_embed != (i == 0):
                raise InputError(
                    f"assignments[{i}].owns_embed", a.owns_embed, "only stage 0 owns the embed"
                )
            if a.owns_head != (i == n - 1):
                raise InputError(
                    f"assignments[{i}].owns_head", a.owns_head, "only the last stage owns the head"
                )
        if self.num_blocks is not None and cursor != self.num_blocks:
            raise InputError(
                "assignments", f"blocks [0, {cursor})", f"must cover num_blocks={self.num_blocks}"
            )
        taken: dict[str, set[int] | None] = {}
        """GPUs of each node that earlier stages use (None: the whole node)."""
        for a in self.assignments:
            if a.node_id in taken:
                earlier = taken[a.node_id]
                if earlier is None or not a.gpu_indices:
                    raise InputError(
                        f"assignments[{a.stage}].node_id",
                        a.node_id,
                        "is already an earlier stage's node; stages share a node only on "
                        "disjoint gpu_indices",
                    )
                overlap = earlier & set(a.gpu_indices)
                if overlap:
                    raise InputError(
                        f"assignments[{a.stage}].gpu_indices",
                        a.gpu_indices,
                        f"GPU {min(overlap)} of {a.node_id} is already an earlier stage's",
                    )
                earlier.update(a.gpu_indices)
            else:
                taken[a.node_id] = set(a.gpu_indices) if a.gpu_indices else None

    @property
    def num_stages(self) -> int:
        return self.topology.num_stages

    def stage(self, index: int) -> StageAssignment:
        if not 0 <= index < self.num_stages:
            raise InputError("STAGE", index, f"must be in [0, {self.num_stages})")
        return self.assignments[index]

    def block_counts(self) -> tuple[int, ...]:
        return tuple(a.num_blocks for a in self.assignments)


def _adapter() -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(Plan)


def _json_safe(value: Any) -> Any:
    """Non-finite floats (an unbounded rate) as the strings ``"inf"``/``"-inf"``/``"nan"``."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def _expert_masks(experts: tuple[ExpertId, ...]) -> list[Any] | None:
    """``owned_experts`` as ``[block, HEX]`` pairs, bit ``e`` of ``HEX`` set for expert ``e``.

    Only for a tuple sorted by (block, expert) without repeats (what the planners produce),
    which the masks give back exactly; None otherwise. A stage owning 26 of 256 experts in
    each of 58 blocks is 58 short pairs instead of 1508 objects.
    """
    keys = [(e.block, e.expert) for e in experts]
    if any(x >= y for x, y in pairwise(keys)):
        return None
    masks: dict[int, int] = {}
    for block, expert in keys:
        masks[block] = masks.get(block, 0) | (1 << expert)
    return [[block, format(mask, "x")] for block, mask in masks.items()]


_MASK_RULE = (
    f"must be [block, HEX] with block < {MAX_BLOCKS} and bit e of the lower-case hexadecimal "
    f"HEX (at most {MAX_EXPERTS // 4} digits) set for each owned expert e, or "
    '{"block": b, "expert": e}'
)


_HEX = frozenset("0123456789abcdef")


def _mask_experts(mask: str) -> list[int]:
    """The set bits of a hexadecimal mask, lowest first; linear in the mask's length."""
    return [e for e, bit in enumerate(reversed(bin(int(mask, 16)))) if bit == "1"]


def _expand_masks(where: str, items: object, budget: list[int]) -> object:
    """The schema's ``{"block", "expert"}`` objects for every ``[block, HEX]`` pair.

    Objects pass through unchanged (plans written before masks existed); anything else is
    left for validation to report. Linear in the input: a mask has at most
    ``MAX_EXPERTS / 4`` digits, a block appears in one pair per stage, and the plan's
    ownerships together stay within ``budget[0]`` (decremented here).
    """
    if not isinstance(items, list):
        return items
    out: list[object] = []
    blocks: set[int] = set()
    for j, item in enumerate(items):
        if not isinstance(item, list):
            budget[0] -= 1
            if budget[0] < 0:
                raise InputError(
                    where,
                    f"<{len(items)} items>",
                    f"a plan owns at most {MAX_OWNED_EXPERTS} experts",
                )
            out.append(item)
            continue
        block, mask = item if len(item) == 2 else (None, None)
        if (
            not (isinstance(block, int) and not isinstance(block, bool) and 0 <= block < MAX_BLOCKS)
            or not isinstance(mask, str)
            or not 0 < len(mask) <= MAX_EXPERTS // 4
            or not _HEX.issuperset(mask)
        ):
            raise InputError(f"{where}[{j}]", item, _MASK_RULE)
        if block in blocks:
            raise InputError(f"{where}[{j}]", item, f"repeats block {block}: one mask per block")
        blocks.add(block)
        experts = _mask_experts(mask)
        budget[0] -= len(experts)
        if budget[0] < 0:
            raise InputError(
                where, f"<{len(items)} masks>", f"a plan owns at most {MAX_OWNED_EXPERTS} experts"
            )
        out += [ExpertId(block=block, expert=e) for e in experts]
    return out


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The plan as plain JSON-compatible data (infinite rates written as ``"inf"``).

    Each stage's sorted ``owned_experts`` is written as ``[block, HEX]`` expert masks
    (:func:`plan_from_dict` reads masks and ``{"block", "expert"}`` objects alike), so an
    expert plan's JSON stays well within one environment variable for ``PLAN_JSON``
    (Linux allows 128 KiB).
    """
    data: dict[str, Any] = _json_safe(_adapter().dump_python(plan, mode="json"))
    topology = data["topology"]
    if topology["experts_per_block"] is None:  # the bytes plans without experts always had
        del topology["experts_per_block"]
        topology[_OLD_EXPERTS_KEY] = None
    for key, empty in (("model_source", None), ("nodes", [])):
        if data[key] == empty:  # plans without them keep the bytes they always had
            del data[key]
    version_1 = not any(a.uses_tensor_parallel_fields for a in plan.assignments)
    if version_1:
        data["schema_version"] = 1
    for stage, a in zip(data["assignments"], plan.assignments, strict=True):
        masks = _expert_masks(a.owned_experts)
        if masks is not None:
            stage["owned_experts"] = masks
        if version_1:
            del stage["tensor_parallel"], stage["gpu_indices"]
    return data


def plan_to_json(plan: Plan, *, indent: int | None = 2) -> str:
    """Canonical JSON: sorted keys, fixed separators. Equal plans give equal bytes."""
    return json.dumps(plan_to_dict(plan), sort_keys=True, indent=indent, allow_nan=False) + (
        "\n" if indent is not None else ""
    )


def with_inputs(
    plan: Plan, *, model_source: str | None, nodes: Sequence[NodeDescriptor] = ()
) -> Plan:
    """``plan`` recording what it was made from: the model an engine loads
    (:attr:`Plan.model_source`) and the descriptors of the nodes its stages use
    (:attr:`Plan.nodes`, in stage order; nodes of ``nodes`` it does not use are left out)."""
    by_id = {n.id: n for n in nodes}
    used = [by_id[i] for i in dict.fromkeys(a.node_id for a in plan.assignments) if i in by_id]
    return replace(plan, model_source=model_source, nodes=tuple(used))


def plan_from_dict(data: object) -> Plan:
    """Validate ``data`` into a :class:`Plan`; raise :class:`InputError` on any problem."""
    from pydantic import ValidationError

    if not isinstance(data, dict):
        raise InputError("plan", type(data).__name__, "must be a JSON object")
    version = data.get("schema_version", SCHEMA_VERSION)
    if version not in _SUPPORTED_VERSIONS or isinstance(version, bool):
        raise InputError(
            "schema_version", version, f"must be one of {', '.join(map(str, _SUPPORTED_VERSIONS))}"
        )
    blocks = data.get("num_blocks")
    if isinstance(blocks, int) and blocks > MAX_BLOCKS:  # before anything walks the blocks
        raise InputError("num_blocks", blocks, f"must be at most {MAX_BLOCKS}")
    stages = data.get("assignments")
    if version == 1 and isinstance(stages, list):
        for i, a in enumerate(stages):
            for key in ("tensor_parallel", "gpu_indices"):
                if isinstance(a, dict) and key in a:
                    raise InputError(
                        f"assignments.{i}.{key}", a[key], "needs schema_version 2 (not 1)"
                    )
    data = {**data, "schema_version": SCHEMA_VERSION}
    topology = data.get("topology")
    if isinstance(topology, dict) and _OLD_EXPERTS_KEY in topology:
        if "experts_per_block" in topology:
            raise InputError(
                f"topology.{_OLD_EXPERTS_KEY}",
                topology[_OLD_EXPERTS_KEY],
                "is the former name of topology.experts_per_block; give one of them",
            )
        renamed = {k: v for k, v in topology.items() if k != _OLD_EXPERTS_KEY}
        data["topology"] = {**renamed, "experts_per_block": topology[_OLD_EXPERTS_KEY]}
    stages = data.get("assignments")
    if isinstance(stages, list) and any(
        isinstance(a, dict) and "owned_experts" in a for a in stages
    ):
        budget = [MAX_OWNED_EXPERTS]
        data = {
            **data,
            "assignments": [
                {
                    **a,
                    "owned_experts": _expand_masks(
                        f"assignments.{i}.owned_experts", a["owned_experts"], budget
                    ),
                }
                if isinstance(a, dict) and "owned_experts" in a
                else a
                for i, a in enumerate(stages)
            ],
        }
    try:
        plan: Plan = _adapter().validate_python(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        cause = err.get("ctx", {}).get("error")
        if isinstance(cause, InputError):  # a check of our own: its field and rule say it all
            raise InputError(cause.field, cause.value, cause.rule) from None
        where = ".".join(str(p) for p in err["loc"]) or "plan"
        message = str(err.get("ctx", {}).get("error", err["msg"]))
        value = None if err["type"] == "missing" else err.get("input")
        raise InputError(where, value, message) from None
    return plan


def plan_from_json(text: str | bytes) -> Plan:
    """Parse and validate plan JSON."""
    from stowplan.files.safeload import parse_json

    return plan_from_dict(parse_json(text, field="plan", source=f"<{len(text)} bytes>"))
