"""GGUF sizes computed from a config (llama.cpp's per-tensor mixes) vs published file sizes.

python benchmarks/quant_sizes.py            # every published figure, worst error last
python benchmarks/quant_sizes.py --table    # the README table (one row per model)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from stowplan.models import inspect_model

PUBLISHED = Path(__file__).with_name("published_gguf_sizes.json")
TABLE_TYPES = ("q2_k", "q3_k_m", "q4_k_m", "q5_k_m", "q6_k", "q8_0")


def rows() -> list[tuple[str, str, float, float, str]]:
    """(model, file type, published GB, computed GB, source) for every published figure."""
    out = []
    for entry in json.loads(PUBLISHED.read_text())["models"]:
        for ftype, gb in entry["sizes_gb"].items():
            computed = inspect_model(entry["model"], dtype=ftype).stored_bytes / 1e9
            out.append((entry["model"], ftype, float(gb), computed, entry["repo"]))
    return out


def _error(published: float, computed: float) -> float:
    return (computed - published) / published * 100


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", action="store_true", help="one row per model (README)")
    args = ap.parse_args()
    found = rows()
    if args.table:
        print("| model | " + " | ".join(TABLE_TYPES) + " |")
        print("|---|" + "---|" * len(TABLE_TYPES))
        for model in dict.fromkeys(r[0] for r in found):
            cells = []
            for ftype in TABLE_TYPES:
                hit = [r for r in found if r[0] == model and r[1] == ftype]
                if not hit:
                    cells.append("–")
                    continue
                _, _, pub, comp, _ = hit[0]
                cells.append(f"{comp:.2f} / {pub:g} ({_error(pub, comp):+.1f} %)")
            print(f"| {model} | " + " | ".join(cells) + " |")
    else:
        print(f"{'model':14s} {'type':8s} {'published':>9s} {'computed':>9s} {'error':>7s}")
        for model, ftype, pub, comp, _ in found:
            print(f"{model:14s} {ftype:8s} {pub:9.2f} {comp:9.3f} {_error(pub, comp):+6.2f}%")
    worst = max(found, key=lambda r: abs(_error(r[2], r[3])))
    print(
        f"{len(found)} published sizes; largest error {_error(worst[2], worst[3]):+.2f} % "
        f"({worst[0]} {worst[1]})"
    )


if __name__ == "__main__":
    main()
