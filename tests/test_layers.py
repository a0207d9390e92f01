"""Imports point down the layers: every module of ``src/stowplan``, every import it makes.

The source is read, not imported: module-level, function-level and
``if TYPE_CHECKING:`` imports are all collected, absolute and relative.  A
``TYPE_CHECKING`` import counts like any other: a type named in a signature is
part of the module's interface, so it may not point up the layers either, and a
pair of modules that name each other's types is still a cycle.  Only an import
written as a string (``importlib.import_module``, the root package's lazy
table) is not seen; the root package mirrors its lazy table in
``TYPE_CHECKING`` imports, which are.

The rules (drawn in ``docs/architecture.md``):

* (a) a module imports only modules of its own layer or a lower one;
* (b) no import cycle between modules (``from a.b import c`` is an edge to the
  module ``a.b.c`` when it is one, else to ``a.b``; Python's running of the
  packages' ``__init__`` on the way is not counted, or every package that
  re-exports its own modules would be a cycle);
* (c) no module imports a private name (``_x``) from another module or reads
  one off an imported module (``certify._note``), and no module outside a
  package imports a private module of it (``cluster._ray`` is for
  ``stowplan.cluster`` only).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import stowplan

SRC = Path(stowplan.__file__).resolve().parent

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "foundations",
        (
            "stowplan.errors",
            "stowplan.moved",
            *(
                f"stowplan.{old}"  # deprecated paths: each only names where its names live now
                for old in [
                    "baselines",
                    "checks",
                    "expert_routing",
                    "expert_stats",
                    "fileio",
                    "gpu_lists",
                    "interconnect",
                    "limits",
                    "nodefile",
                    "parallel_rules",
                    "plan_checks",
                    "safeload",
                    "shell",
                    "units",
                    "wording",
                    "worker",
                ]
            ),
            "stowplan.quantities",
            "stowplan.files",
            "stowplan.text",
        ),
    ),
    (
        "values",
        (
            "stowplan.constraints",
            "stowplan.model",
            "stowplan.plan",
            "stowplan.workload",
            "stowplan.serve_plan",
            "stowplan.circuits",
            "stowplan.calibration.profile",
            "stowplan.calibration.runs",
            "stowplan.files.fleets",
            "stowplan.moe",
            "stowplan.rules",
            "stowplan.stages",
        ),
    ),
    (
        "hardware and models",
        ("stowplan.gpus", "stowplan.calibration", "stowplan.models"),
    ),
    ("cost", ("stowplan.cost",)),
    ("planner", ("stowplan.planner", "stowplan.serving")),
    (
        "edges",
        (
            "stowplan.host",
            "stowplan.cluster",
            "stowplan.exports",
            "stowplan.report",
            "stowplan.demo",
            "stowplan.runtime",
        ),
    ),
    ("interface", ("stowplan.cli", "stowplan")),
)
"""Lowest first.  A module belongs to the layer of the longest name that is it or a
package above it (``stowplan`` itself names only the root package)."""

PENDING_PRIVATE: frozenset[tuple[str, str]] = frozenset()
"""Known imports of another module's private name, each to be made public; none may be
added."""


@dataclass(frozen=True, slots=True)
class Import:
    """One imported name (or module) of one module."""

    module: str
    line: int
    target: str
    """The module imported (or imported from)."""
    name: str | None
    """The name taken from ``target`` (None for ``import target``)."""


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def read_modules(src: Path) -> dict[str, ast.Module]:
    return {
        module_name(p, src): ast.parse(p.read_text(encoding="utf-8"), filename=str(p))
        for p in sorted(src.rglob("*.py"))
    }


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, *([name] if name else [])])


def imports_of(module: str, tree: ast.Module, is_package: bool) -> Iterator[Import]:
    """Every ``stowplan`` import anywhere in ``tree`` (functions, classes, TYPE_CHECKING)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "stowplan":
                    yield Import(module, node.lineno, alias.name, None)
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, is_package, node.level, node.module)
            if target.split(".")[0] == "stowplan":
                for alias in node.names:
                    yield Import(module, node.lineno, target, alias.name)


