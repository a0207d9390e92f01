"""What a serving fleet is asked to carry: the :class:`Workload` of ``serve()``.

A stream of requests, each a prompt of ``prompt_tokens`` answered with
``output_tokens``, under two service-level objectives: the time to the first
token (``ttft_s``) and the time per output token (``tpot_s``).  With neither
``users`` nor ``rate_per_s`` the question is "how many users does this fleet
serve"; with one of them set it is "the cheapest fleet that serves them".
A frozen value validated at construction, like :class:`~stowplan.model.Constraints`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from stowplan.errors import InputError
from stowplan.quantities.checks import check_int, check_rate
from stowplan.quantities.limits import MAX_BATCH, MAX_CONTEXT_TOKENS, MAX_RATE, MIN_RATE

__all__ = ["Binding", "Workload"]


class Binding(StrEnum):
    """What stops a serving replica from holding one more request."""

    TTFT = "ttft"
    """The time to the first token would exceed ``ttft_s``."""
    TPOT = "tpot"
    """The time per output token would exceed ``tpot_s``."""
    MEMORY = "memory"
    """Its KV cache (P + O tokens per request) would not fit beside the weights."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """Requests of ``prompt_tokens`` in and ``output_tokens`` out, under TTFT/TPOT limits."""

    prompt_tokens: int
    """Tokens of every request's prompt (P)."""
    output_tokens: int
    """Tokens of every request's answer (O)."""
    ttft_s: float
    """Longest acceptable time to the first output token, seconds."""
    tpot_s: float
    """Longest acceptable time per output token of one request, seconds (1/tpot_s is
    the tokens/s each user sees)."""
    users: int | None = None
    """Concurrent requests to serve at the cheapest price (None: serve the most)."""
    rate_per_s: float | None = None
    """Requests per second to serve at the cheapest price (None: serve the most)."""

    def __post_init__(self) -> None:
        check_int("prompt_tokens", self.prompt_tokens, minimum=1, maximum=MAX_CONTEXT_TOKENS)
        check_int("output_tokens", self.output_tokens, minimum=1, maximum=MAX_CONTEXT_TOKENS)
        if self.prompt_tokens + self.output_tokens > MAX_CONTEXT_TOKENS:
            raise InputError(
                "output_tokens",
                self.output_tokens,
                f"prompt_tokens + output_tokens must be at most {MAX_CONTEXT_TOKENS}",
            )
        for name in ("ttft_s", "tpot_s"):
            value = check_rate(name, getattr(self, name), lower=MIN_RATE, upper=MAX_RATE)
            object.__setattr__(self, name, value)
        if self.users is not None:
            check_int("users", self.users, minimum=1, maximum=MAX_BATCH)
        if self.rate_per_s is not None:
            rate = check_rate("rate_per_s", self.rate_per_s, lower=MIN_RATE, upper=MAX_RATE)
            object.__setattr__(self, "rate_per_s", rate)
        if self.users is not None and self.rate_per_s is not None:
            raise InputError(
                "rate_per_s",
                self.rate_per_s,
                f"cannot be set with users={self.users}; give one target (or neither)",
            )

    @property
    def context_tokens(self) -> int:
        """Tokens of KV one request holds at its end: P + O."""
        return self.prompt_tokens + self.output_tokens

    @property
    def mean_context_tokens(self) -> float:
        """Tokens of KV a decode step reads for one request on average: C = P + O/2."""
        return self.prompt_tokens + self.output_tokens / 2

    @property
    def has_target(self) -> bool:
        """Whether the workload asks for the cheapest fleet (users or rate set)."""
        return self.users is not None or self.rate_per_s is not None
