"""The public namespace: every name in ``stowplan.__all__`` resolves, the newer parts lazily."""

from __future__ import annotations

import json
import subprocess
import sys

import stowplan


def test_every_public_name_resolves_to_the_object_of_its_module() -> None:
    from stowplan.cluster import init_ray
    from stowplan.exports import export_plan
    from stowplan.planner import plan
    from stowplan.planner.experts import ExpertInputs, ExpertPlacement, plan_with_experts
    from stowplan.planner.residency import plan_employment

    assert [n for n in stowplan.__all__ if not hasattr(stowplan, n)] == []
    assert stowplan.plan is plan
    assert stowplan.ExpertInputs is ExpertInputs
    assert stowplan.ExpertPlacement is ExpertPlacement
    assert stowplan.init_ray is init_ray
    assert stowplan.export_plan is export_plan
    assert stowplan.plan_employment is plan_employment
    assert stowplan.plan_with_experts is plan_with_experts


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        stowplan.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert str(exc) == "module 'stowplan' has no attribute 'no_such_name'"
    else:
        raise AssertionError("stowplan.no_such_name resolved")


def test_the_lazy_parts_are_imported_on_first_use_only() -> None:
    code = (
        "import sys, json, stowplan\n"
        "before = sorted(m for m in ('stowplan.cluster', 'stowplan.host', 'stowplan.exports',"
        " 'stowplan.planner.experts') if m in sys.modules)\n"
        "stowplan.FleetSpec\n"
        "print(json.dumps([before, 'stowplan.cluster' in sys.modules, 'ray' in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout) == [[], True, False]
