"""Whether a plan lies inside its calibration profile's data, and what to expect when not.

A profile's *coverage* is what its fitted runs (:attr:`Calibration.fitted_runs`) span,
computed from them, never listed by hand: the GPU families, the weight dtype classes,
the tensor-parallel degrees, dense or mixture-of-experts, the attention (MLA or
other), expert-parallel or not, and the batch sizes.  A plan is *inside* when each of
its values occurs there: every GPU it runs on takes a profile entry fitted to runs of
its family, its dtype class, every stage's tensor-parallel degree (a stage of an
engine that splits a host's layers over its GPUs counts as 1, as its runs do), its
model's kind and its batch.  How stages are chained over a network is not part of it:
hops are charged by the link figures, not fitted.

Outside, one number would be the optimistic guess the data cannot back; the
prediction becomes a range drawn from the profile's residuals on the nearest data
(:func:`assess_coverage`):

1. A run's *ratio* is its measured tokens/s over what the profile's fitting
   predicts for it with the run held out (``held_out_tokens_per_s``; the profile's
   own prediction where a profile does not record it).
2. A run's or plan's *kind* is (dense or MoE, MLA or not, expert-parallel or not).
   The evidence is every fitted run, and every run kept out of the fit whose kind no
   fitted run has: such a run was kept out because the cost model has no term for
   its kind (an all-to-all, MLA), which is exactly what it shows.
3. The *nearest* runs are the evidence runs whose kind differs from the plan's in
   the fewest of the three features; while they number fewer than
   :data:`MIN_NEAREST_RUNS`, the runs at the next distance join them.
4. The range is the prediction times the least and the greatest ratio of the
   nearest runs, after setting aside the lowest and the highest ⌊n / 10⌋ of the n
   ratios (from ten runs on, about the 10th to the 90th percentile).

A profile that records no runs (a user's own file) has no known coverage: the
verdict says so and gives no range.  This module is pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stowplan.calibration.apply import calibration_label, stage_time_s
from stowplan.calibration.profile import Calibration, dtype_class
from stowplan.calibration.runs import PublishedRun
from stowplan.model import ModelLayout, NodeDescriptor
from stowplan.plan import Plan
from stowplan.quantities.checks import check_int, check_number

__all__ = [
    "MIN_NEAREST_RUNS",
    "Coverage",
    "CoverageVerdict",
    "PlanKind",
    "assess_coverage",
    "calibration_label",
    "plan_kind",
    "profile_coverage",
    "run_ratio",
]

MIN_NEAREST_RUNS = 3
"""The fewest runs a range is drawn from (runs of the next-nearest kind join until then)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Coverage:
    """What a profile's fitted runs span (see the module docstring)."""

    runs: int
    gpu_families: frozenset[str]
    dtype_classes: frozenset[str]
    tensor_parallel: frozenset[int]
    moe: frozenset[bool]
    mla: frozenset[bool]
    expert_parallel: frozenset[bool]
    batches: frozenset[int]


