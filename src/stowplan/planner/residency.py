"""Residency and device-priority planner for one host (seed 004, decisions D25/D30/D31).

Pure: a function of the discovered :class:`HostTopology`, the measured
:class:`CapabilityMatrix` and the model's weight bytes. No device is touched.

Decision D31:

1. The model fits the best-ranked circuit's pool minus its headroom
   (``vram_headroom_frac`` of the pool) and the KV cache asked for → ``Resident``.
2. Otherwise the overflow (model bytes beyond that budget) goes to the argmin
   of measured compute + measured transfer over the candidates:

   * ``HeterogeneousOverflow`` on every secondary circuit whose own pool is
     not the primary's and can hold the overflow — the CPU or an iGPU reading
     system RAM (upload ∞), or a second dGPU holding it in its VRAM. It reads
     the overflow in place, so it pays no per-token transfer:
     ``overflow / compute_bytes_per_s + 0``;
   * ``Streaming`` to the primary over its bus, when the primary is not in
     pool and system RAM can hold the overflow:
     ``overflow / compute_bytes_per_s(primary) + overflow / (upload_gbps · 1e9)``.

   Ties go to ``HeterogeneousOverflow`` (it leaves the bus idle), then to the
   better-ranked circuit.

By default the estimate is first order: decode is memory-bound, each weight a
token uses is read once per token, there is no attention/activation cost and no
overlap of compute with transfer.  With ``whole_model_s`` (per circuit, the
seconds one token takes with the whole model on that circuit, e.g. the
calibrated cost model's one-stage prediction, which ``stowplan residency``
passes so that it predicts what ``plan`` and ``launch`` predict) a segment of
``b`` of the model's ``B`` weight bytes computes in ``b / B · whole_model_s``;
the first-order default is ``whole_model_s = read_bytes / compute_bytes_per_s``,
which gives the formulas above.  Streaming's transfer is not scaled.

A mixture-of-experts model stores every expert but
a token reads only the ones it is routed to: with ``read_bytes`` (the bytes
one token reads) every segment is read in that share (experts spread evenly
over the blocks), and Streaming uploads only that share of the overflow (the
experts a token uses, as expert-offloading runtimes fetch them).

:func:`plan_residency` takes a :class:`~stowplan.model.ModelLayout` and a
context and derives the bytes: weights, what a token reads, the KV cache.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from stowplan.circuits import SYSTEM_POOL, CapabilityMatrix, CircuitCapability, HostTopology
from stowplan.errors import InputError, InsufficientVram
from stowplan.files.safeload import parse_json
from stowplan.model import ModelLayout
from stowplan.moved import renamed_keywords
from stowplan.quantities.checks import check_int
from stowplan.quantities.limits import MAX_BYTE_COUNT

__all__ = [
    "DEFAULT_RESIDENCY_HEADROOM_FRAC",
    "DevicePlacement",
    "EmploymentPlan",
    "OverflowEstimate",
    "PlacementRole",
    "ResidencyProtocol",
    "employment_from_json",
    "employment_to_json",
    "plan_employment",
    "plan_residency",
    "read_bytes_per_token",
]

DEFAULT_RESIDENCY_HEADROOM_FRAC = 0.10
"""The residency planner's default ``vram_headroom_frac``: the fraction of the primary
circuit's pool kept free.

The same quantity as :attr:`Constraints.vram_headroom_frac
<stowplan.model.Constraints.vram_headroom_frac>` (whose default, for a fleet's nodes, is
:data:`~stowplan.model.DEFAULT_HEADROOM_FRAC`): memory no weight and no counted KV cache
may use.  Without a context the residency planner counts no KV cache, so this fraction is
also what the KV cache and the runtime's buffers get."""

_RENAMED = {"DEFAULT_KV_RESERVE": "DEFAULT_RESIDENCY_HEADROOM_FRAC"}


def __getattr__(name: str) -> Any:
    """``DEFAULT_KV_RESERVE``, the former name of :data:`DEFAULT_RESIDENCY_HEADROOM_FRAC`,
    with a :class:`DeprecationWarning`."""
    if name not in _RENAMED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"{__name__}.{name} is deprecated; use {_RENAMED[name]}", DeprecationWarning, stacklevel=2
    )
    return globals()[_RENAMED[name]]


class ResidencyProtocol(StrEnum):
    """The residency protocol chosen for a model on this host (D25)."""

    RESIDENT = "resident"
    """Every weight lives in the primary circuit's pool."""
    HETEROGENEOUS_OVERFLOW = "heterogeneous-overflow"
    """The overflow runs in place on a large-pool secondary circuit."""
    STREAMING = "streaming"
    """The overflow is double-buffered to the primary over its bus every token."""


