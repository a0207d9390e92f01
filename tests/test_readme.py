"""The README's Python example runs as printed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.common.paths import ROOT


def _python_block(section: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(f"## {section}\n")
    match = re.search(r"```python\n(.*?)```", text[start:], re.DOTALL)
    assert match is not None, f"no python block under {section!r}"
    return match.group(1)


def test_the_python_api_example_runs_and_writes_a_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    scope: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(_python_block("The Python API"), "README.md", "exec"), scope)
    written = json.loads((tmp_path / "plan.json").read_text(encoding="utf-8"))
    assert [a["node_id"] for a in written["assignments"]] == ["a", "b"]
    assert capsys.readouterr().out.startswith("(40, 40) N=2:")
    assert len(scope["envs"]) == 2  # type: ignore[arg-type]
