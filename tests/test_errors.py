"""One error tree: every class in ``stowplan.errors``, drawn in its docstring, exported."""

from __future__ import annotations

import importlib
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import stowplan
from stowplan import errors
from stowplan.exports import Engine


def error_classes() -> dict[str, type[BaseException]]:
    return {
        name: obj
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, BaseException)
    }


def test_every_error_class_of_the_package_is_defined_in_the_errors_module() -> None:
    # In a fresh interpreter: every module of the package imported, then every exception
    # class defined under stowplan listed with its module.
    code = (
        "import importlib, json, pkgutil, stowplan\n"
        "for info in pkgutil.walk_packages(stowplan.__path__, 'stowplan.'):\n"
        "    if info.name.endswith('__main__'):\n"
        "        continue\n"
        "    try:\n"
        "        importlib.import_module(info.name)\n"
        "    except ImportError:\n"
        "        continue\n"
        "seen, todo = set(), [BaseException]\n"
        "while todo:\n"
        "    for sub in todo.pop().__subclasses__():\n"
        "        if sub not in seen:\n"
        "            seen.add(sub)\n"
        "            todo.append(sub)\n"
        "print(json.dumps(sorted(f'{c.__module__}:{c.__qualname__}' for c in seen\n"
        "                        if c.__module__.startswith('stowplan'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    defined = json.loads(out.stdout)
    assert [d for d in defined if not d.startswith("stowplan.errors:")] == []
    assert {d.split(":")[1] for d in defined} == set(error_classes())


def drawn_tree() -> dict[str, str | None]:
    """``{class: parent}`` as the module docstring draws it."""
    doc = errors.__doc__ or ""
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in doc.splitlines():
        m = re.match(r"^(\s*(?:[│ ]   )*)(?:[├└]── )?([A-Z]\w+)\s", line + " ")
        if not m or not line.startswith("    ") or m.group(2) not in error_classes():
            continue
        depth = m.start(2)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[m.group(2)] = stack[-1][1] if stack else None
        stack.append((depth, m.group(2)))
    return parents


def test_the_docstring_draws_every_error_under_its_first_stowplan_base() -> None:
    drawn = drawn_tree()
    assert set(drawn) == set(error_classes())
    for name, cls in error_classes().items():
        bases = [b for b in cls.__bases__ if b.__module__ == "stowplan.errors"]
        assert drawn[name] == (bases[0].__name__ if bases else None), name


def test_every_error_is_exported_from_stowplan_in_a_sorted_all() -> None:
    for name, cls in error_classes().items():
        assert name in stowplan.__all__ and getattr(stowplan, name) is cls
    # ruff's order (RUF022): CONSTANTS, then Classes, then functions
    kind = {True: 0, False: 1}
    assert stowplan.__all__ == sorted(
        stowplan.__all__, key=lambda n: (kind[n.isupper()] if n[0].isupper() else 2, n)
    )


@pytest.mark.parametrize(
    ("module", "names"),
    [
        (
            "stowplan.cluster.errors",
            ["InsufficientResources", "PlacementError", "PlacementInfeasible", "PlacementTimeout"],
        ),
        ("stowplan.cluster", ["PlacementError", "PlacementInfeasible"]),
        ("stowplan.cluster.realise", ["StageFailure", "StageStartError", "StageUnplaceable"]),
        ("stowplan.cluster.nodes", ["NodeProbeError"]),
        ("stowplan.cluster.head", ["HeadStartError"]),
        ("stowplan.host.passport", ["PassportUnreadable"]),
        ("stowplan.exports", ["UnsupportedByEngine"]),
        ("stowplan.exports.result", ["UnsupportedByEngine"]),
        ("stowplan.files.safeload", ["MalformedJson"]),
    ],
)
def test_the_old_import_paths_give_the_same_classes(module: str, names: list[str]) -> None:
    mod = importlib.import_module(module)
    for name in names:
        assert getattr(mod, name) is getattr(errors, name)
        assert name in mod.__all__


def test_placement_infeasible_is_the_one_infeasible_and_keeps_its_message() -> None:
    exc = errors.PlacementInfeasible("pg", 2.5, "placement group 'pg' is infeasible")
    assert isinstance(exc, errors.Infeasible) and isinstance(exc, errors.PlacementError)
    assert isinstance(exc, errors.ClusterError) and isinstance(exc, errors.PlanError)
    assert str(exc) == "placement group 'pg' is infeasible"
    assert (exc.name, exc.waited_s, exc.reason) == ("pg", 2.5, str(exc))


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (errors.InputError("tp", 3, "must divide 8"), "tp=3: must divide 8"),
        (errors.MalformedJson("plan", "{", "is not JSON"), "plan='{': is not JSON"),
        (errors.Infeasible("no node"), "constraints unsatisfiable: no node"),
        (
            errors.TargetUnreached(500.0, 100.0, "no node set reaches 500 tokens/s"),
            "constraints unsatisfiable: no node set reaches 500 tokens/s",
        ),
        (
            errors.UnsupportedByEngine(Engine.VLLM, "no"),
            "vllm cannot run this plan: no",
        ),
        (errors.PassportUnreadable(Path("/p.json"), "is empty"), "/p.json: is empty"),
        (errors.HeadStartError("ray start failed"), "ray start failed"),
        (
            errors.NodeProbeError("n0", 5.0),
            "node n0 did not answer the GPU probe within 5 s",
        ),
        (
            errors.InsufficientResources("group", {"GPU": (2.0, 1.0)}, "needs GPU 2 of 1"),
            "group cannot be placed: needs GPU 2 of 1",
        ),
        (errors.PlacementTimeout("pg", 3.0, "not ready"), "not ready"),
        (
            errors.StageUnplaceable(
                [errors.StageFailure(stage=1, node_id="n1", reason="node died")], 2.0
            ),
            "stages could not start after 2.0 s: stage 1 on node n1: node died",
        ),
        (
            errors.StageStartError(0, "n0", "ImportError"),
            "stage 0 on node n0 failed to start: ImportError",
        ),
    ],
)
def test_every_error_keeps_its_message(error: Exception, message: str) -> None:
    assert str(error) == message
    assert isinstance(error, errors.StowplanError)
