"""The test tree mirrors the package: shared code comes from ``tests.common`` only, every
test folder is a package, and every folder but the cross-cutting ones names a subpackage."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.common.paths import FIXTURES, ROOT

TESTS = ROOT / "tests"
PACKAGE = ROOT / "src" / "stowplan"
CROSS_CUTTING = {"common", "docs", "fixtures", "fuzz", "ray"}
"""Folders that test no one subpackage: shared helpers, documentation, data, the fuzz and
real-Ray suites."""


def _modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if FIXTURES not in p.parents)


def _imported(path: Path) -> list[str]:
    """Every module ``path`` imports, at any depth; relative imports keep their dots."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            found.append("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return found


def _outside_common(module: str) -> bool:
    inside = module == "tests.common" or module.startswith("tests.common.")
    return module.startswith(".") or (module.split(".")[0] == "tests" and not inside)


def test_test_modules_import_shared_code_from_tests_common_only() -> None:
    wrong = {
        path.relative_to(ROOT).as_posix(): found
        for path in _modules()
        if (found := [m for m in _imported(path) if _outside_common(m)])
    }
    assert wrong == {}


def test_every_test_folder_is_a_package() -> None:
    folders = {p.parent for p in _modules()}
    assert (
        sorted(f.relative_to(ROOT).as_posix() for f in folders if not (f / "__init__.py").is_file())
        == []
    )


def test_every_test_folder_names_a_subpackage_of_stowplan() -> None:
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert sorted(folders - CROSS_CUTTING - subpackages) == []
    assert {"planner", "cost", "gpus", "models", "exports"} <= folders & subpackages
