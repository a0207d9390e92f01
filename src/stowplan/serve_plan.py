"""A serving fleet's plan: :class:`ServePlan` (replicas, totals, certificate) and its JSON.

``serve()`` (:mod:`stowplan.serving`) returns one; ``stowplan serve --json``
prints :meth:`ServePlan.to_json`, which :meth:`ServePlan.from_json` reads back (schema
versioned, like a :class:`~stowplan.plan.Plan`; every replica's plan is a plan JSON
object of its own).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from stowplan.errors import InputError
from stowplan.plan import Plan, plan_from_dict, plan_to_dict
from stowplan.workload import Binding, Workload

__all__ = [
    "SERVE_SCHEMA_VERSION",
    "ReplicaPlan",
    "ServeCertificate",
    "ServeObjective",
    "ServePlan",
]

SERVE_SCHEMA_VERSION = 1
"""Version of the serve-plan JSON :meth:`ServePlan.to_json` writes."""


class ServeObjective(StrEnum):
    """What ``serve()`` optimised."""

    USERS = "users"
    """The most concurrent users the fleet serves under the SLOs."""
    PRICE = "price"
    """The least $/h of nodes serving the workload's users or rate."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeCertificate:
    """How close the answer is to the best one.

    ``objective=users``: ``bound`` is an upper bound on the users any split of the
    fleet into replicas serves; ``objective=price``: a lower bound on the $/h of any
    node set serving the target.  ``gap`` is ``|bound − value| / bound`` (0: proven
    optimal, then ``exact``).
    """

    objective: ServeObjective
    value: float
    bound: float
    gap: float
    exact: bool
    method: str
    """How the bound was computed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaPlan:
    """One replica: a pipeline of its own nodes, and what it serves (see
    :mod:`stowplan.cost.serving`)."""

    plan: Plan
    users: int
    """U*: concurrent requests it holds within both SLOs and memory."""
    ttft_s: float
    """TTFT(U*) = TTFT0 + cycle(U*)."""
    tpot_s: float
    """TPOT(U*) = cycle(U*) + U*·TTFT0/O."""
    prefill_s: float
    """TTFT0: one prompt's prefill alone."""
    tokens_per_s: float
    """Output tokens/s of its U* requests: U*/TPOT(U*)."""
    requests_per_s: float
    """Requests completed per second: U*/(O·TPOT(U*))."""
    binding: Binding
    """What stops U* + 1: ``ttft``, ``tpot`` or ``memory``."""
    price_per_hour: float | None = None
    """$/h of its nodes (None when a node has no price)."""

    @property
    def node_ids(self) -> tuple[str, ...]:
        """Its physical nodes, in stage order, each once."""
        return tuple(dict.fromkeys(a.node_id for a in self.plan.assignments))


