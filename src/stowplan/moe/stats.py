"""Routing statistics of a mixture-of-experts model, read from files.

Two optional inputs steer expert placement (:mod:`stowplan.planner.experts`):

* **expert load** — per MoE block, how often each routed expert was selected
  (counts or frequencies; only ratios within a block matter).
* **co-activation** — per MoE block, how often two experts were selected for
  the same token (counts of unordered pairs).

Rows are in MoE-block order (row ``i`` is the model's ``i``-th MoE block, as in
EPLB's ``weight[layers, experts]``), unless the file names the block indices.

Accepted files (the suffix decides the format):

``load.json``
    ``[[c0, c1, ...], ...]`` (one row per MoE block), or
    ``{"layers": [[...], ...]}``, or ``{"blocks": {"3": [...], "4": [...]}}``
    (keys are block indices; every MoE block must be present).
``load.npy``
    a numpy array of shape ``[layers, experts]`` (EPLB's ``weight``).
``co.json``
    ``{"layers": [[[e, f, count], ...], ...]}`` or
    ``{"blocks": {"3": [[e, f, count], ...]}}``: sparse pair counts; ``(e, f)``
    and ``(f, e)`` are the same pair and are summed.
``co.npy``
    a numpy array of shape ``[layers, experts, experts]``; the upper triangle
    plus the lower triangle give each pair's count; the diagonal is ignored.

Reading ``.npy`` needs numpy (the ``formats`` extra).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stowplan.errors import DependencyError, InputError
from stowplan.files.fileio import (
    MAX_BYTES,
    FileKind,
    check_regular_file,
    open_regular_file,
    read_json_file,
)
from stowplan.model import ExpertLayout

__all__ = [
    "CoActivation",
    "ExpertLoad",
    "coactivation_from_data",
    "expert_load_from_data",
    "load_coactivation",
    "load_expert_load",
    "zipf_load",
]

Pair = tuple[int, int, float]


def _count(where: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(where, value, "must be a finite number >= 0")
    try:
        v = float(value)
    except OverflowError:
        v = math.inf
    if not math.isfinite(v) or v < 0:
        raise InputError(where, value, "must be a finite number >= 0")
    return v


def _rows_for(
    field: str,
    num_rows: int,
    blocks: tuple[int, ...] | None,
    experts: ExpertLayout,
) -> list[int]:
    """Row index of every MoE block of ``experts``; raise when the rows do not match."""
    moe = experts.moe_blocks
    if blocks is None:
        if num_rows != len(moe):
            raise InputError(
                field,
                f"<{num_rows} rows>",
                f"must have one row per MoE block ({len(moe)}), or name the blocks",
            )
        return list(range(num_rows))
    index = {b: i for i, b in enumerate(blocks)}
    missing = [b for b in moe if b not in index]
    if missing:
        raise InputError(f"{field}.blocks", missing[0], "is a MoE block with no statistics")
    extra = sorted(set(blocks) - set(moe))
    if extra:
        raise InputError(f"{field}.blocks", extra[0], "is not a MoE block of the model")
    return [index[b] for b in moe]


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertLoad:
    """Per MoE block, a selection count (or frequency) per routed expert."""

    rows: tuple[tuple[float, ...], ...]
    blocks: tuple[int, ...] | None = None
    """Block index of each row; None: row ``i`` is the ``i``-th MoE block."""

    def __post_init__(self) -> None:
        rows = tuple(
            tuple(_count(f"expert_load[{i}][]", v) for v in r) for i, r in enumerate(self.rows)
        )
        object.__setattr__(self, "rows", rows)
        if not rows:
            raise InputError("expert_load", "<0 rows>", "must have one row per MoE block")
        if self.blocks is not None:
            object.__setattr__(self, "blocks", tuple(self.blocks))
            if len(self.blocks) != len(rows):
                raise InputError("expert_load.blocks", self.blocks, "must name one block per row")

    def per_block(self, experts: ExpertLayout) -> tuple[tuple[float, ...], ...]:
        """One row of ``num_experts`` non-negative weights per MoE block, in block order.

        A row of zeros (an unused block) is read as uniform routing.
        """
        order = _rows_for("expert_load", len(self.rows), self.blocks, experts)
        out = []
        for i, r in enumerate(order):
            row = self.rows[r]
            if len(row) != experts.num_experts:
                raise InputError(
                    f"expert_load[{i}]",
                    f"<{len(row)} experts>",
                    f"must have num_experts={experts.num_experts} values",
                )
            out.append(row if sum(row) > 0 else (1.0,) * experts.num_experts)
        return tuple(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class CoActivation:
    """Per MoE block, sparse counts of expert pairs selected for the same token."""

    rows: tuple[tuple[Pair, ...], ...]
    """Per row: ``(e, f, count)`` with ``e < f``, each pair once, sorted."""
    blocks: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        rows = []
        for i, raw in enumerate(self.rows):
            merged: dict[tuple[int, int], float] = {}
            for j, item in enumerate(raw):
                where = f"coactivation[{i}][{j}]"
                if not isinstance(item, Sequence) or len(item) != 3:
                    raise InputError(where, item, "must be [expert, expert, count]")
                e, f, c = item
                for x in (e, f):
                    if isinstance(x, bool) or not isinstance(x, int) or x < 0:
                        raise InputError(where, item, "experts must be integers >= 0")
                if e == f:
                    continue
                key = (min(e, f), max(e, f))
                merged[key] = merged.get(key, 0.0) + _count(where, c)
            rows.append(tuple((e, f, c) for (e, f), c in sorted(merged.items()) if c > 0))
        object.__setattr__(self, "rows", tuple(rows))
        if self.blocks is not None:
            object.__setattr__(self, "blocks", tuple(self.blocks))
            if len(self.blocks) != len(rows):
                raise InputError("coactivation.blocks", self.blocks, "must name one block per row")

    def per_block(self, experts: ExpertLayout) -> tuple[tuple[Pair, ...], ...]:
        """The pair counts of every MoE block, in block order; expert indices checked."""
        order = _rows_for("coactivation", len(self.rows), self.blocks, experts)
        out = []
        for i, r in enumerate(order):
            row = self.rows[r]
            for e, f, _ in row:
                if f >= experts.num_experts:
                    raise InputError(
                        f"coactivation[{i}]",
                        (e, f),
                        f"expert indices must be < num_experts={experts.num_experts}",
                    )
            out.append(row)
        return tuple(out)


# -- parsing ----------------------------------------------------------------------------


def _rows_and_blocks(field: str, data: object) -> tuple[list[Any], tuple[int, ...] | None]:
    if isinstance(data, list):
        return data, None
    if isinstance(data, dict):
        if "layers" in data and isinstance(data["layers"], list):
            return data["layers"], None
        if "blocks" in data and isinstance(data["blocks"], dict):
            items = []
            for key, row in data["blocks"].items():
                try:
                    block = int(key)
                except ValueError:
                    raise InputError(f"{field}.blocks", key, "keys must be block indices") from None
                items.append((block, row))
            items.sort(key=lambda kv: kv[0])
            return [row for _, row in items], tuple(b for b, _ in items)
    raise InputError(
        field, type(data).__name__, 'must be a list of rows, {"layers": [...]} or {"blocks": {...}}'
    )


def expert_load_from_data(data: object) -> ExpertLoad:
    """An :class:`ExpertLoad` from parsed JSON (see the module docstring)."""
    rows, blocks = _rows_and_blocks("expert_load", data)
    for i, row in enumerate(rows):
        if not isinstance(row, list):
            raise InputError(f"expert_load[{i}]", row, "must be a list of numbers")
    return ExpertLoad(rows=tuple(tuple(r) for r in rows), blocks=blocks)


_PAIRS_SHAPE = "per MoE block a list of [expert, expert, count] triples"


def coactivation_from_data(data: object) -> CoActivation:
    """A :class:`CoActivation` from parsed JSON (see the module docstring)."""
    rows, blocks = _rows_and_blocks("coactivation", data)
    for i, row in enumerate(rows):
        if not isinstance(row, list):
            raise InputError(f"coactivation[{i}]", row, f"must be a list; expected {_PAIRS_SHAPE}")
        for j, pair in enumerate(row):
            if not isinstance(pair, list) or len(pair) != 3:
                raise InputError(
                    f"coactivation[{i}][{j}]",
                    pair,
                    f"must be [expert, expert, count]; expected {_PAIRS_SHAPE}",
                )
    return CoActivation(rows=tuple(tuple(tuple(p) for p in r) for r in rows), blocks=blocks)


def _read_npy(field: str, path: Path, ndim: int) -> Any:
    try:
        import numpy as np
    except ImportError:
        raise DependencyError("numpy", "formats") from None
    size = check_regular_file(path, field=field).st_size
    if size > MAX_BYTES[FileKind.EXPERT_STATS]:
        raise InputError(
            field,
            str(path),
            f"is larger than {MAX_BYTES[FileKind.EXPERT_STATS] // 2**20} MiB, the most an "
            f"{FileKind.EXPERT_STATS.value} file may be",
        )
    try:
        with open_regular_file(path, field=field) as fh:
            array = np.load(fh, allow_pickle=False)
    except OSError as exc:
        raise InputError(field, str(path), f"cannot be read ({exc})") from None
    except ValueError as exc:
        raise InputError(field, str(path), f"is not a numpy .npy array ({exc})") from None
    square = ndim == 2 or array.ndim != 3 or array.shape[1] == array.shape[2]
    if array.ndim != ndim or array.dtype.kind not in "iuf" or not square:
        shape = "[layers, experts]" if ndim == 2 else "[layers, experts, experts]"
        raise InputError(
            field,
            f"<{array.dtype} array of shape {list(array.shape)}>",
            f"must be a numeric array of shape {shape} (file {path})",
        )
    return array


def _in_file(path: Path, error: InputError) -> InputError:
    """``error`` with the file it came from named in its rule."""
    return InputError(error.field, error.value, f"{error.rule} (file {path})")


def load_expert_load(path: str | Path) -> ExpertLoad:
    """Read expert load statistics from ``.json`` or ``.npy`` (shape ``[layers, experts]``).

    A malformed file is an :class:`InputError` naming the file, the field and the shape
    expected.
    """
    p = Path(path)
    if p.suffix.lower() == ".npy":
        array = _read_npy("--expert-load", p, 2)
        return ExpertLoad(rows=tuple(tuple(float(v) for v in row) for row in array.tolist()))
    data = read_json_file(p, field="--expert-load", kind=FileKind.EXPERT_STATS)
    try:
        return expert_load_from_data(data)
    except InputError as exc:
        raise _in_file(p, exc) from None


def load_coactivation(path: str | Path) -> CoActivation:
    """Read co-activation counts from ``.json`` or ``.npy`` (``[layers, experts, experts]``).

    A malformed file is an :class:`InputError` naming the file, the field and the shape
    expected.
    """
    p = Path(path)
    if p.suffix.lower() == ".npy":
        array = _read_npy("--coactivation", p, 3)
        import numpy as np

        rows = []
        for m in array:
            sym = np.triu(m + m.T, 1)
            es, fs = np.nonzero(sym)
            rows.append(
                tuple((int(e), int(f), float(sym[e, f])) for e, f in zip(es, fs, strict=True))
            )
        return CoActivation(rows=tuple(rows))
    data = read_json_file(p, field="--coactivation", kind=FileKind.EXPERT_STATS)
    try:
        return coactivation_from_data(data)
    except InputError as exc:
        raise _in_file(p, exc) from None


def zipf_load(
    num_layers: int, num_experts: int, *, exponent: float = 1.0, seed: int = 0
) -> ExpertLoad:
    """A synthetic skewed load: per layer, expert ranks follow Zipf(``exponent``), shuffled.

    Row ``l`` gives the expert at a seeded random rank ``r`` the weight ``1 / (r + 1) ** s``.
    """
    rng = random.Random(seed)
    rows = []
    for _ in range(num_layers):
        ranks = list(range(num_experts))
        rng.shuffle(ranks)
        rows.append(tuple(1.0 / (r + 1) ** exponent for r in ranks))
    return ExpertLoad(rows=tuple(rows))
