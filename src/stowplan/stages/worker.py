"""The worker contract (seed 000 §7.3): how a stage process learns its share.

Orchestrator side: :func:`stage_env` gives the environment of every stage.
Worker side: :func:`stage_from_env` reads, in order of precedence,

1. ``PLAN_JSON`` + ``STAGE``: the serialised plan; the worker finds its own
   assignment by stage index;
2. ``PLAN_STAGE_BLOCKS=lo,hi`` (+ optional ``PLAN_OWNS_EMBED=1``,
   ``PLAN_OWNS_HEAD=1``; default: stage 0 owns the embed, the last the head);
3. ``STAGE`` + ``NUM_STAGES`` alone: the even split ``[s*B//N, (s+1)*B//N)``.

``PLAN_TP_SIZE`` is the stage's tensor-parallel degree (how many GPUs split each
of its blocks; 1 when absent). With ``PLAN_JSON`` it must agree with the plan.

``CUDA_VISIBLE_DEVICES``: :func:`stage_env` sets it to the stage's
``gpu_indices`` (comma-joined, ``0,1,2,3``) for a stage that lists GPUs, and
leaves it out for a stage on a whole node that lists none (every stage of a plan
of single-GPU nodes): such a node may be one GPU of a bigger host, described on
its own, and only the host knows which, so the worker keeps whatever the host or
the scheduler gave it. It is read by CUDA, not by :func:`stage_from_env`, so it
is not one of :data:`CONTRACT_KEYS`. Under Ray, an actor that reserves GPUs gets
``CUDA_VISIBLE_DEVICES`` from Ray (the GPUs of its bundle), which replaces the
plan's list; a process started by hand from ``stowplan stage-env --format
shell`` keeps the plan's.

Malformed values raise :class:`~stowplan.errors.InputError` naming the variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stowplan.errors import InputError
from stowplan.plan import Plan, plan_from_json, plan_to_json
from stowplan.stages.gpu_lists import visible_devices

__all__ = [
    "CONTRACT_KEYS",
    "VISIBLE_DEVICES",
    "WorkerStage",
    "even_split",
    "stage_env",
    "stage_from_env",
]

CONTRACT_KEYS = ("PLAN_JSON", "STAGE", "NUM_STAGES", "PLAN_STAGE_BLOCKS", "PLAN_OWNS_EMBED",
                 "PLAN_OWNS_HEAD", "PLAN_TP_SIZE")  # fmt: skip
"""The variables of the contract: every one :func:`stage_env` sets for every stage."""

VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
"""Set by :func:`stage_env` only for a stage that lists its GPUs (see the module notes)."""

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerStage:
    """What one stage runs."""

    stage: int
    num_stages: int
    block_range: tuple[int, int]
    owns_embed: bool
    owns_head: bool
    source: str
    """Which contract supplied it: ``PLAN_JSON``, ``PLAN_STAGE_BLOCKS`` or ``NUM_STAGES``."""
    node_id: str | None = None
    tensor_parallel: int = 1
    """GPUs that split each block of the stage (``PLAN_TP_SIZE``)."""
    gpu_indices: tuple[int, ...] = ()
    """The plan's GPUs of the node for this stage (from ``PLAN_JSON`` only; empty: the
    whole node, or not known)."""

    def placement_info(self, running_node_id: str) -> dict[str, Any]:
        """JSON-ready: the node the stage runs on next to the one its plan named, and what
        it resolved (blocks, embed/head, contract source)."""
        return {
            "stage": self.stage,
            "node_id": running_node_id,
            "plan_node_id": self.node_id,
            "block_range": list(self.block_range),
            "owns_embed": self.owns_embed,
            "owns_head": self.owns_head,
            "source": self.source,
            "tensor_parallel": self.tensor_parallel,
            "gpu_indices": list(self.gpu_indices),
        }


def even_split(num_blocks: int, num_stages: int, stage: int) -> tuple[int, int]:
    """The pre-planner rule: ``[s*B//N, (s+1)*B//N)``."""
    return stage * num_blocks // num_stages, (stage + 1) * num_blocks // num_stages


def _int(env: Mapping[str, str], name: str, minimum: int = 0) -> int:
    raw = env[name]
    try:
        value = int(raw.strip()) if raw.isascii() else -1
    except ValueError:
        raise InputError(name, raw, f"must be an integer >= {minimum}") from None
    if value < minimum:
        raise InputError(name, raw, f"must be an integer >= {minimum}")
    return value


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    if name not in env:
        return default
    raw = env[name].strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise InputError(name, env[name], "must be 1 or 0 (also true/false, yes/no)")


def stage_from_env(
    env: Mapping[str, str] | None = None, *, num_blocks: int | None = None
) -> WorkerStage:
    """This worker's stage from its environment (``os.environ`` by default).

    ``num_blocks`` is needed only for the ``NUM_STAGES`` fallback.
    """
    env = os.environ if env is None else env
    if "STAGE" not in env:
        raise InputError("STAGE", None, "must be set to this worker's stage index")
    stage = _int(env, "STAGE")
    tp = _int(env, "PLAN_TP_SIZE", 1) if "PLAN_TP_SIZE" in env else None
    if env.get("PLAN_JSON"):
        plan = plan_from_json(env["PLAN_JSON"])
        a = plan.stage(stage)
        if tp is not None and tp != a.tensor_parallel:
            raise InputError(
                "PLAN_TP_SIZE",
                env["PLAN_TP_SIZE"],
                f"must equal the tensor_parallel={a.tensor_parallel} of stage {stage} in "
                "PLAN_JSON (or be unset)",
            )
        return WorkerStage(
            stage=stage,
            num_stages=plan.num_stages,
            block_range=a.block_range,
            owns_embed=a.owns_embed,
            owns_head=a.owns_head,
            source="PLAN_JSON",
            node_id=a.node_id,
            tensor_parallel=a.tensor_parallel,
            gpu_indices=a.gpu_indices,
        )
    num_stages = _int(env, "NUM_STAGES", 1) if "NUM_STAGES" in env else None
    if num_stages is not None and stage >= num_stages:
        raise InputError("STAGE", env["STAGE"], f"must be < NUM_STAGES ({num_stages})")
    if env.get("PLAN_STAGE_BLOCKS"):
        raw = env["PLAN_STAGE_BLOCKS"]
        parts = raw.split(",")
        try:
            lo, hi = (int(p.strip()) if p.isascii() else -1 for p in parts)
        except ValueError:
            raise InputError(
                "PLAN_STAGE_BLOCKS", raw, "must be 'lo,hi' with integers 0 <= lo < hi"
            ) from None
        if not 0 <= lo < hi or (num_blocks is not None and hi > num_blocks):
            limit = f" <= {num_blocks}" if num_blocks is not None else ""
            raise InputError(
                "PLAN_STAGE_BLOCKS", raw, f"must be 'lo,hi' with integers 0 <= lo < hi{limit}"
            )
        last = num_stages is not None and stage == num_stages - 1
        return WorkerStage(
            stage=stage,
            num_stages=num_stages or stage + 1,
            block_range=(lo, hi),
            owns_embed=_flag(env, "PLAN_OWNS_EMBED", stage == 0),
            owns_head=_flag(env, "PLAN_OWNS_HEAD", last),
            source="PLAN_STAGE_BLOCKS",
            tensor_parallel=tp or 1,
        )
    if num_stages is None:
        raise InputError(
            "NUM_STAGES", None, "must be set when neither PLAN_JSON nor PLAN_STAGE_BLOCKS is"
        )
    if num_blocks is None:
        raise InputError("num_blocks", None, "is needed for the NUM_STAGES even split")
    if num_stages > num_blocks:
        raise InputError("NUM_STAGES", env["NUM_STAGES"], f"must be <= num_blocks ({num_blocks})")
    return WorkerStage(
        stage=stage,
        num_stages=num_stages,
        block_range=even_split(num_blocks, num_stages, stage),
        owns_embed=stage == 0,
        owns_head=stage == num_stages - 1,
        source="NUM_STAGES",
        tensor_parallel=tp or 1,
    )


def stage_env(plan: Plan) -> list[dict[str, str]]:
    """The environment each stage's process receives, in stage order: every one of
    :data:`CONTRACT_KEYS`, and ``CUDA_VISIBLE_DEVICES`` for a stage that lists its GPUs."""
    plan_json = plan_to_json(plan, indent=None)
    out = []
    for a in plan.assignments:
        env = {
            "PLAN_JSON": plan_json,
            "STAGE": str(a.stage),
            "NUM_STAGES": str(plan.num_stages),
            "PLAN_STAGE_BLOCKS": f"{a.block_range[0]},{a.block_range[1]}",
            "PLAN_OWNS_EMBED": "1" if a.owns_embed else "0",
            "PLAN_OWNS_HEAD": "1" if a.owns_head else "0",
            "PLAN_TP_SIZE": str(a.tensor_parallel),
        }
        if a.gpu_indices:
            env[VISIBLE_DEVICES] = visible_devices(a.gpu_indices)
        out.append(env)
    return out
