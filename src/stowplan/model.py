"""Inputs of the planners: the model's layout, the candidate nodes, the constraints.

All three are frozen values validated at construction. Units are in the field
names; bytes are integers. Every size is capped (see :mod:`stowplan.quantities.limits`):
byte counts within a signed 64-bit integer, blocks and experts at
``MAX_BLOCKS``/``MAX_EXPERTS``, GPUs per node at ``MAX_GPUS_PER_NODE``, rates
finite and at most ``MAX_RATE``, contexts and batches at
``MAX_CONTEXT_TOKENS``/``MAX_BATCH``. The first fields of each type are exactly those of
the topology-planner specification (seed 000 §5.1); later fields are optional
and defaulted so the seed's constructors keep working. The constraints live in
:mod:`stowplan.constraints`; every name of it is importable from here too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from itertools import count, repeat
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any

from stowplan.constraints import (
    DEFAULT_HEADROOM_FRAC,
    Constraints,
    Metric,
    Objective,
    Strategy,
)
from stowplan.errors import InputError
from stowplan.quantities.checks import check_id, check_int, check_number, check_rate
from stowplan.quantities.limits import (
    MAX_BLOCKS,
    MAX_BYTE_COUNT,
    MAX_CONFIG_INT,
    MAX_CONTEXT_TOKENS,
    MAX_EXPERTS,
    MAX_GPUS_PER_NODE,
    MAX_NAME_CHARS,
    MAX_RATE,
    MIN_SHARE_RATE,
)
from stowplan.quantities.units import parse_bytes, parse_link_mbps

__all__ = [
    "DEFAULT_HEADROOM_FRAC",
    "Constraints",
    "ExpertId",
    "ExpertLayout",
    "Metric",
    "ModelLayout",
    "NodeDescriptor",
    "Objective",
    "Strategy",
    "check_unique_ids",
    "gpu_group_id",
    "gpu_group_node",
    "node_kind",
    "node_kinds",
    "stage_node",
]


def _check_bytes(field: str, value: object) -> int:
    """A byte count: an integer in ``[0, MAX_BYTE_COUNT]``."""
    return check_int(field, value, maximum=MAX_BYTE_COUNT)


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class ExpertId:
    """One routed expert of one MoE block."""

    block: int
    expert: int

    def __post_init__(self) -> None:
        if type(self.block) is int and type(self.expert) is int and self.block >= 0 <= self.expert:
            return  # the common case, checked without a call (plans hold many experts)
        check_int("ExpertId.block", self.block)
        check_int("ExpertId.expert", self.expert)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertLayout:
    """The mixture-of-experts part of a model (seed 000 §11)."""

    num_experts: int
    """Routed experts per MoE block."""
    experts_per_token: int
    """Routed experts a token reads per MoE block (top-k)."""
    expert_params_bytes: int
    """Bytes of one routed expert."""
    moe_blocks: tuple[int, ...]
    """Indices of the blocks that are MoE blocks."""
    num_shared_experts: int = 0
    shared_expert_params_bytes: int = 0
    """Bytes of all shared experts of one MoE block together."""

    def __post_init__(self) -> None:
        check_int("experts.num_experts", self.num_experts, minimum=1, maximum=MAX_EXPERTS)
        check_int(
            "experts.experts_per_token", self.experts_per_token, minimum=1, maximum=MAX_EXPERTS
        )
        if self.experts_per_token > self.num_experts:
            raise InputError(
                "experts.experts_per_token",
                self.experts_per_token,
                f"must be <= num_experts ({self.num_experts})",
            )
        _check_bytes("experts.expert_params_bytes", self.expert_params_bytes)
        check_int("experts.num_shared_experts", self.num_shared_experts, maximum=MAX_EXPERTS)
        _check_bytes("experts.shared_expert_params_bytes", self.shared_expert_params_bytes)
        if isinstance(self.moe_blocks, str | bytes) or not isinstance(self.moe_blocks, Sequence):
            raise InputError(
                "experts.moe_blocks", self.moe_blocks, "must be a list of block indices"
            )
        if len(self.moe_blocks) > MAX_BLOCKS:
            raise InputError(
                "experts.moe_blocks",
                f"<{len(self.moe_blocks)} values>",
                f"must hold at most {MAX_BLOCKS} block indices",
            )
        object.__setattr__(self, "moe_blocks", tuple(self.moe_blocks))
        for b in self.moe_blocks:
            check_int("experts.moe_blocks[]", b, maximum=MAX_BLOCKS - 1)
        if any(a >= b for a, b in zip(self.moe_blocks, self.moe_blocks[1:], strict=False)):
            raise InputError(
                "experts.moe_blocks", self.moe_blocks, "must be strictly increasing block indices"
            )

    @property
    def routed_bytes_per_block(self) -> int:
        """Bytes of all routed experts of one MoE block."""
        return self.num_experts * self.expert_params_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelLayout:
    """Static description of the model to serve (seed 000 §5.1, extended).

    ``block_params_bytes`` is the average weight bytes of one block.  When
    blocks differ (dense and MoE layers), ``block_bytes`` gives every block's
    bytes and ``block_params_bytes`` must be their rounded average.
    """

    name: str
    num_blocks: int
    hidden_dim: int
    bytes_per_activation_elem: int
    block_params_bytes: int
    head_params_bytes: int
    """Final norm + lm_head."""
    embed_params_bytes: int
    """Token embedding table."""
    block_bytes: tuple[int, ...] | None = None
    """Bytes of each block, when blocks differ. Includes its routed experts."""
    block_read_bytes: tuple[int, ...] | None = None
    """Bytes one token reads in each block (MoE: attention, router, shared and top-k experts)."""
    kv_bytes_per_token: tuple[int, ...] | None = None
    """KV-cache bytes one token adds in each block; None when unknown."""
    kv_window_tokens: tuple[int | None, ...] | None = None
    """Per block, the sliding-window size bounding its KV cache (None: full attention)."""
    experts: ExpertLayout | None = None
    tied_embeddings: bool = False
    """The head reuses the embedding table (both ends still hold a copy)."""
    total_params: int | None = None
    active_params: int | None = None
    dtype: str | None = None
    """Weight storage convention, e.g. ``bf16`` or ``q4_k_m``."""
    num_attention_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    """Width of one attention head's queries and keys (MLA: its no-position and rotary
    parts together); None: unknown."""
    family: str | None = None
    """Architecture family, e.g. ``llama`` (module names for exports)."""
    max_context_tokens: int | None = None
    """The longest context the model takes per sequence (``max_position_embeddings`` of its
    config, ``context_length`` of a GGUF file); None: unknown."""

    def __post_init__(self) -> None:
        check_id("name", self.name)
        check_int("num_blocks", self.num_blocks, minimum=1, maximum=MAX_BLOCKS)
        check_int("hidden_dim", self.hidden_dim, minimum=1, maximum=MAX_CONFIG_INT)
        check_int(
            "bytes_per_activation_elem",
            self.bytes_per_activation_elem,
            minimum=1,
            maximum=MAX_CONFIG_INT,
        )
        _check_bytes("block_params_bytes", self.block_params_bytes)
        _check_bytes("head_params_bytes", self.head_params_bytes)
        _check_bytes("embed_params_bytes", self.embed_params_bytes)
        for name in ("block_bytes", "block_read_bytes", "kv_bytes_per_token", "kv_window_tokens"):
            values = getattr(self, name)
            if values is None:
                continue
            if isinstance(values, str | bytes) or not isinstance(values, Sequence):
                raise InputError(name, values, "must be a list with one value per block")
            if len(values) != self.num_blocks:
                raise InputError(
                    name,
                    f"<{len(values)} values>",
                    f"must have num_blocks={self.num_blocks} values",
                )
            values = tuple(values)
            object.__setattr__(self, name, values)
            for v in values:
                if name == "kv_window_tokens":
                    if v is not None:
                        check_int(f"{name}[]", v, minimum=1, maximum=MAX_CONTEXT_TOKENS)
                else:
                    _check_bytes(f"{name}[]", v)
        if self.block_bytes is not None:
            # Integers throughout: a float mean loses bytes beyond 2**53.
            total = sum(self.block_bytes)
            mean, rest = divmod(total, self.num_blocks)
            if 2 * rest > self.num_blocks or (2 * rest == self.num_blocks and mean % 2):
                mean += 1  # round half to even, as round() does
            if abs(mean - self.block_params_bytes) > 1:
                raise InputError(
                    "block_params_bytes",
                    self.block_params_bytes,
                    f"must be the average of block_bytes ({mean})",
                )
        if self.experts is not None:
            bad = [b for b in self.experts.moe_blocks if b >= self.num_blocks]
            if bad:
                raise InputError(
                    "experts.moe_blocks", bad[0], f"must be < num_blocks={self.num_blocks}"
                )
        for name, upper in (
            ("total_params", MAX_BYTE_COUNT),
            ("active_params", MAX_BYTE_COUNT),
            ("num_attention_heads", MAX_CONFIG_INT),
            ("num_kv_heads", MAX_CONFIG_INT),
            ("head_dim", MAX_CONFIG_INT),
        ):
            v = getattr(self, name)
            if v is not None:
                check_int(name, v, maximum=upper)
        if self.max_context_tokens is not None:
            check_int(
                "max_context_tokens", self.max_context_tokens, minimum=1, maximum=MAX_CONTEXT_TOKENS
            )

    # -- derived sizes ------------------------------------------------------------------
    @property
    def attention_width(self) -> int:
        """The width attention scores are computed at per token pair:
        ``num_attention_heads × head_dim``, or ``hidden_dim`` when either is unknown."""
        if self.num_attention_heads and self.head_dim:
            return self.num_attention_heads * self.head_dim
        return self.hidden_dim

    def block_sizes(self) -> tuple[int, ...]:
        """Weight bytes of every block."""
        if self.block_bytes is not None:
            return self.block_bytes
        return (self.block_params_bytes,) * self.num_blocks

    def block_read_sizes(self) -> tuple[int, ...]:
        """Bytes one decoded token reads in every block."""
        if self.block_read_bytes is not None:
            return self.block_read_bytes
        return self.block_sizes()

    @property
    def weight_bytes(self) -> int:
        """Seed §6 step 1: every block plus embed plus head."""
        return sum(self.block_sizes()) + self.embed_params_bytes + self.head_params_bytes

    def kv_bytes(self, block: int, context_tokens: int, batch: int = 1) -> int:
        """KV bytes of ``block`` for ``batch`` sequences of ``context_tokens`` (0: unknown)."""
        if self.kv_bytes_per_token is None:
            return 0
        tokens = context_tokens
        if self.kv_window_tokens is not None and self.kv_window_tokens[block] is not None:
            window = self.kv_window_tokens[block]
            assert window is not None
            tokens = min(tokens, window)
        return self.kv_bytes_per_token[block] * tokens * batch


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeDescriptor:
    """One placement target (seed 000 §5.1, extended).

    ``flops_estimate`` is dense bf16 TFLOPs; ``link_mbps`` is the best-effort
    outbound link in Mbit/s; either may be left out or 0 (unknown), as in a
    fleet file.  ``vram_bytes`` may be given as a unit string (``"24GiB"``) and
    ``link_mbps`` as one (``"1Gbit"``); both are stored as numbers.  The
    optional fields, when absent, are filled from the GPU spec table by
    ``gpu_name`` (see :mod:`stowplan.gpus`).

    Rates are finite and at most :data:`~stowplan.quantities.limits.MAX_RATE`; a non-zero
    bandwidth, FLOPs or link figure is at least
    :data:`~stowplan.quantities.limits.MIN_SHARE_RATE`; ``num_gpus`` is at most
    :data:`~stowplan.quantities.limits.MAX_GPUS_PER_NODE`.
    """

    id: str
    gpu_name: str
    vram_bytes: int
    """All the node's GPU memory; an integer or a unit string such as ``"24GiB"``."""
    flops_estimate: float = 0.0
    """Dense bf16 TFLOPs of all the node's GPUs; 0 → unknown (spec table, else not counted)."""
    link_mbps: float = 0.0
    """Outbound link in Mbit/s, or a string such as ``"1Gbit"``; 0 → unknown (not counted)."""
    mem_bandwidth_gbps: float | None = None
    """Memory bandwidth in GB/s (decimal) of all the node's GPUs together; None → spec table
    (one GPU's figure times ``num_gpus``)."""
    link_latency_ms: float = 0.0
    """One-way latency of the outbound link."""
    price_per_hour: float | None = None
    """$ per hour for this node, when rented."""
    num_gpus: int = 1
    """GPUs behind this node; ``vram_bytes`` and ``flops_estimate`` are their totals."""
    labels: tuple[tuple[str, str], ...] = field(default=())
    """Free-form provenance (``source=vastai``, ``measured=bandwidth`` …); a mapping is
    stored as its sorted pairs."""
    intra_link_gbps: float | None = None
    """GB/s per direction between two GPUs of this node (NVLink, PCIe); None → the GPU's
    default (see :mod:`stowplan.gpus.interconnect`)."""
    intra_link_latency_us: float | None = None
    """Microseconds of one collective step between GPUs of this node; None → default."""

    if TYPE_CHECKING:  # the constructor as callers see it: unit strings accepted

        def __init__(
            self,
            *,
            id: str,
            gpu_name: str,
            vram_bytes: int | str,
            flops_estimate: float = 0.0,
            link_mbps: float | str = 0.0,
            mem_bandwidth_gbps: float | None = None,
            link_latency_ms: float = 0.0,
            price_per_hour: float | None = None,
            num_gpus: int = 1,
            labels: tuple[tuple[str, str], ...] | Mapping[str, str] = (),
            intra_link_gbps: float | None = None,
            intra_link_latency_us: float | None = None,
        ) -> None: ...

    def __post_init__(self) -> None:
        check_id("id", self.id)
        if (
            not isinstance(self.gpu_name, str)
            or len(self.gpu_name) > MAX_NAME_CHARS
            or not self.gpu_name.isprintable()
        ):
            raise InputError(
                f"{self.id}.gpu_name",
                self.gpu_name,
                f"must be printable text of at most {MAX_NAME_CHARS} characters",
            )
        vram: object = self.vram_bytes
        if isinstance(vram, str):
            vram = parse_bytes(vram, field=f"{self.id}.vram_bytes")
        object.__setattr__(self, "vram_bytes", _check_bytes(f"{self.id}.vram_bytes", vram))
        link: object = self.link_mbps
        if isinstance(link, str):
            link = parse_link_mbps(link, field=f"{self.id}.link_mbps")
        for name, value in (("flops_estimate", self.flops_estimate), ("link_mbps", link)):
            rate = check_rate(
                f"{self.id}.{name}", value, lower=MIN_SHARE_RATE, upper=MAX_RATE, zero=True
            )
            object.__setattr__(self, name, rate)
        for name in ("mem_bandwidth_gbps", "intra_link_gbps"):
            value = getattr(self, name)
            if value is not None:
                check_rate(f"{self.id}.{name}", value, lower=MIN_SHARE_RATE, upper=MAX_RATE)
        for name in ("link_latency_ms", "price_per_hour", "intra_link_latency_us"):
            value = getattr(self, name)
            if value is not None:
                check_number(f"{self.id}.{name}", value, upper=MAX_RATE)
        check_int(f"{self.id}.num_gpus", self.num_gpus, minimum=1, maximum=MAX_GPUS_PER_NODE)
        object.__setattr__(self, "labels", _labels(f"{self.id}.labels", self.labels))


