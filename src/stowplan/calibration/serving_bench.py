"""Parse serving-benchmark result files into runs: vLLM, SGLang, TensorRT-LLM.

* ``vllm bench serve --save-result`` / ``benchmarks/benchmark_serving.py
  --save-result``: one JSON object (``--append-result`` adds one per line) with
  ``model_id``, ``max_concurrency``, ``request_rate`` (``"inf"``), ``completed``,
  ``median_tpot_ms``, ``mean_tpot_ms``, ``median_itl_ms``, newer builds
  ``max_concurrent_requests`` (the peak seen) and ``spec_decode_acceptance_length``.
* ``python -m sglang.bench_serving --output-file``: JSONL, one object per run,
  the same latency keys, ``max_concurrency``, ``request_rate`` (``Infinity``),
  ``concurrency`` (the mean seen) and ``accept_length`` (speculative decoding).
* ``trtllm-bench ... --report_json``: one object with ``engine`` (``model``),
  ``machine`` (``name``), ``world_info`` (``tp_size``, ``pp_size``,
  ``max_batch_size``), ``request_info`` (``num_requests``) and, for streaming
  runs, ``streaming_metrics`` (``avg_tpot_ms``, ``tpot_percentiles.p50``).

Only a run that served one request at a time is a batch-1 decode measurement:
see :meth:`ServingBenchResult.why_not_batch1`.  Pure: it parses text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from stowplan.errors import InputError
from stowplan.files.safeload import MalformedJson, parse_json

__all__ = [
    "BATCH1_RULE",
    "ServingBenchResult",
    "parse_serving_bench",
]

BATCH1_RULE = (
    "accepted: max_concurrency 1 (vllm bench serve / sglang.bench_serving "
    "--max-concurrency 1), a single request, a peak of 1 concurrent request, "
    "or trtllm-bench world_info.max_batch_size 1"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingBenchResult:
    """One serving-benchmark run (a result object)."""

    tool: str
    """``vllm``, ``sglang`` or ``trtllm`` (from the keys the object has)."""
    label: str
    model: str | None = None
    device: str | None = None
    """The GPU the file names (``trtllm-bench``'s ``machine.name`` only)."""
    max_concurrency: int | None = None
    request_rate: float | None = None
    requests: int | None = None
    """Completed requests (``completed``; ``request_info.num_requests``)."""
    peak_concurrency: int | None = None
    """vLLM's ``max_concurrent_requests``: the most requests seen in flight."""
    mean_concurrency: float | None = None
    """SGLang's ``concurrency`` / trtllm's ``avg_num_concurrent_requests`` (informative)."""
    max_batch_size: int | None = None
    tensor_parallel: int | None = None
    pipeline_parallel: int | None = None
    accept_length: float | None = None
    """Tokens per decode step under speculative decoding (None: not used)."""
    median_tpot_ms: float | None = None
    mean_tpot_ms: float | None = None
    median_itl_ms: float | None = None

    def _time(self) -> tuple[str, float] | None:
        """The first of median TPOT, mean TPOT, median ITL that is > 0: (its name, ms)."""
        for name, ms in (
            ("median TPOT", self.median_tpot_ms),
            ("mean TPOT", self.mean_tpot_ms),
            ("median ITL", self.median_itl_ms),
        ):
            if ms is not None and math.isfinite(ms) and ms > 0:
                return name, ms
        return None

    @property
    def time_per_token_s(self) -> float | None:
        """Median TPOT, else mean TPOT, else median ITL (seconds); None when none is > 0."""
        chosen = self._time()
        return chosen[1] / 1e3 if chosen is not None else None

    @property
    def time_source(self) -> str:
        """Which figure :attr:`time_per_token_s` used."""
        chosen = self._time()
        return chosen[0] if chosen is not None else "none"

    @property
    def one_at_a_time(self) -> bool:
        """The run never had two requests in flight."""
        return (
            self.max_concurrency == 1
            or self.requests == 1
            or self.peak_concurrency == 1
            or self.max_batch_size == 1
        )

    def why_not_batch1(self) -> str | None:
        """Why this run is not a batch-1 decode measurement, or None when it is."""
        if not self.one_at_a_time:
            if self.max_concurrency is not None:
                return f"max_concurrency {self.max_concurrency}"
            rate = "inf" if self.request_rate is None else f"{self.request_rate:g}"
            return f"max_concurrency not set (request_rate {rate})"
        if self.accept_length is not None and self.accept_length > 1:
            return f"speculative decoding (accept length {self.accept_length:g})"
        if self.time_per_token_s is None:
            return "no median/mean TPOT or median ITL > 0 (run it streaming)"
        return None


def _num(obj: dict[str, Any], key: str) -> float | None:
    v = obj.get(key)
    if v is None or v == "" or isinstance(v, bool):
        return None
    if isinstance(v, str):
        if v.strip().lower() in ("inf", "infinity"):
            return math.inf
        try:
            return float(v)
        except ValueError:
            return None
    if isinstance(v, int | float):
        return float(v)
    return None


def _int(obj: dict[str, Any], key: str) -> int | None:
    v = _num(obj, key)
    return int(v) if v is not None and math.isfinite(v) else None


def _sub(obj: dict[str, Any], key: str) -> dict[str, Any]:
    v = obj.get(key)
    return v if isinstance(v, dict) else {}


def _trtllm(obj: dict[str, Any], where: str) -> ServingBenchResult:
    engine, world = _sub(obj, "engine"), _sub(obj, "world_info")
    requests, streaming = _sub(obj, "request_info"), _sub(obj, "streaming_metrics")
    tpot = _sub(streaming, "tpot_percentiles")
    spec = _sub(obj, "decoding_stats")
    accept = _sub(spec, "acceptance_length_percentiles")
    model = engine.get("model") or engine.get("model_path")
    return ServingBenchResult(
        tool="trtllm",
        label=f"{where} trtllm-bench",
        model=str(model) if model else None,
        device=str(_sub(obj, "machine").get("name") or "") or None,
        requests=_int(requests, "num_requests"),
        mean_concurrency=_num(requests, "avg_num_concurrent_requests"),
        max_batch_size=_int(world, "max_batch_size"),
        tensor_parallel=_int(world, "tp_size"),
        pipeline_parallel=_int(world, "pp_size"),
        accept_length=_num(accept, "average"),
        median_tpot_ms=_num(tpot, "p50"),
        mean_tpot_ms=_num(streaming, "avg_tpot_ms"),
    )


def _flat(obj: dict[str, Any], where: str) -> ServingBenchResult:
    sglang = "accept_length" in obj or "total_output_tokens_retokenized" in obj
    tool = "sglang" if sglang and "model_id" not in obj else "vllm"
    accept = _num(obj, "accept_length")
    if accept is None:
        accept = _num(obj, "spec_decode_acceptance_length")
    rate = _num(obj, "request_rate")
    mc = _int(obj, "max_concurrency")
    model = obj.get("model_id") or obj.get("model")
    return ServingBenchResult(
        tool=tool,
        label=f"{where} {tool} c{mc if mc is not None else '-'}",
        model=str(model) if model else None,
        max_concurrency=mc,
        request_rate=None if rate is None or math.isinf(rate) else rate,
        requests=_int(obj, "completed"),
        peak_concurrency=_int(obj, "max_concurrent_requests"),
        mean_concurrency=_num(obj, "concurrency"),
        accept_length=accept,
        median_tpot_ms=_num(obj, "median_tpot_ms"),
        mean_tpot_ms=_num(obj, "mean_tpot_ms"),
        median_itl_ms=_num(obj, "median_itl_ms"),
    )


_LATENCY_KEYS = ("median_tpot_ms", "mean_tpot_ms", "median_itl_ms")


def _record(obj: object, where: str) -> ServingBenchResult:
    if not isinstance(obj, dict):
        raise InputError(where, type(obj).__name__, "must be a JSON object (one benchmark run)")
    if "streaming_metrics" in obj or ("request_info" in obj and "world_info" in obj):
        return _trtllm(obj, where)
    if any(k in obj for k in _LATENCY_KEYS):
        return _flat(obj, where)
    raise InputError(
        where,
        ", ".join(sorted(obj)[:6]) + (", …" if len(obj) > 6 else ""),
        "is not a serving-benchmark result: expected median_tpot_ms / mean_tpot_ms / "
        "median_itl_ms (vllm bench serve --save-result, sglang.bench_serving "
        "--output-file) or streaming_metrics (trtllm-bench --report_json)",
    )


def parse_serving_bench(
    text: str, *, origin: str = "serving benchmark results"
) -> list[ServingBenchResult]:
    """Every run in ``text``: a JSON object, a JSON array of objects, or JSONL.

    Raises :class:`InputError` naming ``origin`` (and the line) when it is none of these.
    """
    stripped = text.strip()
    if not stripped:
        raise InputError(origin, "<empty>", "is empty; expected benchmark result JSON or JSONL")
    try:
        data = parse_json(stripped, field=origin, source=f"<{len(text)} chars>", nonfinite=True)
    except MalformedJson:
        lines = [(i, ln) for i, ln in enumerate(stripped.splitlines()) if ln.strip()]
        if len(lines) < 2 or not stripped.startswith("{"):
            raise InputError(
                origin, f"<{len(text)} chars>", "is not JSON or JSONL benchmark results"
            ) from None
        out = []
        for i, line in lines:
            obj = parse_json(line, field=f"{origin}:{i + 1}", source=line[:40], nonfinite=True)
            out.append(_record(obj, f"{origin}:{i + 1}"))
        return out
    if isinstance(data, list):
        if not data:
            raise InputError(origin, "[]", "holds no benchmark results")
        return [_record(o, f"{origin}[{i}]") for i, o in enumerate(data)]
    return [_record(data, origin)]
