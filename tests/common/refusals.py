"""Refusals inside property tests: an instance the planner refuses is rejected, not passed.

A property test that plans a random instance has nothing to check when the planner
refuses it with a reason; :func:`rejected_if_refused` then rejects the example
(``hypothesis.reject``), so hypothesis counts it as invalid and draws another instead
of counting a vacuous pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

from hypothesis import reject

from stowplan import Constraints, ModelLayout, NodeDescriptor, Plan, plan
from stowplan.errors import PlanError

P = ParamSpec("P")
T = TypeVar("T")


@contextmanager
def rejected_if_refused(*errors: type[Exception]) -> Iterator[None]:
    """Reject the current example when the body raises one of ``errors`` (default:
    :class:`~stowplan.errors.PlanError`)."""
    refusals = errors or (PlanError,)
    try:
        yield
    except refusals:
        reject()


def plan_or_reject(
    model: ModelLayout, nodes: list[NodeDescriptor], constraints: Constraints
) -> Plan:
    """``plan(model, nodes, constraints)``, or reject the example when it is refused."""
    with rejected_if_refused():
        return plan(model, nodes, constraints)


def or_none(call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | None:
    """``call(*args, **kwargs)``, or None when it raises a :class:`~stowplan.errors.PlanError`:
    for properties that compare refusals (two strategies refuse the same instances) or
    keep the feasible cases of an instance."""
    try:
        return call(*args, **kwargs)
    except PlanError:
        return None