@dataclass(frozen=True, slots=True, kw_only=True)
class ServePlan:
    """Disjoint replicas of the model on the fleet, their totals and a certificate."""

    replicas: tuple[ReplicaPlan, ...]
    users: int
    """Σ U* over the replicas."""
    rate_per_s: float
    """Σ U*/(O·TPOT(U*)): requests per second the replicas complete."""
    tokens_per_s: float
    """Σ output tokens/s."""
    price_per_hour: float
    """Σ $/h of the nodes the replicas use (0 when no node has a price)."""
    usd_per_million_output_tokens: float | None
    unused_nodes: tuple[str, ...]
    certificate: ServeCertificate
    workload: Workload
    model_name: str
    notes: tuple[str, ...] = ()
    schema_version: int = SERVE_SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-compatible data (each replica's plan as plan JSON)."""
        w = self.workload
        data: dict[str, Any] = _finite(
            {
                "schema_version": self.schema_version,
                "model_name": self.model_name,
                "workload": {
                    "prompt_tokens": w.prompt_tokens,
                    "output_tokens": w.output_tokens,
                    "ttft_s": w.ttft_s,
                    "tpot_s": w.tpot_s,
                    "users": w.users,
                    "rate_per_s": w.rate_per_s,
                },
                "replicas": [
                    {
                        "plan": plan_to_dict(r.plan),
                        "users": r.users,
                        "ttft_s": r.ttft_s,
                        "tpot_s": r.tpot_s,
                        "prefill_s": r.prefill_s,
                        "tokens_per_s": r.tokens_per_s,
                        "requests_per_s": r.requests_per_s,
                        "binding": r.binding.value,
                        "price_per_hour": r.price_per_hour,
                    }
                    for r in self.replicas
                ],
                "users": self.users,
                "rate_per_s": self.rate_per_s,
                "tokens_per_s": self.tokens_per_s,
                "price_per_hour": self.price_per_hour,
                "usd_per_million_output_tokens": self.usd_per_million_output_tokens,
                "unused_nodes": list(self.unused_nodes),
                "certificate": {
                    "objective": self.certificate.objective.value,
                    "value": self.certificate.value,
                    "bound": self.certificate.bound,
                    "gap": self.certificate.gap,
                    "exact": self.certificate.exact,
                    "method": self.certificate.method,
                },
                "notes": list(self.notes),
            }
        )
        return data

    def to_json(self, *, indent: int | None = 2) -> str:
        """Canonical JSON: sorted keys; equal plans give equal bytes."""
        text = json.dumps(self.to_dict(), sort_keys=True, indent=indent, allow_nan=False)
        return text + ("\n" if indent is not None else "")

    @classmethod
    def from_dict(cls, data: object) -> ServePlan:
        """Validate ``data`` (as :meth:`to_dict` writes it); :class:`InputError` otherwise."""
        d = _object("serve_plan", data)
        version = d.get("schema_version")
        if version != SERVE_SCHEMA_VERSION or isinstance(version, bool):
            raise InputError("schema_version", version, f"must be {SERVE_SCHEMA_VERSION}")
        try:
            w = _object("workload", d["workload"])
            workload = Workload(**w)
            replicas = tuple(
                ReplicaPlan(
                    plan=plan_from_dict(r["plan"]),
                    users=r["users"],
                    ttft_s=_number(r["ttft_s"]),
                    tpot_s=_number(r["tpot_s"]),
                    prefill_s=_number(r["prefill_s"]),
                    tokens_per_s=_number(r["tokens_per_s"]),
                    requests_per_s=_number(r["requests_per_s"]),
                    binding=Binding(r["binding"]),
                    price_per_hour=r["price_per_hour"],
                )
                for r in map(lambda x: _object("replicas[]", x), d["replicas"])
            )
            c = _object("certificate", d["certificate"])
            cert = ServeCertificate(
                objective=ServeObjective(c["objective"]),
                value=_number(c["value"]),
                bound=_number(c["bound"]),
                gap=_number(c["gap"]),
                exact=bool(c["exact"]),
                method=str(c["method"]),
            )
            return cls(
                replicas=replicas,
                users=int(d["users"]),
                rate_per_s=_number(d["rate_per_s"]),
                tokens_per_s=_number(d["tokens_per_s"]),
                price_per_hour=_number(d["price_per_hour"]),
                usd_per_million_output_tokens=d["usd_per_million_output_tokens"],
                unused_nodes=tuple(map(str, d["unused_nodes"])),
                certificate=cert,
                workload=workload,
                model_name=str(d["model_name"]),
                notes=tuple(map(str, d.get("notes", ()))),
            )
        except KeyError as exc:
            raise InputError("serve_plan", str(exc.args[0]), "is a required key") from None
        except (TypeError, ValueError) as exc:
            raise InputError("serve_plan", "<malformed>", f"cannot be read ({exc})") from None

    @classmethod
    def from_json(cls, text: str | bytes) -> ServePlan:
        """Parse and validate serve-plan JSON."""
        from stowplan.files.safeload import parse_json

        return cls.from_dict(parse_json(text, field="serve_plan", source=f"<{len(text)} bytes>"))


def _object(field: str, value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InputError(field, type(value).__name__, "must be a JSON object")
    return value


def _number(value: object) -> float:
    """A float, reading ``"inf"`` as written for an unbounded figure."""
    if isinstance(value, str) and value in {"inf", "-inf"}:
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{value!r} is not a number")
    return float(value)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
