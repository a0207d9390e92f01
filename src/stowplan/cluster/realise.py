"""Realise a plan on Ray, and replan on the survivors when a stage cannot start.

:func:`realise` turns a :class:`~stowplan.plan.Plan` into running stage
actors, in four steps:

1. pre-check: every node the plan names is alive, has the GPUs its stages
   name, and holds the bundles of all its stages (``CPU: 1`` plus the stage's
   ``tp`` GPUs each, :mod:`stowplan.cluster.stage_gpus`) in total;
2. one ``STRICT_PACK`` placement group per stage, its one bundle pinned to the
   plan's node by the ``ray.io/node-id`` label selector (several stages on one
   node: several bundles there), made by
   :func:`stowplan.cluster.groups.create_placement_group` (pre-check, bounded
   wait, fail-fast when infeasible), all within one deadline;
3. one actor per stage inside its group, holding the bundle's GPUs,
   ``PLAN_JSON``/``STAGE``/… in its runtime env (the worker contract,
   :func:`stowplan.stages.worker.stage_env`) with ``PLAN_TP_SIZE`` and
   ``CUDA_VISIBLE_DEVICES`` (:func:`stowplan.cluster.stage_gpus.stage_device_env`),
   no restarts; each must answer within the same deadline;
4. on any failure every actor is killed and every group removed before the
   error is raised: nothing is left behind.

:func:`realise_with_replan` wraps it in seed 000 §7.2 step 5: a stage that
cannot be placed in time, or whose node dies before it starts, excludes its
node; the plan is recomputed on the surviving nodes and realised again, a
bounded number of times.  When nothing fits, the planner's ``PlanError``
(with its numbers) reaches the caller.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stowplan.cluster.errors import PlacementError
from stowplan.cluster.groups import create_placement_group, remove_groups
from stowplan.cluster.nodes import NODE_ID_LABEL, alive_nodes
from stowplan.cluster.ray_runtime import require_ray
from stowplan.cluster.stage_gpus import (
    cpu_node_ids,
    gpu_shortfalls,
    stage_bundle,
    stage_device_env,
    stage_gpus,
)
from stowplan.errors import (
    InputError,
    PlanError,
    StageFailure,
    StageStartError,
    StageUnplaceable,
)
from stowplan.model import Constraints, ModelLayout, NodeDescriptor
from stowplan.plan import Plan, StageAssignment, plan_to_json, with_inputs
from stowplan.planner import plan_blocks as make_plan
from stowplan.quantities.checks import check_int
from stowplan.stages.worker import stage_env
from stowplan.text.wording import plural

__all__ = [
    "Attempt",
    "ContractStage",
    "Realisation",
    "StageFailure",
    "StageStartError",
    "StageUnplaceable",
    "contract_stage_class",
    "realise",
    "realise_with_replan",
    "stage_actor_env",
    "unplaceable_stages",
]

WORKER_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
"""Added to every stage's env: one BLAS thread per stage actor."""


def stage_actor_env(plan: Plan, extra_env: Mapping[str, str] | None = None) -> list[dict[str, str]]:
    """The exact env each stage actor of ``plan`` receives, in stage order.

    :data:`WORKER_ENV`, then ``extra_env``, then the stage's GPUs
    (:func:`~stowplan.cluster.stage_gpus.stage_device_env`: ``PLAN_TP_SIZE``,
    ``CUDA_VISIBLE_DEVICES``), then the worker-contract variables
    (:func:`stowplan.stages.worker.stage_env`), later ones winning.  A stage on a CPU node of
    the plan's :attr:`~stowplan.plan.Plan.nodes` gets no GPU ids (an empty
    ``CUDA_VISIBLE_DEVICES``).  :func:`realise`
    starts the actors with it and ``stowplan launch --plan-debug`` prints it.
    """
    cpu = cpu_node_ids(plan.nodes)
    return [
        {**WORKER_ENV, **(extra_env or {}), **stage_device_env(a, cpu=a.node_id in cpu), **env}
        for a, env in zip(plan.assignments, stage_env(plan), strict=True)
    ]


