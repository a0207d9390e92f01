"""A serve plan's replica recomputed by the public serving function from its plan."""

from __future__ import annotations

from collections.abc import Sequence

from stowplan import ModelLayout, NodeDescriptor, ReplicaPlan, Workload
from stowplan.cost.serving import ReplicaServing, replica_serving
from stowplan.model import gpu_group_node


def recomputed(
    model: ModelLayout, replica: ReplicaPlan, nodes: Sequence[NodeDescriptor], work: Workload
) -> ReplicaServing:
    """The replica's U*, TTFT, TPOT from its plan's pipeline (a stage on part of a node's
    GPUs as that GPU group)."""
    by_id = {n.id: n for n in nodes}
    stage_nodes, parents = [], []
    for a in replica.plan.assignments:
        node = by_id[a.node_id]
        part = a.gpu_indices and a.tensor_parallel < node.num_gpus
        stage_nodes.append(
            gpu_group_node(node, a.gpu_indices[0], a.tensor_parallel) if part else node
        )
        parents.append(a.node_id)
    bounds = [a.block_range[0] for a in replica.plan.assignments]
    bounds.append(replica.plan.assignments[-1].block_range[1])
    return replica_serving(model, stage_nodes, bounds, work, parents=parents)
