"""Fidelity of the residency prediction: measured vs predicted seconds per token on this CPU.

A synthetic memory-bound decode: f32 matrices shaped like a small Llama's
blocks (q, k, v, o, gate, up, down), each token multiplying one activation
vector through every matrix once, so every weight byte is read once per token.
The prediction is ``plan_employment(...).predicted_s_per_token`` from a quick
probe of the same CPU. Probe and decode alternate, ``--rounds`` times; the
medians are compared, and so are the fastest rounds (on a shared machine the
fastest round is the one least disturbed by other processes).

    .venv/bin/python benchmarks/fidelity.py [--rounds 7] [--blocks 4] [--tokens 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from stowplan.host.bench import measure
from stowplan.host.discover import discover
from stowplan.host.residency import ResidencyProtocol, plan_employment

HIDDEN = 2048
KV = 512
FFN = 5632


def make_blocks(num_blocks: int) -> list[list[np.ndarray]]:
    shapes = [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN)]
    shapes += [(FFN, HIDDEN), (FFN, HIDDEN), (HIDDEN, FFN)]
    return [[np.full(s, 1e-3, dtype=np.float32) for s in shapes] for _ in range(num_blocks)]


def decode_token(blocks: list[list[np.ndarray]], x: np.ndarray) -> np.ndarray:
    for q, k, v, o, gate, up, down in blocks:
        _ = k @ x, v @ x
        x = o @ (q @ x)
        x = down @ ((gate @ x) * (up @ x))
        x = x / (np.abs(x).max() + 1.0)
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=3)
    args = ap.parse_args()

    blocks = make_blocks(args.blocks)
    model_bytes = sum(m.nbytes for b in blocks for m in b)
    topo = discover()
    x = np.ones(HIDDEN, dtype=np.float32)
    decode_token(blocks, x)  # warm-up
    measured, predicted = [], []
    for _ in range(args.rounds):
        matrix, _ = measure(topo, quick=True)
        plan = plan_employment(topo, matrix, model_bytes)
        assert plan.protocol is ResidencyProtocol.RESIDENT
        predicted.append(plan.predicted_s_per_token)
        t0 = time.perf_counter()
        for _ in range(args.tokens):
            x = decode_token(blocks, x)
        measured.append((time.perf_counter() - t0) / args.tokens)
    m, p = statistics.median(measured), statistics.median(predicted)
    print(f"model: {args.blocks} blocks, {model_bytes / 2**20:.0f} MiB f32, hidden {HIDDEN}")
    print(f"rounds: {args.rounds} (probe and {args.tokens}-token decode alternate)")
    for label, xs, med in (("predicted", predicted, p), ("measured ", measured, m)):
        lo, hi = min(xs) * 1e3, max(xs) * 1e3
        print(f"{label} s/token (median): {med * 1e3:.1f} ms   [{lo:.1f}, {hi:.1f}]")
    print(f"ratio measured/predicted (medians): {m / p:.3f}")
    fastest = min(measured) / min(predicted)
    print(f"ratio measured/predicted (fastest of each, least disturbed): {fastest:.3f}")


if __name__ == "__main__":
    main()
