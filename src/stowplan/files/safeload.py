"""Bounded parsing of user-given JSON and YAML text.

Every document stowplan reads from a user passes through here, so a file that
would exhaust the stack, the CPU or the memory is refused with an
:class:`~stowplan.errors.InputError` before anything is built:

* JSON: nesting deeper than :data:`MAX_DEPTH` and a number literal longer
  than :data:`MAX_NUMBER_CHARS` characters are refused by one scan of the
  text (strings removed) before :func:`json.loads` runs; a float that
  overflows to infinity is refused as the parser meets it; ``NaN``/``Infinity``
  are refused unless the caller allows them (tool output that writes them).
  The scans run at C speed, so a 2 MB document is checked in milliseconds.
* YAML: the safe loader (libyaml's when built in) composes the node graph,
  in which an alias is one shared node, not a copy; the graph is then walked
  once, counting every node as many times as aliases repeat it. More than
  :data:`MAX_YAML_NODES` such nodes (an alias bomb), a recursive alias, deeper
  nesting than :data:`MAX_DEPTH` or an over-long integer is refused; only
  then are Python objects constructed.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

from stowplan.errors import InputError, MalformedJson

__all__ = [
    "MAX_DEPTH",
    "MAX_NUMBER_CHARS",
    "MAX_YAML_NODES",
    "MalformedJson",
    "parse_json",
    "parse_yaml",
]

MAX_DEPTH = 64
"""Deepest nesting of arrays/objects (JSON) or collections (YAML) accepted."""

MAX_NUMBER_CHARS = 40
"""Longest number literal accepted, in characters (int64 needs 19 digits)."""

MAX_YAML_NODES = 1_000_000
"""Most YAML nodes a document may expand to, each alias counted as a full copy."""


_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
"""A JSON string literal (the unrolled form: no per-character alternation)."""
_BRACKETS_ONLY = {c: None for c in range(128) if chr(c) not in "[]{}"}
_LONG_NUMBER = re.compile(rf"[-+0-9.eE]{{{MAX_NUMBER_CHARS + 1},}}")


def _without_strings(text: str) -> str:
    """``text`` with every string literal removed (keys and values alike)."""
    return _STRING.sub("", text) if '"' in text else text


def _json_depth_exceeds(bare: str, limit: int) -> bool:
    """True when arrays/objects in ``bare`` (JSON without strings) nest deeper than ``limit``."""
    if bare.count("[") + bare.count("{") <= limit:
        return False
    brackets = bare.translate(_BRACKETS_ONLY)
    depth = 0
    for c in brackets:
        if c in "[{":
            depth += 1
            if depth > limit:
                return True
        elif c in "]}":
            depth -= 1
    return False


def _short(token: str) -> str:
    return token if len(token) <= 24 else f"{token[:12]}…({len(token)} characters)"


def parse_json(text: str | bytes, *, field: str, source: str, nonfinite: bool = False) -> Any:
    """The JSON document in ``text``, parsed within the limits above.

    ``field`` names the flag or field in an error, ``source`` the file (or
    another label) holding the text. ``nonfinite`` accepts ``NaN``,
    ``Infinity`` and ``-Infinity`` (as Python's :mod:`json` writes them).
    Raises :class:`InputError` for text that is not JSON or breaks a limit.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(field, source, f"is not UTF-8 text ({exc})") from None
    bare = _without_strings(text)
    if _json_depth_exceeds(bare, MAX_DEPTH):
        raise InputError(field, source, f"nests arrays/objects deeper than {MAX_DEPTH} levels")
    long_number = _LONG_NUMBER.search(bare)
    if long_number is not None:
        token = long_number.group()
        raise InputError(
            field,
            source,
            f"holds the number {_short(token)}, longer than {MAX_NUMBER_CHARS} characters",
        )

    def number(token: str) -> float:
        value = float(token)
        if not math.isfinite(value):
            raise InputError(field, source, f"holds the number {token}, beyond a float's range")
        return value

    def constant(token: str) -> float:
        if not nonfinite:
            raise InputError(
                field, source, f"holds {token}, which is not JSON; use a finite number"
            )
        return float(token)

    try:
        return json.loads(
            text,
            parse_float=number,
            parse_constant=constant,
        )
    except json.JSONDecodeError as exc:
        raise MalformedJson(field, source, f"is not valid JSON ({exc})") from None
    except RecursionError:  # a limit below MAX_DEPTH on this interpreter's stack
        raise InputError(field, source, "nests arrays/objects too deeply") from None


def _yaml_reason(exc: Exception) -> str:
    """PyYAML's multi-line error as one line: the problem and where it is."""
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(problem).split())


def _children(node: Any) -> Iterator[Any]:
    import yaml

    if isinstance(node, yaml.SequenceNode):
        yield from node.value
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            yield key
            yield value


def _too_many(field: str, source: str) -> InputError:
    return InputError(
        field,
        source,
        f"expands to more than {MAX_YAML_NODES:,} YAML nodes (aliases repeat what they name)",
    )


def _check_scalar(node: Any, field: str, source: str) -> None:
    if node.tag.endswith(":int") and len(node.value) > MAX_NUMBER_CHARS:
        raise InputError(
            field,
            source,
            f"holds the number {_short(node.value)}, longer than {MAX_NUMBER_CHARS} characters",
        )


def _check_nodes(root: Any, field: str, source: str) -> None:
    """Refuse a node graph that expands past the limits (see the module docstring).

    One depth-first walk; a node met again through an alias adds its
    remembered expanded size, so the walk is linear in the graph, not in the
    expansion.
    """
    import yaml

    if isinstance(root, yaml.ScalarNode):
        _check_scalar(root, field, source)
        return
    expanded: dict[int, int] = {}  # id(node) -> nodes it stands for, aliases expanded
    path: list[list[Any]] = [[root, _children(root), 1]]  # [node, children left, size so far]
    on_path = {id(root)}
    while path:
        frame = path[-1]
        child = next(frame[1], None)
        if child is None:
            path.pop()
            on_path.discard(id(frame[0]))
            expanded[id(frame[0])] = frame[2]
            if path:
                path[-1][2] += frame[2]
                if path[-1][2] > MAX_YAML_NODES:
                    raise _too_many(field, source)
            continue
        if id(child) in on_path:
            raise InputError(field, source, "holds a recursive YAML alias")
        if id(child) in expanded:
            frame[2] += expanded[id(child)]
        elif isinstance(child, yaml.ScalarNode):
            _check_scalar(child, field, source)
            expanded[id(child)] = 1
            frame[2] += 1
        elif len(path) >= MAX_DEPTH:
            raise InputError(field, source, f"nests YAML collections deeper than {MAX_DEPTH}")
        else:
            path.append([child, _children(child), 1])
            on_path.add(id(child))
            continue
        if frame[2] > MAX_YAML_NODES:
            raise _too_many(field, source)


def parse_yaml(text: str, *, field: str, source: str) -> Any:
    """The YAML document in ``text``, safely loaded within the limits above.

    Only the safe loader's types are built (no Python objects). Raises
    :class:`InputError` for text that is not YAML, holds several documents or
    breaks a limit.
    """
    import yaml

    # libyaml's loader when built in: the pure-Python one takes seconds on big fleets.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_nodes(node, field, source)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise InputError(field, source, f"is not valid YAML ({_yaml_reason(exc)})") from None
    except RecursionError:
        raise InputError(field, source, "nests YAML collections too deeply") from None
    finally:
        loader.dispose()
