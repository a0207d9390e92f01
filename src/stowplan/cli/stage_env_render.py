"""How ``stowplan stage-env`` prints the worker environments: text, shell or JSON.

``text`` is for reading (``PLAN_JSON`` shortened to its length); ``shell`` is
``export KEY='value'`` lines a POSIX shell can source (every value quoted,
``PLAN_JSON`` in full); ``json`` is one object per stage. ``stage`` picks one
stage, which is what a worker's shell should source. Each stage is headed by
its place (``# stage 0 on n0 gpu0-3 tp4``); ``CUDA_VISIBLE_DEVICES`` appears for
a stage that lists its GPUs, and for one on a whole node the shell's own value is
left as it is.
"""

from __future__ import annotations

import json
from enum import StrEnum

from stowplan.quantities.checks import check_choice, check_int
from stowplan.text.shell import check_env_name, shell_comment, shell_quote

__all__ = ["EnvFormat", "render_stage_env"]


class EnvFormat(StrEnum):
    """Output formats of ``stage-env``."""

    TEXT = "text"
    SHELL = "shell"
    JSON = "json"


def render_stage_env(
    envs: list[dict[str, str]],
    places: list[str],
    fmt: str | EnvFormat = EnvFormat.TEXT,
    stage: int | None = None,
) -> str:
    """The environments of every stage (or of ``stage`` only) in ``fmt``, newline-terminated;
    ``places`` name where each stage runs (its node, and GPUs when it lists them).

    Raises :class:`~stowplan.errors.InputError` for an unknown format or a
    stage the plan does not have.
    """
    form = check_choice("--format", fmt, EnvFormat, normalise=str.lower)
    chosen = list(range(len(envs)))
    if stage is not None:
        check_int("--stage", stage, minimum=0, maximum=len(envs) - 1)
        chosen = [stage]
    if form is EnvFormat.JSON:
        doc: object = envs[stage] if stage is not None else envs
        return json.dumps(doc, indent=2, sort_keys=True) + "\n"
    lines: list[str] = []
    for i in chosen:
        lines.append(shell_comment(f"stage {i} on {places[i]}"))
        for key in sorted(envs[i]):
            value = envs[i][key]
            if form is EnvFormat.SHELL:
                lines.append(f"export {check_env_name(key)}={shell_quote(value)}")
            elif key == "PLAN_JSON":
                lines.append(f"{key}=<{len(value)} bytes of plan JSON>")
            else:
                lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"