class PlacementRole(StrEnum):
    """What role a circuit plays in the plan."""

    PRIMARY = "primary"
    """Holds and runs the resident part."""
    OVERFLOW = "overflow"
    """Holds and runs the overflow in its own pool."""
    STREAM_SOURCE = "stream-source"
    """Holds the overflow in system RAM; the primary runs it after each upload."""
    IDLE = "idle"
    """Measured but not employed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DevicePlacement:
    """One circuit's assignment in the plan."""

    circuit: str
    role: PlacementRole
    pool: str
    weight_bytes: int
    """Weight bytes held in ``pool`` for this role."""
    rank: int
    """Position in the measured priority order (0 = most capable)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OverflowEstimate:
    """One candidate for the overflow segment, in seconds per token."""

    protocol: ResidencyProtocol
    circuit: str
    """The circuit that computes the overflow."""
    compute_s: float
    transfer_s: float

    @property
    def total_s(self) -> float:
        """compute + transfer."""
        return self.compute_s + self.transfer_s


@dataclass(frozen=True, slots=True, kw_only=True)
class EmploymentPlan:
    """The full employment plan: protocol, placements, priority, estimates, prediction."""

    protocol: ResidencyProtocol
    model_bytes: int
    read_bytes: int
    """Bytes one token reads (all of ``model_bytes`` for a dense model)."""
    kv_bytes: int
    """KV cache bytes the primary holds beside the weights (0: none asked for)."""
    vram_headroom_frac: float
    """Fraction of the primary's pool kept free beside the weights and ``kv_bytes`` (JSON
    key ``vram_headroom_frac``; plans written before read theirs from ``kv_reserve``)."""
    primary: str
    resident_bytes: int
    """Bytes held by the primary circuit."""
    overflow_bytes: int
    placements: tuple[DevicePlacement, ...]
    priority: tuple[str, ...]
    """Circuit ids in measured capability order (D30)."""
    estimates: tuple[OverflowEstimate, ...]
    """Every overflow candidate considered, cheapest first (empty when Resident)."""
    predicted_s_per_token: float
    rationale: tuple[str, ...]

    @property
    def kv_reserve(self) -> float:
        """Deprecated: :attr:`vram_headroom_frac`."""
        warnings.warn(
            "EmploymentPlan.kv_reserve is deprecated; use EmploymentPlan.vram_headroom_frac",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.vram_headroom_frac

    @property
    def predicted_tokens_per_s(self) -> float:
        """1 / predicted_s_per_token."""
        return 1.0 / self.predicted_s_per_token

    def to_dict(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol.value,
            "model_bytes": self.model_bytes,
            "read_bytes": self.read_bytes,
            "kv_bytes": self.kv_bytes,
            "vram_headroom_frac": self.vram_headroom_frac,
            "primary": self.primary,
            "resident_bytes": self.resident_bytes,
            "overflow_bytes": self.overflow_bytes,
            "placements": [
                {
                    "circuit": p.circuit,
                    "role": p.role.value,
                    "pool": p.pool,
                    "weight_bytes": p.weight_bytes,
                    "rank": p.rank,
                }
                for p in self.placements
            ],
            "priority": list(self.priority),
            "estimates": [
                {
                    "protocol": e.protocol.value,
                    "circuit": e.circuit,
                    "compute_s": e.compute_s,
                    "transfer_s": e.transfer_s,
                    "total_s": e.total_s,
                }
                for e in self.estimates
            ],
            "predicted_s_per_token": self.predicted_s_per_token,
            "rationale": list(self.rationale),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EmploymentPlan:
        """The plan :meth:`to_dict` wrote; the former key ``kv_reserve`` is read as
        ``vram_headroom_frac``, with a :class:`DeprecationWarning`."""
        if "kv_reserve" in d:
            if "vram_headroom_frac" in d:
                raise InputError(
                    "employment.kv_reserve",
                    d["kv_reserve"],
                    "is the former name of vram_headroom_frac; give one of them",
                )
            warnings.warn(
                "employment plan key kv_reserve is deprecated; use vram_headroom_frac",
                DeprecationWarning,
                stacklevel=2,
            )
            d = {("vram_headroom_frac" if k == "kv_reserve" else k): v for k, v in d.items()}
        return cls(
            protocol=ResidencyProtocol(d["protocol"]),
            model_bytes=int(d["model_bytes"]),
            read_bytes=int(d.get("read_bytes", d["model_bytes"])),
            kv_bytes=int(d.get("kv_bytes", 0)),
            vram_headroom_frac=float(d["vram_headroom_frac"]),
            primary=str(d["primary"]),
            resident_bytes=int(d["resident_bytes"]),
            overflow_bytes=int(d["overflow_bytes"]),
            placements=tuple(
                DevicePlacement(
                    circuit=p["circuit"],
                    role=PlacementRole(p["role"]),
                    pool=p["pool"],
                    weight_bytes=int(p["weight_bytes"]),
                    rank=int(p["rank"]),
                )
                for p in d["placements"]
            ),
            priority=tuple(d["priority"]),
            estimates=tuple(
                OverflowEstimate(
                    protocol=ResidencyProtocol(e["protocol"]),
                    circuit=e["circuit"],
                    compute_s=float(e["compute_s"]),
                    transfer_s=float(e["transfer_s"]),
                )
                for e in d["estimates"]
            ),
            predicted_s_per_token=float(d["predicted_s_per_token"]),
            rationale=tuple(d["rationale"]),
        )


def employment_to_json(plan: EmploymentPlan) -> str:
    """Canonical JSON (sorted keys, two-space indent, trailing newline)."""
    return json.dumps(plan.to_dict(), indent=2, sort_keys=True) + "\n"


def employment_from_json(text: str) -> EmploymentPlan:
    """Inverse of :func:`employment_to_json`; :class:`InputError` for text it did not write."""
    data = parse_json(text, field="employment", source=f"<{len(text)} chars>", nonfinite=True)
    if not isinstance(data, dict):
        raise InputError("employment", type(data).__name__, "must be a JSON object")
    try:
        return EmploymentPlan.from_dict(data)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        if isinstance(exc, InputError):
            raise
        reason = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        raise InputError(
            "employment", f"<{len(text)} chars>", f"is not an employment plan ({reason})"
        ) from None


def _fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def _check_bytes(field: str, value: object, minimum: int) -> int:
    return check_int(field, value, minimum=minimum, maximum=MAX_BYTE_COUNT)


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


@renamed_keywords(kv_reserve="vram_headroom_frac")
def plan_employment(
    topology: HostTopology,
    matrix: CapabilityMatrix,
    model_bytes: int,
    vram_headroom_frac: float = DEFAULT_RESIDENCY_HEADROOM_FRAC,
    *,
    read_bytes: int | None = None,
    kv_bytes: int = 0,
    read_why: str = "the experts it is routed to",
    whole_model_s: Mapping[str, float] | None = None,
    model_label: str = "first-order",
) -> EmploymentPlan:
    """Derive the employment plan for ``model_bytes`` of weights on this host (D31).

    ``vram_headroom_frac`` is the fraction of the primary's pool kept free, in [0, 1):
    beside ``kv_bytes`` when given, else it is also the room of the KV cache and runtime
    buffers (the former keyword ``kv_reserve=`` still works, with a
    :class:`DeprecationWarning`).
    ``read_bytes`` is what one token reads (MoE: the routed experts; default
    ``model_bytes``), ``read_why`` what it leaves unread, for the note; ``kv_bytes`` the
    KV cache the primary holds beside the weights.  Raises :class:`InputError` for bad arguments and
    :class:`InsufficientVram` (weights, KV and headroom in GiB, and what to
    change) when no candidate can hold the overflow.
    """
    check_int("model_bytes", model_bytes, minimum=1, maximum=MAX_BYTE_COUNT)
    frac = vram_headroom_frac
    if isinstance(frac, bool) or not (isinstance(frac, int | float) and 0 <= frac < 1):
        raise InputError("vram_headroom_frac", frac, "must be a fraction in [0, 1)")
    read = model_bytes if read_bytes is None else _check_bytes("read_bytes", read_bytes, 1)
    if read > model_bytes:
        raise InputError("read_bytes", read, f"must be at most model_bytes ({model_bytes})")
    kv = _check_bytes("kv_bytes", kv_bytes, 0)
    share = read / model_bytes
    ranked = [e for e in matrix.entries if any(c.id == e.circuit for c in topology.circuits)]
    if not ranked:
        raise InputError("matrix", matrix.order, "measures no circuit of this topology")
    priority = tuple(e.circuit for e in ranked)
    rank = {cid: i for i, cid in enumerate(priority)}
    whole = _whole_model_s(ranked, read, whole_model_s)

    def compute_s(circuit: str, nbytes: float) -> float:
        """Seconds per token for ``nbytes`` of the weights computed on ``circuit``."""
        return nbytes / model_bytes * whole[circuit]

    # Step 1: the primary is the best-ranked circuit; Resident when the model fits its budget.
    top = ranked[0]
    top_pool = topology.pool(topology.circuit(top.circuit).pool)
    headroom = math.ceil(top_pool.capacity_bytes * frac)
    budget = max(top_pool.capacity_bytes - headroom - kv, 0)
    notes = [
        "priority by measured GEMV throughput: "
        + ", ".join(f"{e.circuit} {e.compute_bytes_per_s / 1e9:.2f} GB/s" for e in ranked),
        f"{top.circuit} budget: {top_pool.capacity_bytes} bytes of pool {top_pool.id} "
        f"minus vram_headroom_frac {frac:g}"
        + (f" and KV cache {kv} bytes" if kv else "")
        + f" = {budget} bytes",
    ]
    if read < model_bytes:
        notes.append(
            f"a token reads {read} of the {model_bytes} weight bytes ({share:.1%}: {read_why}); "
            "every segment is read in that share"
        )
    common = {"model_bytes": model_bytes, "read_bytes": read, "kv_bytes": kv}
    if whole_model_s is not None:
        notes.append(
            f"times per token from the {model_label} model: whole model on "
            + ", ".join(f"{e.circuit} {_fmt_ms(whole[e.circuit])}" for e in ranked)
            + "; a segment takes its share of the weight bytes of that"
        )
    if model_bytes <= budget:
        t = whole[top.circuit]
        notes.append(f"model {model_bytes} bytes fits {top.circuit}: Resident, {_fmt_ms(t)}/token")
        return EmploymentPlan(
            protocol=ResidencyProtocol.RESIDENT,
            **common,
            vram_headroom_frac=float(frac),
            primary=top.circuit,
            resident_bytes=model_bytes,
            overflow_bytes=0,
            placements=_placements(priority, rank, topology, {top.circuit: model_bytes}, {}),
            priority=priority,
            estimates=(),
            predicted_s_per_token=t,
            rationale=tuple(notes),
        )

    # Step 2: the overflow goes to the argmin of compute + transfer over the candidates.
    overflow = model_bytes - budget
    overflow_read = overflow * share
    notes.append(f"model {model_bytes} bytes exceeds it by {overflow} bytes of overflow")
    candidates: list[OverflowEstimate] = []
    for e in ranked[1:]:
        pool = topology.pool(topology.circuit(e.circuit).pool)
        if pool.id != top_pool.id and pool.capacity_bytes >= overflow:
            candidates.append(
                OverflowEstimate(
                    protocol=ResidencyProtocol.HETEROGENEOUS_OVERFLOW,
                    circuit=e.circuit,
                    compute_s=compute_s(e.circuit, overflow),
                    transfer_s=0.0,
                )
            )
    system_capacity = next((p.capacity_bytes for p in topology.pools if p.id == SYSTEM_POOL), 0)
    if not top.in_pool and system_capacity >= overflow:
        candidates.append(
            OverflowEstimate(
                protocol=ResidencyProtocol.STREAMING,
                circuit=top.circuit,
                compute_s=compute_s(top.circuit, overflow),
                transfer_s=overflow_read / (top.upload_gbps * 1e9),
            )
        )
    if not candidates:
        largest = _largest_other(topology, top_pool.id)
        raise InsufficientVram(
            needed=model_bytes,
            available=budget + largest,
            detail=_does_not_fit(
                top.circuit, top_pool.capacity_bytes, model_bytes, kv, headroom, frac,
                overflow, largest,
            ),
        )  # fmt: skip
    candidates.sort(
        key=lambda c: (
            c.total_s,
            c.protocol is not ResidencyProtocol.HETEROGENEOUS_OVERFLOW,
            rank[c.circuit],
        )
    )
    best = candidates[0]
    for c in candidates:
        notes.append(
            f"{c.protocol.value} on {c.circuit}: compute {_fmt_ms(c.compute_s)} + "
            f"transfer {_fmt_ms(c.transfer_s)} = {_fmt_ms(c.total_s)}/token"
        )
    resident_s = compute_s(top.circuit, budget)
    predicted = resident_s + best.total_s
    notes.append(
        f"chose {best.protocol.value} on {best.circuit}: resident part {_fmt_ms(resident_s)} "
        f"+ overflow {_fmt_ms(best.total_s)} = {_fmt_ms(predicted)}/token"
    )
    held = {top.circuit: budget}
    if best.protocol is ResidencyProtocol.HETEROGENEOUS_OVERFLOW:
        held[best.circuit] = overflow
        streamed: dict[str, int] = {}
    else:
        streamed = {SYSTEM_POOL: overflow}
    return EmploymentPlan(
        protocol=best.protocol,
        **common,
        vram_headroom_frac=float(frac),
        primary=top.circuit,
        resident_bytes=budget,
        overflow_bytes=overflow,
        placements=_placements(priority, rank, topology, held, streamed),
        priority=priority,
        estimates=tuple(candidates),
        predicted_s_per_token=predicted,
        rationale=tuple(notes),
    )


def _whole_model_s(
    ranked: list[CircuitCapability], read: int, given: Mapping[str, float] | None
) -> dict[str, float]:
    """Per ranked circuit, seconds per token with the whole model on it: ``given``'s
    (checked: a finite number > 0 for every circuit), else first order."""
    if given is None:
        return {e.circuit: read / e.compute_bytes_per_s for e in ranked}
    out = {}
    for e in ranked:
        t = given.get(e.circuit)
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t < math.inf:
            raise InputError(
                f"whole_model_s[{e.circuit!r}]", t, "must be a finite number of seconds > 0"
            )
        out[e.circuit] = float(t)
    return out


def _does_not_fit(
    primary: str,
    capacity: int,
    weights: int,
    kv: int,
    headroom: int,
    frac: float,
    overflow: int,
    largest_other: int,
) -> str:
    """The numbers of a model that fits no pool, and what to change."""
    fits = max(capacity - kv - headroom, 0) + largest_other
    changes = [f"weights of at most {_gib(fits)} (a smaller --dtype or model)"]
    if kv:
        changes.append("a shorter --context")
    if frac > 0:
        changes.append("a lower --headroom")
    return (
        f"weights {_gib(weights)} + KV {_gib(kv)} + headroom {_gib(headroom)} "
        f"(vram_headroom_frac {frac:g}) on {primary}'s {_gib(capacity)} leave "
        f"{_gib(overflow)} of weights over, and no other pool holds it "
        f"(largest other: {_gib(largest_other) if largest_other else 'none'}); needs "
        + ", or ".join(changes)
    )


def read_bytes_per_token(model: ModelLayout) -> int:
    """Weight bytes one decoded token reads: every block's (MoE: its routed experts) and
    the head; of the embedding table a token reads one row, so it is not counted."""
    return sum(model.block_read_sizes()) + model.head_params_bytes


@renamed_keywords(kv_reserve="vram_headroom_frac")
def plan_residency(
    topology: HostTopology,
    matrix: CapabilityMatrix,
    model: ModelLayout,
    *,
    vram_headroom_frac: float = DEFAULT_RESIDENCY_HEADROOM_FRAC,
    context_tokens: int | None = None,
    whole_model_s: Mapping[str, float] | None = None,
    model_label: str = "first-order",
) -> EmploymentPlan:
    """:func:`plan_employment` for ``model``: its weights, what a token reads, and the KV
    cache of ``context_tokens`` (none without a context); ``whole_model_s`` and
    ``model_label`` as there (``kv_reserve=`` is the deprecated spelling of
    ``vram_headroom_frac``)."""
    ctx = context_tokens or 0
    if isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 0:
        raise InputError("context_tokens", context_tokens, "must be an integer >= 0")
    kv = sum(model.kv_bytes(b, ctx) for b in range(model.num_blocks))
    return plan_employment(
        topology,
        matrix,
        model.weight_bytes,
        vram_headroom_frac,
        read_bytes=min(read_bytes_per_token(model), model.weight_bytes),
        kv_bytes=kv,
        read_why=(
            "one row of the embedding table"
            if model.experts is None
            else "the experts it is routed to and one row of the embedding table"
        ),
        whole_model_s=whole_model_s,
        model_label=model_label,
    )


def _largest_other(topology: HostTopology, pool_id: str) -> int:
    return max((p.capacity_bytes for p in topology.pools if p.id != pool_id), default=0)


def _placements(
    priority: tuple[str, ...],
    rank: dict[str, int],
    topology: HostTopology,
    held: dict[str, int],
    streamed: dict[str, int],
) -> tuple[DevicePlacement, ...]:
    out = []
    primary = priority[0]
    for cid in priority:
        circuit = topology.circuit(cid)
        if cid == primary:
            role = PlacementRole.PRIMARY
        elif cid in held:
            role = PlacementRole.OVERFLOW
        else:
            role = PlacementRole.IDLE
        out.append(
            DevicePlacement(
                circuit=cid,
                role=role,
                pool=circuit.pool,
                weight_bytes=held.get(cid, 0),
                rank=rank[cid],
            )
        )
    for pool_id, nbytes in streamed.items():
        out.append(
            DevicePlacement(
                circuit=primary,
                role=PlacementRole.STREAM_SOURCE,
                pool=pool_id,
                weight_bytes=nbytes,
                rank=rank[primary],
            )
        )
    return tuple(out)
