"""What the caller asks of a plan: the :class:`Constraints`, and the strategy, metric and
objective enums.

A frozen value validated at construction, like the other planner inputs of
:mod:`stowplan.model` (which re-exports every name here). The first fields are
exactly those of the topology-planner specification (seed 000 §5.1); later
fields are optional and defaulted so the seed's constructors keep working.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from stowplan.errors import InputError
from stowplan.quantities.checks import check_choice, check_int, check_rate
from stowplan.quantities.limits import (
    MAX_BATCH,
    MAX_CONTEXT_TOKENS,
    MAX_GPUS_PER_NODE,
    MAX_NODES,
    MAX_RATE,
    MIN_RATE,
)

if TYPE_CHECKING:
    from stowplan.calibration.profile import Calibration

__all__ = ["DEFAULT_HEADROOM_FRAC", "Constraints", "Metric", "Objective", "Strategy"]

DEFAULT_HEADROOM_FRAC = 0.2
"""Seed §5.1: reserve 20 % of every node's VRAM unless told otherwise (the default
:attr:`Constraints.vram_headroom_frac`)."""


class Strategy(StrEnum):
    """How the planner chooses stages, nodes and splits."""

    BALANCE_BY_VRAM = "balance-by-vram"
    """Seed 000 §6 (V1): fewest stages, blocks split by VRAM, speed ignored."""
    LATENCY = "latency"
    """Minimum single-stream time per token."""
    THROUGHPUT = "throughput"
    """Most tokens/s for all concurrent sequences (U / cycle)."""
    EXACT = "exact"
    """The proven optimum of the workload's objective (slower; used to certify)."""


class Metric(StrEnum):
    """What a plan is measured by: the unit of its certificate
    (:attr:`stowplan.plan.Certificate.objective`) and the figure the planner's searches
    optimise.

    The strategy chooses it (``latency`` and ``throughput`` name their metric), else the
    workload does: latency at batch 1, throughput above.  Both rank pipelines by the
    cycle; they differ in the unit a certificate states and the searches a strategy runs.
    Not :class:`Objective`, which chooses the node set (best plan, or the cheapest)."""

    LATENCY = "latency"
    """Seconds per token of one sequence (lower is better)."""
    THROUGHPUT = "throughput"
    """Tokens/s of all concurrent sequences (higher is better)."""


