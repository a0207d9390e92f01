"""Model layouts: the known-model table and readers of real model files.

:func:`resolve_model` is the loader: it accepts a known name, a Hugging Face id of a known
model, a ``config.json`` path, a checkpoint folder (safetensors headers, or
its config alone when it holds no weights), a safetensors index JSON or a
``.gguf`` file.
"""

from __future__ import annotations

from pathlib import Path

from stowplan.errors import InputError
from stowplan.files.fileio import path_exists
from stowplan.model import ModelLayout
from stowplan.models.dtypes import format_names, parse_dtype
from stowplan.models.grouping import ModelReport
from stowplan.models.hf import SUPPORTED, from_hf_config, hf_report
from stowplan.models.known import (
    hf_id,
    known_model,
    known_names,
    known_report,
    known_with_dtype,
    lookup,
    suggest,
)

__all__ = [
    "SUPPORTED",
    "ModelReport",
    "format_names",
    "from_hf_config",
    "hf_id",
    "inspect_model",
    "known_names",
    "lookup",
    "model_source",
    "parse_dtype",
    "resolve_model",
]


def _existing(spec: str) -> Path | None:
    """``spec`` as an existing path, or None (also for a name no file system accepts)."""
    try:
        path = Path(spec).expanduser()
    except RuntimeError:  # ~user of no user
        return None
    return path if path_exists(path) else None


def _looks_like_path(spec: str) -> bool:
    return spec.endswith((".json", ".gguf", ".safetensors")) or spec.startswith(("/", "./", "~"))


def inspect_model(spec: str, *, dtype: str | None = None) -> ModelReport:
    """The layout of ``spec`` with its report (source, exactness, MTP, other tensors);
    accepts and refuses what :func:`resolve_model` does.

    ``dtype`` re-prices a known model or a config (``bf16``, ``fp8``, ``q4_k_m`` …);
    files with stored tensors keep their exact bytes and reject it.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise InputError("MODEL", spec, "must be a model name or a path")
    if dtype is not None:
        dtype = parse_dtype(dtype)
    path = _existing(spec)
    if path is not None:
        return _from_path(path, dtype)
    if _looks_like_path(spec):
        raise InputError("MODEL", spec, "does not exist")
    if dtype is None:
        report = known_report(spec)
        if report is not None:
            return report
        tagged = known_with_dtype(spec)
        if tagged is not None:
            row, tag = tagged
            return hf_report(row.config, name=f"{row.name}@{tag}", dtype=tag)
    else:
        found = known_model(spec)
        if found is not None:
            return hf_report(found.config, name=f"{found.name}@{dtype}", dtype=dtype)
    close = suggest(spec)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise InputError(
        "MODEL",
        spec,
        f"is not a known model; {hint}known: {', '.join(known_names())}; "
        "or give a config.json, a checkpoint folder or a .gguf file",
    )


def _from_path(path: Path, dtype: str | None) -> ModelReport:
    from stowplan.models.gguf import gguf_report
    from stowplan.models.safetensors import safetensors_report, shard_paths

    exact: ModelReport | None = None
    if path.is_file() and path.suffix == ".gguf":
        exact = gguf_report(path)
    elif path.is_dir() or path.name.endswith((".safetensors", ".index.json")):
        folder, shards = shard_paths(path)
        if shards:
            exact = safetensors_report(path)
        elif (folder / "config.json").is_file():
            return hf_report(folder / "config.json", name=folder.name, dtype=dtype)
        else:
            raise InputError(
                "MODEL", str(path), "holds neither *.safetensors files nor a config.json"
            )
    if exact is not None:
        if dtype is not None:
            raise InputError(
                "--dtype", dtype, "applies to known models and config.json only; "
                "a checkpoint's stored bytes are exact",
            )  # fmt: skip
        return exact
    name = path.parent.name if path.name == "config.json" else path.stem
    return hf_report(path, name=name or path.stem, dtype=dtype)


def resolve_model(spec: str, *, dtype: str | None = None) -> ModelLayout:
    """The loader: a layout from a known name, HF id, config.json, checkpoint folder or
    .gguf file (``dtype`` re-prices a known model or a config).

    Raises :class:`InputError` when ``spec`` is none of these: an unknown name's message
    names the closest known names first (``did you mean llama3.1:70b or …?``, by
    :func:`difflib.get_close_matches` over the names and their aliases), then every
    known name. :func:`lookup` is the query that returns None instead;
    :func:`inspect_model` gives the layout with its report.
    """
    if dtype is None and isinstance(spec, str) and _existing(spec) is None:
        layout = lookup(spec)
        if layout is not None:
            return layout
    return inspect_model(spec, dtype=dtype).layout


def model_source(spec: str) -> str | None:
    """``spec`` as an engine loads it: an existing path made absolute, else the Hugging
    Face id of the known model it names, else None."""
    path = _existing(spec) if isinstance(spec, str) and spec.strip() else None
    if path is not None:
        return str(path.resolve())
    return hf_id(spec)
