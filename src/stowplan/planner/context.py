"""The context a plan reserves KV cache for: the default, the largest that fits, and a
refusal that says, with the numbers, why a context does not fit.

A plan reserves ``Constraints.context_tokens`` tokens of KV cache for each of the
``Constraints.batch`` concurrent sequences (``None`` or 0: no reserve).  The library
keeps that default; the command line reserves :func:`default_context_tokens` unless
told otherwise, so a plan it prints has room to run.

:func:`fit_context` finds the largest context that fits, as llama.cpp's
``llama-fit-params`` does: plans are deterministic and a longer context only adds
bytes to every block, so it bisects the context.  The memory bounds it first, with no
plan made: the weights and KV within the usable VRAM of the largest nodes, every block
whole on a node (:func:`~stowplan.planner.problem.most_blocks`).  The context that
bound gives is planned; only when its plan fails is the planner itself bisected, below
it.  The most sequences a refusal names are found the same way.
:func:`plan_within_context` plans and, when only the context is too long, refuses
with the weights, the KV bytes, the usable VRAM and the largest context that fits.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from stowplan.errors import Infeasible, InputError, InsufficientVram, PlanError
from stowplan.model import Constraints, ModelLayout, NodeDescriptor, Objective, usable_bytes
from stowplan.plan import Plan
from stowplan.planner import plan
from stowplan.planner.certify import probing, sketching
from stowplan.planner.problem import block_bytes, most_blocks
from stowplan.quantities.limits import MAX_CONTEXT_TOKENS
from stowplan.quantities.search import last_true
from stowplan.quantities.units import format_bytes

__all__ = [
    "DEFAULT_CONTEXT_TOKENS",
    "ContextFit",
    "Planner",
    "default_context_tokens",
    "fit_context",
    "plan_within_context",
]

DEFAULT_CONTEXT_TOKENS = 8192
"""Tokens per sequence the command line reserves KV cache for unless told otherwise."""

Planner = Callable[[ModelLayout, Sequence[NodeDescriptor], Constraints], Plan]
"""A planning function with :func:`stowplan.planner.plan`'s signature."""


