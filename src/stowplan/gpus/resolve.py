"""Resolve a GPU name from any tool to one spec row, the node's memory breaking ties.

Step 1: the name becomes a key and a stated memory (:func:`parse_gpu_name`).
Step 2: the first of these that finds rows wins: the key in the curated table, the key in
the database, the longest known name that starts the key (``RTX 4090 D`` → ``RTX 4090``
unless the next word names another part: ``Ti``, ``SUPER``, ``Laptop`` …) in the curated
table then the database, and last the known names the key starts (``P100`` → its PCIe
and SXM2 rows).  A name nvidia-smi cut short (``RTX 2080 ...``) may be any known name it
starts, ``Ti`` and ``SUPER`` parts included (laptop parts not).
Step 3: a name as the NVIDIA driver reports it (nvidia-smi, NVML: it starts ``NVIDIA ``)
says ``PCIe`` for every PCIe board (``NVIDIA H800 PCIe``, ``NVIDIA A100-PCIE-40GB``), so
such a name without it drops the PCIe rows: ``NVIDIA H800`` is the SXM part.  A bare name
(``H800``, as a person types it) keeps them: it may be either.
Step 4: among the rows found, the memory stated in the name, then the node's memory,
picks the closest (``A100`` with 80 GB → the 80 GB rows).  What is still tied goes to
the lowest-bandwidth row, and the match says so (:attr:`GpuMatch.assumption`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from functools import cache, lru_cache

from stowplan.errors import InputError
from stowplan.gpus.curated import CURATED
from stowplan.gpus.database import database_specs
from stowplan.gpus.names import OTHER_PART, parse_gpu_name
from stowplan.gpus.spec import GpuMatch, GpuOrigin, GpuSpec
from stowplan.quantities.limits import MAX_BYTE_COUNT

__all__ = ["DRIVER_PREFIX", "lookup_gpu", "resolve_gpu", "shadowed_by_curated"]

DRIVER_PREFIX = "NVIDIA "
"""How the NVIDIA driver (nvidia-smi, NVML) begins every board's name."""

_GIB = 2**30
_LAPTOP = frozenset({"mobile", "maxq"})
Index = dict[str, tuple[GpuSpec, ...]]


def _keys(spec: GpuSpec) -> list[str]:
    keys = [parse_gpu_name(spec.name).key]
    keys += [parse_gpu_name(a).key for a in spec.aliases]
    return [k for k in dict.fromkeys(keys) if k]


def _build(specs: Iterable[GpuSpec]) -> Index:
    """Rows by key, and by key without spaces (``rtxa6000``) where that is not a key."""
    out: dict[str, list[GpuSpec]] = {}
    for spec in specs:
        for key in _keys(spec):
            out.setdefault(key, []).append(spec)
    for key, group in list(out.items()):
        out.setdefault(key.replace(" ", ""), group)
    return {k: tuple(v) for k, v in out.items()}


@cache
def _curated() -> Index:
    return _build(CURATED)


@cache
def _database() -> Index:
    return _build(database_specs())


def _candidates_exact(index: Index, key: str) -> tuple[GpuSpec, ...]:
    for k in (key, *(["rtx " + key] if key[:1].isdigit() else [])):
        for form in (k, k.replace(" ", "")):
            if form in index:
                return index[form]
    return ()


def _candidates_prefix(index: Index, key: str) -> tuple[GpuSpec, ...]:
    words = key.split()
    for n in range(len(words) - 1, 0, -1):
        known = " ".join(words[:n])
        if known in index and words[n] not in OTHER_PART:
            return index[known]
    return ()


def _candidates_extension(index: Index, key: str) -> tuple[GpuSpec, ...]:
    found: list[GpuSpec] = []
    for known, specs in index.items():
        if known.startswith(key + " ") and not OTHER_PART & set(known[len(key) :].split()):
            found += [s for s in specs if s not in found]
    return tuple(found)


def _candidates_truncated(indexes: Sequence[Index], key: str) -> tuple[GpuSpec, ...]:
    """Every desktop or server row whose name starts ``key``, curated or not (a cut name
    hides its suffix; laptop parts are left out)."""
    found: list[GpuSpec] = []
    for index in indexes:
        for known, specs in index.items():
            extra = set(known[len(key) :].split())
            if known == key or (known.startswith(key + " ") and not extra & _LAPTOP):
                found += [s for s in specs if s not in found]
    curated = [s for s in found if s.origin is GpuOrigin.CURATED]
    return tuple(curated + [s for s in found if s not in curated and not shadowed_by_curated(s)])


def _closest(specs: Sequence[GpuSpec], memory_gb: float) -> list[GpuSpec]:
    def distance(s: GpuSpec) -> float:
        return abs(math.log(memory_gb / s.memory_gb))

    best = min(distance(s) for s in specs)
    return [s for s in specs if distance(s) - best < 1e-9]


