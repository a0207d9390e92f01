"""Bounded JSON and YAML parsing: documents that would exhaust stack, CPU or memory are refused."""

from __future__ import annotations

import time

import pytest

from stowplan.errors import InputError
from stowplan.files.safeload import (
    MAX_DEPTH,
    MAX_NUMBER_CHARS,
    MAX_YAML_NODES,
    parse_json,
    parse_yaml,
)


def _json(text: str, **kw: bool) -> object:
    return parse_json(text, field="PLAN", source="p.json", **kw)


def _yaml(text: str) -> object:
    return parse_yaml(text, field="file", source="f.yaml")


def test_ordinary_json_parses_as_the_json_module_would() -> None:
    text = '{"a": [1, 2.5, -3e2, "x[{"], "b": {"c": null, "d": true}}'
    assert _json(text) == {"a": [1, 2.5, -300.0, "x[{"], "b": {"c": None, "d": True}}


def test_json_nested_at_the_limit_parses_and_one_deeper_is_refused() -> None:
    assert _json("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    deeper = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)
    with pytest.raises(InputError) as info:
        _json(deeper)
    assert str(info.value) == (
        f"PLAN='p.json': nests arrays/objects deeper than {MAX_DEPTH} levels"
    )


def test_a_million_brackets_are_refused_fast() -> None:
    started = time.monotonic()
    with pytest.raises(InputError, match="deeper than"):
        _json("[" * 1_000_000)
    assert time.monotonic() - started < 1.0


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    text = '["' + "[" * 500 + '\\"' + "{" * 500 + '"]'
    assert _json(text) == ["[" * 500 + '"' + "{" * 500]


def test_a_5000_digit_integer_is_refused_with_its_length() -> None:
    with pytest.raises(InputError) as info:
        _json("[" + "9" * 5000 + "]")
    assert str(info.value) == (
        f"PLAN='p.json': holds the number 999999999999…(5000 characters), "
        f"longer than {MAX_NUMBER_CHARS} characters"
    )


def test_a_float_beyond_range_is_refused() -> None:
    with pytest.raises(InputError, match=r"holds the number 1e400, beyond a float's range"):
        _json("[1e400]")


def test_nan_and_infinity_are_refused_unless_allowed() -> None:
    with pytest.raises(InputError, match="holds NaN, which is not JSON"):
        _json("[NaN]")
    assert _json("[Infinity, -Infinity]", nonfinite=True) == [float("inf"), float("-inf")]


def test_malformed_json_and_bytes_name_the_source() -> None:
    with pytest.raises(InputError, match=r"^PLAN='p.json': is not valid JSON \(Expecting"):
        _json("{")
    with pytest.raises(InputError, match=r"^PLAN='p.json': is not UTF-8 text"):
        parse_json(b"\xff", field="PLAN", source="p.json")


def test_ordinary_yaml_with_aliases_and_merge_keys_loads() -> None:
    text = "base: &b {gpu_name: RTX 4090, vram_bytes: 24GiB}\nnodes:\n- {<<: *b, id: a}\n- *b\n"
    data = _yaml(text)
    assert data["nodes"][0] == {"gpu_name": "RTX 4090", "vram_bytes": "24GiB", "id": "a"}
    assert data["nodes"][1] == {"gpu_name": "RTX 4090", "vram_bytes": "24GiB"}


def _alias_bomb(levels: int) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_a_400_byte_alias_bomb_is_refused_in_well_under_a_second() -> None:
    bomb = _alias_bomb(9)
    assert len(bomb) < 600
    started = time.monotonic()
    with pytest.raises(InputError) as info:
        _yaml(bomb)
    assert time.monotonic() - started < 1.0
    assert str(info.value) == (
        f"file='f.yaml': expands to more than {MAX_YAML_NODES:,} YAML nodes "
        "(aliases repeat what they name)"
    )


def test_aliases_expanding_below_the_cap_load() -> None:
    data = _yaml(_alias_bomb(3))
    assert isinstance(data, dict) and len(data["a2"]) == 10 and len(data["a2"][0][0]) == 10


def test_a_recursive_alias_is_refused() -> None:
    with pytest.raises(InputError, match="holds a recursive YAML alias"):
        _yaml("a: &a [1, *a]\n")


def test_yaml_nested_past_the_limit_is_refused() -> None:
    text = "".join("  " * i + "k:\n" for i in range(MAX_DEPTH + 2)) + "  " * (MAX_DEPTH + 2) + "v\n"
    with pytest.raises(InputError, match=f"nests YAML collections deeper than {MAX_DEPTH}"):
        _yaml(text)
    with pytest.raises(InputError, match="YAML"):
        _yaml("[" * 100_000)


def test_an_over_long_yaml_integer_is_refused() -> None:
    with pytest.raises(InputError, match="holds the number 999999999999…"):
        _yaml("count: " + "9" * 5000 + "\n")
    with pytest.raises(InputError, match="holds the number"):
        _yaml("9" * 5000 + "\n")


def test_invalid_yaml_is_one_line_naming_the_place() -> None:
    with pytest.raises(InputError) as info:
        _yaml("a: [1\n")
    message = str(info.value)
    assert "\n" not in message and message.startswith("file='f.yaml': is not valid YAML (")


def test_an_empty_yaml_document_is_none() -> None:
    assert _yaml("") is None and _yaml("# nothing\n") is None