def profile_coverage(calibration: Calibration) -> Coverage:
    """The coverage of ``calibration``, from its fitted runs (empty sets when it has none)."""
    runs = calibration.fitted_runs
    return Coverage(
        runs=len(runs),
        gpu_families=frozenset(r.family for r in runs),
        dtype_classes=frozenset(dtype_class(r.dtype) for r in runs),
        tensor_parallel=frozenset(r.tensor_parallel for r in runs),
        moe=frozenset(r.moe for r in runs),
        mla=frozenset(r.attention == "mla" for r in runs),
        expert_parallel=frozenset(r.expert_parallel > 1 for r in runs),
        batches=frozenset(r.batch for r in runs),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanKind:
    """What of a plan coverage looks at."""

    gpu_names: tuple[str, ...]
    """The GPU name of every stage's node, in stage order."""
    dtype: str | None
    tensor_parallel: tuple[int, ...]
    """Every stage's tensor-parallel degree."""
    moe: bool = False
    mla: bool = False
    expert_parallel: bool = False
    """Some stage holds experts of blocks it does not run."""
    batch: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpu_names", tuple(self.gpu_names))
        object.__setattr__(self, "tensor_parallel", tuple(self.tensor_parallel))
        for i, tp in enumerate(self.tensor_parallel):
            check_int(f"tensor_parallel[{i}]", tp, minimum=1)
        check_int("batch", self.batch, minimum=1)


def plan_kind(
    plan: Plan,
    nodes: Sequence[NodeDescriptor],
    layout: ModelLayout,
    *,
    attention: str = "gqa",
) -> PlanKind:
    """The :class:`PlanKind` of ``plan`` of ``layout`` on ``nodes``; ``attention`` is the
    model's (``mla`` or ``gqa``: :attr:`ModelReport.layer_kinds` tells it)."""
    by_id = {n.id: n for n in nodes}
    stages = [a for a in plan.assignments if a.node_id in by_id]
    away = any(
        not a.block_range[0] <= e.block < a.block_range[1]
        for a in plan.assignments
        for e in a.owned_experts
    )
    prediction = plan.rationale.prediction
    return PlanKind(
        gpu_names=tuple(by_id[a.node_id].gpu_name for a in stages),
        dtype=layout.dtype,
        tensor_parallel=tuple(a.tensor_parallel for a in stages),
        moe=layout.experts is not None,
        mla=attention == "mla",
        expert_parallel=away,
        batch=prediction.batch if prediction is not None else 1,
    )


def run_ratio(run: PublishedRun, calibration: Calibration) -> float:
    """Measured over held-out predicted tokens/s of ``run`` (the profile's own prediction
    when the held-out one is not recorded)."""
    predicted = run.held_out_tokens_per_s
    if predicted is None:
        tp = run.tensor_parallel
        predicted = 1.0 / stage_time_s(
            read_bytes=run.read_bytes,
            params=0,
            num_blocks=run.num_blocks,
            bandwidth_gbps=run.bandwidth_gbps * tp,
            tflops=0.0,
            dtype=run.dtype,
            hops=run.hops,
            tensor_parallel=tp,
            device=calibration.for_device(run.gpu_name),
        )
    return run.tokens_per_s / predicted


@dataclass(frozen=True, slots=True, kw_only=True)
class CoverageVerdict:
    """Whether a prediction lies inside its profile's data, and the range when it does not."""

    label: str
    """The profile as :func:`calibration_label` names it."""
    known: bool
    """The profile records its runs (False: coverage unknown, no range)."""
    outside: tuple[str, ...] = ()
    """What of the plan lies outside the data, in words (empty: inside)."""
    low_tokens_per_s: float | None = None
    high_tokens_per_s: float | None = None
    nearest_runs: int = 0
    """How many runs the range is drawn from."""

    @property
    def inside(self) -> bool:
        """Known coverage and nothing outside it."""
        return self.known and not self.outside


def _run_kind(r: PublishedRun) -> tuple[bool, bool, bool]:
    return (r.moe, r.attention == "mla", r.expert_parallel > 1)


def _outside(cal: Calibration, cov: Coverage, kind: PlanKind) -> tuple[str, ...]:
    """The plan's values outside ``cov``, in words, kind first."""
    out: list[str] = []
    if kind.moe not in cov.moe:
        out.append("MoE" if kind.moe else "dense model")
    if kind.mla not in cov.mla:
        out.append("MLA attention" if kind.mla else "attention other than MLA")
    if kind.expert_parallel not in cov.expert_parallel:
        out.append("MoE with expert-parallel" if kind.expert_parallel else "experts beside blocks")
    if dtype_class(kind.dtype) not in cov.dtype_classes:
        out.append(f"dtype {kind.dtype}" if kind.dtype else "dtype unknown")
    gpus: list[str] = []
    for name in kind.gpu_names:
        entry = cal.for_device(name)
        if (entry is None or entry.device not in cov.gpu_families) and name not in gpus:
            gpus.append(name)
    if gpus:
        out.append("GPU " + ", ".join(gpus))
    split = cal.engine.splits_layers
    degrees = sorted({1 if split else tp for tp in kind.tensor_parallel} - cov.tensor_parallel)
    if degrees:
        out.append("tensor-parallel " + ", ".join(map(str, degrees)))
    if kind.batch not in cov.batches:
        out.append(f"batch {kind.batch}")
    return tuple(out)


def _nearest(cal: Calibration, kind: PlanKind) -> list[PublishedRun]:
    """Step 2 and 3 of the module docstring: the evidence runs nearest the plan's kind."""
    fitted_kinds = {_run_kind(r) for r in cal.fitted_runs}
    evidence = [r for r in cal.runs if r.fitted or _run_kind(r) not in fitted_kinds]
    want = (kind.moe, kind.mla, kind.expert_parallel)
    by_distance: dict[int, list[PublishedRun]] = {}
    for r in evidence:
        d = sum(a != b for a, b in zip(_run_kind(r), want, strict=True))
        by_distance.setdefault(d, []).append(r)
    nearest: list[PublishedRun] = []
    for d in sorted(by_distance):
        if len(nearest) >= MIN_NEAREST_RUNS:
            break
        nearest += by_distance[d]
    return nearest


def assess_coverage(
    calibration: Calibration | None, kind: PlanKind, predicted_tokens_per_s: float
) -> CoverageVerdict:
    """Whether ``kind`` lies inside ``calibration``'s data and, when not, the range of
    tokens/s to expect around ``predicted_tokens_per_s`` (the rule: module docstring).

    ``calibration`` None (the first-order model) and a profile without runs give a
    verdict of unknown coverage.
    """
    check_number("predicted_tokens_per_s", predicted_tokens_per_s, positive=True)
    label = calibration_label(calibration)
    if calibration is None or not calibration.fitted_runs:
        return CoverageVerdict(label=label, known=False)
    outside = _outside(calibration, profile_coverage(calibration), kind)
    if not outside:
        return CoverageVerdict(label=label, known=True)
    nearest = _nearest(calibration, kind)
    ratios = sorted(run_ratio(r, calibration) for r in nearest)
    trim = len(ratios) // 10
    kept = ratios[trim : len(ratios) - trim]
    return CoverageVerdict(
        label=label,
        known=True,
        outside=outside,
        low_tokens_per_s=predicted_tokens_per_s * kept[0],
        high_tokens_per_s=predicted_tokens_per_s * kept[-1],
        nearest_runs=len(nearest),
    )