def _choose(
    query: str, specs: Sequence[GpuSpec], stated_gb: float | None, memory_bytes: int | None
) -> GpuMatch:
    cands = list(dict.fromkeys(specs))
    if query.startswith(DRIVER_PREFIX) and "pcie" not in query.lower():
        boards = [s for s in cands if "pcie" not in s.name.lower()]
        cands = boards or cands  # the driver names PCIe boards "… PCIe": this is not one
    if len(cands) > 1 and stated_gb is not None and stated_gb > 0:
        cands = _closest(cands, stated_gb)
    if len(cands) > 1 and memory_bytes is not None and memory_bytes > 0:
        cands = _closest(cands, memory_bytes / _GIB)
    pick = min(cands, key=lambda s: s.mem_bandwidth_gbps)  # the first of the slowest
    figures = {(s.mem_bandwidth_gbps, s.bf16_tflops, s.nvlink_gbps) for s in cands}
    if len(figures) == 1:
        return GpuMatch(spec=pick, query=query)
    names = ", ".join(s.name for s in cands)
    known = memory_bytes is not None or stated_gb is not None
    way = "the full name" if known else "the node's memory or the full name"
    note = (
        f"{query!r} may be any of {names}; took {pick.name} "
        f"({pick.mem_bandwidth_gbps:g} GB/s, the slowest): give {way} to choose"
    )
    return GpuMatch(spec=pick, query=query, assumption=note)


def resolve_gpu(
    gpu_name: str, memory_bytes: int | None = None, *, database: bool = True
) -> GpuMatch | None:
    """See :func:`_resolve_gpu`; answers are remembered (a fleet names few parts).

    Raises :class:`~stowplan.errors.InputError` when ``memory_bytes`` is not None or a
    byte count (an integer in ``[0, MAX_BYTE_COUNT]``).
    """
    if memory_bytes is not None and (
        isinstance(memory_bytes, bool)
        or not isinstance(memory_bytes, int)
        or not 0 <= memory_bytes <= MAX_BYTE_COUNT
    ):
        raise InputError(
            "memory_bytes", memory_bytes, f"must be None or an integer in [0, {MAX_BYTE_COUNT}]"
        )
    if not isinstance(gpu_name, str):
        return _resolve_gpu(gpu_name, memory_bytes, database=database)
    return _resolve_cached(gpu_name, memory_bytes, database)


@lru_cache(maxsize=4096)
def _resolve_cached(gpu_name: str, memory_bytes: int | None, database: bool) -> GpuMatch | None:
    return _resolve_gpu(gpu_name, memory_bytes, database=database)


def _resolve_gpu(
    gpu_name: str, memory_bytes: int | None = None, *, database: bool = True
) -> GpuMatch | None:
    """The spec row ``gpu_name`` names, and any assumption made; None when unknown.

    ``gpu_name`` may come from nvidia-smi (``NVIDIA A100-SXM4-80GB``), vast.ai (``A100
    SXM4``), Ray (``A100-80G``), rocm-smi (``AMD Instinct MI300X OAM``) or a person
    (``a6000``).  ``memory_bytes`` is one GPU's memory on the node (nvidia-smi's total is
    fine: GiB and GB are both close enough); it tells apart parts that share a name.
    ``database=False`` consults the curated table only.  Never raises on a bad name.
    """
    if not isinstance(gpu_name, str):
        return None
    parsed = parse_gpu_name(gpu_name)
    if not parsed.key:
        return None
    indexes = [_curated(), _database()] if database else [_curated()]
    if parsed.truncated:
        found = _candidates_truncated(indexes, parsed.key)
        return _choose(gpu_name, found, parsed.memory_gb, memory_bytes) if found else None
    for stage in (_candidates_exact, _candidates_prefix, _candidates_extension):
        for index in indexes:
            found = stage(index, parsed.key)
            if found:
                return _choose(gpu_name, found, parsed.memory_gb, memory_bytes)
    return None


def lookup_gpu(gpu_name: str, memory_bytes: int | None = None) -> GpuSpec | None:
    """The spec of ``gpu_name`` (see :func:`resolve_gpu`); None when unknown.

    ``lookup_gpu("NVIDIA GeForce RTX 4090")``, ``lookup_gpu("RTX 4090")`` and
    ``lookup_gpu("rtx4090")`` all give the RTX 4090 row; ``"H100 80GB HBM3"``
    (nvidia-smi's name of the SXM part) gives the H100 SXM5 row.
    """
    match = resolve_gpu(gpu_name, memory_bytes)
    return match.spec if match is not None else None


def shadowed_by_curated(spec: GpuSpec) -> bool:
    """Whether a database row names a part of the curated table (same key, memory within
    15 %): the curated row answers for it."""
    curated = _curated()
    for key in _keys(spec):
        for c in curated.get(key, ()):
            if abs(math.log(c.memory_gb / spec.memory_gb)) < math.log(1.15):
                return True
    return False