def private_reads(module: str, tree: ast.Module, modules: set[str]) -> Iterator[tuple[int, str]]:
    """``(line, dotted name)`` of every private attribute read off an imported module."""
    bound: dict[str, str] = {}  # local name -> the stowplan module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "stowplan":
                    local = alias.asname or alias.name.split(".")[0]
                    bound[local] = alias.name if alias.asname else "stowplan"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in modules:
                    bound[alias.asname or alias.name] = full
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        chain = [node.attr]
        value = node.value
        while isinstance(value, ast.Attribute):
            chain.append(value.attr)
            value = value.value
        if not isinstance(value, ast.Name) or value.id not in bound:
            continue
        dotted = bound[value.id]
        for attr in reversed(chain):
            if f"{dotted}.{attr}" in modules:
                dotted = f"{dotted}.{attr}"
                continue
            if _private(attr) and dotted != module:
                yield node.lineno, f"{dotted}.{attr}"
            break


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            inside = module == p or (p != "stowplan" and module.startswith(p + "."))
            if inside and (best is None or len(p) > best[0]):
                best = (len(p), i)
    return None if best is None else best[1]


@dataclass(frozen=True, slots=True)
class Graph:
    modules: set[str]
    imports: list[Import]

    def edge(self, imp: Import) -> str:
        """The module ``imp`` makes its module depend on."""
        if imp.name is not None and f"{imp.target}.{imp.name}" in self.modules:
            return f"{imp.target}.{imp.name}"
        return imp.target

    def edges(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {m: set() for m in self.modules}
        for imp in self.imports:
            target = self.edge(imp)
            if target != imp.module:
                out[imp.module].add(target)
        return out


def build(src: Path) -> Graph:
    trees = read_modules(src)
    imports = []
    for name, tree in trees.items():
        is_package = (src.parent / Path(*name.split("."))).is_dir()
        imports.extend(imports_of(name, tree, is_package))
    return Graph(set(trees), imports)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


GRAPH = build(SRC)


def test_every_module_has_a_layer() -> None:
    assert sorted(m for m in GRAPH.modules if layer_of(m) is None) == []


def test_imports_point_down_the_layers() -> None:
    upward = []
    for imp in GRAPH.imports:
        target = GRAPH.edge(imp)
        mine, theirs = layer_of(imp.module), layer_of(target)
        assert mine is not None and theirs is not None, (imp, target)
        if theirs > mine:
            upward.append(
                f"{imp.module}:{imp.line} imports {target} "
                f"({LAYERS[mine][0]} -> {LAYERS[theirs][0]})"
            )
    assert upward == []


def test_no_import_cycles() -> None:
    assert cycles(GRAPH.edges()) == []


def private_uses(graph: Graph, src: Path) -> list[tuple[str, int, str]]:
    """``(module, line, dotted private name)`` of every use of another module's ``_name``."""
    found = [
        (imp.module, imp.line, f"{imp.target}.{imp.name}")
        for imp in graph.imports
        if imp.name is not None
        and _private(imp.name)
        and f"{imp.target}.{imp.name}" not in graph.modules
        and imp.target != imp.module
    ]
    found.extend(
        (imp.module, imp.line, graph.edge(imp))
        for imp in graph.imports
        if outside_private_module(imp.module, graph.edge(imp))
    )
    for name, tree in read_modules(src).items():
        found.extend((name, line, what) for line, what in private_reads(name, tree, graph.modules))
    return found


def outside_private_module(importer: str, target: str) -> bool:
    """Whether ``target`` is (inside) a private module of a package ``importer`` is not in."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if _private(part):
            package = ".".join(parts[:i])
            return not (importer == package or importer.startswith(package + "."))
    return False


def test_no_module_imports_a_private_name_of_another() -> None:
    found = [
        f"{module}:{line} uses {what}"
        for module, line, what in private_uses(GRAPH, SRC)
        if (module, what) not in PENDING_PRIVATE
    ]
    assert found == []


def test_the_pending_private_imports_still_exist() -> None:
    """An exception that is no longer needed is removed from :data:`PENDING_PRIVATE`."""
    used = {(module, what) for module, _, what in private_uses(GRAPH, SRC)}
    assert sorted(PENDING_PRIVATE - used) == []


SAMPLE = """
from __future__ import annotations
from typing import TYPE_CHECKING
import stowplan.planner.certify as cert
from stowplan.planner import exact
from . import sibling
if TYPE_CHECKING:
    from stowplan.cli.app import App

def f() -> None:
    from stowplan.cost import _hidden
    cert._note()
    exact.solve_exact()
"""


def test_the_reader_sees_function_level_type_checking_and_relative_imports(
    tmp_path: Path,
) -> None:
    pkg = tmp_path / "stowplan" / "planner"
    pkg.mkdir(parents=True)
    (tmp_path / "stowplan" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "sibling.py").write_text("")
    (pkg / "certify.py").write_text("")
    (pkg / "exact.py").write_text("")
    (pkg / "sample.py").write_text(SAMPLE)
    graph = build(tmp_path / "stowplan")
    sample = [i for i in graph.imports if i.module == "stowplan.planner.sample"]
    assert [(i.line, graph.edge(i), i.name) for i in sample] == [
        (4, "stowplan.planner.certify", None),
        (5, "stowplan.planner.exact", "exact"),
        (6, "stowplan.planner.sibling", "sibling"),
        (8, "stowplan.cli.app", "App"),
        (11, "stowplan.cost", "_hidden"),
    ]
    tree = read_modules(tmp_path / "stowplan")["stowplan.planner.sample"]
    reads = list(private_reads("stowplan.planner.sample", tree, graph.modules))
    assert reads == [(12, "stowplan.planner.certify._note")]


@pytest.mark.parametrize(
    ("importer", "target", "outside"),
    [
        ("stowplan.cli.launch_cmd", "stowplan.cluster._ray", True),
        ("stowplan.demo", "stowplan.cluster._ray.helpers", True),
        ("stowplan.cluster.local", "stowplan.cluster._ray", False),
        ("stowplan.cluster", "stowplan.cluster._ray", False),
        ("stowplan.cli.launch_cmd", "stowplan.cluster.ray_runtime", False),
        ("stowplan.cluster.local", "stowplan.cli._opts", True),
    ],
)
def test_a_private_module_is_for_its_own_package(importer: str, target: str, outside: bool) -> None:
    assert outside_private_module(importer, target) is outside


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"a"}, "c": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}}, [["a", "b", "c"]]),
    ],
)
def test_cycles_are_found(edges: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert cycles(edges) == expected


def test_a_module_takes_the_layer_of_its_longest_named_package() -> None:
    def name(module: str) -> str | None:
        layer = layer_of(module)
        return None if layer is None else LAYERS[layer][0]

    assert name("stowplan.calibration.profile") == "values"
    assert name("stowplan.calibration.store") == "hardware and models"
    assert name("stowplan.planner.experts.packing") == "planner"
    assert name("stowplan") == "interface"
    assert name("stowplan.circuits") == "values"
    assert name("stowplan.host.discover") == "edges"
    assert name("stowplan.planner.residency") == "planner"
    assert name("stowplan.unplaced") is None


PLANNER_ROOMS = {
    "baselines": "peer placement rules and EPLB, what plans are compared with",
    "certify": "a pipeline made a Plan with its prediction and certificate",
    "cheapest": "objective=cost: the cheapest node set meeting a rate",
    "context": "the longest context a fleet holds",
    "exact": "everything behind the scipy extra: optima, bounds, the node-set MILP",
    "experts": "MoE expert placement",
    "problem": "the validated planning problem every strategy reads",
    "residency": "one host: which circuits hold the weights, which stream (seed 004)",
    "strategies": "the block strategies (vram, latency, throughput, cycle)",
    "tensor": "tensor parallel inside nodes: GPU groups",
    "tiebreak": "plans within 0.1 % of the best: more KV room, then balanced memory",
}
"""The rooms of ``stowplan.planner``, one per capability (``docs/architecture.md`` names each)."""


def test_the_planner_folder_lists_its_capabilities() -> None:
    planner = SRC / "planner"
    found = {
        p.stem if p.is_file() else p.name
        for p in planner.iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()
    }
    assert found == set(PLANNER_ROOMS)
    drawing = (SRC.parent.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert [room for room in PLANNER_ROOMS if f"planner/{room}" not in drawing] == []


def test_no_planner_import_inside_a_function_but_the_deferred_alias() -> None:
    """A function-level import of the planner defers nothing (the modules are loaded with
    ``stowplan.planner``) but the expert planner's, loaded on a MoE model's first plan, and
    the deprecated alias's, which the package imports."""
    inside = []
    for name, tree in read_modules(SRC).items():
        if not name.startswith("stowplan.planner"):
            continue
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("stowplan"):
                    where = (node.module or "").removeprefix("stowplan.planner.")
                    inside.append(f"{name}:{node.lineno} {where}")
    assert sorted(i.split(":")[0] + " " + i.split(" ")[1] for i in inside) == [
        "stowplan.planner experts.choice",
        "stowplan.planner experts.inputs",
        "stowplan.planner.experts.deprecated stowplan.planner",
    ]