@dataclass(slots=True)
class Realisation:
    """Running stages of one plan: the groups and actors, in stage order.

    A runtime handle, not a value.  ``release()`` kills the actors and removes
    the groups; it is idempotent.
    """

    plan: Plan
    groups: list[Any]
    actors: list[Any]
    attempts: tuple[Attempt, ...] = ()
    """Earlier attempts that failed and were replanned (empty when the first plan started)."""
    released: bool = field(default=False)

    def release(self) -> None:
        """Kill every stage actor and remove every placement group."""
        if self.released:
            return
        _cleanup(self.actors, self.groups)
        self.released = True

    def __enter__(self) -> Realisation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """One failed realisation: the plan tried and the stages that did not start."""

    plan: Plan
    failures: tuple[StageFailure, ...]


def _cleanup(actors: Sequence[Any], groups: Sequence[Any]) -> None:
    ray = require_ray()
    for actor in actors:
        with contextlib.suppress(Exception):  # already dead: nothing to free
            ray.kill(actor, no_restart=True)
    remove_groups(groups)


def _plan_tag(plan: Plan) -> str:
    return hashlib.sha256(plan_to_json(plan, indent=None).encode()).hexdigest()[:10]


def _free_resources() -> dict[str, dict[str, float]]:
    """Node id → its resources not held now (empty when Ray's state API cannot say)."""
    try:
        from ray._private.state import available_resources_per_node

        per_node: dict[str, dict[str, float]] = available_resources_per_node()  # type: ignore[no-untyped-call]
    except Exception:  # a private API: without it, reasons omit the free count
        return {}
    return {str(k): {r: float(x) for r, x in v.items()} for k, v in per_node.items()}


def _free_gpus() -> dict[str, float]:
    """Node id → GPUs not held now (empty when Ray's state API cannot say)."""
    return {k: v.get("GPU", 0.0) for k, v in _free_resources().items()}


def _with_shortfall(
    a: StageAssignment, reason: str, resources: Mapping[str, float], bundle: Mapping[str, float]
) -> str:
    """``reason``, then what the stage's bundle needs that the node has not free now (its
    CPU, its GPUs or both); its GPUs and the free ones when Ray cannot say."""
    free = _free_resources().get(a.node_id)
    if free is not None:
        short = [
            f"{plural(int(need), key)} of the node ({free.get(key, 0.0):g} of "
            f"{float(resources.get(key, 0.0)):g} free now)"
            for key, need in sorted(bundle.items(), key=lambda kv: kv[0] != "CPU")
            if need > free.get(key, 0.0) + 1e-9
        ]
        if short:
            return f"{reason}; the stage needs " + " and ".join(short)
    need = plural(len(stage_gpus(a)), "GPU")
    gpus = None if free is None else free.get("GPU", 0.0)
    have = float(resources.get("GPU", 0.0))
    tail = "" if gpus is None else f" ({gpus:g} of {have:g} free now)"
    return f"{reason}; the stage needs {need} of the node{tail}"


def _precheck(plan: Plan) -> tuple[list[dict[str, float]], list[StageFailure]]:
    alive = {str(n["NodeID"]): n for n in alive_nodes()}
    resources = {k: dict(n.get("Resources", {})) for k, n in alive.items()}
    short = gpu_shortfalls(plan, resources, _free_gpus())
    bundles, failures = [], []
    for a in plan.assignments:
        bundles.append(stage_bundle(a, resources.get(a.node_id, {})))
        if a.node_id not in alive:
            reason = "node is not alive"
        elif a.stage in short:
            reason = short[a.stage]
        else:
            continue
        failures.append(StageFailure(stage=a.stage, node_id=a.node_id, reason=reason))
    return bundles, failures