def _labels(field: str, labels: object) -> tuple[tuple[str, str], ...]:
    """Labels as ``(key, value)`` string pairs; a mapping becomes its sorted pairs."""
    rule = "must be (key, value) pairs of strings or a mapping of strings"
    if isinstance(labels, Mapping):
        labels = sorted(labels.items(), key=lambda kv: str(kv[0]))
    if isinstance(labels, str | bytes) or not isinstance(labels, Sequence):
        raise InputError(field, labels, rule)
    pairs = tuple(tuple(kv) if isinstance(kv, Sequence) else kv for kv in labels)
    for kv in pairs:
        if (
            not isinstance(kv, tuple)
            or len(kv) != 2
            or not all(isinstance(part, str) for part in kv)
        ):
            raise InputError(f"{field}[]", kv, rule)
    return pairs


def gpu_group_id(node_id: str, start: int, size: int) -> str:
    """The planning id of GPUs ``[start, start + size)`` of node ``node_id``: ``n1/gpu4-7``
    (``n1/gpu4`` for one GPU)."""
    last = start + size - 1
    return f"{node_id}/gpu{start}" if size == 1 else f"{node_id}/gpu{start}-{last}"


@lru_cache(maxsize=16384)
def gpu_group_node(node: NodeDescriptor, start: int, size: int) -> NodeDescriptor:
    """GPUs ``[start, start + size)`` of ``node`` as a planning node of their own: their
    share of its VRAM, bandwidth and FLOPs, ``num_gpus = size``, id
    :func:`gpu_group_id` (the node itself when ``size`` is all its GPUs)."""
    if size == node.num_gpus:
        return node
    g = node.num_gpus
    bw = node.mem_bandwidth_gbps
    return replace(
        node,
        id=gpu_group_id(node.id, start, size),
        num_gpus=size,
        vram_bytes=node.vram_bytes * size // g,
        flops_estimate=node.flops_estimate * size / g,
        mem_bandwidth_gbps=None if bw is None else bw * size / g,
    )


