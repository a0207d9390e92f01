"""Every Python and console example in README.md and docs/*.md runs as printed.

A ```python block runs on its own in an empty folder. A ```console block whose
first command is ``$ stowplan …`` (after any ``$ export NAME=value`` lines, which
set its environment) runs that first command with ``COLUMNS=100`` in an empty
folder that links the shipped ``examples/``; it must exit as the block shows (2
when the block's output of that command has a ``stowplan: error:`` line, else
0), and its first output line must be the block's first output line (blank
space at the ends aside). When the block's first output line is an elision
(``[…]``), its first shown line must be one of the output's lines instead.

A block that cannot run here (it needs a GPU, Ray, a file the docs do not ship,
or is a list of commands rather than a transcript) carries
``<!-- not-run: reason -->`` on the line before it; such a block is reported as
skipped with its reason, and a marker without a reason fails.
"""

from __future__ import annotations

import io
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!--\s*not-run:(?P<reason>.*?)-->\s*$")
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\s*$")
ELISION = re.compile(r"^\[….*\]$")


@dataclass(frozen=True)
class Block:
    """One fenced example: where it is, its language, its text and why it is not run."""

    path: Path
    line: int
    lang: str
    body: str
    not_run: str | None

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _blocks(path: Path) -> Iterator[Block]:
    lines = path.read_text(encoding="utf-8").split("\n")
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        start, lang = i, fence.group("lang")
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        previous = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(previous)
        reason = marker.group("reason").strip() if marker else None
        if lang in ("python", "console"):
            yield Block(path, start + 1, lang, "\n".join(lines[start + 1 : end]), reason)
        i = end + 1


def _markers(path: Path) -> list[tuple[int, str, str]]:
    """Every not-run marker: its line, its reason and the line after it."""
    lines = path.read_text(encoding="utf-8").split("\n")
    found = []
    for n, line in enumerate(lines):
        if line.lstrip().startswith("<!--") and "not-run" in line:
            match = MARKER.match(line)
            reason = match.group("reason").strip() if match else ""
            following = next((x for x in lines[n + 1 :] if x.strip()), "")
            found.append((n + 1, reason, following))
    return found


BLOCKS = [block for path in DOCS for block in _blocks(path)]


def _params(lang: str) -> list[object]:
    return [
        pytest.param(
            block,
            id=block.name,
            marks=[pytest.mark.skip(reason=f"not-run: {block.not_run}")] if block.not_run else [],
        )
        for block in BLOCKS
        if block.lang == lang
    ]


def test_the_docs_have_examples_and_every_not_run_marker_gives_a_reason() -> None:
    assert len([b for b in BLOCKS if b.lang == "python"]) >= 3
    assert len([b for b in BLOCKS if b.lang == "console" and not b.not_run]) >= 8
    for path in DOCS:
        for line, reason, following in _markers(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            assert reason, f"{where}: a not-run marker needs a reason"
            assert following in ("```python", "```console"), (
                f"{where}: a not-run marker must stand right before a python or console block"
            )


@pytest.mark.parametrize("block", _params("python"))
def test_python_example_runs(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    scope: dict[str, object] = {"__name__": "doc_example"}
    out = io.StringIO()
    with redirect_stdout(out):
        exec(compile(block.body, block.name, "exec"), scope)
    assert scope.keys() - {"__name__", "__builtins__"}, f"{block.name} defined nothing"


@dataclass(frozen=True)
class Transcript:
    """The first stowplan command of a console block and what the block shows it printing."""

    env: dict[str, str]
    command: str
    shown: list[str]


def _transcript(block: Block) -> Transcript:
    env: dict[str, str] = {}
    lines = block.body.split("\n")
    i = 0
    while i < len(lines) and lines[i].startswith("$ export "):
        for word in shlex.split(lines[i][len("$ export ") :]):
            name, _, value = word.partition("=")
            env[name] = value
        i += 1
    assert i < len(lines) and lines[i].startswith("$ stowplan "), (
        f"{block.name}: a console block must show `$ stowplan …` first "
        "(or carry <!-- not-run: reason --> before it)"
    )
    command = lines[i][2:]
    shown = []
    for line in lines[i + 1 :]:
        if line.startswith("$ "):
            break
        shown.append(line)
    assert shown, f"{block.name}: the block shows no output for `{command}`"
    return Transcript(env, command, shown)


def _shell(tmp_path: Path) -> dict[str, str]:
    """An environment whose `stowplan` is this interpreter's, in a folder that sees examples/."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    launcher = bin_dir / "stowplan"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m stowplan.cli "$@"\n')
    launcher.chmod(0o755)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "100"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    return env


@pytest.mark.parametrize("block", _params("console"))
def test_console_example_exits_and_starts_as_shown(block: Block, tmp_path: Path) -> None:
    transcript = _transcript(block)
    env = _shell(tmp_path)
    env.update(transcript.env)
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", transcript.command],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    fails = any(line.startswith("stowplan: error:") for line in transcript.shown)
    assert done.returncode == (2 if fails else 0), (
        f"{block.name}: `{transcript.command}` exited {done.returncode}\n{done.stderr[-2000:]}"
    )
    printed = done.stdout if done.stdout.strip() else done.stderr
    if fails:
        printed = "\n".join(x for x in done.stderr.split("\n") if x.startswith("stowplan: error:"))
    actual = [x.strip() for x in printed.split("\n") if x.strip()]
    first = transcript.shown[0].strip()
    if ELISION.match(first):
        wanted = next(x.strip() for x in transcript.shown if not ELISION.match(x.strip()))
        assert wanted in actual, f"{block.name}: {wanted!r} is not a line of\n{printed}"
    else:
        assert actual and actual[0] == first, (
            f"{block.name}: first line {actual[:1]!r}, the docs show {first!r}"
        )


def test_every_readme_link_into_the_repository_names_a_file_that_exists() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = [t for t in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) if "://" not in t]
    assert len(targets) >= 12
    missing = [t for t in targets if not (ROOT / t).is_file()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_the_readme_is_a_front_page_of_at_most_300_lines() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 300, f"README.md has {lines} lines; the details belong under docs/"
