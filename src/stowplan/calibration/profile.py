"""Calibration profiles: per-device corrections on top of the first-order cost model.

A :class:`Calibration` is a named set of :class:`DeviceCalibration` entries for
one engine (``generic``, ``llamacpp``, ``vllm``, ``trtllm``, ``sglang``,
``transformers``).
Every figure is a :class:`Figure` that says where it came from: ``table`` (a shipped default with
its public source), ``fitted`` (least squares on the user's own runs), ``measured``
(a probe measured it directly) or ``assumed`` (an entry the user's runs or probe wrote
kept it from the prior profile, their data not determining it).

The JSON format (``schema_version`` 1)::

    {
      "schema_version": 1,
      "name": "llamacpp-default",
      "engine": "llamacpp",
      "description": "...",
      "devices": [
        {
          "device": "rtx-3090",              # family key, or "*" for any device
          "match": ["3090"],                 # tokens that must all occur in gpu_name
          "bandwidth_fraction": {            # by dtype class; "default" is required
            "default": {"value": 0.8, "provenance": "table", "source": "..."},
            "q4": {"value": 0.62, "provenance": "table", "source": "..."}
          },
          "block_overhead_s": {"value": 1e-4, "provenance": "table", "source": "..."},
          "hop_overhead_s": {"value": 1e-5, "provenance": "table", "source": "..."},
          "collective_overhead_s": {"value": 7e-6, "provenance": "table", "source": "..."},
          "compute_efficiency": {"value": 0.6, "provenance": "table", "source": "..."}
        }
      ],
      "runs": [...]                          # optional: the published runs behind the fits
    }

``runs`` (see :mod:`.runs`) lists the published decode runs the profile was
fitted to and the ones kept on record but left out; :mod:`.coverage` reads
them to tell whether a plan lies inside the profile's data.

This module is pure: it parses and validates already-read text and renders
canonical JSON.  Reading shipped or user files lives in :mod:`.store`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from stowplan.calibration.runs import PublishedRun, run_from_dict, run_to_dict
from stowplan.errors import InputError
from stowplan.files.safeload import parse_json
from stowplan.quantities.checks import check_choice, check_number

__all__ = [
    "CALIBRATION_SCHEMA_VERSION",
    "MAX_BANDWIDTH_FRACTION",
    "Calibration",
    "DeviceCalibration",
    "Engine",
    "Figure",
    "FractionTable",
    "Provenance",
    "assumed",
    "calibration_from_dict",
    "calibration_from_json",
    "calibration_to_dict",
    "calibration_to_json",
    "dtype_class",
    "normalise_gpu_name",
]

CALIBRATION_SCHEMA_VERSION = 1

MAX_BANDWIDTH_FRACTION = 4.0
"""Upper bound of a bandwidth fraction.  Above 1 means the working set is served from a
cache faster than the peak (DRAM) bandwidth the fraction is relative to: CPUs with large
last-level caches, small models."""


class Engine(StrEnum):
    """The inference engine a profile describes."""

    GENERIC = "generic"
    LLAMACPP = "llamacpp"
    VLLM = "vllm"
    TRTLLM = "trtllm"
    SGLANG = "sglang"
    TRANSFORMERS = "transformers"
    """Hugging Face transformers eager ``generate`` (what Accelerate ``device_map`` runs)."""

    @property
    def splits_layers(self) -> bool:
        """Whether the engine runs a multi-GPU host as a pipeline over its GPUs (llama.cpp's
        default layer split, an Accelerate ``device_map``) rather than tensor parallel."""
        return self in (Engine.LLAMACPP, Engine.TRANSFORMERS)


class Provenance(StrEnum):
    """Where a figure came from."""

    TABLE = "table"
    """A shipped default, derived from the public source it cites."""
    FITTED = "fitted"
    """Least squares on the user's own benchmark runs."""
    MEASURED = "measured"
    """Measured directly by the probe."""
    ASSUMED = "assumed"
    """Kept from the prior profile: the data of the run that wrote this entry did not
    determine it (its source says where the prior figure came from)."""


_DTYPE_CLASSES: tuple[tuple[str, str], ...] = (
    (r"^(f32|fp32|float32)$", "f32"),
    (r"^(f16|fp16|bf16|float16|bfloat16)$", "f16"),
    (r"^(fp8|f8|e4m3|e5m2|fp8_e4m3|w8a8_fp8)", "fp8"),
    (r"^(q8|int8|w8a8|w8a16|i8)", "q8"),
    (r"^(q6|iq6)", "q6"),
    (r"^(q5|iq5)", "q5"),
    (r"^(q4|iq4|int4|awq|gptq|w4a16|mxfp4|nf4|fp4|nvfp4)", "q4"),
    (r"^(q3|iq3)", "q3"),
    (r"^(q2|iq2|iq1|q1)", "q2"),
)


