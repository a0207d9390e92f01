"""Every legal pipeline of the tensor-parallel referee's small instances, for the tests
that check the GPU-group bounds against them."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import replace

from stowplan import Constraints, PlanError
from stowplan.planner.problem import Problem, prepare
from tests.common import tp_referee as tp


def referee_cases(
    seeds: range = range(16), small_first: bool = False
) -> Iterator[tuple[tp.Instance, tp.Spec, Problem, int]]:
    """The referee's instances of 3–4 blocks on 2–3 nodes of 1–8 GPUs that plan: each
    with its spec, problem and most stages (GPUs or blocks).  With ``small_first``, the
    first block (of four, the first one or two) shrinks to a tenth to two fifths of its
    size, as a model's dense blocks before its MoE blocks."""
    for seed in seeds:
        inst = tp.draw(seed, max_blocks=4)
        if small_first:
            inst = _small_first(inst)
        spec = inst.spec("throughput")
        c = Constraints(batch=spec.batch, context_tokens=inst.context_tokens)
        try:
            problem = prepare(inst.model, inst.nodes, c)
        except PlanError:
            continue
        top = min(sum(n.num_gpus for n in problem.nodes), problem.model.num_blocks)
        yield inst, spec, problem, top


def pipelines_with_layouts(spec: tp.Spec, top: int) -> Iterator[tuple[int, tp.Layout, tp.Score]]:
    """(stage count, layout, score at that count's microbatch) of every legal pipeline:
    every sequence of (node, degree) stages within the nodes' GPUs, every contiguous split."""
    nb = spec.nb
    items = [(d, t) for d in range(len(spec.nodes)) for t in spec.degrees(d)]
    for count in range(1, min(top, nb) + 1):
        for seq in itertools.product(items, repeat=count):
            used = [0] * len(spec.nodes)
            for d, t in seq:
                used[d] += t
            if any(u > n.gpus for u, n in zip(used, spec.nodes, strict=True)):
                continue
            for cuts in itertools.combinations(range(1, nb), count - 1):
                layout = tp.Layout(tuple(seq), (0, *cuts, nb))
                if not tp.violations(spec, layout):
                    yield count, layout, tp.score(spec, layout)


def _small_first(inst: tp.Instance) -> tp.Instance:
    """``inst`` with its first blocks shrunk (:func:`referee_cases`)."""
    rng = random.Random(f"small-first-{inst.seed}")
    m = inst.model
    sizes = list(m.block_bytes or (m.block_params_bytes,) * m.num_blocks)
    small = rng.randint(1, max(1, m.num_blocks - 2))
    for b in range(small):
        sizes[b] = 2 * int(sizes[b] * rng.uniform(0.1, 0.4) / 2)
    total = sum(sizes) + m.head_params_bytes + m.embed_params_bytes
    model = replace(
        m,
        block_bytes=tuple(sizes),
        block_params_bytes=round(sum(sizes) / m.num_blocks),
        total_params=total // 2,
        active_params=total // 2,
    )
    return replace(inst, model=model)
