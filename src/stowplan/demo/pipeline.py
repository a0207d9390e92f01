"""The demo model run stage by stage across Ray actors, checked against one process.

Each :class:`StageWorker` actor reads its share from its environment through
the worker contract (:func:`stowplan.stages.worker.stage_from_env`) and builds only
its own blocks (plus the embed or head when it owns them).  The driver chains
the calls: stage i's output object is the argument of stage i+1, so
activations travel stage to stage through Ray; the last stage samples
greedily and its output object is the argument of stage 0's next call, so the
token goes back to stage 0 without passing through the driver.  The driver
only fetches the last stage's logits at the end.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from stowplan.cluster.ray_runtime import require_ray
from stowplan.demo.model import DemoConfig, Generation, StageModel, check_request
from stowplan.stages.worker import CONTRACT_KEYS, stage_from_env

__all__ = [
    "PipelineRun",
    "StageStats",
    "StageWorker",
    "compare",
    "run_pipeline",
    "stage_worker_class",
]


class StageWorker:
    """One pipeline stage of the demo model (run as a Ray actor)."""

    def __init__(self, config: dict[str, int]) -> None:
        import ray

        self.config = DemoConfig(**config)
        self.stage = stage_from_env(os.environ, num_blocks=self.config.num_blocks)
        self.model = StageModel.load(
            self.config, self.stage.block_range, self.stage.owns_embed, self.stage.owns_head
        )
        self.node_id = ray.get_runtime_context().get_node_id()
        self.busy_s = 0.0
        self.steps = 0

    def info(self) -> dict[str, Any]:
        """Where this stage runs, what it resolved, and the contract env it saw."""
        return self.stage.placement_info(self.node_id) | {
            "num_stages": self.stage.num_stages,
            "weight_bytes": self.model.weight_bytes,
            "env": {k: os.environ[k] for k in CONTRACT_KEYS if k in os.environ},
        }

    def reset(self) -> None:
        self.model.reset()
        self.busy_s = 0.0
        self.steps = 0

    def step(self, x: Any) -> Any:
        """One position: a token id / the last stage's output (stage 0) or activations."""
        t0 = time.perf_counter()
        if isinstance(x, dict):
            x = x["token"]
        y = self.model.step(x)
        out: Any = {"token": int(np.argmax(y)), "logits": y} if self.stage.owns_head else y
        self.busy_s += time.perf_counter() - t0
        self.steps += 1
        return out

    def stats(self) -> dict[str, float]:
        return {"steps": self.steps, "busy_s": self.busy_s}


def stage_worker_class() -> Any:
    """:class:`StageWorker` as a Ray actor class."""
    ray = require_ray()
    return ray.remote(StageWorker)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageStats:
    """What one stage did during a run."""

    stage: int
    node_id: str
    block_range: tuple[int, int]
    weight_bytes: int
    steps: int
    busy_s: float
    """Seconds spent computing (excludes waiting for inputs)."""

    @property
    def tokens_per_s(self) -> float:
        """Positions per second of compute this stage sustains on its own."""
        return self.steps / self.busy_s if self.busy_s > 0 else float("inf")


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineRun:
    """A distributed generation: the result, each stage's numbers, the wall time."""

    generation: Generation
    stages: tuple[StageStats, ...]
    wall_s: float
    """Seconds from the first step to the last logits, prompt included."""

    @property
    def tokens_per_s(self) -> float:
        return len(self.generation.tokens) / self.wall_s if self.wall_s > 0 else float("inf")


def run_pipeline(
    actors: Sequence[Any],
    config: DemoConfig,
    prompt: Sequence[int],
    num_tokens: int,
    *,
    timeout_s: float = 60.0,
) -> PipelineRun:
    """Generate ``num_tokens`` greedily through the stage actors (stage order)."""
    ray = require_ray()
    check_request(config, prompt, num_tokens)
    deadline = time.monotonic() + timeout_s
    ray.get([a.reset.remote() for a in actors], timeout=timeout_s)
    start = time.perf_counter()

    def through(x: Any) -> Any:
        for actor in actors:
            x = actor.step.remote(x)
        return x

    for token in prompt[:-1]:
        through(token)
    outputs = [through(prompt[-1])]
    for _ in range(num_tokens - 1):
        outputs.append(through(outputs[-1]))
    left = max(0.1, deadline - time.monotonic())
    results = ray.get(outputs, timeout=left)
    wall = time.perf_counter() - start
    infos = ray.get(
        [a.info.remote() for a in actors], timeout=max(0.1, deadline - time.monotonic())
    )
    stats = ray.get(
        [a.stats.remote() for a in actors], timeout=max(0.1, deadline - time.monotonic())
    )
    generation = Generation(
        tokens=tuple(int(r["token"]) for r in results),
        logits=np.stack([np.asarray(r["logits"], dtype=np.float32) for r in results]),
    )
    return PipelineRun(
        generation=generation,
        stages=tuple(
            StageStats(
                stage=int(info["stage"]),
                node_id=str(info["node_id"]),
                block_range=(int(info["block_range"][0]), int(info["block_range"][1])),
                weight_bytes=int(info["weight_bytes"]),
                steps=int(s["steps"]),
                busy_s=float(s["busy_s"]),
            )
            for info, s in zip(infos, stats, strict=True)
        ),
        wall_s=wall,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """Distributed against single-process generation."""

    tokens_match: bool
    max_abs_logit_diff: float
    tolerance: float

    @property
    def match(self) -> bool:
        return self.tokens_match and self.max_abs_logit_diff <= self.tolerance


def compare(
    distributed: Generation, reference: Generation, *, tolerance: float = 1e-4
) -> Comparison:
    """Token ids must be identical; logits equal within ``tolerance`` (absolute)."""
    tokens_match = distributed.tokens == reference.tokens
    if distributed.logits.shape != reference.logits.shape:
        diff = float("inf")
    else:
        diff = float(np.max(np.abs(distributed.logits - reference.logits)))
    return Comparison(tokens_match=tokens_match, max_abs_logit_diff=diff, tolerance=tolerance)


def config_args(config: DemoConfig) -> dict[str, int]:
    """The constructor argument of :class:`StageWorker` for ``config``."""
    return asdict(config)
