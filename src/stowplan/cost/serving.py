"""Serving a stream of requests on one replica: prefill, TTFT, TPOT and the users it holds.

First-order, on the stage terms of :class:`~stowplan.cost.model.CostModel` (whose
bandwidth and compute rates carry the calibration when one is given).  A request
has a prompt of ``P`` tokens and an answer of ``O`` tokens.

**Prefill** of one prompt, stage ``s`` on a node of ``tp`` GPUs holding blocks
``[lo, hi)`` (``k = hi − lo``)::

    pre(s) = max( read_P(s) / (tp·BW),
                  (2·params_P(s)·P + 2·Σ_b P·min(P, window_b)·A + 2·head_params·[last])
                  / (tp·F) )
             + k · 2 · AR_P(tp)
             + [s < S−1] · P · hidden · act_bytes / link(s → s+1)
    AR_P(tp) = 0 if tp == 1 else intra_latency + 2 (tp − 1)/tp · P · hidden · act_bytes
                                                 / intra_bw
    TTFT0  = Σ_s pre(s) + Σ_{s < S−1} latency(s → s+1)

``read_P(s)`` is the stage's block bytes as P tokens read them — a MoE block's
dense part plus the ``E × (1 − (1 − k/E)^P)`` experts they touch
(:mod:`stowplan.cost.touch`) — plus the head's bytes on the last stage (read once,
for the last prompt token).  ``params_P(s)`` is the stage's active parameters (what
one token multiplies through: the compute of the touch rule stays 2 × active × u).
``A`` is the attention width, ``num_attention_heads × head_dim``
(:attr:`~stowplan.model.ModelLayout.attention_width`; ``hidden_dim`` when the layout
states no head dimension);
a sliding-window block caps ``P²`` at ``P × window``.  ``link`` is the GPUs' own
link when both stages are GPU groups of one node, else the sender's network link.

**A replica serving U concurrent requests** (prefill not overlapped with decode —
first order and conservative)::

    TPOT(U) = cycle(U) + U · TTFT0 / O        TTFT(U) = TTFT0 + cycle(U)
    tokens/s = U / TPOT(U)                    requests/s = U / (O · TPOT(U))

``cycle(U)`` is the decode cycle of U sequences (:func:`~stowplan.cost.cycle_seconds`
over ``m = min(U, S)`` microbatches of ``⌈U/m⌉``), each reading its KV at the mean
context ``C = P + O/2``.  Memory holds the weights and ``U · (P + O)`` tokens of KV
per stage.  The replica serves ``U*``, the largest U with ``TTFT(U) ≤ ttft_s``,
``TPOT(U) ≤ tpot_s`` and the memory: cycle(U) never decreases with U (more
sequences per microbatch read and compute more, and up to S stages every added
sequence adds a microbatch), so TPOT(U) grows strictly and TTFT(U) never falls, and
``U*`` is found by bisection.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from stowplan.cost.cycle import cycle_seconds, microbatches
from stowplan.cost.model import CostModel
from stowplan.cost.touch import expert_touch_bytes
from stowplan.errors import InputError
from stowplan.model import Constraints, ModelLayout, NodeDescriptor
from stowplan.quantities.limits import MAX_BATCH
from stowplan.quantities.search import last_true
from stowplan.workload import Binding, Workload

__all__ = [
    "Binding",
    "Prefill",
    "ReplicaServing",
    "group_all_reduce_s",
    "pipeline_prefill",
    "pipeline_serving",
    "prefill_seconds",
    "replica_serving",
    "serving_constraints",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Prefill:
    """One prompt's prefill through a pipeline."""

    stage_s: tuple[float, ...]
    """pre(s) of every stage, seconds."""
    hops_s: float
    """Latencies of the forward hops s → s+1."""

    @property
    def ttft0_s(self) -> float:
        """TTFT0: one prompt alone, Σ pre(s) + forward hop latencies."""
        return sum(self.stage_s) + self.hops_s


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaServing:
    """What one pipeline serves under a workload (see the module)."""

    users: int
    """U*: the most concurrent requests within both SLOs and memory (0: none)."""
    ttft_s: float
    """TTFT(U*) (TTFT(1) when U* is 0)."""
    tpot_s: float
    """TPOT(U*) (TPOT(1) when U* is 0)."""
    prefill_s: float
    """TTFT0: one prompt's prefill alone."""
    cycle_s: float
    """cycle(U*): the decode cycle of U* sequences."""
    tokens_per_s: float
    """Output tokens/s of all U* requests: U* / TPOT(U*)."""
    requests_per_s: float
    """Requests completed per second: U* / (O · TPOT(U*))."""
    binding: Binding
    """What U* + 1 would break first (memory, then TTFT, then TPOT)."""
    memory_users: int
    """The most requests the memory holds (U·(P+O) tokens of KV per stage)."""


