"""The root's helper modules moved into packages; each old path still answers every public
name of its new module, with a warning naming where it lives now."""

from __future__ import annotations

import importlib

import pytest

MOVED = {
    "stowplan.fileio": "stowplan.files.fileio",
    "stowplan.safeload": "stowplan.files.safeload",
    "stowplan.nodefile": "stowplan.files.fleets",
    "stowplan.units": "stowplan.quantities.units",
    "stowplan.limits": "stowplan.quantities.limits",
    "stowplan.checks": "stowplan.quantities.checks",
    "stowplan.expert_routing": "stowplan.moe.routing",
    "stowplan.expert_stats": "stowplan.moe.stats",
    "stowplan.wording": "stowplan.text.wording",
    "stowplan.shell": "stowplan.text.shell",
    "stowplan.interconnect": "stowplan.gpus.interconnect",
    "stowplan.gpu_lists": "stowplan.stages.gpu_lists",
    "stowplan.worker": "stowplan.stages.worker",
    "stowplan.parallel_rules": "stowplan.rules.tensor_parallel",
    "stowplan.plan_checks": "stowplan.rules.plan_fit",
    "stowplan.baselines": "stowplan.planner.baselines",
}


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_every_public_name_of_the_new_module_answers_at_the_old_path(old: str, new: str) -> None:
    module, target = importlib.import_module(old), importlib.import_module(new)
    names = list(target.__all__)
    assert names
    for name in names:
        with pytest.warns(
            DeprecationWarning, match=rf"^{old}\.{name} is deprecated; import it from {new}$"
        ):
            found = getattr(module, name)
        assert found is getattr(target, name)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_knows_no_other_name(old: str) -> None:
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        importlib.import_module(old).no_such_name  # noqa: B018
