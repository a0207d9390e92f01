"""The llama.cpp export run for real: ``make e2e-llamacpp`` (opt-in, not part of CI).

1. Builds llama.cpp with RPC from the source the pinned ``llama-cpp-python`` sdist
   carries (``vendor/llama.cpp``), CPU only, into a cache folder (first build ~40
   minutes on 2 cores; later runs reuse it).
2. Writes a tiny 6-block Llama GGUF with ``gguf`` (``tests/common/tiny_gguf.py``) and a
   fleet of three CPU nodes on loopback addresses (127.0.0.2, 127.0.0.3, 127.0.0.1).
3. ``stowplan plan … --min-stages 3 --max-stages 3 --json`` and ``stowplan export
   --to llamacpp`` (no ``--nodes``: the plan keeps its nodes), then runs the exported
   commands as printed: one ``ggml-rpc-server`` per RPC stage, ``llama-server`` last
   (only ``--host/--port``, ``-v`` for the layer log and ``-nr`` added).
4. Checks the per-device layer assignment in llama-server's log against the plan, and
   the greedy tokens against one process (``llama-server -ngl 0 -nr``).

``--dry-run`` stops after step 3's export and prints the commands it would run.
Exit status 0 when every check holds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.common.tiny_gguf import write_tiny_llama  # noqa: E402

LLAMA_CPP_PYTHON = "0.3.36"
"""The pinned ``llama-cpp-python`` sdist whose ``vendor/llama.cpp`` is built."""
CACHE = Path(os.environ.get("STOWPLAN_CACHE", Path.home() / ".cache" / "stowplan"))
RPC_NAMES = ("ggml-rpc-server", "rpc-server")
"""The RPC server's binary: current name first, then the name before the rename."""
FLEET = """\
nodes:
  - {id: s0, gpu_name: CPU, vram_bytes: 1GiB, mem_bandwidth_gbps: 40, link_mbps: 10000,
     labels: {address: 127.0.0.2}}
  - {id: s1, gpu_name: CPU, vram_bytes: 1GiB, mem_bandwidth_gbps: 40, link_mbps: 10000,
     labels: {address: 127.0.0.3}}
  - {id: s2, gpu_name: CPU, vram_bytes: 1GiB, mem_bandwidth_gbps: 40, link_mbps: 10000,
     labels: {address: 127.0.0.1}}
"""
PROMPT = "Hello, world"
TOKENS = 24


def build_llama_cpp(jobs: int) -> Path:
    """The ``bin`` folder of a CPU + RPC build of the pinned sdist's llama.cpp (cached)."""
    home = CACHE / f"llama.cpp-{LLAMA_CPP_PYTHON}"
    bin_dir = home / "build" / "bin"
    if (bin_dir / "llama-server").exists() and any((bin_dir / n).exists() for n in RPC_NAMES):
        return bin_dir
    home.mkdir(parents=True, exist_ok=True)
    sdist = home / "sdist"
    if not any(sdist.glob("llama_cpp_python-*.tar.gz")):
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
             f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(sdist)],
            check=True,
        )  # fmt: skip
    (archive,) = sdist.glob("llama_cpp_python-*.tar.gz")
    source = home / "src"
    if not source.exists():
        with tarfile.open(archive) as tar:
            tar.extractall(home / "unpacked", filter="data")
        (top,) = (home / "unpacked").iterdir()
        shutil.move(str(top / "vendor" / "llama.cpp"), source)
    build = home / "build"
    subprocess.run(
        ["cmake", "-S", str(source), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
         "-DGGML_RPC=ON", "-DGGML_NATIVE=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
         "-DLLAMA_BUILD_EXAMPLES=OFF"],
        check=True,
    )  # fmt: skip
    subprocess.run(
        ["cmake", "--build", str(build), "-j", str(jobs), "--target", "llama-server"], check=True
    )
    for name in RPC_NAMES:
        done = subprocess.run(
            ["cmake", "--build", str(build), "-j", str(jobs), "--target", name], check=False
        )
        if done.returncode == 0:
            break
    return bin_dir


def stowplan(*args: str) -> str:
    exe = Path(sys.executable).with_name("stowplan")
    done = subprocess.run([str(exe), *args], check=True, capture_output=True, text=True)
    return done.stdout


def exported(work: Path) -> tuple[dict[str, object], dict[str, object]]:
    """The plan and its llama.cpp export, made by the command line as a user would."""
    model = write_tiny_llama(work / "tiny.gguf")
    fleet = work / "loop.yaml"
    fleet.write_text(FLEET)
    plan_text = stowplan(
        "plan", str(model), "--nodes", str(fleet), "--min-stages", "3", "--max-stages", "3",
        "--context", "512", "--json",
    )  # fmt: skip
    (work / "plan.json").write_text(plan_text)
    export = json.loads(stowplan("export", str(work / "plan.json"), "--to", "llamacpp", "--json"))
    return json.loads(plan_text), export


