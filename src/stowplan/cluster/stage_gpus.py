"""The GPUs of each stage of a plan on its node: the bundle, the device env, the shortfalls.

A stage runs on ``tensor_parallel`` GPUs of its node: ``gpu_indices`` when the
plan lists them, else GPUs ``0 … tp-1`` (a single-GPU node's stage is GPU 0).
:func:`realise <stowplan.cluster.realise.realise>` reserves one bundle of that
many GPUs on the node per stage, and the stage's process is told which:

* ``PLAN_TP_SIZE`` — the stage's tensor-parallel degree;
* ``CUDA_VISIBLE_DEVICES`` — the plan's GPU indices, in the plan's order;
* ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1`` — so Ray keeps that list
  instead of writing its own.  Ray counts the bundle's GPUs against the node
  either way, and ``ray.get_gpu_ids()`` in the stage reports the plan's
  indices (Ray maps its slots onto a ``CUDA_VISIBLE_DEVICES`` the worker
  started with).  Ray's slot numbers need not equal the plan's indices, so on
  a node shared with other Ray GPU work the plan's GPUs are only as free as
  the count says.

:func:`gpu_shortfalls` is the pure pre-check: a stage whose GPUs are not GPUs
of its node, or stages of one node that need more GPUs (or CPUs) than it has.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from stowplan.model import NodeDescriptor
from stowplan.plan import Plan, StageAssignment
from stowplan.text.wording import plural

__all__ = [
    "CPU_NAMES",
    "NOSET_VISIBLE_DEVICES",
    "cpu_node_ids",
    "gpu_shortfalls",
    "stage_bundle",
    "stage_device_env",
    "stage_gpus",
]

NOSET_VISIBLE_DEVICES = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
"""Set to ``1`` in a stage's env: Ray leaves the plan's ``CUDA_VISIBLE_DEVICES`` alone."""


def stage_gpus(a: StageAssignment) -> tuple[int, ...]:
    """The node-local GPU indices stage ``a`` runs on: its ``gpu_indices``, else ``0 … tp-1``."""
    return a.gpu_indices or tuple(range(a.tensor_parallel))


def stage_device_env(a: StageAssignment, *, cpu: bool = False) -> dict[str, str]:
    """``PLAN_TP_SIZE``, ``CUDA_VISIBLE_DEVICES`` and the flag that keeps Ray from rewriting
    it; a stage on a CPU node (``cpu``) sees no GPU (``CUDA_VISIBLE_DEVICES`` empty)."""
    return {
        "PLAN_TP_SIZE": str(a.tensor_parallel),
        "CUDA_VISIBLE_DEVICES": "" if cpu else ",".join(str(g) for g in stage_gpus(a)),
        NOSET_VISIBLE_DEVICES: "1",
    }


CPU_NAMES = frozenset({"cpu", "host", "system ram", "ram"})
"""``gpu_name`` values (lower case) that mean the host CPU."""


def cpu_node_ids(nodes: Sequence[NodeDescriptor]) -> frozenset[str]:
    """The ids of ``nodes`` that are the host CPU: a label ``kind=cpu`` or a ``gpu_name``
    of :data:`CPU_NAMES`."""
    return frozenset(
        n.id
        for n in nodes
        if dict(n.labels).get("kind", "").lower() == "cpu"
        or n.gpu_name.strip().lower() in CPU_NAMES
    )


def _wants_gpus(a: StageAssignment) -> bool:
    """Whether the plan asks for GPUs by count or index (a plain stage may run on a CPU node)."""
    return a.tensor_parallel > 1 or bool(a.gpu_indices)


def stage_bundle(a: StageAssignment, resources: Mapping[str, float]) -> dict[str, float]:
    """The bundle stage ``a`` asks of its node: one CPU and its ``tp`` GPUs (none on a node
    that registers no GPU and a stage that asks for none)."""
    bundle = {"CPU": 1.0}
    if float(resources.get("GPU", 0.0)) > 0 or _wants_gpus(a):
        bundle["GPU"] = float(len(stage_gpus(a)))
    return bundle


def _fmt(gpus: Sequence[int]) -> str:
    return ",".join(str(g) for g in gpus)


def _free(free_gpus: float | None) -> str:
    return "" if free_gpus is None else f", {free_gpus:g} free now"


def gpu_shortfalls(
    plan: Plan,
    resources: Mapping[str, Mapping[str, float]],
    free_gpus: Mapping[str, float] | None = None,
) -> dict[int, str]:
    """Stage → why its node cannot hold it, for the stages of ``plan`` on the nodes of
    ``resources`` (node id → its total Ray resources; absent nodes are not judged here).

    ``free_gpus`` (node id → GPUs not in use) only adds the free count to the reasons.
    """
    free_gpus = free_gpus or {}
    reasons: dict[int, str] = {}
    by_node: dict[str, list[StageAssignment]] = {}
    for a in plan.assignments:
        if a.node_id in resources:
            by_node.setdefault(a.node_id, []).append(a)
    for node_id, stages in by_node.items():
        total = resources[node_id]
        have = int(total.get("GPU", 0.0))
        free = _free(free_gpus.get(node_id))
        for a in stages:
            gpus = stage_gpus(a)
            if _wants_gpus(a) and max(gpus) >= have:
                where = f"GPUs 0-{have - 1}" if have > 1 else ("GPU 0" if have else "no GPU")
                reasons[a.stage] = (
                    f"needs {plural(len(gpus), 'GPU')} (indices {_fmt(gpus)}) but the node "
                    f"has {where}{free}"
                )
        bundles = {a.stage: stage_bundle(a, total) for a in stages}
        for key in ("GPU", "CPU"):
            need = sum(b.get(key, 0.0) for b in bundles.values())
            if need <= float(total.get(key, 0.0)):
                continue
            listed = ", ".join(f"{s} ({b.get(key, 0.0):g})" for s, b in bundles.items())
            note = free if key == "GPU" else ""
            for s, b in bundles.items():
                reasons.setdefault(
                    s,
                    f"needs {plural(int(b.get(key, 0.0)), key)} of the node's "
                    f"{total.get(key, 0.0):g}{note}; its stages {listed} need {need:g} in all",
                )
    return reasons
