"""Stage actors on Ray: each builds its share from its env alone; the driver chains them.

:class:`StageWorker` is the actor :func:`realise_checkpoint` starts for every
stage of a plan (through :func:`stowplan.cluster.realise.realise`: one pinned
placement group per stage, the worker contract in its env).  Its only
argument is the checkpoint folder; its blocks, embed and head come from
``PLAN_JSON``/``STAGE`` (:func:`stowplan.stages.worker.stage_from_env`).

:func:`run_generation` runs ``U`` sequences as the plan's ``m = min(U, S)``
microbatches (the cycle the cost model assumes, :func:`stowplan.cost.microbatches`):
each microbatch has its own KV cache on every stage; stage ``i``'s output object
is the argument of stage ``i+1``'s call, so hidden states travel actor to actor;
the last stage samples greedily and its output object is the argument of stage
0's next call for that microbatch, so the token goes back to stage 0 without
passing through the driver.  All calls are submitted at once; each actor runs
them in order, so while stage 1 works on microbatch 0, stage 0 works on
microbatch 1.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stowplan.cluster.ray_runtime import require_ray
from stowplan.cluster.realise import Realisation, realise
from stowplan.errors import InputError
from stowplan.plan import Plan
from stowplan.quantities.checks import check_int
from stowplan.runtime.checkpoint import read_config
from stowplan.runtime.families import check_runnable
from stowplan.runtime.generation import Generation
from stowplan.stages.worker import CONTRACT_KEYS, stage_from_env

__all__ = [
    "OFFLINE_ENV",
    "PipelineRun",
    "StageWorker",
    "realise_checkpoint",
    "run_generation",
    "split_microbatches",
]

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
"""Added to every stage's env: a worker reads the local folder and never the network."""


class StageWorker:
    """One stage of a Hugging Face checkpoint (run as a Ray actor); see the module notes."""

    def __init__(self, checkpoint: str) -> None:
        import ray
        from stowplan.runtime.stage import StageModel

        self.stage = stage_from_env(os.environ)
        self.model = StageModel.load(checkpoint, self.stage)
        self.node_id = ray.get_runtime_context().get_node_id()
        self.caches: dict[int, Any] = {}
        self.busy_s = 0.0
        self.steps = 0

    def info(self) -> dict[str, Any]:
        """Where the stage runs, what it resolved and read, and the contract env it saw."""
        r = self.model.report
        return self.stage.placement_info(self.node_id) | {
            "shards": list(r.shards),
            "header_bytes": r.header_bytes,
            "tensor_bytes": r.tensor_bytes,
            "bytes_read": r.bytes_read,
            "load_s": r.load_s,
            "device": r.device,
            "weight_bytes": self.model.weight_bytes,
            "env": {k: os.environ[k] for k in CONTRACT_KEYS if k in os.environ},
        }

    def reset(self) -> None:
        """Drop every microbatch's KV cache and the counters."""
        self.caches.clear()
        self.busy_s = 0.0
        self.steps = 0

    def step(self, microbatch: int, x: Any) -> Any:
        """One prefill or decode step of ``microbatch``: token ids (a list of lists, or the
        last stage's output) on stage 0, hidden states after it."""
        import torch

        t0 = time.perf_counter()
        if isinstance(x, dict):
            x = x["tokens"][:, None]
        elif isinstance(x, list):
            x = torch.tensor(x, dtype=torch.long)
        cache = self.caches.get(microbatch)
        if cache is None:
            cache = self.caches[microbatch] = self.model.new_cache()
        y = self.model.forward(x, cache)
        out: Any
        if self.stage.owns_head:
            out = {"tokens": y.argmax(-1).cpu(), "logits": y.float().cpu()}
        else:
            out = y.cpu()
        self.busy_s += time.perf_counter() - t0
        self.steps += 1
        return out

    def stats(self) -> dict[str, float]:
        return {"steps": self.steps, "busy_s": self.busy_s}