def dtype_class(dtype: str | None) -> str:
    """The class a weight dtype belongs to: ``Q4_K - Medium`` → ``q4``, ``bf16`` → ``f16``.

    A mix ``bf16+mxfp4`` (dense layers + experts, as a quantisation config that quantises
    only the experts reads) takes its last part's class, ``q4``: the published runs of
    such models are recorded under the experts' dtype.  Unknown or missing dtypes give
    ``default``.
    """
    if not dtype:
        return "default"
    key = re.sub(r"[\s\-]+", "_", dtype.strip().lower()).removeprefix("mostly_")
    key = key.rpartition("+")[2]
    for pattern, cls in _DTYPE_CLASSES:
        if re.match(pattern, key):
            return cls
    return "default"


def normalise_gpu_name(name: str) -> str:
    """Lower-case words of a device name without vendor noise.

    ``NVIDIA GeForce RTX 4090`` → ``rtx 4090``.
    """
    words = re.sub(r"[^a-z0-9.]+", " ", name.lower()).split()
    noise = {"nvidia", "geforce", "tesla", "amd", "radeon", "apple", "corporation"}
    return " ".join(w for w in words if w not in noise)


class FractionTable(dict[str, "Figure"]):
    """A read-only, hashable ``dtype class → Figure`` mapping (profiles are frozen values)."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items(), key=lambda kv: kv[0])))

    def _readonly(self, *args: object, **kwargs: object) -> None:
        raise TypeError("a calibration's bandwidth fractions are read-only")

    __setitem__ = _readonly
    __delitem__ = _readonly
    update = _readonly
    pop = _readonly  # type: ignore[assignment]
    clear = _readonly
    setdefault = _readonly  # type: ignore[assignment]


@dataclass(frozen=True, slots=True, kw_only=True)
class Figure:
    """One calibration figure, with its provenance and its source."""

    value: float
    provenance: Provenance = Provenance.TABLE
    source: str = ""
    """Public source (repo + thread, or URL) or a description of the fit."""

    def __post_init__(self) -> None:
        provenance = check_choice("provenance", self.provenance, Provenance)
        object.__setattr__(self, "provenance", provenance)


def assumed(figure: Figure) -> Figure:
    """``figure`` taken over from a prior profile by an entry whose data did not determine
    it: the same value, labelled :attr:`Provenance.ASSUMED`, its source naming the prior's
    label and source."""
    if figure.provenance is Provenance.ASSUMED:
        return figure
    source = f"prior ({figure.provenance.value})"
    return Figure(
        value=figure.value,
        provenance=Provenance.ASSUMED,
        source=f"{source}: {figure.source}" if figure.source else source,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceCalibration:
    """Corrections for one device family.

    ``bandwidth_fraction`` maps a dtype class (see :func:`dtype_class`) to the
    fraction of peak memory bandwidth decode kernels reach; ``default`` covers
    any class not listed.  ``block_overhead_s`` is the fixed time every block
    adds per token (attention, norms, launches), ``hop_overhead_s`` the fixed
    time every stage hop adds per token, ``collective_overhead_s`` the fixed
    time every block adds per token when its stage is split over several GPUs
    (tensor parallel: the block's all-reduces), ``compute_efficiency`` the
    fraction of peak FLOP/s reached when decode is compute-bound.  A profile
    without ``collective_overhead_s`` charges 0 for it.
    """

    device: str
    """Family key, e.g. ``rtx-4090``; ``*`` matches any device."""
    match: tuple[str, ...] = ()
    """Tokens that must all occur in the normalised gpu_name (default: the key's words)."""
    bandwidth_fraction: Mapping[str, Figure] = field(default_factory=dict)
    block_overhead_s: Figure = field(default_factory=lambda: Figure(value=0.0))
    hop_overhead_s: Figure = field(default_factory=lambda: Figure(value=0.0))
    collective_overhead_s: Figure = field(default_factory=lambda: Figure(value=0.0))
    compute_efficiency: Figure = field(default_factory=lambda: Figure(value=1.0))

    def __post_init__(self) -> None:
        where = f"devices[{self.device!r}]"
        if not isinstance(self.device, str) or not self.device.strip():
            raise InputError("devices[].device", self.device, "must be a non-empty string")
        match = tuple(self.match) or tuple(self.device.replace("-", " ").split())
        object.__setattr__(self, "match", tuple(m.lower() for m in match))
        fractions = dict(self.bandwidth_fraction)
        if "default" not in fractions:
            raise InputError(
                f"{where}.bandwidth_fraction", sorted(fractions), "must have a 'default' entry"
            )
        for key, fig in fractions.items():
            v = check_number(
                f"{where}.bandwidth_fraction.{key}", fig.value, upper=MAX_BANDWIDTH_FRACTION
            )
            if v == 0:
                raise InputError(f"{where}.bandwidth_fraction.{key}", fig.value, "must be > 0")
        object.__setattr__(self, "bandwidth_fraction", FractionTable(sorted(fractions.items())))
        check_number(f"{where}.block_overhead_s", self.block_overhead_s.value, upper=1.0)
        check_number(f"{where}.hop_overhead_s", self.hop_overhead_s.value, upper=10.0)
        check_number(f"{where}.collective_overhead_s", self.collective_overhead_s.value, upper=1.0)
        eff = check_number(f"{where}.compute_efficiency", self.compute_efficiency.value, upper=1.0)
        if eff == 0:
            raise InputError(
                f"{where}.compute_efficiency", self.compute_efficiency.value, "must be > 0"
            )

    def fraction(self, dtype: str | None) -> Figure:
        """The bandwidth fraction for ``dtype`` (its class, else ``default``)."""
        return self.bandwidth_fraction.get(dtype_class(dtype), self.bandwidth_fraction["default"])

    def matches(self, gpu_name: str) -> bool:
        """Whether this entry describes ``gpu_name`` (``*`` matches everything)."""
        if self.device == "*":
            return True
        words = normalise_gpu_name(gpu_name).split()
        glued = "".join(words)

        def found(tok: str) -> bool:
            # A word, or part of a run-together name (``rtx4090``); a token starting with a
            # letter must not follow one (``b200`` is not in ``gb200``).
            lead = r"(?<![a-z])" if tok[:1].isalpha() else ""
            return tok in words or re.search(lead + re.escape(tok), glued) is not None

        return all(found(tok) for tok in self.match)


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """A named profile for one engine: an ordered list of device entries, and the published
    runs behind them (empty for a profile that does not record them)."""

    name: str
    engine: Engine
    devices: tuple[DeviceCalibration, ...]
    description: str = ""
    runs: tuple[PublishedRun, ...] = ()
    schema_version: int = CALIBRATION_SCHEMA_VERSION

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise InputError("name", self.name, "must be a non-empty string")
        object.__setattr__(self, "engine", check_choice("engine", self.engine, Engine))
        if self.schema_version != CALIBRATION_SCHEMA_VERSION:
            raise InputError(
                "schema_version",
                self.schema_version,
                f"only version {CALIBRATION_SCHEMA_VERSION} is supported",
            )
        devices = tuple(self.devices)
        object.__setattr__(self, "devices", devices)
        keys = [d.device for d in devices]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise InputError("devices[].device", dupes[0], "device keys must be unique")
        runs = tuple(self.runs)
        object.__setattr__(self, "runs", runs)
        for i, run in enumerate(runs):
            if not isinstance(run, PublishedRun):
                raise InputError(f"runs[{i}]", type(run).__name__, "must be a PublishedRun")
            check_choice(f"runs[{i}].engine", run.engine, Engine)

    @property
    def fitted_runs(self) -> tuple[PublishedRun, ...]:
        """The published runs the profile was fitted to (those not ``excluded``)."""
        return tuple(r for r in self.runs if r.fitted)

    def for_device(self, gpu_name: str) -> DeviceCalibration | None:
        """The most specific entry matching ``gpu_name`` (most match tokens), else ``*``."""
        best: DeviceCalibration | None = None
        for d in self.devices:
            if d.matches(gpu_name) and (
                best is None
                or best.device == "*"
                or (d.device != "*" and len(d.match) > len(best.match))
            ):
                best = d
        return best

    def with_device(self, entry: DeviceCalibration) -> Calibration:
        """A new profile with ``entry`` replacing the one of the same key (or added first)."""
        rest = tuple(d for d in self.devices if d.device != entry.device)
        return Calibration(
            name=self.name,
            engine=self.engine,
            devices=(entry, *rest),
            description=self.description,
            runs=self.runs,
        )


# -- JSON -----------------------------------------------------------------------------------

_FIGURE_KEYS = {"value", "provenance", "source"}
_DEVICE_KEYS = {
    "device",
    "match",
    "bandwidth_fraction",
    "block_overhead_s",
    "hop_overhead_s",
    "collective_overhead_s",
    "compute_efficiency",
}
_TOP_KEYS = {"schema_version", "name", "engine", "description", "devices", "runs"}


def _object(where: str, data: object, allowed: set[str], required: set[str]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise InputError(where, type(data).__name__, "must be a JSON object")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise InputError(
            f"{where}.{unknown[0]}", data[unknown[0]], f"unknown key; allowed: {sorted(allowed)}"
        )
    missing = sorted(required - set(data))
    if missing:
        raise InputError(f"{where}.{missing[0]}", None, "is required")
    return data


def _figure(where: str, data: object) -> Figure:
    obj = _object(where, data, _FIGURE_KEYS, {"value"})
    source = obj.get("source", "")
    if not isinstance(source, str):
        raise InputError(f"{where}.source", source, "must be a string")
    return Figure(
        value=check_number(f"{where}.value", obj["value"]),
        provenance=obj.get("provenance", Provenance.TABLE),
        source=source,
    )


def _device(where: str, data: object) -> DeviceCalibration:
    obj = _object(where, data, _DEVICE_KEYS, {"device", "bandwidth_fraction"})
    match = obj.get("match", [])
    if not isinstance(match, list) or not all(isinstance(m, str) for m in match):
        raise InputError(f"{where}.match", match, "must be a list of strings")
    fractions = obj["bandwidth_fraction"]
    if not isinstance(fractions, dict):
        raise InputError(f"{where}.bandwidth_fraction", fractions, "must be a JSON object")
    kwargs: dict[str, Any] = {}
    for key in (
        "block_overhead_s",
        "hop_overhead_s",
        "collective_overhead_s",
        "compute_efficiency",
    ):
        if key in obj:
            kwargs[key] = _figure(f"{where}.{key}", obj[key])
    return DeviceCalibration(
        device=obj["device"],
        match=tuple(match),
        bandwidth_fraction={
            str(k): _figure(f"{where}.bandwidth_fraction.{k}", v) for k, v in fractions.items()
        },
        **kwargs,
    )


def calibration_from_dict(data: object) -> Calibration:
    """Validate ``data`` into a :class:`Calibration`; raise :class:`InputError` on any problem."""
    obj = _object("calibration", data, _TOP_KEYS, {"name", "engine", "devices"})
    version = obj.get("schema_version", CALIBRATION_SCHEMA_VERSION)
    if version != CALIBRATION_SCHEMA_VERSION:
        raise InputError(
            "schema_version", version, f"only version {CALIBRATION_SCHEMA_VERSION} is supported"
        )
    devices = obj["devices"]
    if not isinstance(devices, list) or not devices:
        raise InputError("devices", devices, "must be a non-empty list of device objects")
    description = obj.get("description", "")
    if not isinstance(description, str):
        raise InputError("description", description, "must be a string")
    runs = obj.get("runs", [])
    if not isinstance(runs, list):
        raise InputError("runs", type(runs).__name__, "must be a list of run objects")
    return Calibration(
        name=obj["name"],
        engine=obj["engine"],
        description=description,
        devices=tuple(_device(f"devices[{i}]", d) for i, d in enumerate(devices)),
        runs=tuple(run_from_dict(r, f"runs[{i}]") for i, r in enumerate(runs)),
    )


def calibration_from_json(text: str | bytes, *, origin: str = "calibration") -> Calibration:
    """Parse and validate profile JSON; ``origin`` names the file in messages."""
    data = parse_json(text, field=origin, source=f"<{len(text)} bytes>")
    return calibration_from_dict(data)


def _figure_dict(fig: Figure) -> dict[str, Any]:
    return {"value": fig.value, "provenance": fig.provenance.value, "source": fig.source}


def calibration_to_dict(cal: Calibration) -> dict[str, Any]:
    """The profile as plain JSON-compatible data (``runs`` only when it records some)."""
    data: dict[str, Any] = {
        "schema_version": cal.schema_version,
        "name": cal.name,
        "engine": cal.engine.value,
        "description": cal.description,
        "devices": [
            {
                "device": d.device,
                "match": list(d.match),
                "bandwidth_fraction": {k: _figure_dict(v) for k, v in d.bandwidth_fraction.items()},
                "block_overhead_s": _figure_dict(d.block_overhead_s),
                "hop_overhead_s": _figure_dict(d.hop_overhead_s),
                "collective_overhead_s": _figure_dict(d.collective_overhead_s),
                "compute_efficiency": _figure_dict(d.compute_efficiency),
            }
            for d in cal.devices
        ],
    }
    if cal.runs:
        data["runs"] = [run_to_dict(r) for r in cal.runs]
    return data


def calibration_to_json(cal: Calibration) -> str:
    """Canonical JSON (sorted keys, two-space indent, trailing newline)."""
    return json.dumps(calibration_to_dict(cal), sort_keys=True, indent=2, allow_nan=False) + "\n"
