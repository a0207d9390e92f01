"""``stowplan launch SERVE.json``: realise every replica of a serve plan on Ray.

A serve plan (``stowplan serve --json``) is launched as planned: its replicas' nodes
must be the Ray cluster's nodes (their ids are Ray node ids), no planning option
applies, and nothing is replanned.  ``--plan-debug`` prints every replica's stage
envs and starts nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stowplan.cli.common import out_console
from stowplan.errors import InputError
from stowplan.files.fileio import read_text_file
from stowplan.files.safeload import parse_json
from stowplan.serve_plan import ServePlan
from stowplan.stages.gpu_lists import stage_place_text
from stowplan.text.shell import shell_comment

__all__ = ["launch_serve_plan", "read_serve_plan"]


def read_serve_plan(model: str) -> ServePlan | None:
    """The serve plan in file ``model`` when it is one (a JSON object with replicas and a
    workload), else None (``model`` names a model)."""
    path = Path(model)
    if path.suffix.lower() != ".json" or not path.is_file():
        return None
    text = read_text_file(path, field="MODEL")
    if '"replicas"' not in text:
        return None
    data = parse_json(text, field="MODEL", source=str(path))
    if not (isinstance(data, dict) and "replicas" in data and "workload" in data):
        return None
    return ServePlan.from_dict(data)


def refuse_plan_options(model: str, given: dict[str, object]) -> None:
    """A serve plan is launched as planned: every planning option in ``given`` (flag →
    value, None or default when not given) is refused."""
    used = [flag for flag, value in given.items() if value]
    if used:
        raise InputError(
            used[0],
            str(given[used[0]]),
            f"does not apply to the serve plan {model}: it is launched as planned; plan "
            "again with `stowplan serve` to change it",
        )


def _actor_envs(sp: ServePlan) -> list[list[dict[str, str]]]:
    from stowplan.cluster.realise import stage_actor_env
    from stowplan.exports.replica_env import replica_keys

    return [stage_actor_env(r.plan, replica_keys(sp, i)) for i, r in enumerate(sp.replicas)]


def _debug(sp: ServePlan, as_json: bool) -> None:
    from stowplan.cli.stage_env_render import render_stage_env
    from stowplan.cluster.replicas import check_disjoint

    check_disjoint(sp)
    envs = _actor_envs(sp)  # exactly what each replica's stage actors receive
    if as_json:
        doc = {"serve_plan": sp.to_dict(), "stage_env": envs}
        out_console.file.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        return
    for i, (r, env) in enumerate(zip(sp.replicas, envs, strict=True)):
        out_console.file.write(
            shell_comment(
                f"replica {i} of {len(sp.replicas)}: {r.users} users on {' '.join(r.node_ids)}"
            )
            + "\n"
        )
        out_console.file.write(
            render_stage_env(env, [stage_place_text(a) for a in r.plan.assignments])
        )
    out_console.print("plan-debug: nothing was provisioned")


def launch_serve_plan(sp: ServePlan, *, plan_debug: bool, as_json: bool, timeout: float) -> None:
    """Print the replicas' stage envs (``plan_debug``), or realise every replica on the
    connected Ray cluster, report where each stage started, and release them."""
    if plan_debug:
        _debug(sp, as_json)
        return
    from stowplan.cluster.ray_runtime import require_ray
    from stowplan.cluster.realise import contract_stage_class
    from stowplan.cluster.replicas import realise_serve_plan

    ray = require_ray()
    with realise_serve_plan(sp, contract_stage_class(), timeout_s=timeout) as running:
        infos: list[list[dict[str, Any]]] = [
            ray.get([a.info.remote() for a in r.actors], timeout=timeout) for r in running.replicas
        ]
        if as_json:
            doc = {"serve_plan": sp.to_dict(), "replicas": infos}
            out_console.file.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        else:
            for i, stages in enumerate(infos):
                for info in stages:
                    where = (
                        "on its planned node"
                        if info["node_id"] == info["plan_node_id"]
                        else f"on {info['node_id']}, NOT its planned node"
                    )
                    lo, hi = info["block_range"]
                    out_console.print(
                        f"replica {i} stage {info['stage']} started {where}; "
                        f"resolved blocks [{lo}, {hi})"
                    )
    if not as_json:
        count = sum(r.plan.num_stages for r in sp.replicas)
        out_console.print(f"released {len(sp.replicas)} replica(s), {count} stage(s)")