def stage_node(
    node: NodeDescriptor, gpu_indices: Sequence[int], tensor_parallel: int
) -> NodeDescriptor:
    """The planning node a stage on GPUs ``gpu_indices`` of ``node`` runs on: that GPU group
    (:func:`gpu_group_node`), or ``node`` when the stage takes all its GPUs or names none."""
    if gpu_indices and tensor_parallel < node.num_gpus:
        return gpu_group_node(node, gpu_indices[0], tensor_parallel)
    return node


def check_unique_ids(nodes: Sequence[NodeDescriptor]) -> None:
    """Raise :class:`InputError` naming the first duplicated node id."""
    # Every node a descriptor and no id twice (the common case) is checked at C speed.
    if all(map(isinstance, nodes, repeat(NodeDescriptor))) and len(set(map(_ID, nodes))) == len(
        nodes
    ):
        return
    seen: set[str] = set()
    for node in nodes:
        if not isinstance(node, NodeDescriptor):
            raise InputError("nodes[]", node, "must be a NodeDescriptor")
        if node.id in seen:
            raise InputError("nodes[].id", node.id, "node ids must be unique")
        seen.add(node.id)


def usable_bytes(node: NodeDescriptor, headroom: float) -> int:
    """Seed §6 step 2: ``vram_bytes * (1 - headroom)``, rounded down."""
    return math.floor(node.vram_bytes * (1.0 - headroom))


