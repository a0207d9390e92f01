"""The stowplan error tree: every error stowplan raises on purpose, in one place.

::

    StowplanError
    ├── InputError              bad user input: names the field, the value and what is accepted
    │   └── MalformedJson       the text is not JSON at all (a syntax error, not a limit)
    ├── DependencyError         an optional extra is not installed
    ├── PassportUnreadable      a host passport file exists but cannot be used
    ├── PlanError               no placement satisfies the model, the nodes and the constraints
    │   ├── InsufficientVram    the model needs more bytes than the nodes offer
    │   ├── NoNodeFitsHead      no node can hold the largest indivisible component
    │   ├── Infeasible          the constraints cannot be met (reason says which)
    │   │   └── TargetUnreached a throughput target above what the nodes can reach
    │   ├── UnsupportedByEngine the plan asks for a placement the engine cannot express
    │   └── UnsupportedByWorker the reference stage worker cannot execute the plan or model
    └── ClusterError            running a plan on a Ray cluster failed
        ├── HeadStartError      ``ray start --head`` failed
        ├── NodeProbeError      a node's probe task did not answer in time
        ├── PlacementError      a placement group could not be made (none is left behind)
        │   ├── InsufficientResources  the cluster lacks what the groups ask for
        │   ├── PlacementInfeasible    Ray: no live node can ever hold a bundle (also an
        │   │                          ``Infeasible``)
        │   └── PlacementTimeout       not ready within the timeout (also a ``TimeoutError``)
        ├── StageUnplaceable    stages could not be placed, or their node died first
        │   └── ReplicaUnplaceable  a replica of a serve plan cannot be placed (none started)
        └── StageStartError     a placed stage failed while starting

``InputError`` also subclasses :class:`ValueError` and ``DependencyError``
:class:`ImportError`, so callers that catch those keep working.  The CLI turns
every ``StowplanError`` into one line on stderr and exit code 2.  The classes
are importable from ``stowplan`` and, as before, from the modules that raise
them (``stowplan.cluster.errors``, ``stowplan.exports`` …).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

__all__ = [
    "ClusterError",
    "DependencyError",
    "HeadStartError",
    "Infeasible",
    "InputError",
    "InsufficientResources",
    "InsufficientVram",
    "MalformedJson",
    "NoNodeFitsHead",
    "NodeProbeError",
    "PassportUnreadable",
    "PlacementError",
    "PlacementInfeasible",
    "PlacementTimeout",
    "PlanError",
    "ReplicaUnplaceable",
    "StageFailure",
    "StageStartError",
    "StageUnplaceable",
    "StowplanError",
    "TargetUnreached",
    "UnsupportedByEngine",
    "UnsupportedByWorker",
    "show_value",
]


_MAX_SHOWN = 300
"""Most characters of a value echoed in a message; the rest is summarised by its length."""


def show_value(value: object) -> str:
    """``repr(value)`` for a message, bounded: a huge value never makes a huge (or failing) line.

    An integer too long for :func:`repr` (Python refuses over 4,300 digits) is
    described by its digit count; any other repr longer than the bound is cut
    and its length given.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 1000:
        return f"<an integer of about {int(value.bit_length() * 0.30103) + 1} digits>"
    try:
        text = repr(value)
    except Exception:  # a repr that fails is not the user's message
        return f"<{type(value).__name__}>"
    if len(text) > _MAX_SHOWN:
        return f"{text[: _MAX_SHOWN - 40]}…({len(text)} characters)"
    return text


class StowplanError(Exception):
    """Root of every error stowplan raises on purpose."""


class InputError(StowplanError, ValueError):
    """A value given by the user is not acceptable.

    ``field`` names the offending field, ``value`` echoes it, the message says
    what would be accepted.
    """

    def __init__(self, field: str, value: object, rule: str) -> None:
        self.field = field
        self.value = value
        self.rule = rule
        super().__init__(f"{field}={show_value(value)}: {rule}")


class MalformedJson(InputError):
    """The text is not JSON at all (a syntax error), as opposed to JSON breaking a limit."""


