"""Hostile inputs for the fuzz suite, and the one property every public parser must keep.

The property (:func:`typed`): a call returns a result or raises a
:class:`~stowplan.errors.StowplanError`, within :data:`MAX_CALL_S`; any other
exception, or a hang, fails the test.

``STOWPLAN_FUZZ_EXAMPLES`` sets the examples per target (a few dozen in the
normal test run; ``make fuzz`` runs thousands).
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st

from stowplan.errors import StowplanError

T = TypeVar("T")

EXAMPLES = int(os.environ.get("STOWPLAN_FUZZ_EXAMPLES", "25"))
"""Examples per fuzz target."""

MAX_CALL_S = 5.0
"""Longest one parser call may take on one example."""

fuzz = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)
"""Settings of every fuzz target."""


def typed(call: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    """``call(*args, **kwargs)``; None when it raised a StowplanError. Other errors propagate.

    Each outcome is a Hypothesis event, so ``--hypothesis-show-statistics``
    shows how often a target gave a result and how often a typed error.
    """
    started = time.monotonic()
    name = getattr(call, "__qualname__", repr(call))
    try:
        result = call(*args, **kwargs)
    except StowplanError:
        event(f"{name}: StowplanError")
        return None
    else:
        event(f"{name}: result")
        return result
    finally:
        took = time.monotonic() - started
        assert took < MAX_CALL_S, f"{name} took {took:.1f} s"


# -- scalars ---------------------------------------------------------------------------------
HOSTILE_INTS = [0, 1, -1, 2, 3, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, 10**30, 10**4000]
HOSTILE_FLOATS = [0.0, -0.0, 5e-324, 1e-300, 1e-9, 0.5, 1e300, 1.7976931348623157e308]
HOSTILE_STRINGS = [
    "",
    " ",
    "0",
    "-1",
    "1.5",
    "nan",
    "inf",
    "-inf",
    "Infinity",
    "1e300",
    "1e-320",
    "24GiB",
    "24kiB",
    "24 GB",
    "1e300GB",
    "1Gbit",
    "20tok/s",
    "4096",
    "re:(",
    "bfloat16",
    "fp8",
    "\x00",
    "a" * 300,
    "9" * 5000,
    "[" * 200,
    "😀",
]

ints = st.one_of(
    st.integers(-10, 300),
    st.integers(),
    st.sampled_from(HOSTILE_INTS),
    st.builds(lambda: 10**5000),  # too long for repr(): built, not listed, so Hypothesis can print
)
floats = st.one_of(st.floats(), st.sampled_from(HOSTILE_FLOATS))
strings = st.one_of(st.text(max_size=20), st.sampled_from(HOSTILE_STRINGS))
scalars = st.one_of(st.none(), st.booleans(), ints, floats, strings)

json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(strings, inner, max_size=5),
    ),
    max_leaves=25,
)
"""Any JSON-like value (Python's json module can write each; NaN and inf included)."""


def deep(depth: int, leaf: str = "1") -> str:
    """JSON text nested ``depth`` arrays deep."""
    return "[" * depth + leaf + "]" * depth


def dumps(value: Any) -> str:
    """``json.dumps``, with an integer too long for it written out digit by digit."""
    try:
        return json.dumps(value)
    except ValueError:
        return "[" + "9" * 5000 + "]"


json_texts = st.one_of(
    st.text(max_size=200),
    json_values.map(dumps),
    st.integers(60, 5000).map(deep),
    st.integers(1, 6000).map(lambda n: "[" + "9" * n + "]"),
    st.sampled_from(["[NaN]", "[Infinity]", "[1e400]", "{", "", "[1,]", '{"a":1,"a":2}']),
)
"""Text that is JSON, nearly JSON, hostile JSON or no JSON at all."""


# -- mutations of real documents -------------------------------------------------------------
def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated(draw: st.DrawFn, base: Any, max_changes: int = 3) -> Any:
    """``base`` (a JSON-like document) with up to ``max_changes`` values replaced or removed."""
    doc = copy.deepcopy(base)
    paths = _paths(doc)
    if not paths:
        return draw(json_values)
    for _ in range(draw(st.integers(1, max_changes))):
        path = draw(st.sampled_from(paths))
        parent = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            if draw(st.booleans()) and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = draw(json_values)
        except (KeyError, IndexError, TypeError):  # an earlier change removed the path
            continue
    return doc


@st.composite
def mutated_text(draw: st.DrawFn, base: str, max_changes: int = 4) -> str:
    """``base`` with up to ``max_changes`` lines deleted, duplicated or replaced."""
    lines = base.splitlines()
    for _ in range(draw(st.integers(1, max_changes))):
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["delete", "duplicate", "replace", "truncate"]))
        if action == "delete":
            del lines[i]
        elif action == "duplicate":
            lines.insert(i, lines[i])
        elif action == "replace":
            lines[i] = draw(strings)
        else:
            lines[i] = lines[i][: draw(st.integers(0, max(len(lines[i]) - 1, 0)))]
    return "\n".join(lines) + "\n"