_ID = attrgetter("id")

node_kind: Callable[[NodeDescriptor], tuple[Any, ...]] = attrgetter(
    *(f.name for f in fields(NodeDescriptor) if f.name != "id")
)
"""A node's fields but its id, as a tuple: nodes alike but for the id share it."""


def node_kinds(nodes: Sequence[NodeDescriptor]) -> tuple[list[int], list[int], tuple[int, ...]]:
    """The kinds of ``nodes`` (alike in every field but the id), at C speed per node met
    before: each node's kind as a number (the same for every node of a kind, never that
    of another kind; to key what is kept per kind), one node index per kind (its first
    node, kinds first seen first) and each node's kind among these."""
    at = list(map(id, nodes))
    seen = list(map(_kind_seen.get, at))
    if None in seen:
        if len(_kind_seen) + len(at) > _KINDS_KEPT:
            _kind_seen.clear()
            _kind_number.clear()
        for i, got in enumerate(seen):
            if got is None:
                key = node_kind(nodes[i])
                number = _kind_number.get(key)
                if number is None:
                    number = _kind_number[key] = next(_numbers)
                # The node is kept beside its number: while kept, no other object has its id.
                seen[i] = _kind_seen[at[i]] = (nodes[i], number)
    kinds: list[int] = list(map(_SECOND, seen))  # type: ignore[arg-type]
    first: dict[int, int] = {}
    # Each node's kind names its first node (one lookup per node, at C speed).
    firsts = list(map(first.setdefault, kinds, range(len(kinds))))
    reps = list(first.values())
    index = dict(zip(reps, range(len(reps)), strict=True))
    return kinds, reps, tuple(map(index.__getitem__, firsts))


_KINDS_KEPT = 16384
"""Nodes whose kind :func:`node_kinds` keeps (all are let go when more come)."""

_kind_seen: dict[int, tuple[NodeDescriptor, int]] = {}
"""Per ``id()`` of a node met, the node and its kind's number."""

_kind_number: dict[tuple[Any, ...], int] = {}
"""Per :func:`node_kind`, its number (numbers are never given twice: a kind numbered
again after :data:`_kind_seen` is let go is never taken for another)."""

_numbers = count()
_SECOND = itemgetter(1)
