"""Expert parallelism (seed 000 §11): where every routed expert of a MoE model lives.

How blocks and experts share memory
-----------------------------------
A MoE :class:`~stowplan.model.ModelLayout` counts a block's routed experts in
its ``block_bytes``.  In an expert-parallel plan those experts need not live
on the node of the stage that runs the block:

1. **Blocks first, without their routed experts.**  The block planner places
   the *backbone* (:func:`backbone_layout`): every block counted with only its
   non-expert bytes (attention, norms, router, shared experts), plus embed,
   head and KV reserve, exactly as for a dense model.
2. **Experts fill what is left, anywhere.**  A stage node's expert capacity is
   ``usable_vram - backbone blocks - embed/head - KV reserve`` divided by
   ``expert_params_bytes``.  Every routed expert of every MoE block is placed
   on at least one stage node; spare slots may hold redundant replicas of hot
   experts.
3. Every stage's ``estimated_vram_bytes`` is its backbone bytes plus the bytes
   of the experts it owns (``owned_experts``), and never exceeds its usable
   VRAM.  When the stage nodes cannot hold every expert even with all offered
   nodes as stages, :class:`~stowplan.errors.InsufficientVram` gives the bytes.

Dense models (``experts is None``) get exactly the block planner's plan.

Load and locality
-----------------
Decode is memory-bound, so a node's expert *speed* is its memory bandwidth
(the cost model's figure: given, else the GPU spec table).  Per MoE block, spare slots first
get replicas by EPLB's rule (each extra copy goes to the expert with the
heaviest load per copy, at most ``redundant_per_block``, and only while that
copy carries more than half a node's mean load; a replicated
expert's tokens are split evenly over its copies).  All copies are then
packed heaviest first onto the node whose finish time ``load / speed`` after
the addition is least (capacity-weighted LPT; copies of one expert on
distinct nodes), and single-copy experts are moved or swapped off the slowest
node while that lowers it.  The **imbalance** of a block is
``max_j(load_j / speed_j) / (sum(load) / sum(speed))`` (1.0 is perfect).

With co-activation counts, experts selected together at least twice as often
as chance are grouped (up to ``experts_per_token`` per group) and a group is
placed (and moved) as one item; the grouped layout is kept for a block when
its slowest node is within ``locality_tolerance`` (default 5 %) of the
load-only layout's.

**Cross-node transfers per token** of a block: the expected number of distinct
nodes other than the stage's node that hold the experts a token selects (each
costs one send of the hidden state and one return), estimated per node as
``sum(p_e) - sum(p_ef)`` clipped to ``[max(p_e), 1]`` (second-order
inclusion-exclusion; exact when no more than two selected experts share a
node), with ``p_ef`` from the co-activation counts (pairs a file does not
list are taken at chance level) or, without them, independent routing
(``p_ef = p_e * p_f * (k - 1) / k``).

The modules
-----------
* :mod:`.inputs` — :class:`ExpertInputs` (statistics, replicas, :class:`ExpertPlacement`),
  node speeds, free slots;
* :mod:`.packing` — :func:`pack_experts`, the packing rule in EPLB's shape
  (a load matrix in, every expert's copies out), with :mod:`.refine` its last step;
* :mod:`.placement` — :func:`place_experts`, that rule on a backbone plan;
* :mod:`.choice` — block-local or expert-parallel (:func:`plan_experts`, which
  :func:`stowplan.plan` calls for a MoE model);
* :mod:`.deprecated` — :func:`plan_with_experts`, the former entry point;
* :mod:`.summary` — :func:`expert_summary`, a plan's experts read back.

The cost model's expert term (:func:`expert_stage_times`,
:func:`expert_prediction`) is in :mod:`stowplan.cost.experts`, and the routing
figures both the planner and the cost model read (selection probabilities,
where each copy lives, a node's reach) are in :mod:`stowplan.moe.routing`;
both are re-exported here.
"""

from __future__ import annotations

from stowplan.cost.experts import ExpertTime, expert_prediction, expert_stage_times
from stowplan.moe.routing import backbone_layout
from stowplan.planner.experts.choice import BlockPlanner, plan_experts
from stowplan.planner.experts.deprecated import plan_with_experts
from stowplan.planner.experts.inputs import (
    LOCALITY_TOLERANCE,
    ExpertInputs,
    ExpertPlacement,
    expert_speeds,
    free_slots,
)
from stowplan.planner.experts.packing import ExpertPacking, pack_experts
from stowplan.planner.experts.placement import place_experts
from stowplan.planner.experts.summary import ExpertSummary, NodeExperts, expert_summary

__all__ = [
    "LOCALITY_TOLERANCE",
    "BlockPlanner",
    "ExpertInputs",
    "ExpertPacking",
    "ExpertPlacement",
    "ExpertSummary",
    "ExpertTime",
    "NodeExperts",
    "backbone_layout",
    "expert_prediction",
    "expert_speeds",
    "expert_stage_times",
    "expert_summary",
    "free_slots",
    "pack_experts",
    "place_experts",
    "plan_experts",
    "plan_with_experts",
]