def unplaceable_stages(plan: Plan) -> list[StageFailure]:
    """The stages of ``plan`` the live cluster cannot hold (:func:`realise`'s step 1: a
    node gone, or short of the GPUs/CPUs its stages need), found before anything is
    created; empty when every stage can be placed."""
    return _precheck(plan)[1]


def realise(
    plan: Plan,
    actor_class: Any,
    *,
    actor_args: Sequence[Any] = (),
    timeout_s: float = 30.0,
    start_timeout_s: float = 60.0,
    extra_env: Mapping[str, str] | None = None,
) -> Realisation:
    """Start one ``actor_class`` actor per stage of ``plan`` on the node the plan names.

    ``actor_class`` is a Ray actor class (``ray.remote(cls)``); each actor holds
    its stage's ``tp`` GPUs and gets ``actor_args`` and, in its runtime env,
    :func:`stage_actor_env` (the worker contract, the stage's GPUs,
    :data:`WORKER_ENV` and ``extra_env``).  Every group must be placed within ``timeout_s``,
    then every actor must answer within ``start_timeout_s`` (its process
    starts and builds its share of the model).

    Raises:
        StageUnplaceable: a node is gone, lacks the GPUs its stages name or
            need (each failure names the stage, the node, the GPUs needed and
            free), a group was infeasible or not placed in time, or a node died
            before its actor answered.  Nothing is left behind.
        StageStartError: an actor failed in its constructor on a live node.
    """
    ray = require_ray()
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    for name, value in (("timeout_s", timeout_s), ("start_timeout_s", start_timeout_s)):
        if not value > 0:
            raise InputError(name, value, "must be a number of seconds > 0")
    start = time.monotonic()
    deadline = start + timeout_s
    # Step 1: pre-check nodes and resources before anything is created.
    bundles, failures = _precheck(plan)
    if failures:
        raise StageUnplaceable(failures, 0.0)
    envs = stage_actor_env(plan, extra_env)
    tag = _plan_tag(plan)
    groups: list[Any] = []
    actors: list[Any] = []
    try:
        # Step 2: one pinned STRICT_PACK group per stage, within one deadline.
        for a, bundle in zip(plan.assignments, bundles, strict=True):
            try:
                groups.append(
                    create_placement_group(
                        [bundle],
                        "STRICT_PACK",
                        name=f"stowplan-{tag}-stage{a.stage}",
                        timeout_s=max(0.1, deadline - time.monotonic()),
                        bundle_label_selector=[{NODE_ID_LABEL: a.node_id}],
                    )
                )
            except PlacementError as exc:
                node = next((n for n in alive_nodes() if n["NodeID"] == a.node_id), {})
                reason = _with_shortfall(a, str(exc), node.get("Resources", {}), bundle)
                failure = StageFailure(stage=a.stage, node_id=a.node_id, reason=reason)
                raise StageUnplaceable([failure], time.monotonic() - start) from None
        # Step 3: one actor per stage in its group, the plan in its env.
        for a, bundle, env, group in zip(plan.assignments, bundles, envs, groups, strict=True):
            actors.append(
                actor_class.options(
                    num_cpus=bundle["CPU"],
                    num_gpus=bundle.get("GPU", 0.0),
                    max_restarts=0,
                    runtime_env={"env_vars": env},
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=group, placement_group_bundle_index=0
                    ),
                    name=f"stowplan-{tag}-stage{a.stage}",
                ).remote(*actor_args)
            )
        deadline = time.monotonic() + start_timeout_s
        for a, actor in zip(plan.assignments, actors, strict=True):
            left = max(0.1, deadline - time.monotonic())
            try:
                ray.get(actor.__ray_ready__.remote(), timeout=left)
            except ray.exceptions.GetTimeoutError:
                failure = StageFailure(
                    stage=a.stage, node_id=a.node_id, reason="actor did not start in time"
                )
                raise StageUnplaceable([failure], time.monotonic() - start) from None
            except ray.exceptions.RayActorError as exc:
                if a.node_id not in {str(n["NodeID"]) for n in alive_nodes()}:
                    failure = StageFailure(
                        stage=a.stage,
                        node_id=a.node_id,
                        reason="node died before the stage started",
                    )
                    raise StageUnplaceable([failure], time.monotonic() - start) from None
                raise StageStartError(a.stage, a.node_id, _first_line(exc)) from None
    except BaseException:
        # Step 4: nothing is left behind.
        _cleanup(actors, groups)
        raise
    return Realisation(plan=plan, groups=groups, actors=actors)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[-1] if text else type(exc).__name__


