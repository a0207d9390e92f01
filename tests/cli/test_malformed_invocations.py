"""A table of malformed CLI invocations: each exits 2 with one line on stderr, fast, writing nothing.

Every row is one class of bad input (a hostile file, an out-of-range number,
a conflicting flag); the expected text is part of the one error line. The
run happens with HOME, the cache and the profile folder inside the test's
temporary folder, and every file under it is compared before and after.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stowplan.cli import main
from tests.common.gguf_files import lying_gguf
from tests.common.paths import EXAMPLES, FIXTURES

FLEET = str(EXAMPLES / "fleets" / "case-a.yaml")
PLAN = str(FIXTURES / "plans" / "llama3_1_70b__mixed-consumer__39.json")
LLAMA_BENCH = str(FIXTURES / "llama-bench" / "readme_rtx4080.json")
VAST_TABLE = str(FIXTURES / "vastai" / "offer_rtx4090_1x_2024_cli-table-line.txt")


def _node(**fields: object) -> dict[str, object]:
    return {"id": "a", "gpu_name": "RTX 4090", "vram_bytes": "24GiB", **fields}


def _fleet(**fields: object) -> str:
    return json.dumps([_node(**fields)])


def _alias_bomb() -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    return "\n".join(lines) + "\nnodes: []\n"


def _config(**fields: object) -> str:
    base = json.loads((FIXTURES / "hf-configs" / "Llama-3.1-8B.json").read_text())
    return json.dumps({**base, **fields})


def _plan(**fields: object) -> str:
    return json.dumps({**json.loads(Path(PLAN).read_text()), **fields})


def _plan_stage(stage: int, num_blocks: int | None = None, **fields: object) -> str:
    """The plan with ``fields`` set on one stage (schema 2: GPU lists and degrees)."""
    data = json.loads(Path(PLAN).read_text())
    if num_blocks is not None:
        data["num_blocks"] = num_blocks
    data["assignments"][stage].update(fields)
    data["schema_version"] = 2
    for a in data["assignments"]:
        a.setdefault("tensor_parallel", 1)
        a.setdefault("gpu_indices", [])
    return json.dumps(data)


MIXED = str(EXAMPLES / "fleets" / "mixed-consumer.yaml")
_EIGHT_GPUS = json.dumps(
    [
        {"id": n, "gpu_name": "RTX 4090", "vram_bytes": "192GiB", "num_gpus": 8}
        for n in ("us-5090", "eu-4090", "us-4090", "ap-3090", "eu-3090", "us-a6000")
    ]
)


def _safetensors_with(dtype: object) -> bytes:
    header = json.dumps({"w": {"dtype": dtype, "shape": [2], "data_offsets": [0, 4]}}).encode()
    return len(header).to_bytes(8, "little") + header + b"\0" * 4


@dataclass(frozen=True)
class Case:
    """One malformed invocation: ``IN`` in argv is the folder of ``files``."""

    id: str
    argv: list[str]
    expect: str
    files: dict[str, str | bytes] = field(default_factory=dict)
    setup: Callable[[Path], None] | None = None


def _fifo(folder: Path) -> None:
    os.mkfifo(folder / "fifo.json")


CASES = [
    # -- hangs and memory blow-ups: non-regular files, huge or nested documents --------------
    Case("fleet /dev/zero", ["plan", "llama3.1:8b", "--nodes", "/dev/zero"], "character device"),
    Case(
        "fleet FIFO",
        ["plan", "llama3.1:8b", "--nodes", "IN/fifo.json"],
        "FIFO",
        setup=_fifo,
    ),
    Case("fleet is a folder", ["plan", "llama3.1:8b", "--nodes", "IN"], "is a folder"),
    Case(
        "stage-env /dev/zero", ["stage-env", "/dev/zero"], "PLAN='/dev/zero': is a character device"
    ),
    Case("export FIFO", ["export", "IN/fifo.json", "--to", "vllm"], "FIFO", setup=_fifo),
    Case("model inspect /dev/zero", ["model", "inspect", "/dev/zero"], "character device"),
    Case(
        "passport /dev/zero",
        ["residency", "llama3.1:8b", "--passport", "/dev/zero"],
        "character device",
    ),
    Case(
        "calibration /dev/zero",
        ["plan", "llama3.1:8b", "--nodes", FLEET, "--calibration", "/dev/zero"],
        "character device",
    ),
    Case(
        "expert load FIFO",
        ["plan", "mixtral:8x7b", "--nodes", FLEET, "--expert-load", "IN/fifo.json"],
        "FIFO",
        setup=_fifo,
    ),
    Case(
        "llama-bench /dev/zero",
        ["calibrate", "--from-llama-bench", "/dev/zero"],
        "character device",
    ),
    Case(
        "serving bench FIFO",
        ["calibrate", "--from-serving-bench", "IN/fifo.json"],
        "FIFO",
        setup=_fifo,
    ),
    Case(
        "YAML alias bomb",
        ["plan", "llama3.1:8b", "--nodes", "IN/bomb.yaml"],
        "expands to more than 1,000,000 YAML nodes",
        {"bomb.yaml": _alias_bomb()},
    ),
    Case(
        "recursive YAML alias",
        ["plan", "llama3.1:8b", "--nodes", "IN/loop.yaml"],
        "recursive YAML alias",
        {"loop.yaml": "nodes: &n [*n]\n"},
    ),
    Case(
        "plan file with 10**9 blocks",
        ["export", "IN/plan.json", "--to", "accelerate"],
        "num_blocks=1000000000: must be at most 4096",
        {"plan.json": _plan(num_blocks=10**9)},
    ),
    Case(
        "config with 10**7 layers",
        ["model", "inspect", "IN/config.json"],
        "config.num_hidden_layers=10000000: must be an integer in [0, 4096]",
        {"config.json": _config(num_hidden_layers=10**7)},
    ),
    # -- raw exceptions: RecursionError, long integers, overflow, KeyError, division ---------
    Case(
        "deep JSON fleet",
        ["plan", "llama3.1:8b", "--nodes", "IN/deep.json"],
        "nests arrays/objects deeper than 64 levels",
        {"deep.json": "[" * 100_000 + "]" * 100_000},
    ),
    Case(
        "deep JSON plan",
        ["stage-env", "IN/plan.json"],
        "nests arrays/objects deeper than 64 levels",
        {"plan.json": '{"a":' * 50_000 + "1" + "}" * 50_000},
    ),
    Case(
        "deep JSON passport",
        ["residency", "llama3.1:8b", "--passport", "IN/passport.json"],
        "nests arrays/objects deeper than 64 levels",
        {"passport.json": "[" * 50_000 + "]" * 50_000},
    ),
    Case(
        "5000-digit integer in a fleet",
        ["plan", "llama3.1:8b", "--nodes", "IN/fleet.json"],
        "longer than 40 characters",
        {"fleet.json": '[{"id": "a", "gpu_name": "x", "vram_bytes": ' + "9" * 5000 + "}]"},
    ),
    Case(
        "5000-digit integer in a plan",
        ["export", "IN/plan.json", "--to", "vllm"],
        "longer than 40 characters",
        {"plan.json": '{"num_blocks": ' + "9" * 5000 + "}"},
    ),
    Case(
        "5000-digit integer in a YAML fleet",
        ["plan", "llama3.1:8b", "--nodes", "IN/fleet.yaml"],
        "longer than 40 characters",
        {"fleet.yaml": "- {id: a, gpu_name: x, vram_bytes: " + "9" * 5000 + "}\n"},
    ),
    Case(
        "1e300GB",
        ["plan", "llama3.1:8b", "--nodes", "IN/fleet.json"],
        "nodes[0].vram_bytes='1e300GB': must be a byte count in [0, 9223372036854775807]",
        {"fleet.json": _fleet(vram_bytes="1e300GB")},
    ),
    Case(
        "huge flops",
        ["plan", "llama3.1:8b", "--nodes", "IN/fleet.json"],
        "nodes[0].flops_estimate=1e+300: must be 0 or a number in [1e-06, 1e+18]",
        {"fleet.json": _fleet(flops_estimate=1e300)},
    ),
    Case(
        "subnormal bandwidth",
        ["plan", "mixtral:8x7b", "--nodes", "IN/fleet.json"],
        "nodes[0].mem_bandwidth_gbps=5e-324: must be 0 or a number in [1e-06, 1e+18]",
        {"fleet.json": _fleet(mem_bandwidth_gbps=5e-324)},
    ),
    Case(
        "24kiB is a size, 24kib is not",
        ["plan", "llama3.1:8b", "--nodes", "IN/fleet.json"],
        "nodes[0].vram_bytes='24kib': must be a byte count",
        {"fleet.json": _fleet(vram_bytes="24kib")},
    ),
    Case(
        "offer with 1e300 MB",
        ["plan", "llama3.1:8b", "--offers", "IN/offers.json"],
        "offers[0].gpu_ram=1e+300: times num_gpus must be at most 8796093022207 MB",
        {"offers.json": json.dumps([{"id": 1, "gpu_name": "RTX 4090", "gpu_ram": 1e300}])},
    ),
    Case(
        "weight_block_size [0, 128]",
        ["model", "inspect", "IN/config.json"],
        "config.quantization_config.weight_block_size=[0, 128]: must be [rows, columns]",
        {
            "config.json": _config(
                quantization_config={"quant_method": "fp8", "weight_block_size": [0, 128]}
            )
        },
    ),
    Case(
        "sliding_window as a string",
        ["model", "inspect", "IN/config.json"],
        "config.sliding_window='4096': must be an integer",
        {"config.json": _config(model_type="mistral", sliding_window="4096")},
    ),
    Case(
        "malformed regex in a config",
        ["model", "inspect", "IN/config.json"],
        "is not a valid regular expression",
        {
            "config.json": _config(
                quantization_config={"quant_method": "fp8", "modules_to_not_convert": ["re:("]}
            )
        },
    ),
    Case(
        "mixed-type unknown keys",
        ["plan", "llama3.1:8b", "--nodes", "IN/fleet.yaml"],
        "is not a node field",
        {"fleet.yaml": "- {id: a, gpu_name: x, vram_bytes: 1, 1: x, b: y}\n"},
    ),
    Case(
        "non-string safetensors dtype",
        ["model", "inspect", "IN/model.safetensors"],
        "dtype=['F16']: is not a safetensors dtype",
        {"model.safetensors": _safetensors_with(["F16"]), "config.json": _config()},
    ),
    Case(
        "model name of 300 characters",
        ["plan", "m" * 300, "--nodes", FLEET],
        "is not a known model",
    ),
    Case(
        "calibrate --out a folder",
        ["calibrate", "--from-llama-bench", LLAMA_BENCH, "--out", "IN"],
        "--out=",
    ),
    # -- wrong acceptances ---------------------------------------------------------------------
    Case(
        "id: null",
        ["plan", "llama3.1:8b", "--nodes", "IN/fleet.yaml"],
        "nodes[0].id=None: is required",
        {"fleet.yaml": "- {id: null, gpu_name: x, vram_bytes: 24GiB}\n"},
    ),
    Case(
        "--max-attempts -1",
        ["launch", "llama3.1:8b", "--nodes", FLEET, "--plan-debug", "--max-attempts", "-1"],
        "--max-attempts=-1: must be an integer >= 1",
    ),
    Case(
        "--timeout nan",
        ["launch", "llama3.1:8b", "--nodes", FLEET, "--plan-debug", "--timeout", "nan"],
        "--timeout=nan: must be a finite number in (0, 86400.0]",
    ),
    Case(
        "--from-llama-bench with --from-probe",
        ["calibrate", "--from-llama-bench", LLAMA_BENCH, "--from-probe"],
        "fit from one source at a time (not with --from-probe)",
    ),
    Case(
        "vast.ai table instead of --raw JSON",
        ["plan", "llama3.1:8b", "--offers", VAST_TABLE],
        "vastai search offers --raw",
    ),
    Case(
        "Infinity in a fleet",
        ["plan", "llama3.1:8b", "--nodes", "IN/fleet.json"],
        "holds Infinity, which is not JSON",
        {"fleet.json": '[{"id": "a", "gpu_name": "x", "vram_bytes": Infinity}]'},
    ),
    # -- ids are one printable line (they reach shell comments and messages) ------------------
    Case(
        "node id with a newline",
        ["plan", "llama3.1:8b", "--nodes", "IN/fleet.json"],
        "nodes[0].id='a\\ntouch x': must be printable text",
        {"fleet.json": _fleet(id="a\ntouch x")},
    ),
    Case(
        "plan node id with a newline",
        ["stage-env", "IN/plan.json", "--format", "shell"],
        "assignments[0].node_id='n\\x1b[2K': must be printable text",
        {"plan.json": _plan_stage(0, node_id="n\x1b[2K")},
    ),
    # -- a plan file is checked like a planner's plan ------------------------------------------
    Case(
        "plan context -5",
        ["export", "IN/plan.json", "--to", "llamacpp"],
        "context_tokens=-5: must be an integer in [0, 1073741824]",
        {"plan.json": _plan(context_tokens=-5)},
    ),
    Case(
        "plan block range 10^30",
        ["export", "IN/plan.json", "--to", "accelerate"],
        "must satisfy 0 <= lo <= hi <= 4096",
        {"plan.json": _plan_stage(5, block_range=[59, 10**30])},
    ),
    Case(
        "plan stage on a node missing from --nodes",
        ["export", PLAN, "--to", "vllm", "--nodes", FLEET],
        "assignments[0].node_id='us-5090': must be a node of --nodes",
    ),
    Case(
        "plan GPU index 8 of an 8-GPU node",
        ["export", "IN/plan.json", "--to", "vllm", "--nodes", "IN/fleet.json"],
        "assignments[0].gpu_indices=(8,): must be GPU indices of node us-5090, in [0, 8)",
        {"plan.json": _plan_stage(0, gpu_indices=[8]), "fleet.json": _EIGHT_GPUS},
    ),
    Case(
        "plan tp 3 for a 64-head model (stage-env)",
        ["stage-env", "IN/plan.json"],
        "assignments[0].tensor_parallel=3: must divide num_attention_heads=64",
        {"plan.json": _plan_stage(0, tensor_parallel=3, gpu_indices=[0, 1, 2])},
    ),
    Case(
        "plan blocks past the model (stage-env)",
        ["stage-env", "IN/plan.json"],
        "assignments[5].block_range=(59, 81): must lie within llama3.1:70b's 80 blocks",
        {"plan.json": _plan_stage(5, block_range=[59, 81], num_blocks=81)},
    ),
    # -- numbers are ASCII digits ----------------------------------------------------------------
    Case(
        "--context superscript two",
        ["plan", "llama3.1:8b", "--nodes", FLEET, "--context", "\u00b2"],
        "--context='\u00b2': must be a number of tokens",
    ),
    Case(
        "--batch fullwidth three",
        ["plan", "llama3.1:8b", "--nodes", FLEET, "--batch", "\uff13"],
        "--batch='\uff13': must be a number (ASCII digits 0-9 only)",
    ),
    Case(
        "--tp Arabic-Indic three",
        ["plan", "llama3.1:8b", "--nodes", FLEET, "--tp=\u0663"],
        "--tp='\u0663': must be a number (ASCII digits 0-9 only)",
    ),
    Case(
        "fleet link in fullwidth digits",
        ["plan", "llama3.1:8b", "--nodes", "IN/fleet.json"],
        "(ASCII digits 0-9 only)",
        {"fleet.json": _fleet(link_mbps="\uff11\uff10\uff10\uff10")},
    ),
    # -- every search has a bound: queries that match nothing useful, the exact solver's cap --
    Case("gpus blank query", ["gpus", " "], "QUERY=' ': must name a GPU"),
    Case("gpus emoji query", ["gpus", "\U0001f642"], "must name a GPU (letters or digits"),
    Case(
        "exact strategy on 33 nodes",
        ["plan", "llama3.1:8b", "--nodes", "IN/fleet.json", "--strategy", "exact"],
        "strategy='exact': takes at most 32 nodes (33 given)",
        {"fleet.json": json.dumps([_node(id=f"n{i}") for i in range(33)])},
    ),
    # -- a binary model file is checked against its own length and counts --------------------
    Case(
        "GGUF tensor count made smaller",
        ["model", "inspect", "IN/m.gguf"],
        "the GGUF tensor count (2) or offsets do not match the file",
        setup=lambda folder: lying_gguf(folder, "tensor count"),
    ),
    Case(
        "GGUF tensors sharing data",
        ["model", "inspect", "IN/m.gguf"],
        "over another tensor's data",
        setup=lambda folder: lying_gguf(folder, "overlap"),
    ),
    # -- one line on stderr: a GPU warning is not printed before the error -------------------
    Case(
        "unknown GPU and a model that does not fit",
        ["plan", "llama3.1:70b", "--nodes", "IN/fleet.json"],
        "stowplan: error: ",
        {"fleet.json": _fleet(gpu_name="Mystery 9000", vram_bytes="1GiB")},
    ),
]


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and modification time."""
    out = {}
    for p in root.rglob("*"):
        if p.is_file() and not p.is_fifo():
            st = p.stat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_malformed_invocation_exits_2_with_one_line_fast_writing_nothing(
    case: Case,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    for name, content in case.files.items():
        target = folder / name
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
    if case.setup is not None:
        case.setup(folder)
    home = tmp_path / "home"
    home.mkdir()
    for var in ("HOME", "STOWPLAN_HOME", "STOWPLAN_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.setenv(var, str(home))
    monkeypatch.chdir(home)
    argv = [str(folder) + a[2:] if a.startswith("IN") else a for a in case.argv]
    before = _tree(tmp_path)

    started = time.monotonic()
    code = main(argv)
    took = time.monotonic() - started
    out, err = capsys.readouterr()

    assert code == 2, err
    assert err.startswith("stowplan: error: ") and err.count("\n") == 1, err
    assert case.expect in err, err
    assert "internal error" not in err and "Traceback" not in err
    assert took < 5.0, f"{took:.1f} s"
    assert out == ""
    assert _tree(tmp_path) == before
