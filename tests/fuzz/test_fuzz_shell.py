"""Fuzz every script stowplan generates for a shell: hostile ids and labels never run.

Each example takes a real plan and its fleet, renames the nodes to hostile ids
(payloads that create a canary file when a shell runs them: after a newline, in
``$(…)``, in backticks, after ``;``, behind quotes, as a here-document's end),
gives them hostile address labels and a hostile model name, and runs the
commands that print shell (``stage-env --format shell``, ``export --to
llamacpp|vllm|sglang|accelerate``). Either the input is refused (exit 2, one
line) or the output is valid shell (``bash -n``) that a real ``bash``, run in a
temporary folder whose ``PATH`` holds only ``touch`` and ``cat``, executes
without creating the canary.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from stowplan.cli import main
from stowplan.text.shell import heredoc_marker, one_line, shell_comment, shell_quote
from tests.common.fuzz import fuzz
from tests.common.paths import FIXTURES

BASH = shutil.which("bash")
PLAN = json.loads((FIXTURES / "plans" / "llama3_1_70b__mixed-consumer__39.json").read_text())
NODES = [a["node_id"] for a in PLAN["assignments"]]

PAYLOADS = [
    "n\ntouch $CANARY",
    "n\rtouch $CANARY",
    "n\r\ntouch $CANARY\n",
    "$(touch $CANARY)",
    "`touch $CANARY`",
    "n; touch $CANARY",
    "n' ; touch $CANARY; '",
    'n" ; touch $CANARY; "',
    "n && touch $CANARY #",
    "n | touch $CANARY",
    "n\u2028touch $CANARY",
    "n\x0btouch $CANARY",
    "n\x00touch $CANARY",
    "EOF\ntouch $CANARY",
    "n\nEOF\ntouch $CANARY\ncat <<'EOF'",
    "$CANARY",
    "n\\\ntouch $CANARY",
    "# n\ntouch $CANARY",
]
SEPARATORS = ["\n", "\r", ";", "$(", "`", "'", '"', "&&", "|", "\n#", "\x1b[2K"]

hostile = st.one_of(
    st.sampled_from(PAYLOADS),
    st.builds(
        lambda a, sep, b: f"{a}{sep}touch $CANARY{b}",
        st.text(max_size=6),
        st.sampled_from(SEPARATORS),
        st.text(max_size=6),
    ),
    st.text(min_size=1, max_size=12),
)
_PRINTABLE_CHARS = st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"))
printable = st.one_of(
    st.sampled_from([p for p in PAYLOADS if p.isprintable()]),
    st.builds(
        lambda a, sep, b: f"n{a}{sep}touch $CANARY{b}",
        st.text(_PRINTABLE_CHARS, max_size=6),
        st.sampled_from([s for s in SEPARATORS if s.isprintable()]),
        st.text(_PRINTABLE_CHARS, max_size=6),
    ),
).filter(str.isprintable)
"""Hostile ids that pass the id check (quotes, ``$(…)``, ``;``): they reach the scripts."""


def _ids(values: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    return st.lists(values, min_size=len(NODES), max_size=len(NODES), unique=True)


COMMANDS = [
    ["stage-env", "@plan", "--format", "shell"],
    ["stage-env", "@plan", "--format", "shell", "--stage", "1"],
    ["export", "@plan", "--to", "llamacpp", "--nodes", "@fleet"],
    ["export", "@plan", "--to", "vllm", "--nodes", "@fleet"],
    ["export", "@plan", "--to", "sglang", "--nodes", "@fleet"],
    ["export", "@plan", "--to", "vllm"],
    ["export", "@plan", "--to", "llamacpp", "--nodes", "@fleet", "--model", "@model"],
    ["export", "@plan", "--to", "accelerate", "--model", "@model", "--family", "llama"],
]


def _write_inputs(folder: Path, ids: list[str], address: str, model_name: str) -> None:
    plan = json.loads(json.dumps(PLAN))
    for a, node_id in zip(plan["assignments"], ids, strict=True):
        a["node_id"] = node_id
    plan["model_name"] = model_name
    (folder / "plan.json").write_text(json.dumps(plan))
    fleet = [
        {
            "id": node_id,
            "gpu_name": "RTX 4090",
            "vram_bytes": "24564MiB",
            "link_mbps": 1000,
            "labels": {"address": f"{address}{i}", "host": address},
        }
        for i, node_id in enumerate(ids)
    ]
    fleet[-1]["vram_bytes"] = "49140MiB"
    (folder / "fleet.json").write_text(json.dumps({"nodes": fleet}))


def _run_script(folder: Path, script: str) -> None:
    """``bash -n`` then ``bash`` on ``script`` in a sandbox; assert the canary stays absent."""
    assert BASH is not None
    run = folder / "run"
    run.mkdir()
    tools = folder / "bin"
    tools.mkdir()
    for tool in ("touch", "cat"):
        found = shutil.which(tool)
        assert found is not None
        (tools / tool).symlink_to(found)
    canary = folder / "canary"
    (run / "script.sh").write_text(script)
    env = {"PATH": str(tools), "CANARY": str(canary), "HOME": str(run)}
    check = subprocess.run(
        [BASH, "-n", "script.sh"], cwd=run, env=env, capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stderr[:500]
    subprocess.run(
        [BASH, "script.sh"], cwd=run, env=env, capture_output=True, timeout=30, check=False
    )
    assert not canary.exists(), script[:2000]


@pytest.mark.skipif(BASH is None, reason="needs bash")
@pytest.mark.timeout(900)
@fuzz
@given(
    ids=st.one_of(_ids(printable), _ids(printable), _ids(hostile)),
    address=hostile,
    model_name=st.one_of(st.just(PLAN["model_name"]), printable, hostile),
    model=hostile,
    command=st.sampled_from(COMMANDS),
)
@example(
    ids=["n\ntouch $CANARY", *NODES[1:]],
    address="127.0.0.1",
    model_name="llama3.1:70b",
    model="m",
    command=COMMANDS[0],
)
@example(
    ids=[*NODES[:-1], "n\ntouch $CANARY"],
    address="127.0.0.1",
    model_name="llama3.1:70b",
    model="m",
    command=COMMANDS[2],
)
@example(
    ids=[
        "$(touch $CANARY)",
        "`touch $CANARY`",
        "a; touch $CANARY",
        "b' ;touch $CANARY;'",
        *NODES[4:],
    ],
    address="h$(touch $CANARY)",
    model_name="llama3.1:70b",
    model="x\nEOF\ntouch $CANARY",
    command=COMMANDS[2],
)
@example(
    ids=NODES,
    address="h\ntouch $CANARY",
    model_name="llama3.1:70b\ntouch $CANARY",
    model="x\nEOF\ntouch $CANARY",
    command=COMMANDS[7],
)
@example(
    ids=["n\u2028x", *NODES[1:]],
    address="127.0.0.1",
    model_name="llama3.1:70b",
    model="m'\"$(touch $CANARY)",
    command=COMMANDS[3],
)
def test_generated_shell_runs_nothing_it_embeds(
    ids: list[str], address: str, model_name: str, model: str, command: list[str]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _write_inputs(folder, ids, address, model_name)
        files = {
            "@plan": str(folder / "plan.json"),
            "@fleet": str(folder / "fleet.json"),
            "@model": model,
        }
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([files.get(a, a) for a in command])
        message = err.getvalue()
        assert code in (0, 2), message[:500]
        if code == 2:
            assert message.count("\n") == 1 and message.startswith("stowplan: error: "), message
            event(f"{command[0]}: refused")
            return
        event(f"{' '.join(command[:4:3])}: script run")
        _run_script(folder, out.getvalue())


@pytest.mark.parametrize("payload", PAYLOADS)
def test_a_control_character_in_an_id_is_refused_at_every_edge(payload: str) -> None:
    """Fleet file, offer list, plan JSON: an id that is not one printable line is an
    input error naming the field; a printable payload is accepted (and quoted later)."""
    from stowplan.errors import InputError
    from stowplan.files.fleets import load_nodes, load_offers
    from stowplan.model import NodeDescriptor
    from stowplan.plan import plan_from_json

    bad = not payload.isprintable()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _write_inputs(folder, [payload, *NODES[1:]], "127.0.0.1", "llama3.1:70b")
        offers = [{"id": payload, "gpu_name": "RTX 4090", "gpu_ram": 24564, "num_gpus": 1}]
        (folder / "offers.json").write_text(json.dumps(offers))
        calls = [
            (lambda: load_nodes(folder / "fleet.json"), "nodes[0].id"),
            (lambda: plan_from_json((folder / "plan.json").read_text()), "assignments[0].node_id"),
            (lambda: NodeDescriptor(id=payload, gpu_name="x", vram_bytes=1), "id"),
        ]
        if bad:
            calls.append((lambda: load_offers(folder / "offers.json"), "offers[0].id"))
        for call, where in calls:
            if bad:
                with pytest.raises(InputError) as info:
                    call()
                assert info.value.field == where
                assert "\n" not in str(info.value) and "printable" in str(info.value)
            else:
                call()


def test_shell_helpers_keep_one_line_and_one_word() -> None:
    assert one_line("a\nb\x1bc\u2028") == "a\\nb\\x1bc\\u2028"
    assert one_line("plain — text") == "plain — text"
    assert shell_comment("on n\ntouch x") == "# on n\\ntouch x"
    assert shell_quote("a'b") == "'a'\"'\"'b'"
    assert heredoc_marker("x\nEOF\ny") == "EOF_1"
    assert heredoc_marker("x\nEOF\nEOF_1") == "EOF_2"
    assert heredoc_marker("EOFx") == "EOF"
