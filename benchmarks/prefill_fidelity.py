"""Calibrated prefill: each published prompt-processing run predicted from the others.

python benchmarks/prefill_fidelity.py

For every run of ``src/stowplan/calibration/data/prefill_runs.json``,
:func:`stowplan.calibration.prefill.leave_one_out` fits the device's prefill compute
without it (its other runs, else other devices' share of their datasheet figure) and
predicts its tokens/s; the table lists both and the error, then the median error.
"""

from __future__ import annotations

import statistics

from stowplan.calibration.prefill import leave_one_out


def main() -> None:
    print("| GPU | model | quant | pp512 measured | predicted | error |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    errors = []
    for run, predicted in leave_one_out():
        if predicted is None:
            print(
                f"| {run.gpu_name} | {run.model} | {run.quant} | {run.tokens_per_s:.0f} | – | – |"
            )
            continue
        err = (predicted - run.tokens_per_s) / run.tokens_per_s
        errors.append(abs(err))
        print(
            f"| {run.gpu_name} | {run.model} | {run.quant} | {run.tokens_per_s:.0f} "
            f"| {predicted:.0f} | {err:+.0%} |"
        )
    print(f"\nmedian |error| over {len(errors)} runs: {statistics.median(errors):.1%}")


if __name__ == "__main__":
    main()
