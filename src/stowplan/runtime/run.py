"""``stowplan run`` as a library call: plan a checkpoint, run it on Ray, set it against the model.

:func:`plan_checkpoint` plans a checkpoint folder for a request (KV reserved for the
prompt plus the new tokens, ``U`` concurrent sequences, one GPU per stage, MoE experts
block-local) and checks the worker can execute the plan.  :func:`predicted_ttft_s` is
the cost model's prefill term for it.  :func:`run_checkpoint` realises the plan
(:func:`stowplan.runtime.pipeline.realise_checkpoint`), generates, releases the
stages, and, with ``check``, generates again in one process with ``transformers``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from stowplan.cost import microbatches, node_rates, predict
from stowplan.errors import InputError
from stowplan.model import Constraints, ModelLayout, NodeDescriptor
from stowplan.models import resolve_model
from stowplan.plan import Plan, Prediction
from stowplan.planner import plan as make_plan
from stowplan.planner.experts import ExpertInputs, ExpertPlacement
from stowplan.quantities.checks import check_int
from stowplan.runtime.checkpoint import read_config
from stowplan.runtime.families import check_runnable, family_of
from stowplan.runtime.generation import Comparison, compare, generate_reference
from stowplan.runtime.pipeline import PipelineRun, realise_checkpoint, run_generation

__all__ = ["RunReport", "plan_checkpoint", "predicted_ttft_s", "run_checkpoint", "tokenize"]


def plan_checkpoint(
    folder: str | Path,
    nodes: Sequence[NodeDescriptor],
    *,
    prompt_tokens: int,
    max_new_tokens: int,
    batch: int = 1,
    constraints: Constraints | None = None,
) -> tuple[ModelLayout, Plan]:
    """The checkpoint's layout and a plan of it on ``nodes`` the worker can execute.

    ``constraints`` (default: none) gets ``batch``, ``context_tokens = prompt_tokens +
    max_new_tokens`` and ``tensor_parallel = 1``.

    Raises:
        UnsupportedByWorker: the family is not one the worker runs.
        PlanError: the nodes cannot hold it (the planner's error).
    """
    check_int("prompt_tokens", prompt_tokens, minimum=1)
    check_int("max_new_tokens", max_new_tokens, minimum=1)
    check_int("batch", batch, minimum=1)
    config = read_config(folder)
    family_of(config)  # refuse an unknown family before planning
    layout = resolve_model(str(Path(folder)))
    asked = replace(
        constraints or Constraints(),
        batch=batch,
        context_tokens=prompt_tokens + max_new_tokens,
        tensor_parallel=1,
    )
    experts = ExpertInputs(placement=ExpertPlacement.BLOCK_LOCAL) if layout.experts else None
    result = make_plan(layout, nodes, asked, experts=experts)
    check_runnable(result, config)
    return layout, result


def predicted_ttft_s(
    layout: ModelLayout, nodes: Sequence[NodeDescriptor], plan: Plan, prompt_tokens: int, batch: int
) -> float:
    """Seconds to the first token of all ``batch`` sequences (DESIGN, the prefill term).

    Per microbatch of ``b`` sequences of ``P`` tokens, stage ``s`` takes
    ``pre(s) = max(W_s / BW, (2·params_s·P·b + 2·k_s·P²·hidden·b + [last] 2·head·b) / F)
    + [s < N-1] P·b·hidden·act / link`` (``W_s`` its weight bytes, ``k_s`` its blocks;
    the head runs on the last position only); ``m`` microbatches are in the pipeline at
    once: ``TTFT = Σ pre(s) + hops + (m − 1) · max pre(s)``.
    """
    by_id = {n.id: n for n in nodes}
    m, b = microbatches(batch, plan.num_stages)
    per_byte = (layout.total_params or layout.weight_bytes) / max(1, layout.weight_bytes)
    sizes = layout.block_sizes()
    p = prompt_tokens
    pre: list[float] = []
    hops = 0.0
    for a in plan.assignments:
        rates, _ = node_rates(by_id[a.node_id], 0.0)
        lo, hi = a.block_range
        weights = sum(sizes[lo:hi]) + (layout.head_params_bytes if a.owns_head else 0)
        head = layout.head_params_bytes * per_byte if a.owns_head else 0.0
        flops = (
            2 * sum(sizes[lo:hi]) * per_byte * p * b
            + 2 * (hi - lo) * p * p * layout.hidden_dim * b
            + 2 * head * b
        )
        t = max(weights / rates.bandwidth_bytes_per_s, flops / rates.flops_per_s)
        if a.stage < plan.num_stages - 1:
            t += (
                p
                * b
                * layout.hidden_dim
                * layout.bytes_per_activation_elem
                / rates.link_bytes_per_s
            )
            hops += rates.latency_s
        pre.append(t)
    return sum(pre) + hops + (m - 1) * max(pre)


def tokenize(folder: str | Path, text: str) -> list[int]:
    """``text`` as token ids of the checkpoint's own tokenizer (from its folder, offline)."""
    tok = _tokenizer(folder)
    ids = [int(i) for i in tok(text)["input_ids"]]
    if not ids:
        raise InputError("--prompt", text, "must give at least one token")
    return ids


def _tokenizer(folder: str | Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise InputError(
            "CHECKPOINT", str(folder), f"has no tokenizer transformers can load ({exc})"
        ) from None


def detokenize(folder: str | Path, ids: Sequence[int]) -> str:
    """Token ids back to text with the checkpoint's tokenizer."""
    return str(_tokenizer(folder).decode(list(ids), skip_special_tokens=False))


@dataclass(frozen=True, slots=True, kw_only=True)
class RunReport:
    """One ``stowplan run``: the plan, what was predicted, what ran, and the check."""

    plan: Plan
    prompt: tuple[int, ...]
    run: PipelineRun
    prediction: Prediction
    """The cost model's decode prediction at ``batch`` sequences."""
    predicted_ttft_s: float
    comparison: Comparison | None
    """Against one process (None: not asked)."""

    @property
    def batch(self) -> int:
        return len(self.run.generations)


def run_checkpoint(
    folder: str | Path,
    nodes: Sequence[NodeDescriptor],
    prompt: Sequence[int],
    max_new_tokens: int,
    *,
    batch: int = 1,
    constraints: Constraints | None = None,
    check: bool = False,
    timeout_s: float = 30.0,
) -> RunReport:
    """Plan ``folder`` on ``nodes`` (their ids are the Ray node ids), run ``batch`` copies of
    ``prompt`` through the stages on the connected Ray cluster, release them.

    Raises:
        UnsupportedByWorker: a family or plan the worker cannot execute (nothing starts).
        PlanError: the nodes cannot hold the model.
        StageUnplaceable, StageStartError: the stages did not start.
    """
    layout, result = plan_checkpoint(
        folder,
        nodes,
        prompt_tokens=len(prompt),
        max_new_tokens=max_new_tokens,
        batch=batch,
        constraints=constraints,
    )
    asked = replace(
        constraints or Constraints(),
        batch=batch,
        context_tokens=len(prompt) + max_new_tokens,
        tensor_parallel=1,
    )
    prediction = predict(layout, nodes, asked, result)
    with realise_checkpoint(result, folder, timeout_s=timeout_s) as stages:
        run = run_generation(
            stages.actors,
            [list(prompt)] * batch,
            max_new_tokens,
            timeout_s=max(300.0, timeout_s * 10),
        )
    comparison = None
    if check:
        reference = generate_reference(folder, prompt, max_new_tokens)
        worst = [compare(g, reference) for g in run.generations]
        comparison = next((c for c in worst if not c.match), worst[0])
    return RunReport(
        plan=result,
        prompt=tuple(prompt),
        run=run,
        prediction=prediction,
        predicted_ttft_s=predicted_ttft_s(layout, nodes, result, len(prompt), batch),
        comparison=comparison,
    )
