"""The pure core imports nothing that touches a device or the network."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.common.purity import FORBIDDEN, PROBE


@pytest.mark.parametrize(
    "module", ["stowplan", "stowplan.planner", "stowplan.models", "stowplan.stages.worker"]
)
def test_importing_the_core_loads_no_device_or_network_module(module: str) -> None:
    code = PROBE.format(module=module, forbidden=sorted(FORBIDDEN))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout) == []


PURE_MODULES = (
    "stowplan.planner.baselines",
    "stowplan.calibration.apply",
    "stowplan.calibration.fit",
    "stowplan.calibration.profile",
    "stowplan.quantities.checks",
    "stowplan.circuits",
    "stowplan.cluster",
    "stowplan.cluster.fleet",
    "stowplan.cluster.parallelism",
    "stowplan.cluster.ranks",
    "stowplan.cluster.stage_gpus",
    "stowplan.cluster.topology",
    "stowplan.cost",
    "stowplan.errors",
    "stowplan.moe.numbering",
    "stowplan.moe.routing",
    "stowplan.moe.stats",
    "stowplan.exports",
    "stowplan.exports.accelerate",
    "stowplan.exports.llamacpp",
    "stowplan.exports.llamacpp_rpc",
    "stowplan.exports.pipeline",
    "stowplan.exports.sglang",
    "stowplan.exports.vllm",
    "stowplan.stages.gpu_lists",
    "stowplan.gpus",
    "stowplan.host",
    "stowplan.host.nvidia_topo",
    "stowplan.planner.residency",
    "stowplan.model",
    "stowplan.models.dtypes",
    "stowplan.models.grouping",
    "stowplan.models.hf",
    "stowplan.models.known",
    "stowplan.plan",
    "stowplan.rules.plan_fit",
    "stowplan.serve_plan",
    "stowplan.planner.baselines",
    "stowplan.planner.baselines.eplb",
    "stowplan.planner.baselines.peers",
    "stowplan.planner.certify",
    "stowplan.planner.cheapest",
    "stowplan.planner.context",
    "stowplan.planner.exact",
    "stowplan.planner.exact.node_sets",
    "stowplan.planner.exact.pipelines",
    "stowplan.planner.exact.trip",
    "stowplan.planner.exact.trip_nodes",
    "stowplan.planner.experts",
    "stowplan.planner.problem",
    "stowplan.planner.strategies.capacity_arrays",
    "stowplan.planner.strategies.cycle",
    "stowplan.planner.strategies.evaluated",
    "stowplan.planner.strategies.fractional",
    "stowplan.planner.strategies.memo",
    "stowplan.planner.strategies.split_tables",
    "stowplan.planner.strategies.interior",
    "stowplan.planner.strategies.latency",
    "stowplan.planner.strategies.throughput",
    "stowplan.planner.strategies.vram",
    "stowplan.planner.tensor",
    "stowplan.planner.tensor.capacity",
    "stowplan.runtime",
    "stowplan.runtime.families",
    "stowplan.serving",
    "stowplan.serving.price_cut",
    "stowplan.serving.kinds_bound",
    "stowplan.serving.kinds_price",
    "stowplan.serving.kind_replicas",
    "stowplan.serving.node_groups",
    "stowplan.quantities.units",
    "stowplan.workload",
)
"""Modules (and the packages whose import stays lazy) that must not load a device or network
module when imported; ``stowplan.demo.model`` is the numpy model and may load numpy only."""
EACH_PROBE = (
    "import importlib, sys, json; forbidden = {forbidden!r}; found = {{}}\n"
    "for name in {modules!r}:\n"
    "    before = set(sys.modules)\n"
    "    importlib.import_module(name)\n"
    "    new = sorted(m for m in set(sys.modules) - before\n"
    "                 if m in forbidden or m.split('.')[0] in forbidden)\n"
    "    if new: found[name] = new\n"
    "print(json.dumps(found))"
)


def _forbidden_loaded_by(modules: tuple[str, ...], forbidden: set[str]) -> dict[str, list[str]]:
    code = EACH_PROBE.format(modules=modules, forbidden=sorted(forbidden))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    found: dict[str, list[str]] = json.loads(out.stdout)
    return found


def test_pure_modules_load_no_device_or_network_module() -> None:
    assert _forbidden_loaded_by(PURE_MODULES, FORBIDDEN) == {}


def test_the_numpy_demo_model_loads_numpy_and_nothing_else_forbidden() -> None:
    assert _forbidden_loaded_by(("stowplan.demo.model",), FORBIDDEN - {"numpy"}) == {}
