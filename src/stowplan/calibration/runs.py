"""The published decode runs a profile was fitted to, carried in the profile itself.

A shipped profile lists, under ``runs``, every published batch-1 decode run it
was fitted to and the runs of its engine kept on record but left out of the fit
(``excluded`` says why).  Each run holds what the cost model needs to predict it
(bytes read per token, blocks, hops, GPUs, one GPU's peak bandwidth, dtype) and
what tells its kind apart (dense or mixture-of-experts, the attention, the
expert-parallel degree, the batch), so a plan can be checked against the data
behind its prediction (:mod:`.coverage`).  JSON, per run::

    {"engine": "vllm", "family": "h100-sxm", "gpu_name": "NVIDIA H100 80GB HBM3",
     "model": "meta-llama/Llama-3.1-8B-Instruct", "dtype": "fp16",
     "tokens_per_s": 154.32, "read_bytes": 15035..., "num_blocks": 32, "hops": 0,
     "tensor_parallel": 1, "expert_parallel": 1, "moe": false, "attention": "gqa",
     "batch": 1, "bandwidth_gbps": 3350, "held_out_tokens_per_s": 101.6,
     "source": "...", "excluded": ""}

This module is pure: it validates already-parsed data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stowplan.errors import InputError
from stowplan.quantities.checks import check_int, check_number

__all__ = ["ATTENTION_KINDS", "PublishedRun", "run_from_dict", "run_to_dict"]

ATTENTION_KINDS = ("gqa", "mla")
"""``gqa``: multi-head or grouped-query attention; ``mla``: multi-head latent attention."""

_KEYS = (
    "engine",
    "family",
    "gpu_name",
    "model",
    "dtype",
    "tokens_per_s",
    "read_bytes",
    "num_blocks",
    "hops",
    "tensor_parallel",
    "expert_parallel",
    "moe",
    "attention",
    "batch",
    "bandwidth_gbps",
    "held_out_tokens_per_s",
    "source",
    "excluded",
)
_REQUIRED = {
    "engine",
    "family",
    "gpu_name",
    "model",
    "dtype",
    "tokens_per_s",
    "read_bytes",
    "num_blocks",
    "bandwidth_gbps",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishedRun:
    """One published decode run: its setup, its measured speed and where it was read."""

    engine: str
    """The engine that ran it (``llamacpp``, ``vllm``, … ; ``generic``: compiled PyTorch);
    a profile checks it names an :class:`~stowplan.calibration.profile.Engine`."""
    family: str
    """The GPU family key a profile entry is fitted under (``a100-80gb``)."""
    gpu_name: str
    model: str
    dtype: str
    tokens_per_s: float
    """Measured decode speed of one request (batch 1: one stream)."""
    read_bytes: int
    """Bytes one decoded token reads as the cost model counts them (blocks and head)."""
    num_blocks: int
    hops: int = 0
    """Pipeline-stage hops a token crosses (a layer split over a host's GPUs)."""
    tensor_parallel: int = 1
    """GPUs every block is split over."""
    expert_parallel: int = 1
    """GPUs a layer's experts are spread over (1: every GPU holds a share of every expert)."""
    moe: bool = False
    """Mixture-of-experts model (a token reads fewer parameters than the model holds)."""
    attention: str = "gqa"
    """One of :data:`ATTENTION_KINDS`."""
    batch: int = 1
    bandwidth_gbps: float
    """One GPU's datasheet peak memory bandwidth, GB/s."""
    held_out_tokens_per_s: float | None = None
    """What the profile's fitting predicts for the run with the run held out of the fit
    (leave-one-out); for a run kept out of the fit, the profile's own prediction.  None:
    not recorded (:mod:`.coverage` then uses the profile's prediction)."""
    source: str = ""
    excluded: str = ""
    """Why the run is kept on record but left out of the fit ("" for a fitted run)."""

    def __post_init__(self) -> None:
        where = f"runs[{self.model!r}]"
        for name in ("engine", "family", "gpu_name", "model", "dtype"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise InputError(f"{where}.{name}", value, "must be a non-empty string")
        for name in ("source", "excluded"):
            if not isinstance(getattr(self, name), str):
                raise InputError(f"{where}.{name}", getattr(self, name), "must be a string")
        check_number(f"{where}.tokens_per_s", self.tokens_per_s, positive=True)
        check_number(f"{where}.bandwidth_gbps", self.bandwidth_gbps, positive=True)
        if self.held_out_tokens_per_s is not None:
            check_number(
                f"{where}.held_out_tokens_per_s", self.held_out_tokens_per_s, positive=True
            )
        check_int(f"{where}.read_bytes", self.read_bytes, minimum=1)
        check_int(f"{where}.num_blocks", self.num_blocks, minimum=1)
        check_int(f"{where}.hops", self.hops)
        for name in ("tensor_parallel", "expert_parallel", "batch"):
            check_int(f"{where}.{name}", getattr(self, name), minimum=1)
        if not isinstance(self.moe, bool):
            raise InputError(f"{where}.moe", self.moe, "must be true or false")
        if self.attention not in ATTENTION_KINDS:
            raise InputError(
                f"{where}.attention", self.attention, f"must be one of {', '.join(ATTENTION_KINDS)}"
            )

    @property
    def fitted(self) -> bool:
        """Whether the profile was fitted to this run (it is not ``excluded``)."""
        return not self.excluded

    @property
    def num_gpus(self) -> int:
        """GPUs the run used: ``tensor_parallel × (hops + 1)``."""
        return self.tensor_parallel * (self.hops + 1)


def run_from_dict(data: object, where: str = "runs[]") -> PublishedRun:
    """Validate one run's JSON object into a :class:`PublishedRun`."""
    if not isinstance(data, dict):
        raise InputError(where, type(data).__name__, "must be a JSON object")
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise InputError(
            f"{where}.{unknown[0]}", data[unknown[0]], f"unknown key; allowed: {_KEYS}"
        )
    missing = sorted(_REQUIRED - set(data))
    if missing:
        raise InputError(f"{where}.{missing[0]}", None, "is required")
    return PublishedRun(**data)


def run_to_dict(run: PublishedRun) -> dict[str, Any]:
    """The run as plain JSON-compatible data (``held_out_tokens_per_s`` only when recorded)."""
    data = {key: getattr(run, key) for key in _KEYS}
    if run.held_out_tokens_per_s is None:
        del data["held_out_tokens_per_s"]
    return data