def realise_with_replan(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    constraints: Constraints | None,
    actor_class: Any,
    *,
    actor_args: Sequence[Any] = (),
    max_attempts: int = 3,
    timeout_s: float = 30.0,
    start_timeout_s: float = 60.0,
    extra_env: Mapping[str, str] | None = None,
    on_failure: Callable[[Attempt], None] | None = None,
) -> Realisation:
    """Plan ``model`` on ``nodes``, realise it, and replan without failed nodes (seed §7.2).

    Each failed attempt is passed to ``on_failure`` (when given) and recorded in
    the returned :attr:`Realisation.attempts`; its nodes are excluded and the
    plan is recomputed on the survivors, at most ``max_attempts`` plans in all.

    Raises:
        PlanError: the surviving nodes cannot hold the model (the planner's
            error, with its numbers).
        StageUnplaceable: the last of ``max_attempts`` plans still failed.
        StageStartError: an actor failed in its constructor (not a placement
            problem, so no replan).
    """
    check_int("max_attempts", max_attempts, minimum=1)
    survivors = list(nodes)
    attempts: list[Attempt] = []
    while True:
        try:
            current = with_inputs(
                make_plan(model, survivors, constraints), model_source=None, nodes=survivors
            )
        except PlanError as exc:
            for attempt in attempts:
                exc.add_note("earlier attempt: " + "; ".join(str(f) for f in attempt.failures))
            raise
        try:
            realisation = realise(
                current,
                actor_class,
                actor_args=actor_args,
                timeout_s=timeout_s,
                start_timeout_s=start_timeout_s,
                extra_env=extra_env,
            )
        except StageUnplaceable as exc:
            attempt = Attempt(plan=current, failures=exc.failures)
            attempts.append(attempt)
            if on_failure is not None:
                on_failure(attempt)
            if len(attempts) >= max_attempts:
                raise
            excluded = set(exc.node_ids)
            survivors = [n for n in survivors if n.id not in excluded]
            continue
        realisation.attempts = tuple(attempts)
        return realisation


class ContractStage:
    """A stage actor that resolves its share through the worker contract and reports it.

    What ``stowplan launch`` starts for a model it does not execute itself: it
    proves each stage landed on its node with its ``PLAN_JSON`` and found its
    own blocks (:func:`stowplan.stages.worker.stage_from_env`).
    """

    def __init__(self) -> None:
        import os

        import ray
        from stowplan.stages.worker import stage_from_env

        self.stage = stage_from_env(os.environ)
        self.node_id = ray.get_runtime_context().get_node_id()
        self.gpu_ids = [str(g) for g in ray.get_gpu_ids()]
        replica = os.environ.get("STOWPLAN_REPLICA")
        self.replica = None if replica is None else int(replica)

    def info(self) -> dict[str, Any]:
        """Where this stage runs and what it resolved (and its replica of a serve plan)."""
        extra: dict[str, Any] = {"gpu_ids": self.gpu_ids}
        if self.replica is not None:
            extra["replica"] = self.replica
        return self.stage.placement_info(self.node_id) | extra


def contract_stage_class() -> Any:
    """:class:`ContractStage` as a Ray actor class."""
    return require_ray().remote(ContractStage)
