"""The residency planner's and the host values' old paths still resolve, with a warning
naming the new one."""

from __future__ import annotations

import importlib

import pytest

import stowplan.planner.residency as residency


@pytest.mark.parametrize("old", ["stowplan.host.residency", "stowplan.host"])
@pytest.mark.parametrize(
    "name", ["plan_employment", "EmploymentPlan", "DEFAULT_RESIDENCY_HEADROOM_FRAC"]
)
def test_an_old_path_warns_and_gives_the_new_name(old: str, name: str) -> None:
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=rf"{old}\.{name} .*stowplan\.planner\.residency"):
        found = getattr(module, name)
    assert found is getattr(residency, name)


def test_a_name_that_never_lived_there_is_an_attribute_error() -> None:
    module = importlib.import_module("stowplan.host.residency")
    with pytest.raises(AttributeError, match="has no attribute 'probe_host'"):
        module.probe_host  # noqa: B018


@pytest.mark.parametrize("name", ["HostTopology", "CapabilityMatrix", "SYSTEM_POOL"])
def test_the_host_values_old_path_warns_and_gives_the_new_name(name: str) -> None:
    import stowplan.circuits as circuits

    module = importlib.import_module("stowplan.host.topology")
    with pytest.warns(DeprecationWarning, match=rf"host\.topology\.{name} .*stowplan\.circuits"):
        found = getattr(module, name)
    assert found is getattr(circuits, name)
