"""The library runs without the ``cli`` extra: ``typer`` and ``rich`` are the command line's.

Each check runs in a fresh interpreter in which importing ``typer`` or ``rich`` raises
:class:`ImportError`, as it does where ``stowplan`` is installed without ``[cli]``.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import stowplan
from stowplan.cli import CLI_EXTRA_MODULES

ROOT = Path(__file__).resolve().parent.parent
SRC = Path(stowplan.__file__).resolve().parent

BLOCK = """
import importlib.abc, sys
class _NoCli(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("typer", "rich"):
            raise ImportError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NoCli())
"""

LIBRARY = """
import json, sys
import stowplan
from stowplan.cli import CLI_EXTRA_MODULES
from stowplan import Constraints, export_plan, load_nodes, plan, plan_from_json, plan_to_json
from stowplan import fit_context, resolve_model
fleet = load_nodes(sys.argv[1])
dense = plan(resolve_model("llama3.1:70b"), fleet, Constraints())
moe = plan(resolve_model("mixtral:8x7b"), fleet, Constraints(batch=4, context_tokens=4096))
fit = fit_context(resolve_model("llama3.1:8b"), fleet, Constraints())
assert plan_from_json(plan_to_json(moe)) == moe
exports = {e: sum(export_plan(dense, e, nodes=fleet).block_counts) for e in ("vllm", "llamacpp")}
loaded = sorted({m.split(".")[0] for m in sys.modules} & {"typer", "rich"})
print(json.dumps({
    "dense": [dense.num_stages, dense.topology.kind.value],
    "moe": [moe.num_stages, moe.topology.experts_per_block],
    "fit": fit.context_tokens > 0,
    "exports": exports,
    "loaded": loaded,
}))
"""


def _run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCK + code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_plan_and_export_run_with_typer_and_rich_unimportable() -> None:
    out = _run(LIBRARY, str(ROOT / "examples" / "fleets" / "mixed-consumer.yaml"))
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["dense"][1] == "PipelineChain" and got["dense"][0] >= 2
    assert got["moe"][1] == 8
    assert got["fit"] is True
    assert got["exports"] == {"vllm": 80, "llamacpp": 80}  # every block of llama3.1:70b
    assert got["loaded"] == []


def test_only_the_command_line_and_its_renderers_import_typer_or_rich() -> None:
    users = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            if any(n.split(".")[0] in CLI_EXTRA_MODULES for n in names):
                users.add(path.relative_to(SRC).as_posix())
    outside = sorted(u for u in users if not u.startswith("cli/"))
    assert outside == ["report/experts.py", "report/serving.py", "report/terminal.py"]


def test_the_command_without_the_extra_says_how_to_get_it() -> None:
    code = "import sys\nfrom stowplan.cli import main\nsys.exit(main(['plan', 'llama3.1:8b']))"
    out = _run(code)
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0] == (
        "stowplan: error: this needs the optional package 'typer'; install it with "
        "`pip install 'stowplan[cli]'`"
    )


def test_the_cli_extra_holds_typer_and_rich_and_dev_installs_it() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]

    def names(reqs: list[str]) -> set[str]:
        return {re.split(r"[<>=\[ ]", r, maxsplit=1)[0] for r in reqs}

    def reached(extra: str) -> set[str]:
        out = {extra}
        for r in extras[extra]:
            if r.startswith("stowplan["):
                for e in r.removeprefix("stowplan[").removesuffix("]").split(","):
                    out |= reached(e)
        return out

    assert names(extras["cli"]) == set(CLI_EXTRA_MODULES)
    assert not names(project["dependencies"]) & set(CLI_EXTRA_MODULES)
    assert "cli" in reached("dev") and "cli" in reached("all")
