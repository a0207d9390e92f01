"""A plan on one multi-GPU node is certified exact: its bound is its own value (issue 26)."""

from __future__ import annotations

import pytest

from stowplan import Constraints, NodeDescriptor, PlanError, lookup, plan

pytest.importorskip("numpy")


def _node(gpus: int) -> NodeDescriptor:
    return NodeDescriptor(
        id="only", gpu_name="H100 SXM5", vram_bytes=gpus * 80 * 10**9, num_gpus=gpus
    )


@pytest.mark.parametrize("name", ["llama3.1:8b", "llama3.1:70b"])
@pytest.mark.parametrize("batch", [1, 16])
@pytest.mark.parametrize("gpus", [1, 4, 8])
def test_one_node_certificate_is_exact(name: str, batch: int, gpus: int) -> None:
    model = lookup(name)
    assert model is not None
    if gpus == 1 and name == "llama3.1:70b":
        with pytest.raises(PlanError):  # 70b in bf16 does not fit one H100
            plan(model, [_node(gpus)], Constraints(batch=batch))
        return
    got = plan(model, [_node(gpus)], Constraints(batch=batch))
    cert, pred = got.rationale.certificate, got.rationale.prediction
    assert cert is not None and pred is not None
    assert cert.exact, cert
    assert cert.gap <= 1e-9, cert
    assert cert.bound == pytest.approx(cert.value, rel=1e-9)
    # No single-degree layout (every stage of one tensor-parallel degree) beats the plan.
    for tp in (t for t in (1, 2, 4, 8) if t <= gpus):
        try:
            other = plan(model, [_node(gpus)], Constraints(batch=batch, tensor_parallel=tp))
        except PlanError:
            continue
        theirs = other.rationale.prediction
        assert theirs is not None
        assert pred.time_per_token_s <= theirs.time_per_token_s * (1 + 1e-9)