def serving_constraints(workload: Workload, constraints: Constraints | None = None) -> Constraints:
    """``constraints`` for planning a replica of ``workload``: every sequence's KV reserve
    is P + O tokens and a decode step reads it at C = P + O/2."""
    from dataclasses import replace

    base = Constraints() if constraints is None else constraints
    return replace(
        base,
        context_tokens=workload.context_tokens,
        kv_read_tokens=workload.mean_context_tokens,
    )


def group_all_reduce_s(cm: CostModel, d: int, act_bytes: float) -> float:
    """One all-reduce of ``act_bytes`` among node ``d``'s tensor-parallel GPUs (0 for one)."""
    tp = cm.tensor_parallel[d]
    if tp <= 1:
        return 0.0
    r = cm.rates[d]
    return r.intra_latency_s + 2 * (tp - 1) / tp * act_bytes / r.intra_bytes_per_s


def pipeline_prefill(
    cm: CostModel, order: Sequence[int], bounds: Sequence[int], prompt_tokens: int
) -> Prefill:
    """:class:`Prefill` of one prompt of ``prompt_tokens`` on nodes ``order`` (indices of
    ``cm.nodes``) with block boundaries ``bounds`` (see the module's formula)."""
    model = cm.model
    p = prompt_tokens
    reads = model.block_read_sizes()
    touch = expert_touch_bytes(model, p)
    windows = model.kv_window_tokens or (None,) * model.num_blocks
    width = model.attention_width
    act = p * model.hidden_dim * model.bytes_per_activation_elem
    n = len(order)
    stages: list[float] = []
    hops = 0.0
    for s, d in enumerate(order):
        lo, hi = bounds[s], bounds[s + 1]
        last = s == n - 1
        weights = sum(reads[lo:hi])
        read = weights + sum(touch[lo:hi]) + (cm.head if last else 0)
        params = weights * cm.params_per_byte
        attention = sum(p * (p if w is None else min(p, w)) for w in windows[lo:hi])
        flops = 2.0 * params * p + 2.0 * attention * width
        if last:
            flops += 2.0 * cm.head * cm.params_per_byte
        t = max(read * cm.inv_bw[d], flops * cm.inv_prefill_flops[d])
        t += (hi - lo) * 2 * group_all_reduce_s(cm, d, act)
        if not last:
            nxt = order[s + 1]
            r = cm.rates[d]
            link = r.intra_bytes_per_s if cm.same_node(d, nxt) else r.link_bytes_per_s
            t += act / link
            hops += cm.hop_s(d, nxt)
        stages.append(t)
    return Prefill(stage_s=tuple(stages), hops_s=hops)