def default_context_tokens(model: ModelLayout) -> int:
    """:data:`DEFAULT_CONTEXT_TOKENS`, or the model's maximum context when that is smaller."""
    if model.max_context_tokens is None:
        return DEFAULT_CONTEXT_TOKENS
    return min(DEFAULT_CONTEXT_TOKENS, model.max_context_tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextFit:
    """The largest context that fits, and the plan that holds it."""

    context_tokens: int
    """Tokens per sequence (0: not even one token beside the weights)."""
    batch: int
    """Sequences, each with ``context_tokens`` of KV cache."""
    limit_tokens: int
    """The most that was tried: the model's maximum context, the caller's bound, or the
    most the nodes' memory could hold at all."""
    limited_by_model: bool
    """``context_tokens`` is the model's maximum context (memory would hold more)."""
    plan: Plan


def _probing(run: Planner) -> Planner:
    """``run`` as a probe of whether a plan exists: inside :func:`probing` (each search
    stops at the first pipeline it finds) or, for the cost objective, whose search ranks
    node sets against its target, :func:`sketching` (each plan's own optimum solve, the
    certificate, skipped): neither skips anything that decides whether a plan is found."""

    def probe(model: ModelLayout, nodes: Sequence[NodeDescriptor], c: Constraints) -> Plan:
        with sketching() if c.objective is Objective.COST else probing():
            return run(model, nodes, c)

    return probe


def _planner(planner: Planner | None) -> Planner:
    if planner is not None:
        return planner

    return plan


class _Memory:
    """What the memory of ``nodes`` could hold at all, for :func:`fit_context` and
    :func:`_largest_batch`'s bisections: the nodes' usable bytes are read and sorted once,
    not once per context or batch tried."""

    def __init__(self, model: ModelLayout, nodes: Sequence[NodeDescriptor], c: Constraints):
        self.model = model
        caps = sorted((usable_bytes(n, c.headroom) for n in nodes), reverse=True)
        self.most = min(c.max_stages or len(nodes), len(nodes), model.num_blocks)
        self.usable = sum(caps[: self.most])
        """Usable VRAM of the largest nodes a plan may use (``max_stages`` of them)."""
        # :func:`most_blocks` sums the ``most`` largest and asks every node what the embed
        # and the head cost it, keeping the two least per anchor on distinct nodes: beyond
        # the largest, two nodes of each size say all that the rest would.
        kept = Counter(caps[: self.most])
        rest = Counter(caps[self.most :])
        self.caps = [*caps[: self.most]]
        self.caps += [cap for cap, k in rest.items() for _ in range(min(k, 2 - min(2, kept[cap])))]

    def may_fit(self, context: int, batch: int) -> bool:
        """Whether ``batch`` sequences of ``context`` tokens may fit at all: weights and KV
        within the usable VRAM of the largest ``max_stages`` nodes and, for a model of whole
        blocks (no routed experts a plan may spread), every block whole on a node
        (:func:`~stowplan.planner.problem.most_blocks`).  False means no plan fits: a
        planner keeps every stage within its node's usable VRAM."""
        model = self.model
        if model.weight_bytes + _kv_total(model, context, batch) > self.usable:
            return False
        if model.experts is not None:
            return True
        _, mem = block_bytes(model, context, batch)
        return most_blocks(model, mem, self.caps, self.most) >= model.num_blocks


def _kv_total(model: ModelLayout, context: int, batch: int) -> int:
    """KV bytes of every block for ``batch`` sequences of ``context`` tokens."""
    return sum(model.kv_bytes(b, context, batch) for b in range(model.num_blocks))


def _try(
    planner: Planner,
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    c: Constraints,
    context: int,
) -> Plan | None:
    try:
        return planner(model, nodes, replace(c, context_tokens=context))
    except PlanError:
        return None


def fit_context(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    constraints: Constraints | None = None,
    *,
    planner: Planner | None = None,
    upper: int | None = None,
) -> ContextFit:
    """The largest context per sequence, for ``constraints.batch`` sequences, whose plan
    fits ``nodes``: the context ``c`` returned plans, ``c + 1`` does not (or ``c`` is the
    limit).

    The limit is ``upper`` when given, else the model's maximum context, else
    ``MAX_CONTEXT_TOKENS``; the search never goes past what the usable VRAM of the
    largest ``max_stages`` nodes could hold beside the weights, every block whole on a
    node.  ``planner`` (default :func:`stowplan.planner.plan`, or one that keeps every
    stage within its node's usable VRAM as it does) is called with ``constraints`` whose
    ``context_tokens`` is replaced, every other constraint kept: once when the context
    the memory bounds fits, else about log2 of it more times, as probes (inside
    :func:`~stowplan.planner.certify.probing`: only whether a plan exists), and once
    more in full at the context found.

    Raises:
        InputError: the layout has no KV-cache figure and no maximum context (every
            context "fits"; give one), or ``upper`` is negative.
        PlanError: whatever ``planner`` raises with no context at all (the weights
            alone do not fit; no context can help).
    """
    c = Constraints() if constraints is None else constraints
    run = _planner(planner)
    if upper is not None and (isinstance(upper, bool) or not isinstance(upper, int) or upper < 0):
        raise InputError("upper", upper, "must be an integer >= 0 (tokens)")
    limit = upper if upper is not None else model.max_context_tokens or MAX_CONTEXT_TOKENS
    limit = min(limit, MAX_CONTEXT_TOKENS)
    if model.kv_bytes_per_token is None:
        if upper is None and model.max_context_tokens is None:
            raise InputError(
                "context_tokens",
                "max",
                f"{model.name} has no KV-cache figure, so no context is too long; "
                "give a number of tokens",
            )
        return ContextFit(
            context_tokens=limit,
            batch=c.batch,
            limit_tokens=limit,
            limited_by_model=limit == model.max_context_tokens,
            plan=run(model, nodes, replace(c, context_tokens=limit)),
        )

    # Step 1: bound the search by what the memory could hold at all.
    memory = _Memory(model, nodes, c)

    def may_fit(context: int) -> bool:
        return memory.may_fit(context, c.batch)

    hi = last_true(may_fit, 0, limit) if may_fit(0) else 0
    # Step 2: the longest context first (the common case: it fits, or it is the limit).
    top = _try(run, model, nodes, c, hi)
    if top is not None:
        return ContextFit(
            context_tokens=hi,
            batch=c.batch,
            limit_tokens=limit,
            limited_by_model=hi == model.max_context_tokens,
            plan=top,
        )
    # Step 3: no context at all must fit, or no context can help.  The search asks only
    # whether a plan exists (probes, which find one exactly when the planner does); the
    # context it ends at is then planned in full.
    probe = _probing(run)
    probe(model, nodes, replace(c, context_tokens=0))
    lo = 0
    # Step 4: binary search: ``lo`` fits, ``hi`` does not.
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _try(probe, model, nodes, c, mid) is None:
            hi = mid
        else:
            lo = mid
    return ContextFit(
        context_tokens=lo,
        batch=c.batch,
        limit_tokens=limit,
        limited_by_model=False,
        plan=run(model, nodes, replace(c, context_tokens=lo)),
    )


def _sequences(n: int) -> str:
    return f"{n:,} sequence" if n == 1 else f"{n:,} sequences"


def _shortfall(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    constraints: Constraints,
    largest: int,
    fewer_sequences: int | None,
) -> str:
    """Why ``constraints.context_tokens`` does not fit, with the numbers, and what to change."""
    ctx, batch = constraints.context_tokens or 0, constraints.batch
    per_token = sum(model.kv_bytes_per_token or ())
    kv = _kv_total(model, ctx, batch)
    memory = _Memory(model, nodes, constraints)
    usable, most = memory.usable, memory.most
    window = (
        " (sliding-window blocks hold at most their window)"
        if model.kv_window_tokens is not None and any(model.kv_window_tokens)
        else ""
    )
    text = (
        f"a context of {ctx:,} tokens × {_sequences(batch)} does not fit: weights "
        f"{format_bytes(model.weight_bytes)} + KV {format_bytes(kv)} ({format_bytes(per_token)}"
        f"/token × {ctx:,} tokens × {_sequences(batch)}{window}) = "
        f"{format_bytes(model.weight_bytes + kv)} against usable VRAM {format_bytes(usable)} "
        f"on {most} node{'' if most == 1 else 's'} ({constraints.headroom:.0%} headroom kept "
        "free)"
    )
    ways = [f"the largest context that fits is {largest:,} tokens (--context max)"]
    if fewer_sequences:
        fit = "fits" if fewer_sequences == 1 else "fit"
        ways.append(f"{_sequences(fewer_sequences)} {fit} {ctx:,} tokens each (--batch)")
    ways.append("or add nodes")
    return f"{text}; {'; '.join(ways)}"


def _largest_batch(
    run: Planner, model: ModelLayout, nodes: Sequence[NodeDescriptor], c: Constraints
) -> int | None:
    """The most sequences below ``c.batch`` that fit ``c.context_tokens`` each (None: not one).

    The memory alone bounds the search: the most sequences that may fit are planned first
    (the common case: they fit), then fewer by bisection."""
    context = c.context_tokens or 0

    memory = _Memory(model, nodes, c)

    def may_fit(batch: int) -> bool:
        return memory.may_fit(context, batch)

    if not may_fit(1):
        return None
    top = last_true(may_fit, 1, c.batch - 1)
    try:
        run(model, nodes, replace(c, batch=top))
    except PlanError:
        hi = top  # ``hi`` does not fit
    else:
        return top
    lo = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            run(model, nodes, replace(c, batch=mid))
        except PlanError:
            hi = mid
        else:
            lo = mid
    return lo or None


def plan_within_context(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    constraints: Constraints,
    *,
    planner: Planner | None = None,
) -> Plan:
    """``planner(model, nodes, constraints)`` (default :func:`stowplan.planner.plan`), with
    a context that cannot fit refused by the numbers.

    Raises:
        InputError: ``constraints.context_tokens`` exceeds the model's maximum context.
        Infeasible: the plan fails with the context but fits with a shorter one; the
            message gives the weights, the KV bytes per token × tokens × sequences, the
            usable VRAM and what to change (the largest context that fits, fewer
            sequences, more nodes).
        PlanError: whatever ``planner`` raises when the context is not the cause.
    """
    ctx = constraints.context_tokens or 0
    most = model.max_context_tokens
    if most is not None and ctx > most:
        raise InputError(
            "context_tokens", ctx, f"must be at most {model.name}'s maximum context ({most:,})"
        )
    run = _planner(planner)
    try:
        return run(model, nodes, constraints)
    except PlanError as exc:
        if ctx == 0 or model.kv_bytes_per_token is None:
            raise
        # The refusal counts on which contexts and batches plan, not on their plans: the
        # probes' certificates are not computed (a plan is found or not alike).
        probe = _probing(run)
        try:
            fit = fit_context(model, nodes, constraints, planner=probe, upper=ctx - 1)
        except InsufficientVram as bare:  # the weights alone do not fit: say so
            kv = f"before any KV cache ({ctx:,} tokens × {_sequences(constraints.batch)})"
            raise InsufficientVram(
                bare.needed, bare.available, f"the weights alone, {kv}"
            ) from None
        except PlanError:
            raise exc from None  # not the context's doing
        fewer = _largest_batch(probe, model, nodes, constraints) if constraints.batch > 1 else None
        reason = _shortfall(model, nodes, constraints, fit.context_tokens, fewer)
        raise Infeasible(reason) from None
