"""What an export produces, the engines it targets, and the refusal it raises."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from stowplan.errors import UnsupportedByEngine
from stowplan.text.shell import check_env_name, heredoc_marker, shell_comment, shell_quote

__all__ = ["Engine", "EngineExport", "UnsupportedByEngine", "shell_line"]


class Engine(StrEnum):
    """The serving engines a plan can be exported to."""

    VLLM = "vllm"
    SGLANG = "sglang"
    LLAMACPP = "llamacpp"
    ACCELERATE = "accelerate"


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineExport:
    """A plan translated into one engine's settings.

    ``env`` and ``args`` are the engine-specific settings; ``commands`` are complete
    shell lines that start the engine (one per node where each node is started on
    its own); ``files`` are files the commands read, by name; ``notes`` say what the
    engine does differently from the plan and how to keep the node order.
    """

    engine: Engine
    block_counts: tuple[int, ...]
    """Blocks per stage, in stage order, as the export encodes them."""
    env: tuple[tuple[str, str], ...] = ()
    args: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()
    files: tuple[tuple[str, str], ...] = ()
    """(file name, text) pairs, e.g. Accelerate's ``device_map.json``."""
    notes: tuple[str, ...] = ()
    data: dict[str, Any] = field(default_factory=dict)
    """Engine settings as data (Accelerate: ``device_map`` and ``max_memory``)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-compatible data."""
        return {
            "engine": self.engine.value,
            "block_counts": list(self.block_counts),
            "env": dict(self.env),
            "args": list(self.args),
            "commands": list(self.commands),
            "files": dict(self.files),
            "notes": list(self.notes),
            "data": self.data,
        }

    def render_text(self) -> str:
        """A shell-script-like text: notes as comments, then the commands and files."""
        counts = ",".join(map(str, self.block_counts))
        lines = [shell_comment(f"{self.engine.value}: blocks per stage {counts}")]
        lines += [shell_comment(note) for note in self.notes]
        for name, text in self.files:
            body = text.rstrip("\n")
            marker = heredoc_marker(body)
            lines.append(f"cat > {shell_quote(name)} <<'{marker}'")
            lines += body.splitlines()
            lines.append(marker)
        lines += list(self.commands)
        return "\n".join(lines) + "\n"


def shell_line(env: tuple[tuple[str, str], ...], argv: list[str]) -> str:
    """``K=V … prog arg …`` with every word quoted for a POSIX shell."""
    words = [f"{check_env_name(k)}={shell_quote(v)}" for k, v in env]
    words += [shell_quote(a) for a in argv]
    return " ".join(words)