class Objective(StrEnum):
    """What the node selection optimises (the plan's own figure is its :class:`Metric`)."""

    SPEED = "speed"
    """Best plan on all offered nodes."""
    COST = "cost"
    """Cheapest node set whose optimal plan meets ``target_tokens_per_s``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Constraints:
    """What the caller asks of a plan (seed 000 §5.1, extended). ``None`` means the default."""

    min_stages: int | None = None
    """Fewest pipeline stages (default 1)."""
    max_stages: int | None = None
    """Most pipeline stages (default: the number of nodes)."""
    vram_headroom_frac: float | None = None
    """VRAM fraction in [0, 1) kept free per node for framework overhead and safety
    (default 0.2).

    No weight and no KV reserve may use it: the KV reserve
    (``StageAssignment.kv_reserve_bytes``, the KV cache of ``context_tokens``) is counted
    beside the weights, in the rest of the VRAM.  The residency planner of one host
    (``stowplan residency``) keeps the same fraction of its primary pool under the same
    name, with its own default
    (:data:`~stowplan.planner.residency.DEFAULT_RESIDENCY_HEADROOM_FRAC`)."""
    strategy: Strategy | None = None
    """Planner strategy (default: ``latency`` at batch 1, ``throughput`` above)."""
    batch: int = 1
    """Concurrent sequences in flight."""
    context_tokens: int | None = None
    """Context tokens per sequence to reserve KV cache for, for each of the ``batch``
    sequences.

    None or 0: no KV reserve (the library's default); the command line reserves
    :func:`~stowplan.planner.context.default_context_tokens` unless told otherwise."""
    objective: Objective = Objective.SPEED
    target_tokens_per_s: float | None = None
    """With ``objective=cost``: the throughput the cheapest node set must reach."""
    calibration: Calibration | None = None
    """Calibration profile the cost model applies on top of the first-order terms.  None
    (the library's default) is the first-order model, which is optimistic; the CLI
    instead defaults to ``resolve_calibration("generic")``, fitted to every engine's
    published runs."""
    tensor_parallel: int | None = None
    """GPUs that split every stage's blocks, the same for every stage (default: chosen per
    stage within the engine's rule)."""
    kv_read_tokens: float | None = None
    """Context tokens of KV a decode step reads per sequence (default: half of
    ``context_tokens``, a sequence's mean context while it grows to the reserve; a
    serving workload reads at its mean context P + O/2)."""

    def __post_init__(self) -> None:
        stages_cap = MAX_NODES * MAX_GPUS_PER_NODE
        if self.min_stages is not None:
            check_int("min_stages", self.min_stages, minimum=1, maximum=stages_cap)
        if self.max_stages is not None:
            check_int("max_stages", self.max_stages, minimum=1, maximum=stages_cap)
        if (
            self.min_stages is not None
            and self.max_stages is not None
            and self.min_stages > self.max_stages
        ):
            raise InputError(
                "min_stages",
                self.min_stages,
                f"must be <= max_stages ({self.max_stages})",
            )
        h = self.vram_headroom_frac
        if h is not None and (
            isinstance(h, bool)
            or not isinstance(h, int | float)
            or not 0 <= h < 1  # before isfinite: an int like 10**400 has no float
            or not math.isfinite(h)
        ):
            raise InputError("vram_headroom_frac", h, "must be a number in [0, 1)")
        if self.strategy is not None:
            object.__setattr__(self, "strategy", check_choice("strategy", self.strategy, Strategy))
        object.__setattr__(self, "objective", check_choice("objective", self.objective, Objective))
        check_int("batch", self.batch, minimum=1, maximum=MAX_BATCH)
        if self.context_tokens is not None:
            check_int("context_tokens", self.context_tokens, maximum=MAX_CONTEXT_TOKENS)
        if self.target_tokens_per_s is not None:
            check_rate(
                "target_tokens_per_s", self.target_tokens_per_s, lower=MIN_RATE, upper=MAX_RATE
            )
        if self.kv_read_tokens is not None:
            value = check_rate(
                "kv_read_tokens", self.kv_read_tokens, lower=0.0, upper=MAX_CONTEXT_TOKENS
            )
            object.__setattr__(self, "kv_read_tokens", value)
        if self.tensor_parallel is not None:
            check_int("tensor_parallel", self.tensor_parallel, minimum=1, maximum=MAX_GPUS_PER_NODE)
        if self.calibration is not None:
            from stowplan.calibration.profile import Calibration

            if not isinstance(self.calibration, Calibration):
                raise InputError(
                    "calibration", type(self.calibration).__name__, "must be a Calibration"
                )
        if self.objective is Objective.COST and self.target_tokens_per_s is None:
            raise InputError(
                "target_tokens_per_s", None, "is required with objective='cost' (e.g. 20)"
            )

    @property
    def headroom(self) -> float:
        """The effective headroom fraction."""
        return DEFAULT_HEADROOM_FRAC if self.vram_headroom_frac is None else self.vram_headroom_frac

    @property
    def kv_read_context(self) -> float:
        """Tokens of KV a decode step reads per sequence: ``kv_read_tokens``, else half
        of ``context_tokens`` (0 without a reserve)."""
        if self.kv_read_tokens is not None:
            return self.kv_read_tokens
        return (self.context_tokens or 0) / 2

    def resolved_strategy(self) -> Strategy:
        """The strategy that will run: the given one, or the workload's default."""
        if self.strategy is not None:
            return self.strategy
        return Strategy.LATENCY if self.batch == 1 else Strategy.THROUGHPUT