def realise_checkpoint(
    plan: Plan,
    folder: str | Path,
    *,
    timeout_s: float = 30.0,
    start_timeout_s: float = 180.0,
    extra_env: Mapping[str, str] | None = None,
) -> Realisation:
    """Start one :class:`StageWorker` per stage of ``plan`` on its node, reading ``folder``.

    The plan is checked first (:func:`stowplan.runtime.families.check_runnable`):
    nothing starts for a plan the worker cannot execute.  ``folder`` must be
    readable at the same path on every node.

    Raises:
        UnsupportedByWorker: the family, a stage's tensor parallel, or expert
            parallel experts (nothing is started).
        StageUnplaceable, StageStartError: as :func:`stowplan.cluster.realise.realise`.
    """
    folder = Path(folder).resolve()
    check_runnable(plan, read_config(folder))
    ray = require_ray()
    return realise(
        plan,
        ray.remote(StageWorker),
        actor_args=(str(folder),),
        timeout_s=timeout_s,
        start_timeout_s=start_timeout_s,
        extra_env={**OFFLINE_ENV, **(extra_env or {})},
    )


def split_microbatches(num_sequences: int, num_stages: int) -> list[range]:
    """The sequences of each of the ``m = min(U, S)`` microbatches, sizes as even as can be
    (the largest ``⌈U / m⌉``, as the cost model charges)."""
    check_int("num_sequences", num_sequences, minimum=1)
    m = min(num_sequences, num_stages)
    bounds = [i * num_sequences // m for i in range(m + 1)]
    return [range(bounds[i], bounds[i + 1]) for i in range(m)]


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineRun:
    """A distributed generation: each sequence's tokens, the timings, each stage's report."""

    generations: tuple[Generation, ...]
    ttft_s: float
    """Seconds from the first call to every sequence's first token being back."""
    wall_s: float
    """Seconds from the first call to the last token of every sequence."""
    stages: tuple[dict[str, Any], ...]
    """Each stage's :meth:`StageWorker.info` with its ``steps`` and ``busy_s``."""

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens of all sequences after their first, per second after the first token."""
        tokens = sum(len(g.tokens) - 1 for g in self.generations)
        span = self.wall_s - self.ttft_s
        return tokens / span if tokens and span > 0 else float("nan")


def run_generation(
    actors: Sequence[Any],
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    timeout_s: float = 300.0,
) -> PipelineRun:
    """Generate ``max_new_tokens`` greedy tokens after each prompt through the stage actors.

    The prompts of one microbatch (:func:`split_microbatches`) must have one length.

    Raises:
        InputError: no prompt, an empty prompt, prompts of one microbatch of different
            lengths, or ``max_new_tokens < 1``.
    """
    import numpy as np

    ray = require_ray()
    check_int("max_new_tokens", max_new_tokens, minimum=1)
    if not prompts or any(not p for p in prompts):
        raise InputError("prompts", len(prompts), "must be one or more non-empty token lists")
    groups = split_microbatches(len(prompts), len(actors))
    for g in groups:
        lengths = sorted({len(prompts[i]) for i in g})
        if len(lengths) > 1:
            raise InputError(
                "prompts", lengths, "must have one length within a microbatch (no padding)"
            )
    deadline = time.monotonic() + timeout_s

    def left() -> float:
        return max(0.1, deadline - time.monotonic())

    ray.get([a.reset.remote() for a in actors], timeout=left())

    def through(mb: int, x: Any) -> Any:
        for actor in actors:
            x = actor.step.remote(mb, x)
        return x

    start = time.perf_counter()
    outputs = [[through(mb, [list(prompts[i]) for i in g])] for mb, g in enumerate(groups)]
    for _ in range(max_new_tokens - 1):
        for mb, out in enumerate(outputs):
            out.append(through(mb, out[-1]))
    ray.get([out[0] for out in outputs], timeout=left())
    ttft = time.perf_counter() - start
    results = ray.get([out for mb in outputs for out in mb], timeout=left())
    wall = time.perf_counter() - start
    infos = ray.get([a.info.remote() for a in actors], timeout=left())
    stats = ray.get([a.stats.remote() for a in actors], timeout=left())
    generations: list[Generation] = []
    k = 0
    for g in groups:
        steps = results[k : k + max_new_tokens]
        k += max_new_tokens
        for row in range(len(g)):
            generations.append(
                Generation(
                    tokens=tuple(int(s["tokens"][row]) for s in steps),
                    logits=np.stack([s["logits"][row].numpy() for s in steps]),
                )
            )
    return PipelineRun(
        generations=tuple(generations),
        ttft_s=ttft,
        wall_s=wall,
        stages=tuple(info | s for info, s in zip(infos, stats, strict=True)),
    )