def _memory_users(cm: CostModel, order: Sequence[int], bounds: Sequence[int], ctx: int) -> int:
    """The most sequences of ``ctx`` tokens of KV every stage holds beside its weights."""
    model = cm.model
    n = len(order)
    best = MAX_BATCH
    for s, d in enumerate(order):
        lo, hi = bounds[s], bounds[s + 1]
        held = cm.kv_held_prefix[hi] - cm.kv_held_prefix[lo]
        weights = cm.stage_bytes(lo, hi, s == 0, s == n - 1) - held
        room = cm.usable[d] - weights
        if room < 0:
            return 0
        per_seq = sum(model.kv_bytes(b, ctx, 1) for b in range(lo, hi))
        if per_seq > 0:
            best = min(best, room // per_seq)
    return best


def pipeline_serving(
    cm: CostModel, order: Sequence[int], bounds: Sequence[int], workload: Workload
) -> ReplicaServing:
    """:class:`ReplicaServing` of nodes ``order`` with block boundaries ``bounds``.

    ``cm`` must read KV at the workload's mean context (built with
    :func:`serving_constraints`); its batch bounds the microbatches it is asked about,
    so a view of ``cm`` at each microbatch size is used.
    """
    o = workload.output_tokens
    ttft0 = pipeline_prefill(cm, order, bounds, workload.prompt_tokens).ttft0_s
    u_mem = _memory_users(cm, order, bounds, workload.context_tokens)
    u_cap = u_mem
    if ttft0 > 0:
        # TPOT(U) >= U·TTFT0/O, so no U above tpot·O/TTFT0 meets the TPOT limit.
        u_cap = min(u_cap, int(workload.tpot_s * o / ttft0) + 1)
    u_cap = max(1, min(u_cap, MAX_BATCH))
    root = cm if cm.batch > u_cap else _with_batch(cm, u_cap + 1)
    s = len(order)

    def cycle(u: int) -> float:
        m, b = microbatches(u, s)
        ev = root.at_microbatch(min(b, root.batch)).evaluate_here(order, bounds)
        return cycle_seconds(ev.stage_time_s, ev.hops_s, m)

    def meets(u: int) -> bool:
        c = cycle(u)
        return u <= u_mem and ttft0 + c <= workload.ttft_s and c + u * ttft0 / o <= workload.tpot_s

    u = last_true(meets, 0, u_cap)  # meets(0) holds vacuously
    shown = max(u, 1)
    c = cycle(shown)
    tpot = c + shown * ttft0 / o
    ttft = ttft0 + c
    nxt = u + 1
    if nxt > u_mem:
        binding = Binding.MEMORY
    elif ttft0 + cycle(nxt) > workload.ttft_s:
        binding = Binding.TTFT
    else:
        binding = Binding.TPOT
    tokens = u / tpot if tpot > 0 else math.inf
    return ReplicaServing(
        users=u,
        ttft_s=ttft,
        tpot_s=tpot,
        prefill_s=ttft0,
        cycle_s=c,
        tokens_per_s=tokens if u else 0.0,
        requests_per_s=(tokens / o) if u else 0.0,
        binding=binding,
        memory_users=u_mem,
    )


def _with_batch(cm: CostModel, batch: int) -> CostModel:
    from dataclasses import replace

    return CostModel(
        cm.model,
        cm.nodes,
        replace(cm.constraints, batch=batch),
        cm.calibration,
        parents=cm.parent,
    )


def _stage_model(
    model: ModelLayout,
    stage_nodes: Sequence[NodeDescriptor],
    bounds: Sequence[int],
    constraints: Constraints,
    parents: Sequence[str] | None,
) -> tuple[CostModel, list[int]]:
    if len(bounds) != len(stage_nodes) + 1:
        raise InputError(
            "bounds", list(bounds), f"must hold len(stage_nodes) + 1 = {len(stage_nodes) + 1}"
        )
    if bounds[0] != 0 or bounds[-1] != model.num_blocks or any(a >= b for a, b in pairwise(bounds)):
        raise InputError(
            "bounds", list(bounds), f"must rise strictly from 0 to num_blocks={model.num_blocks}"
        )
    if parents is not None and len(parents) != len(stage_nodes):
        raise InputError("parents", list(parents), "must name one node per stage")
    cm = CostModel(model, stage_nodes, constraints, parents=parents)
    return cm, list(range(len(stage_nodes)))


def prefill_seconds(
    model: ModelLayout,
    stage_nodes: Sequence[NodeDescriptor],
    bounds: Sequence[int],
    prompt_tokens: int,
    constraints: Constraints | None = None,
    *,
    parents: Sequence[str] | None = None,
) -> Prefill:
    """One prompt's :class:`Prefill` on a pipeline given as its stage nodes, in stage
    order (each on all its ``num_gpus`` GPUs, tensor parallel), and block boundaries
    ``bounds`` (``bounds[s]..bounds[s+1]`` on stage ``s``).  ``parents`` names each
    stage's physical node when several stages are GPU groups of one node (their
    transfers then use the GPUs' own link).  The first-order model unless
    ``constraints.calibration`` is set."""
    c = Constraints() if constraints is None else constraints
    cm, order = _stage_model(model, stage_nodes, bounds, c, parents)
    return pipeline_prefill(cm, order, bounds, prompt_tokens)


def replica_serving(
    model: ModelLayout,
    stage_nodes: Sequence[NodeDescriptor],
    bounds: Sequence[int],
    workload: Workload,
    constraints: Constraints | None = None,
    *,
    parents: Sequence[str] | None = None,
) -> ReplicaServing:
    """:class:`ReplicaServing` of the pipeline ``stage_nodes``/``bounds`` (as in
    :func:`prefill_seconds`) under ``workload``: U*, TTFT(U*), TPOT(U*), TTFT0, tokens/s,
    requests/s and the binding constraint.  ``constraints`` gives the headroom and the
    calibration; its batch and context are the workload's."""
    c = serving_constraints(workload, constraints)
    cm, order = _stage_model(model, stage_nodes, bounds, c, parents)
    return pipeline_serving(cm, order, bounds, workload)
