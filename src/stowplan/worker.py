"""The worker contract (seed 000 §7.3): how a stage process learns its share.

Orchestrator side: :func:`stage_env` gives the environment of every stage.
Worker side: :func:`stage_from_env` reads, in order of precedence,

1. ``PLAN_JSON`` + ``STAGE``: the serialised plan; the worker finds its own
   assignment by stage index;
2. ``PLAN_STAGE_BLOCKS=lo,hi`` (+ optional ``PLAN_OWNS_EMBED=1``,
   ``PLAN_OWNS_HEAD=1``; default: stage 0 owns the embed, the last the head);
3. ``STAGE`` + ``NUM_STAGES`` alone: the even split ``[s*B//N, (s+1)*B//N)``.

Malformed values raise :class:`~stowplan.errors.InputError` naming the variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stowplan.errors import InputError
from stowplan.plan import Plan, plan_from_json, plan_to_json

__all__ = ["CONTRACT_KEYS", "WorkerStage", "even_split", "stage_env", "stage_from_env"]

CONTRACT_KEYS = ("PLAN_JSON", "STAGE", "NUM_STAGES", "PLAN_STAGE_BLOCKS", "PLAN_OWNS_EMBED",
                 "PLAN_OWNS_HEAD")  # fmt: skip
"""The variables of the contract: every one :func:`stage_env` sets."""

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
        }


def even_split(num_blocks: int, num_stages: int, stage: int) -> tuple[int, int]:
    """The pre-planner rule: ``[s*B//N, (s+1)*B//N)``."""
    return stage * num_blocks // num_stages, (stage + 1) * num_blocks // num_stages


def _int(env: Mapping[str, str], name: str, minimum: int = 0) -> int:
    raw = env[name]
    try:
        value = int(raw.strip())
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
    if env.get("PLAN_JSON"):
        plan = plan_from_json(env["PLAN_JSON"])
        a = plan.stage(stage)
        return WorkerStage(
            stage=stage,
            num_stages=plan.num_stages,
            block_range=a.block_range,
            owns_embed=a.owns_embed,
            owns_head=a.owns_head,
            source="PLAN_JSON",
            node_id=a.node_id,
        )
    num_stages = _int(env, "NUM_STAGES", 1) if "NUM_STAGES" in env else None
    if num_stages is not None and stage >= num_stages:
        raise InputError("STAGE", env["STAGE"], f"must be < NUM_STAGES ({num_stages})")
    if env.get("PLAN_STAGE_BLOCKS"):
        raw = env["PLAN_STAGE_BLOCKS"]
        parts = raw.split(",")
        try:
            lo, hi = (int(p.strip()) for p in parts)
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
    )


def stage_env(plan: Plan) -> list[dict[str, str]]:
    """The environment each stage's process receives, in stage order."""
    plan_json = plan_to_json(plan, indent=None)
    out = []
    for a in plan.assignments:
        out.append(
            {
                "PLAN_JSON": plan_json,
                "STAGE": str(a.stage),
                "NUM_STAGES": str(plan.num_stages),
                "PLAN_STAGE_BLOCKS": f"{a.block_range[0]},{a.block_range[1]}",
                "PLAN_OWNS_EMBED": "1" if a.owns_embed else "0",
                "PLAN_OWNS_HEAD": "1" if a.owns_head else "0",
            }
        )
    return out
