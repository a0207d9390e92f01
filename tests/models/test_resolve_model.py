"""``resolve_model`` is the loader: an unknown name is an ``InputError`` naming near matches."""

from __future__ import annotations

from pathlib import Path

import pytest

import stowplan
from stowplan.errors import InputError
from stowplan.models import inspect_model, known_names, lookup, resolve_model

KNOWN = ", ".join(known_names())
TAIL = "or give a config.json, a checkpoint folder or a .gguf file"


@pytest.mark.parametrize(
    ("name", "near"),
    [
        ("mixtrel:8x7b", "mixtral:8x7b or mixtral:8x22b or mistral:7b"),
        ("deepsek-v3", "deepseek-v3 or deepseek-r1"),
        ("gptoss:20", "gpt-oss:20b or gpt-oss:120b"),
        ("mixtrel:8x7b-q4", "mixtral:8x7b or mixtral:8x22b or mistral:7b"),
        ("Meta-Llama/Llama-3.1-80B", "llama3.1:8b or llama3.1:70b or llama3.1:405b"),
    ],
)
def test_an_unknown_name_names_its_near_matches_closest_first(name: str, near: str) -> None:
    with pytest.raises(InputError) as err:
        resolve_model(name)
    assert str(err.value) == (
        f"MODEL={name!r}: is not a known model; did you mean {near}? known: {KNOWN}; {TAIL}"
    )
    assert (err.value.field, err.value.value) == ("MODEL", name)


def test_a_name_far_from_every_known_one_lists_them_all() -> None:
    with pytest.raises(InputError) as err:
        resolve_model("zzz")
    assert str(err.value) == f"MODEL='zzz': is not a known model; known: {KNOWN}; {TAIL}"


def test_the_same_message_with_a_dtype_and_from_inspect_model() -> None:
    with pytest.raises(InputError) as err:
        resolve_model("mixtrel:8x7b", dtype="q4_0")
    with pytest.raises(InputError) as inspected:
        inspect_model("mixtrel:8x7b")
    assert str(err.value) == str(inspected.value)
    assert "did you mean mixtral:8x7b or " in str(err.value)


def test_lookup_is_the_query_that_answers_none_and_agrees_with_the_loader() -> None:
    assert lookup("mixtrel:8x7b") is None
    assert lookup("mixtral:8x7b") == resolve_model("mixtral:8x7b")
    assert resolve_model("mixtral:8x7b") == inspect_model("mixtral:8x7b").layout


def test_the_cli_prints_the_near_matches_on_one_line_and_exits_2(capsys) -> None:
    from stowplan.cli import main

    fleet = Path(__file__).resolve().parents[2] / "examples" / "fleets" / "case-b.yaml"
    assert main(["plan", "mixtrel:8x7b", "--nodes", str(fleet)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(
        "stowplan: error: MODEL='mixtrel:8x7b': is not a known model; did you mean "
        "mixtral:8x7b or mixtral:8x22b or mistral:7b? known: "
    )


def test_calibration_is_exported_and_accepted_by_constraints() -> None:
    from stowplan.calibration import shipped_calibration
    from stowplan.calibration.profile import Calibration

    assert stowplan.Calibration is Calibration and "Calibration" in stowplan.__all__
    cal = shipped_calibration("llamacpp")
    assert isinstance(cal, stowplan.Calibration)
    assert stowplan.Constraints(calibration=cal).calibration is cal