class DependencyError(StowplanError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""

    def __init__(self, module: str, extra: str) -> None:
        self.module = module
        self.extra = extra
        super().__init__(
            f"this needs the optional package {module!r}; install it with "
            f"`pip install 'stowplan[{extra}]'`"
        )


class PassportUnreadable(StowplanError):
    """The passport file exists but cannot be used: ``path`` and ``reason`` say why."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class PlanError(StowplanError):
    """No plan satisfies the model, the nodes and the constraints."""


class InsufficientVram(PlanError):
    """The model needs ``needed`` bytes; the usable VRAM of all candidates is ``available``."""

    def __init__(self, needed: int, available: int, detail: str = "") -> None:
        self.needed = needed
        self.available = available
        self.detail = detail
        message = f"model does not fit: needs {needed} bytes, total available {available}"
        super().__init__(f"{message}; {detail}" if detail else message)


class NoNodeFitsHead(PlanError):
    """No node can hold the largest indivisible component (embed or head) of ``needed`` bytes."""

    def __init__(self, needed: int) -> None:
        self.needed = needed
        super().__init__(f"no node can hold the largest indivisible component ({needed} bytes)")


class Infeasible(PlanError):
    """The constraints are unsatisfiable; ``reason`` says why, with the numbers."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"constraints unsatisfiable: {reason}")


class TargetUnreached(Infeasible):
    """A throughput target no plan of the nodes can meet: ``target`` tokens/s is above
    ``reach``, the most tokens/s any pipeline of them can serve (a bound; no plan passes
    it).  ``reason`` says so with the numbers."""

    def __init__(self, target: float, reach: float, reason: str) -> None:
        self.target = target
        self.reach = reach
        super().__init__(reason)


class UnsupportedByEngine(PlanError):
    """The plan asks for a placement the engine cannot express; ``reason`` says which part.

    ``engine`` is a :class:`stowplan.exports.Engine`.
    """

    def __init__(self, engine: StrEnum, reason: str) -> None:
        self.engine = engine
        self.reason = reason
        super().__init__(f"{engine.value} cannot run this plan: {reason}")


class UnsupportedByWorker(PlanError):
    """The reference stage worker (:mod:`stowplan.runtime`) cannot execute this plan or
    model: ``reason`` says which part, ``remedy`` what to do instead.  Raised before
    anything is loaded."""

    def __init__(self, reason: str, remedy: str) -> None:
        self.reason = reason
        self.remedy = remedy
        super().__init__(f"the stage worker cannot run this: {reason}; {remedy}")


class ClusterError(StowplanError):
    """Running a plan on a Ray cluster failed (see the subclasses for which step)."""


class HeadStartError(ClusterError):
    """``ray start --head`` failed; the message carries the end of its output."""


class NodeProbeError(ClusterError):
    """The probe task on a node did not answer in time."""

    def __init__(self, node_id: str, timeout_s: float) -> None:
        self.node_id = node_id
        self.timeout_s = timeout_s
        super().__init__(f"node {node_id} did not answer the GPU probe within {timeout_s:g} s")


class PlacementError(ClusterError):
    """A placement group could not be created; no group of the request is left behind."""


class InsufficientResources(PlacementError):
    """``missing`` maps each short resource to ``(needed, available)``."""

    def __init__(self, what: str, missing: dict[str, tuple[float, float]], detail: str) -> None:
        self.what = what
        self.missing = missing
        super().__init__(f"{what} cannot be placed: {detail}")


class PlacementInfeasible(PlacementError, Infeasible):
    """Ray marked the group INFEASIBLE: no live node (set) can ever satisfy it.

    Also an :class:`Infeasible` (the one name for constraints that cannot be met);
    ``reason`` is the message.
    """

    def __init__(self, name: str, waited_s: float, detail: str) -> None:
        self.name = name
        self.waited_s = waited_s
        self.reason = detail
        StowplanError.__init__(self, detail)


class PlacementTimeout(PlacementError, TimeoutError):
    """The group was not ready after ``timeout_s`` seconds."""

    def __init__(self, name: str, timeout_s: float, detail: str) -> None:
        self.name = name
        self.timeout_s = timeout_s
        super().__init__(detail)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageFailure:
    """Why one stage did not start on its node (carried by :class:`StageUnplaceable`)."""

    stage: int
    node_id: str
    reason: str

    def __str__(self) -> str:
        return f"stage {self.stage} on node {self.node_id}: {self.reason}"


class StageUnplaceable(ClusterError):
    """One or more stages could not be placed (or their node died before they started)."""

    def __init__(self, failures: Sequence[StageFailure], waited_s: float) -> None:
        self.failures = tuple(failures)
        self.waited_s = waited_s
        listed = "; ".join(str(f) for f in self.failures)
        super().__init__(f"stages could not start after {waited_s:.1f} s: {listed}")

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(f.node_id for f in self.failures)


class ReplicaUnplaceable(StageUnplaceable):
    """A replica of a serve plan cannot be placed; the replicas started are released."""

    def __init__(
        self,
        replica: int,
        num_replicas: int,
        failures: Sequence[StageFailure],
        waited_s: float,
    ) -> None:
        super().__init__(failures, waited_s)
        self.replica = replica
        listed = "; ".join(str(f) for f in self.failures)
        self.args = (
            f"replica {replica} of {num_replicas} cannot be placed, so no replica was "
            f"started: {listed}",
        )

    def __str__(self) -> str:
        return str(self.args[0])


class StageStartError(ClusterError):
    """A stage actor was placed but failed while starting (its node is alive)."""

    def __init__(self, stage: int, node_id: str, cause: str) -> None:
        self.stage = stage
        self.node_id = node_id
        super().__init__(f"stage {stage} on node {node_id} failed to start: {cause}")
