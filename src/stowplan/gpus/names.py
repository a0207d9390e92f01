"""GPU names as the tools print them, reduced to one comparable form.

nvidia-smi prints ``NVIDIA GeForce RTX 4090`` and ``NVIDIA A100-SXM4-80GB``, vast.ai
``RTX 4090`` and ``Q RTX 8000``, Ray ``A100-80G`` and ``AMD-Instinct-MI300X-OAM``,
rocm-smi ``AMD Instinct MI300X OAM``, TechPowerUp ``GeForce RTX 3050 8 GB``; the summary
table of nvidia-smi cuts long names (``NVIDIA RTX 6000 Ada Gene...``).  :func:`parse_gpu_name`
turns each into a key without vendor words, punctuation or memory size, and the memory
size the name states, if any.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["OTHER_PART", "ParsedName", "normalise_gpu_name", "parse_gpu_name"]

_DROP = re.compile(
    r"\b(nvidia|geforce|amd|ati|radeon|tesla|instinct|apple|quadro|intel|"
    r"generation|edition|workstation|graphics|gpu|vram|card|data center)\b"
)
_GLUED_SUFFIX = re.compile(r"(\d)(ada|ti|super|xtx|xt|gb|gib|g)\b")
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)(?:gb|gib|g)$")

OTHER_PART = frozenset(
    {"ti", "super", "max", "maxq", "laptop", "mobile", "ultra", "pro", "xt", "xtx", "gre"}
)
"""Words that, after a known name, make another part (``RTX 4080 SUPER``, ``M2 Ultra``,
``RTX 4090 Laptop``), never a variant of the same one."""


def normalise_gpu_name(name: str) -> str:
    """Lower-case, vendor words dropped, separators collapsed: ``'NVIDIA GeForce RTX 4090'``
    → ``'rtx 4090'``; ``'H100-80GB-HBM3'`` → ``'h100 80gb hbm3'``; ``'RTX 6000Ada'`` →
    ``'rtx 6000 ada'``; ``'Max-Q'`` → ``'maxq'``; ``'Laptop GPU'`` → ``'mobile'`` (TechPowerUp's
    word for it)."""
    s = name.lower().replace("max-q", "maxq").replace("laptop", "mobile")
    s = re.sub(r"[^a-z0-9.]+", " ", s)
    s = re.sub(r"(?<!\d)\.|\.(?!\d)", " ", s)  # keep decimal points only
    s = _GLUED_SUFFIX.sub(r"\1 \2", s)
    s = re.sub(r"\b(rtx|gtx|rx)(?=\d)", r"\1 ", s)
    s = re.sub(r"\b(\d+(?:\.\d+)?) (gb|gib|g)\b", r"\1gb", s)
    s = _DROP.sub(" ", s)
    words = s.split()
    if len(words) > 1 and words[0] == "q" and words[1] == "rtx":
        words = words[1:]  # vast.ai's "Q RTX 8000" is the Quadro RTX 8000
    return " ".join(words)


@dataclass(frozen=True, slots=True)
class ParsedName:
    """A GPU name as a lookup key, and the memory it states."""

    key: str
    """Normalised name without memory sizes: ``'a100 sxm4'`` for ``A100-SXM4-80GB``."""
    memory_gb: float | None
    """The first memory size the name states (``80`` for ``80GB``), None when none."""
    truncated: bool = False
    """The name was cut short (``...``): any known name it starts may be meant."""


def parse_gpu_name(name: str) -> ParsedName:
    """The lookup key and stated memory of ``name``.

    A MIG slice (``H100 80GB HBM3 MIG 1g.10gb``) is read as its GPU; a name cut short by
    nvidia-smi (ending ``...``) loses its last, partial word.
    """
    raw = name.strip()
    truncated = raw.endswith("...")
    head = raw.removesuffix("...")
    words = normalise_gpu_name(head).split()
    if truncated and len(words) > 1 and not head.endswith(" "):
        words = words[:-1]  # the last word is cut: "Ada Gene..."
    if "mig" in words:
        words = words[: words.index("mig")]
    memory: float | None = None
    kept = []
    for w in words:
        m = _MEMORY.match(w)
        if m:
            if memory is None:
                memory = float(m.group(1))
            continue
        kept.append(w)
    return ParsedName(key=" ".join(kept), memory_gb=memory, truncated=truncated)
