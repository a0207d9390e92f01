"""HiGHS's native diagnostics stay off the standard output, where a plan may be written."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by a fresh interpreter in the repository root (``tests`` importable)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        cwd=ROOT,
    )


def test_native_writes_to_the_standard_output_go_to_the_standard_error_within_the_block():
    got = _run(
        """
        import os, sys
        from stowplan.planner.exact.highs import native_output_to_stderr
        print("before", flush=True)
        with native_output_to_stderr():
            os.write(1, b"native\\n")
            print("python inside")
        os.write(1, b"after\\n")
        """
    )
    assert got.stdout.split() == ["before", "after"]
    assert got.stderr.split() == ["native", "python", "inside"]


def test_highs_log_reaches_the_standard_error_through_milp_and_the_standard_output_without():
    """HiGHS's log (``disp``) is written by its C++ code to file descriptor 1: bare
    ``scipy.optimize.milp`` puts it on the standard output, :func:`milp` on the
    standard error."""
    solve = """
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint
        from {module} import milp
        a = np.array([[1.0, 1.0, 1.0], [1.0, 3.0, 0.0]])
        got = milp(
            -np.array([1.0, 2.0, 3.0]), integrality=np.ones(3), bounds=Bounds(0, 5),
            constraints=LinearConstraint(a, -np.inf, [7.5, 9.5]), options={{"disp": True}},
        )
        print(f"{{-got.fun:g}}")
        """
    bare = _run(solve.format(module="scipy.optimize"))
    assert "Running HiGHS" in bare.stdout
    kept = _run(solve.format(module="stowplan.planner.exact.highs"))
    assert kept.stdout.split() == [bare.stdout.split()[-1]]
    assert "Running HiGHS" in kept.stderr


def test_an_exact_plan_whose_milp_prints_leaves_the_standard_output_to_the_caller():
    """Five mixed nodes, mixtral:8x7b at 16 sequences with the generic calibration and an
    8,192-token reserve, planned with ``strategy="exact"``: its MILP solves run with
    HiGHS's log on (``disp``), which HiGHS's C++ code writes to file descriptor 1 (as it
    writes its ``transformNewIntegerFeasibleSolution`` diagnostics on some problems, with
    no log asked for); the log reaches the standard error, and the standard output holds
    only what the caller prints.  (The quick bound's hops, sends and fixed seconds are
    left out: with them, the bounds prove the plan before any MILP runs.)"""
    got = _run(
        """
        import scipy.optimize

        from stowplan import Constraints, plan
        from stowplan.calibration import resolve_calibration
        from stowplan.models import resolve_model
        from stowplan.planner.strategies import cycle
        from tests.common.gpu_fleets import nodes_of

        cycle._cheapest = lambda cm, layouts: ([0.0], [0.0], 0.0, 0.0)
        bare = scipy.optimize.milp

        def logged(*args, **kwargs):
            kwargs["options"] = {**(kwargs.get("options") or {}), "disp": True}
            return bare(*args, **kwargs)

        scipy.optimize.milp = logged
        nodes = nodes_of(
            [
                ("L4", 24, 1, 68393.45712718941, 0.47205981884748477),
                ("L4", 24, 1, 21238.939112239772, 0.4675747384041345),
                ("A100 40GB SXM4", 40, 8, 46120.89204507565, 0.11799391533515557),
                ("H100 PCIe", 80, 8, 87929.70257858183, 0.15568975421473757),
                ("A100 80GB SXM4", 80, 2, 70641.4922862441, 0.41131111236128676),
            ]
        )
        c = Constraints(
            batch=16, context_tokens=8192, calibration=resolve_calibration("generic"),
            strategy="exact",
        )
        got = plan(resolve_model("mixtral:8x7b"), nodes, c)
        print(f"{got.rationale.prediction.tokens_per_s:.1f}")
        """
    )
    assert got.stdout.split() == ["1551.6"]
    assert "Running HiGHS" in got.stderr
