"""Reading exported launch commands: environment, argument values, the engines' layer rule."""

from __future__ import annotations

import shlex


def engine_pp_indices(
    partition: str, num_layers: int, pp_rank: int, pp_size: int
) -> tuple[int, int]:
    """The engines' rule (vLLM and SGLang ``get_pp_indices`` with the variable set)."""
    partitions = [int(x) for x in partition.split(",")]
    if len(partitions) != pp_size:
        raise ValueError(f"{len(partitions)=} does not match {pp_size=}.")
    if sum(partitions) != num_layers:
        raise ValueError(f"{sum(partitions)=} does not match {num_layers=}.")
    start = sum(partitions[:pp_rank])
    return start, start + partitions[pp_rank]


def parse_command(line: str) -> tuple[dict[str, str], list[str]]:
    words = shlex.split(line)
    env = {}
    while "=" in words[0] and not words[0].startswith("-"):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    return env, words


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]
