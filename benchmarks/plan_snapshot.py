"""Every plan output of a fixed set of inputs, as one JSON document, for refactorings.

python benchmarks/plan_snapshot.py OUT.json

Known models (dense, MoE, tensor parallel) × the shipped fleets in examples/fleets ×
strategies, batches and calibrations, each written as its plan JSON (predictions and
certificate included) or its refusal.  A move that changes no behaviour leaves the file
byte-identical; compare with ``cmp``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from stowplan import Constraints, PlanError, Strategy, load_nodes, plan, plan_to_json
from stowplan.calibration import resolve_calibration
from stowplan.models import resolve_model

FLEETS = Path(__file__).resolve().parent.parent / "examples" / "fleets"

MODELS = (
    "llama3.1:8b",
    "llama3.1:70b",
    "llama3.1:70b-q4_0",
    "mixtral:8x7b-q4_0",
    "qwen3:30b-a3b-q4_0",
)
STRATEGIES = (None, Strategy.BALANCE_BY_VRAM, Strategy.LATENCY, Strategy.THROUGHPUT)
BATCHES = (1, 8)


def cases() -> list[tuple[str, str, Constraints]]:
    generic = resolve_calibration("generic")
    out = []
    for fleet in sorted(FLEETS.glob("*.yaml")):
        for model in MODELS:
            for strategy in STRATEGIES:
                for batch in BATCHES:
                    for calibration in (None, generic):
                        c = Constraints(
                            strategy=strategy,
                            batch=batch,
                            context_tokens=4096,
                            calibration=calibration,
                        )
                        out.append((fleet.name, model, c))
    two = "two-h100-nodes.yaml"
    for tp in (1, 2, 4, 8):
        out.append((two, "llama3.1:70b", Constraints(tensor_parallel=tp, batch=4)))
    out.append((two, "llama3.1:405b-q4_0", Constraints(batch=16, context_tokens=8192)))
    out.append(
        ("mixed-consumer.yaml", "llama3.1:70b", Constraints(strategy=Strategy.EXACT, batch=4))
    )
    return out


def main() -> None:
    doc = []
    for fleet, model, c in cases():
        key = {
            "fleet": fleet,
            "model": model,
            "strategy": None if c.strategy is None else str(c.strategy),
            "batch": c.batch,
            "calibrated": c.calibration is not None,
            "tensor_parallel": c.tensor_parallel,
        }
        nodes = load_nodes(FLEETS / fleet)
        try:
            result = json.loads(plan_to_json(plan(resolve_model(model), nodes, c)))
        except PlanError as exc:
            result = {"refused": type(exc).__name__, "message": str(exc)}
        doc.append({"case": key, "result": result})
    Path(sys.argv[1]).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"{len(doc)} cases, {sum('refused' in d['result'] for d in doc)} refused")


if __name__ == "__main__":
    main()
