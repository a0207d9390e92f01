"""Fuzz the command line: no invocation built from real flags and hostile values exits 1.

Each example is a command and a few of its flags with values drawn from a
pool of hostile ones (bad numbers, bad files, hostile documents). The only
outcomes allowed are success (0) and a usage or input error (2) printed as
one line; "internal error" (1) never. Commands that would start Ray or probe
this host are run only in forms that do neither.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stowplan.cli import main
from tests.common.fuzz import fuzz
from tests.common.paths import EXAMPLES, FIXTURES

FLEET = str(EXAMPLES / "fleets" / "case-a.yaml")
PLAN = str(FIXTURES / "plans" / "llama3_1_70b__mixed-consumer__39.json")
BENCH = str(FIXTURES / "llama-bench" / "readme_rtx4080.json")

NUMBERS = ["0", "-1", "1", "3", "nan", "inf", "-inf", "1e300", "9" * 5000, "x", "", "0.5"]
FILES = ["/dev/zero", "@fifo", "@folder", "@deep", "@bomb", "@digits", "@garbage", "/nonexistent"]
MODELS = ["llama3.1:8b", "mixtral:8x7b", "m" * 300, "", "@config", "/dev/zero", "gpt-oss-120b"]

# command -> (fixed arguments, {flag: values})
COMMANDS: dict[str, tuple[list[str], dict[str, list[str]]]] = {
    "plan": (
        ["@model", "--nodes", "@fleet"],
        {
            "--offers": FILES,
            "--min-stages": NUMBERS,
            "--max-stages": NUMBERS,
            "--headroom": NUMBERS,
            "--batch": NUMBERS,
            "--context": NUMBERS,
            "--target": [*NUMBERS, "20tok/s", "1e300tok/s"],
            "--strategy": ["latency", "fast", ""],
            "--dtype": ["int4", "fp3", ""],
            "--engine": ["vllm", "x"],
            "--calibration": FILES,
            "--expert-load": FILES,
            "--coactivation": FILES,
        },
    ),
    "model inspect": (["@model"], {"--dtype": ["bf16", "q4_k_m", "x"]}),
    "stage-env": (["@plan"], {}),
    "export": (
        ["@plan", "--to", "vllm"],
        {"--nodes": FILES, "--model": MODELS, "--family": ["llama", "x"]},
    ),
    "residency": (["@model", "--passport", "@passport"], {"--headroom": NUMBERS}),
    "calibrate": (
        [],
        {
            "--from-llama-bench": [*FILES, BENCH],
            "--from-serving-bench": FILES,
            "--device": ["RTX 4080", "", "x" * 300],
            "--bandwidth-gbps": NUMBERS,
            "--blocks": NUMBERS,
            "--gpus": NUMBERS,
            "--engine": ["llamacpp", "x"],
            "--out": ["@folder", "@new", "/dev/null/x.json"],
        },
    ),
    "validate": (
        ["--role", "inference"],
        {
            "--tp": NUMBERS,
            "--pp": NUMBERS,
            "--dp": NUMBERS,
            "--ep": NUMBERS,
            "--nodes": ["1", "2", "-1", "9" * 30],
            "--gpus-per-node": ["0", "8", "9" * 30],
            "--model": MODELS,
            "--strategy": ["PACK", "x"],
            "--segment-size": NUMBERS,
        },
    ),
    "cluster resources": ([], {"--nvidia-smi": FILES}),
    "launch": (
        ["@model", "--nodes", "@fleet", "--plan-debug"],
        {
            "--timeout": NUMBERS,
            "--max-attempts": NUMBERS,
            "--min-stages": NUMBERS,
            "--headroom": NUMBERS,
        },
    ),
    "models": ([], {"--json": []}),
}

SPECIAL = {
    "@model": MODELS,
    "@fleet": [FLEET, *FILES],
    "@plan": [PLAN, *FILES],
    "@passport": FILES,
}


@st.composite
def invocations(draw: st.DrawFn) -> list[str]:
    name = draw(st.sampled_from(sorted(COMMANDS)))
    fixed, flags = COMMANDS[name]
    argv = name.split()
    for arg in fixed:
        argv.append(draw(st.sampled_from(SPECIAL[arg])) if arg in SPECIAL else arg)
    for flag in draw(
        st.lists(st.sampled_from(sorted(flags) or ["--json"]), max_size=3, unique=True)
    ):
        values = flags.get(flag, [])
        argv += [flag, draw(st.sampled_from(values))] if values else [flag]
    return argv


def _files(folder: Path) -> dict[str, str]:
    """The hostile files an ``@name`` value stands for."""
    os.mkfifo(folder / "fifo.json")
    (folder / "dir").mkdir()
    (folder / "deep.json").write_text("[" * 100_000)
    (folder / "digits.json").write_text("[" + "9" * 5000 + "]")
    (folder / "garbage.json").write_bytes(b"\xff\xfe garbage")
    bomb = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    bomb += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    (folder / "bomb.yaml").write_text("\n".join(bomb) + "\n")
    config = json.loads((FIXTURES / "hf-configs" / "Llama-3.2-1B.json").read_text())
    config["sliding_window"] = "4096"
    (folder / "config.json").write_text(json.dumps(config))
    return {
        "@fifo": str(folder / "fifo.json"),
        "@folder": str(folder / "dir"),
        "@deep": str(folder / "deep.json"),
        "@digits": str(folder / "digits.json"),
        "@garbage": str(folder / "garbage.json"),
        "@bomb": str(folder / "bomb.yaml"),
        "@config": str(folder / "config.json"),
        "@new": str(folder / "out" / "profile.json"),
    }


@pytest.mark.timeout(600)
@fuzz
@given(invocations())
def test_no_invocation_exits_1(argv: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        files = _files(folder)
        home = folder / "home"
        home.mkdir()
        saved = {k: os.environ.get(k) for k in ("HOME", "STOWPLAN_HOME", "STOWPLAN_CACHE_DIR")}
        os.environ.update(HOME=str(home), STOWPLAN_HOME=str(home), STOWPLAN_CACHE_DIR=str(home))
        try:
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code = main([files.get(a, a) for a in argv])
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    message = err.getvalue()
    assert code in (0, 2), f"{argv[:6]} exited {code}: {message[:300]}"
    assert "internal error" not in message
    if code == 2:
        assert message.count("\n") == 1 and message.startswith("stowplan: error: "), message[:300]
