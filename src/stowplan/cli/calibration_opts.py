"""The calibration every CLI prediction uses, and its coverage verdict for a plan.

CLI predictions are calibrated by default: without ``--engine`` or ``--calibration``
they use the ``generic`` profile, fitted to the published runs of every engine (with
the user's own fitted entries in front).  ``--engine first-order`` asks for the
first-order model (weights over peak bandwidth, no fixed costs: optimistic).  The
Python API's default stays the first-order model (``Constraints(calibration=None)``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from stowplan.calibration.apply import calibration_label
from stowplan.calibration.coverage import CoverageVerdict, assess_coverage, plan_kind
from stowplan.calibration.profile import Calibration, Engine
from stowplan.calibration.store import resolve_calibration
from stowplan.cli.options import FIRST_ORDER
from stowplan.errors import Infeasible, InputError, TargetUnreached
from stowplan.model import Constraints, ModelLayout, NodeDescriptor
from stowplan.models import inspect_model
from stowplan.plan import Plan
from stowplan.report.calibration import annotate_notes, headline_tokens_per_s

__all__ = [
    "CALIBRATION_HELP",
    "DEFAULT_ENGINE",
    "cli_calibration",
    "labelled_notes",
    "model_attention",
    "plan_verdict",
    "target_named",
]

DEFAULT_ENGINE = Engine.GENERIC

CALIBRATION_HELP = "Calibration profile JSON to predict with instead of --engine's."

_CHOICES = ", ".join([*(e.value for e in Engine), FIRST_ORDER])


def cli_calibration(engine: str | None, path: Path | None) -> Calibration | None:
    """The profile a CLI prediction uses: ``--calibration`` FILE, else ``--engine``'s
    shipped profile with the user's fitted entries (default ``generic``); None for
    ``--engine first-order``.

    Raises :class:`InputError` for an unknown engine, or ``first-order`` with a file.
    """
    if engine == FIRST_ORDER:
        if path is not None:
            raise InputError(
                "--engine",
                engine,
                "predicts without a profile; drop it to use --calibration, or drop --calibration",
            )
        return None
    if engine is not None and engine not in {e.value for e in Engine}:
        raise InputError("--engine", engine, f"must be one of {_CHOICES}")
    return resolve_calibration(engine or DEFAULT_ENGINE, path)


def model_attention(model: str, dtype: str | None) -> str:
    """``mla`` when a block of ``model`` uses multi-head latent attention, else ``gqa``."""
    kinds = inspect_model(model, dtype=dtype).layer_kinds
    mla = any(k.partition("+")[2].startswith("mla") for k in kinds)
    return "mla" if mla else "gqa"


def plan_verdict(
    plan: Plan,
    nodes: Sequence[NodeDescriptor],
    layout: ModelLayout,
    calibration: Calibration | None,
    attention: str,
) -> CoverageVerdict:
    """Whether ``plan``'s prediction lies inside ``calibration``'s data, with its range."""
    headline = headline_tokens_per_s(plan)
    if headline is None:
        return CoverageVerdict(label=calibration_label(calibration), known=False)
    kind = plan_kind(plan, nodes, layout, attention=attention)
    return assess_coverage(calibration, kind, headline)


def labelled_notes(plan: Plan, calibration: Calibration | None) -> tuple[str, ...]:
    """``plan``'s notes with its prediction named by the model that made it (no coverage
    check: for commands that plan without a model file to read the attention from)."""
    verdict = CoverageVerdict(label=calibration_label(calibration), known=False)
    return annotate_notes(plan.rationale.notes, verdict)


@contextmanager
def target_named(constraints: Constraints) -> Iterator[None]:
    """Under ``--target``, an unreachable target's error also names the model that
    predicted every node set's speed (``… (predicted with engine generic, calibrated on
    101 published runs)``)."""
    try:
        yield
    except Infeasible as exc:
        if constraints.target_tokens_per_s is None:
            raise
        label = calibration_label(constraints.calibration)
        article = "the " if constraints.calibration is None else ""
        reason = f"{exc.reason} (predicted with {article}{label})"
        if isinstance(exc, TargetUnreached):
            raise TargetUnreached(exc.target, exc.reach, reason) from None
        raise Infeasible(reason) from None