def split_env(line: str) -> tuple[dict[str, str], list[str]]:
    words = shlex.split(line)
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return env, words


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(host: str, port: int, seconds: float = 60) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {host}:{port}")


def complete(port: int) -> list[int]:
    """Greedy tokens of the prompt from the llama-server on ``port``."""
    wait_for_port("127.0.0.1", port, 300)
    end = time.monotonic() + 300
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.5)
    body = json.dumps(
        {"prompt": PROMPT, "n_predict": TOKENS, "temperature": 0, "top_k": 1, "seed": 0,
         "cache_prompt": False, "return_tokens": True, "n_probs": 0}
    ).encode()  # fmt: skip
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/completion",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as r:
        answer = json.load(r)
    return [int(t) for t in answer["tokens"]]


def layer_devices(log: str) -> tuple[dict[int, str], set[int]]:
    """llama.cpp's ``layer N assigned to device D`` lines, and the blocks whose tensors
    ``-ot`` overrode to the CPU."""
    # Current builds name RPC devices ``RPC0``, ``RPC1``… in the assignment lines and say
    # once which endpoint each name is; older builds print ``RPC[host:port]`` inline.
    endpoint = {
        m.group(1): f"{m.group(1)}[{m.group(2)}]"
        for m in re.finditer(r"using device (\S+) \(([^)\s]+:\d+)\)", log)
    }
    assigned = {
        int(m.group(1)): endpoint.get(m.group(2), m.group(2))
        for m in re.finditer(r"layer\s+(\d+) assigned to device (\S+?),", log)
    }
    overridden = {
        int(m.group(1))
        for m in re.finditer(r"tensor blk\.(\d+)\.\S+ \([^)]*\) buffer type overridden to CPU", log)
    }
    return assigned, overridden


def check_layers(plan: dict, export: dict, log: str) -> list[str]:
    """Where each block landed versus the plan; the problems found."""
    assigned, on_cpu = layer_devices(log)
    servers = {s["stage"]: s["endpoint"] for s in export["data"]["rpc_servers"]}
    problems = []
    for a in plan["assignments"]:
        for block in range(*a["block_range"]):
            device = assigned.get(block, "?")
            if a["stage"] in servers:
                if servers[a["stage"]] not in device:
                    problems.append(f"block {block}: {device}, planned {servers[a['stage']]}")
            elif block not in on_cpu:
                problems.append(f"block {block}: {device}, planned the CPU of llama-server")
    return problems


def run(bin_dir: Path, work: Path, plan: dict, export: dict) -> int:
    rpc = next(bin_dir / n for n in RPC_NAMES if (bin_dir / n).exists())
    procs: list[subprocess.Popen[bytes]] = []
    try:
        commands = [c for c in export["commands"] if not c.startswith("#")]
        for line in commands[:-1]:
            env, argv = split_env(line)
            assert argv[0] == "ggml-rpc-server", argv
            log = open(work / f"rpc-{len(procs)}.log", "wb")  # noqa: SIM115
            procs.append(
                subprocess.Popen([str(rpc), *argv[1:]], env={**os.environ, **env}, stdout=log,
                                 stderr=subprocess.STDOUT)
            )  # fmt: skip
            host, port = argv[argv.index("-H") + 1], int(argv[argv.index("-p") + 1])
            wait_for_port(host, port)
        env, argv = split_env(commands[-1])
        port = free_port()
        server_log = work / "llama-server.log"
        with open(server_log, "wb") as log:
            procs.append(
                subprocess.Popen(
                    [str(bin_dir / "llama-server"), *argv[1:], "--host", "127.0.0.1", "--port",
                     str(port), "-nr", "-v"],
                    env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
                )
            )  # fmt: skip
            split_tokens = complete(port)
        for p in procs:
            p.terminate()
        ref_port = free_port()
        with open(work / "reference.log", "wb") as log:
            ref = subprocess.Popen(
                [str(bin_dir / "llama-server"), "-m", str(work / "tiny.gguf"), "-ngl", "0", "-nr",
                 "-c", "512", "-np", "1", "--host", "127.0.0.1", "--port", str(ref_port)],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
            procs.append(ref)
            one_tokens = complete(ref_port)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
    problems = check_layers(plan, export, server_log.read_text(errors="replace"))
    same = split_tokens == one_tokens
    print(f"blocks per stage: {','.join(map(str, export['block_counts']))}")
    print(f"layer assignment as planned: {'yes' if not problems else 'no'}")
    for p in problems:
        print(f"  {p}")
    print(f"greedy tokens equal one process ({len(one_tokens)} tokens): {'yes' if same else 'no'}")
    return 0 if same and not problems else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="Export only; build nothing.")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stowplan-e2e-") as tmp:
        work = Path(tmp)
        plan, export = exported(work)
        if args.dry_run:
            print("\n".join(export["commands"]))
            return 0
        return run(build_llama_cpp(args.jobs), work, plan, export)


if __name__ == "__main__":
    sys.exit(main())
