"""Parse ``llama-bench`` output (markdown, CSV, JSON, JSONL) into results.

``llama-bench`` prints one row per test: the model (``llama 7B Q4_0``), its
size (``3.56 GiB`` / ``model_size`` bytes), parameters (``6.74 B`` /
``model_n_params``), backend, the test (``tg128``, ``pp512``, ``tg 128``,
``tg128 @ d512``, ``pp512+tg128``) and tokens/s (``132.19 ± 0.55`` /
``avg_ts``).  Markdown tables may sit inside a pasted log or thread; every
table whose header names ``model`` and ``t/s`` is read.  Pure: it parses text.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass
from typing import Any

from stowplan.errors import InputError
from stowplan.files.safeload import parse_json

__all__ = [
    "LlamaBenchResult",
    "estimate_num_blocks",
    "parse_llama_bench",
]

_UNITS = {
    "b": 1,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
}
_COUNT = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


@dataclass(frozen=True, slots=True, kw_only=True)
class LlamaBenchResult:
    """One ``llama-bench`` test result."""

    model_type: str
    """llama-bench's model description, e.g. ``llama 7B Q4_0``."""
    size_bytes: int
    n_params: int
    backend: str
    test: str
    """Normalised test name: ``tg128``, ``pp512``, ``pp512+tg128``, ``tg128@d512``."""
    n_prompt: int
    n_gen: int
    n_depth: int
    tokens_per_s: float
    stddev_tokens_per_s: float | None = None
    n_gpu_layers: int | None = None
    gpu_info: str | None = None
    """The devices, comma-separated (JSON and CSV output only)."""
    split_mode: str | None = None
    """``layer`` (pipeline over the GPUs), ``row`` (every layer split) or ``none``."""

    @property
    def gpu_names(self) -> tuple[str, ...]:
        """The devices ``gpu_info`` lists (empty when the output does not say)."""
        return tuple(g.strip() for g in (self.gpu_info or "").split(",") if g.strip())

    def layout(self, num_gpus: int | None = None) -> tuple[int, int]:
        """``(hops, tensor_parallel)`` of the run over ``num_gpus`` (default: ``gpu_info``'s count).

        Split mode ``row`` splits every layer over the GPUs (tensor parallel);
        ``layer`` (llama.cpp's default) gives each GPU a run of layers, so a
        token crosses ``num_gpus - 1`` stage hops; ``none`` runs on one GPU.
        """
        n = num_gpus if num_gpus is not None else max(len(self.gpu_names), 1)
        mode = (self.split_mode or "layer").strip().lower()
        if mode not in ("layer", "row", "none"):
            raise InputError("split_mode", self.split_mode, "must be one of layer, row, none")
        if n <= 1 or mode == "none":
            return 0, 1
        if mode == "row":
            return 0, n
        return n - 1, 1

    @property
    def dtype(self) -> str:
        """The weight type from the model description: ``llama 1B Q4_K - Medium`` → ``Q4_K_M``."""
        m = re.search(r"\d+(?:\.\d+)?[BbMm]\s+(?:mostly\s+)?(.+)$", self.model_type.strip())
        raw = m.group(1) if m else self.model_type.split()[-1]
        raw = raw.strip()
        sub = re.match(r"^(\w+)\s*-\s*(Small|Medium|Large|Extra small)$", raw, re.I)
        if sub:
            return f"{sub.group(1)}_{sub.group(2)[0].upper()}"
        return raw.replace(" ", "_")

    @property
    def is_decode(self) -> bool:
        """A pure token-generation test (``tgN``, at any depth)."""
        return self.n_gen > 0 and self.n_prompt == 0


