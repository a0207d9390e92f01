"""The KV cache a plan reserves, as the engines take it: the context, the sequences in
flight, the memory fraction they may fill, and the refusal of a plan whose stages cannot
hold the KV cache of its context.

A plan reserves KV cache for ``context_tokens`` tokens of each of its batch's sequences
(``Prediction.batch``; 1 without a prediction).  The engines size their KV cache from the
memory they may use, so the exports pass the context and the memory fraction the plan
leaves them: ``1 − headroom`` of every GPU (the plan keeps the headroom free).
"""

from __future__ import annotations

from stowplan.errors import Infeasible
from stowplan.exports.common import replan_command
from stowplan.model import DEFAULT_HEADROOM_FRAC, ModelLayout, NodeDescriptor
from stowplan.plan import Plan, StageAssignment
from stowplan.quantities.units import format_bytes

__all__ = ["check_kv_fits", "context_of", "memory_fraction", "sequences_of"]


def context_of(plan: Plan) -> int | None:
    """Tokens per sequence the plan reserves KV cache for (None: none, or not said)."""
    return plan.context_tokens or None


def sequences_of(plan: Plan) -> int:
    """Concurrent sequences the plan was made for (1 without a prediction)."""
    prediction = plan.rationale.prediction
    return prediction.batch if prediction is not None else 1


def _stage_vram(a: StageAssignment, node: NodeDescriptor) -> int:
    """The VRAM of the GPUs stage ``a`` runs on (all of its node's when it lists none)."""
    if a.gpu_indices:
        return node.vram_bytes * len(a.gpu_indices) // node.num_gpus
    return node.vram_bytes


def memory_fraction(plan: Plan, nodes: dict[str, NodeDescriptor]) -> tuple[str, str | None]:
    """The fraction of GPU memory the engine may fill, as text (``0.8``), and a note when
    it is assumed.

    With the plan's nodes it is the smallest ``usable / VRAM`` over the stages (that is
    ``1 − headroom``); without them (or when a stage's usable VRAM exceeds its GPUs'),
    ``1 −`` the default headroom, said in the note.
    """
    fractions = [
        a.usable_vram_bytes / vram
        for a in plan.assignments
        if a.usable_vram_bytes is not None
        and (node := nodes.get(a.node_id)) is not None
        and (vram := _stage_vram(a, node)) > 0
    ]
    value = _decimal(1.0 - DEFAULT_HEADROOM_FRAC)
    if len(fractions) < plan.num_stages:
        return value, (
            f"the memory fraction {value} assumes the default {DEFAULT_HEADROOM_FRAC:.0%} "
            "headroom: pass --nodes FLEET to read the plan's own"
        )
    if not 0 < min(fractions) <= max(fractions) <= 1:
        return value, (
            f"the memory fraction {value} assumes the default {DEFAULT_HEADROOM_FRAC:.0%} "
            "headroom: the fleet gives a stage less VRAM than the plan uses (another fleet?)"
        )
    # Three decimals, rounded down: the engine never gets more than the plan gave it.
    return _decimal(min(fractions)), None


def _decimal(x: float) -> str:
    """``x`` rounded down to three decimals (a hair of float noise forgiven), as text."""
    thousandths = int(x * 1000 + 1e-6)
    return f"{thousandths / 1000:g}"


def _sequences(n: int) -> str:
    return f"{n:,} sequence" if n == 1 else f"{n:,} sequences"


def check_kv_fits(
    plan: Plan,
    layout: ModelLayout | None,
    nodes_file: str | None = None,
) -> tuple[str, ...]:
    """Refuse a plan whose stages cannot hold the KV cache of its context; return notes.

    With the model's ``layout``, every stage must hold its weights plus the KV cache of
    ``context_tokens`` × sequences for its blocks (sliding windows counted) within its
    usable VRAM.  Without it, every stage's ``estimated_vram_bytes`` must be within its
    usable VRAM, and a KV capacity below the context is reported in a note.

    Raises:
        Infeasible: a stage's weights and KV cache exceed its usable VRAM; the message
            gives the numbers and the ``stowplan plan … --context max`` line.
    """
    ctx = context_of(plan)
    if ctx is None:
        return ()
    seqs = sequences_of(plan)
    fix = replan_command(plan, None, nodes_file, context="max")
    blocks = plan.num_blocks or plan.assignments[-1].block_range[1]
    per_block = (
        layout.kv_bytes_per_token if layout is not None and layout.num_blocks == blocks else None
    )
    for a in plan.assignments:
        usable = a.usable_vram_bytes
        if usable is None:
            continue
        weights = a.estimated_vram_bytes - a.kv_reserve_bytes
        lo, hi = a.block_range
        if per_block is not None:
            assert layout is not None
            kv = sum(layout.kv_bytes(b, ctx, seqs) for b in range(lo, hi))
            per_token = sum(per_block[lo:hi])
            what = f"{format_bytes(per_token)}/token × {ctx:,} tokens × {_sequences(seqs)}"
        else:
            kv = a.kv_reserve_bytes
            what = f"the reserve for {ctx:,} tokens × {_sequences(seqs)}"
        if weights + kv > usable:
            raise Infeasible(
                f"the plan's stage {a.stage} on {a.node_id} cannot hold the KV cache of its "
                f"context: weights {format_bytes(weights)} + KV {format_bytes(kv)} ({what}) = "
                f"{format_bytes(weights + kv)} > usable VRAM {format_bytes(usable)}; replan "
                "with the largest context that "
                f"fits: {fix}"
            )
    prediction = plan.rationale.prediction
    capacity = prediction.kv_capacity_tokens if prediction is not None else None
    if layout is None and capacity is not None and capacity < ctx * seqs:
        return (
            f"the plan's KV capacity ({capacity:,} tokens) is below its context × sequences "
            f"({ctx:,} × {seqs:,}); pass the model (--model) to check it against the model's "
            "own KV figures, or replan: " + fix,
        )
    return ()
