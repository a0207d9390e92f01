"""The known GPUs for people: search the table and the database, and say how to fix a
GPU that is in neither."""

from __future__ import annotations

from stowplan.gpus.curated import CURATED
from stowplan.gpus.database import database_specs, database_version
from stowplan.gpus.names import normalise_gpu_name, parse_gpu_name
from stowplan.gpus.resolve import resolve_gpu, shadowed_by_curated
from stowplan.gpus.spec import GpuSpec

__all__ = ["known_gpus", "unknown_gpu_message"]


def _text(spec: GpuSpec) -> str:
    return " ".join(normalise_gpu_name(n) for n in (spec.name, *spec.aliases))


def known_gpus(query: str | None = None, *, database: bool = True) -> tuple[GpuSpec, ...]:
    """The curated rows, then the database rows no curated row answers for.

    With ``query``, only the rows whose name holds every word of it, and first the row
    ``query`` resolves to (``known_gpus("a6000")`` lists the RTX A6000); a query with no
    word (``" "``, ``"🙂"``: no letter or digit) matches nothing.
    """
    rows: list[GpuSpec] = list(CURATED)
    if database:
        rows += [s for s in database_specs() if not shadowed_by_curated(s)]
    if query is None:
        return tuple(rows)
    words = parse_gpu_name(query).key.split() or normalise_gpu_name(query).split()
    if not words:
        return ()
    hits = [s for s in rows if all(w in _text(s) for w in words)]
    match = resolve_gpu(query, database=database)
    if match is not None:
        hits = [match.spec, *(s for s in hits if s != match.spec)]
    return tuple(hits)


def unknown_gpu_message(gpu_name: str, assumed_gbps: float) -> str:
    """What to tell the user about a GPU that resolves to nothing, and the ways out."""
    where = (
        "the spec table or the GPU database"
        if database_version() is not None
        else "the spec table (the broader GPU database is not installed: "
        "pip install 'stowplan[gpus]')"
    )
    return (
        f"GPU {gpu_name!r} is not in {where}; its memory bandwidth is assumed to be "
        f"{assumed_gbps:g} GB/s per GPU. Set mem_bandwidth_gbps: for the node in the fleet "
        "file, or measure it with `stowplan calibrate`"
    )