def _size_bytes(text: str) -> int:
    m = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?i?B)\s*", text, re.I)
    if not m:
        raise ValueError(text)
    return round(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _count(text: str) -> int:
    m = re.fullmatch(r"\s*([\d.]+)\s*([KMBT]?)\s*", text, re.I)
    if not m:
        raise ValueError(text)
    return round(float(m.group(1)) * _COUNT[m.group(2).lower()])


def _test(text: str) -> tuple[str, int, int, int]:
    """``tg 128`` / ``pp512+tg128`` / ``tg128 @ d512`` → (name, n_prompt, n_gen, n_depth)."""
    t = re.sub(r"\s+", "", text.lower())
    m = re.fullmatch(r"(?:pp(\d+))?\+?(?:tg(\d+))?(?:@d(\d+))?", t)
    if not m or not (m.group(1) or m.group(2)):
        raise ValueError(text)
    pp, tg, depth = (int(g) if g else 0 for g in m.groups())
    return t, pp, tg, depth


def _ts(text: str) -> tuple[float, float | None]:
    m = re.fullmatch(r"\s*([\d.]+)\s*(?:±\s*([\d.]+))?\s*", text)
    if not m:
        raise ValueError(text)
    return float(m.group(1)), float(m.group(2)) if m.group(2) else None


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _parse_markdown(text: str) -> list[LlamaBenchResult]:
    out: list[LlamaBenchResult] = []
    header: list[str] | None = None
    for line in text.splitlines():
        s = line.strip()
        if not s.startswith("|"):
            header = None
            continue
        cells = _cells(s)
        lowered = [c.lower() for c in cells]
        if "model" in lowered and "t/s" in lowered and "test" in lowered:
            header = lowered
            continue
        if header is None or all(re.fullmatch(r":?-+:?", c) for c in cells if c):
            continue
        if len(cells) != len(header):
            continue
        row = dict(zip(header, cells, strict=True))
        try:
            name, pp, tg, depth = _test(row["test"])
            ts, sd = _ts(row["t/s"])
            size = _size_bytes(row["size"]) if "size" in row else 0
            params = _count(row["params"]) if "params" in row else 0
            ngl = int(row["ngl"]) if row.get("ngl", "").lstrip("-").isdigit() else None
            split = row.get("sm") or None
        except (ValueError, KeyError):
            continue
        out.append(
            LlamaBenchResult(
                model_type=row["model"],
                size_bytes=size,
                n_params=params,
                backend=row.get("backend", ""),
                test=name,
                n_prompt=pp,
                n_gen=tg,
                n_depth=depth,
                tokens_per_s=ts,
                stddev_tokens_per_s=sd,
                n_gpu_layers=ngl,
                split_mode=split,
            )
        )
    return out


def _int(obj: dict[str, Any], key: str, default: int = 0) -> int:
    v = obj.get(key, default)
    if v in (None, ""):
        return default
    return int(float(v))


def _from_record(obj: dict[str, Any], where: str) -> LlamaBenchResult:
    try:
        n_prompt, n_gen, depth = _int(obj, "n_prompt"), _int(obj, "n_gen"), _int(obj, "n_depth")
        ts = float(obj["avg_ts"])
        sd = obj.get("stddev_ts")
        parts = [f"pp{n_prompt}" if n_prompt else "", f"tg{n_gen}" if n_gen else ""]
        name = "+".join(p for p in parts if p) + (f"@d{depth}" if depth else "")
        ngl = obj.get("n_gpu_layers")
        return LlamaBenchResult(
            model_type=str(obj.get("model_type", "")),
            size_bytes=_int(obj, "model_size"),
            n_params=_int(obj, "model_n_params"),
            backend=str(obj.get("backends", obj.get("backend", ""))),
            test=name,
            n_prompt=n_prompt,
            n_gen=n_gen,
            n_depth=depth,
            tokens_per_s=ts,
            stddev_tokens_per_s=float(sd) if sd not in (None, "") else None,
            n_gpu_layers=int(ngl) if ngl not in (None, "") else None,
            gpu_info=str(obj["gpu_info"]) if obj.get("gpu_info") else None,
            split_mode=str(obj["split_mode"]) if obj.get("split_mode") else None,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(
            where, obj.get("model_type"), f"is not a llama-bench result ({exc})"
        ) from None


def partial_offload(result: LlamaBenchResult, num_blocks: int) -> str | None:
    """Why ``result`` is not a full-GPU run of a ``num_blocks``-block model, or None when it is.

    ``n_gpu_layers`` 0 ran on the CPU; 0 < ngl < ``num_blocks`` split the layers
    between GPU and CPU. A negative ngl (llama-bench's "all") or an unknown one
    counts as full offload, and so does any ngl > 0 on the Metal backend (its
    early builds, whose tables print ``ngl 1``, offloaded the whole model once
    ngl was positive).
    """
    ngl = result.n_gpu_layers
    if ngl is None or ngl < 0 or ngl >= num_blocks:
        return None
    if ngl > 0 and "metal" in result.backend.lower():
        return None
    if ngl == 0:
        return "ngl 0: ran on the CPU"
    return f"ngl {ngl} < {num_blocks} layers: partial offload"


def parse_llama_bench(text: str, *, origin: str = "llama-bench output") -> list[LlamaBenchResult]:
    """Every result in ``text`` (markdown, CSV, JSON or JSONL, detected from the content).

    Raises :class:`InputError` naming ``origin`` when nothing parses.
    """
    stripped = text.lstrip()
    results: list[LlamaBenchResult] = []
    if stripped.startswith("["):
        data = parse_json(stripped, field=origin, source=f"<{len(text)} chars>")
        if not isinstance(data, list):
            raise InputError(origin, type(data).__name__, "must be a JSON array of results")
        results = [
            _from_record(o, f"{origin}[{i}]") for i, o in enumerate(data) if isinstance(o, dict)
        ]
    elif stripped.startswith("{"):
        for i, line in enumerate(stripped.splitlines()):
            if line.strip():
                obj = parse_json(line, field=f"{origin}:{i + 1}", source=line[:40])
                if not isinstance(obj, dict):
                    raise InputError(f"{origin}:{i + 1}", line[:40], "must be a JSON object")
                results.append(_from_record(obj, f"{origin}:{i + 1}"))
    else:
        lines = text.splitlines()
        start = next((i for i, ln in enumerate(lines) if "avg_ts" in ln and "," in ln), None)
        if start is not None:
            rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
            header = rows[0]
            for i, row in enumerate(rows[1:]):
                if not row:
                    continue
                # Schemas drift between builds: a row may have more or fewer fields than
                # the header. Identity fields lead and timing fields trail, so align both ends.
                record = dict(zip(header, row, strict=False))
                tail = min(len(row), len(header)) // 2
                if len(row) != len(header) and tail:
                    record.update(zip(header[-tail:], row[-tail:], strict=True))
                results.append(_from_record(record, f"{origin}:{start + 2 + i}"))
        else:
            results = _parse_markdown(text)
    if not results:
        raise InputError(
            origin,
            f"<{len(text)} chars>",
            "contains no llama-bench results (expected its markdown table, CSV, JSON or JSONL)",
        )
    return results


# Dense decoder shapes (parameters in billions → blocks) of common open models.
_SHAPES: tuple[tuple[float, int], ...] = (
    (0.5, 24),
    (1.1, 22),
    (1.24, 16),
    (1.5, 28),
    (3.2, 28),
    (3.8, 32),
    (6.74, 32),
    (7.24, 32),
    (7.6, 28),
    (8.0, 32),
    (9.2, 42),
    (13.0, 40),
    (14.8, 48),
    (27.0, 46),
    (32.8, 64),
    (34.0, 48),
    (46.7, 32),
    (70.6, 80),
    (72.7, 80),
    (123.0, 88),
    (405.0, 126),
)


def estimate_num_blocks(n_params: int) -> int:
    """Blocks of the common dense model closest in size to ``n_params`` (an estimate).

    llama-bench does not print the block count; pass the real one when known.
    """
    if n_params <= 0:
        raise InputError("n_params", n_params, "must be > 0 to estimate the block count")
    b = n_params / 1e9
    return min(_SHAPES, key=lambda s: abs(math.log(b / s[0])))[1]
