"""A local fake multi-node Ray cluster on 127.0.0.1 for demos and tests.

Each fake node declares a GPU count and carries the labels ``gpu_name`` and
``vram_bytes`` that :mod:`stowplan.cluster.nodes` reads when no NVML is
present.  The head node holds no GPU and no VRAM label, so it is never a
placement target.  Ray is kept on loopback and isolated in a fresh temporary
directory: :func:`~stowplan.cluster.ray_runtime.prepare_local_ray` sets the defaults
of :data:`~stowplan.cluster.ray_runtime.LOCAL_START_ENV` before Ray starts (a variable
the user set wins) and restores the environment at shutdown.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from stowplan.cluster.ray_runtime import (
    LOCAL_HEAD_ARGS,
    LOCAL_START_ENV,
    OBJECT_STORE_BYTES,
    prepare_local_ray,
    require_ray,
)
from stowplan.errors import InputError
from stowplan.model import NodeDescriptor
from stowplan.quantities.checks import check_int

__all__ = [
    "DEFAULT_FAKE_NODES",
    "FakeNode",
    "LocalCluster",
    "fake_node_descriptors",
    "local_cluster",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class FakeNode:
    """One fake worker node: a GPU name and count, and the VRAM it claims in total."""

    gpu_name: str
    vram_bytes: int
    num_gpus: int = 1
    num_cpus: int = 1

    def __post_init__(self) -> None:
        if not self.gpu_name or any(c.isspace() for c in self.gpu_name):
            raise InputError("gpu_name", self.gpu_name, "must be a non-empty label without spaces")
        for name in ("vram_bytes", "num_gpus", "num_cpus"):
            check_int(name, getattr(self, name), minimum=1)

    def labels(self) -> dict[str, str]:
        return {"gpu_name": self.gpu_name, "vram_bytes": str(self.vram_bytes)}

    def node_args(self) -> dict[str, Any]:
        """Keyword arguments of ``Cluster.add_node`` for this node."""
        return {
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "labels": self.labels(),
            "object_store_memory": OBJECT_STORE_BYTES,
        }


DEFAULT_FAKE_NODES: tuple[FakeNode, ...] = (
    FakeNode(gpu_name="RTX-4070", vram_bytes=5 << 20),
    FakeNode(gpu_name="RTX-3060", vram_bytes=4 << 20),
    FakeNode(gpu_name="RTX-2080", vram_bytes=7 << 19),
    FakeNode(gpu_name="GTX-1660", vram_bytes=2 << 20),
)
"""Four nodes with different VRAM (5, 4, 3.5 and 2 MiB), scaled to the demo model
(about 6.5 MiB): no two hold it, so the planner builds a three-stage pipeline, and
any one of its nodes can fail and the rest still hold it."""


@dataclass(slots=True)
class LocalCluster:
    """A running local cluster: the Ray ``Cluster`` object and its worker nodes in order."""

    cluster: Any
    workers: list[Any]
    tmpdir: str
    saved_env: dict[str, str | None]

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def add(self, node: FakeNode) -> Any:
        """Add one fake node and wait until Ray sees it."""
        handle = self.cluster.add_node(**node.node_args())
        self.workers.append(handle)
        self.cluster.wait_for_nodes()
        return handle

    def remove(self, handle: Any) -> None:
        """Remove a worker node (its processes end at once, as when a host dies)."""
        self.cluster.remove_node(handle, allow_graceful=False)
        self.workers.remove(handle)

    def node_id(self, handle: Any) -> str:
        return str(handle.node_id)

    def shutdown(self) -> None:
        """Disconnect, stop every node, delete the temporary directory, restore the env."""
        ray = require_ray()
        try:
            ray.shutdown()
            if self.cluster is not None:
                self.cluster.shutdown()
        finally:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            for key, value in self.saved_env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def start_local_cluster(
    nodes: Sequence[FakeNode] = DEFAULT_FAKE_NODES, *, verbose: bool = False
) -> LocalCluster:
    """Start a head (no GPU) plus one fake node per entry and connect this process to it.

    Ray's own log lines (INFO and its workers' output) are shown only when ``verbose``.
    """
    tmpdir = tempfile.mkdtemp(prefix="stowplan-ray-")
    saved = {key: os.environ.get(key) for key in (*LOCAL_START_ENV, "RAY_TMPDIR")}
    os.environ["RAY_TMPDIR"] = tmpdir
    ray = prepare_local_ray()  # loopback defaults, before (or applied after) Ray's import
    from ray.cluster_utils import Cluster

    local = LocalCluster(cluster=None, workers=[], tmpdir=tmpdir, saved_env=saved)
    try:
        local.cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 1, "num_gpus": 0, **LOCAL_HEAD_ARGS},
        )
        for node in nodes:
            local.workers.append(local.cluster.add_node(**node.node_args()))
        local.cluster.wait_for_nodes()
        ray.init(
            address=local.cluster.address,
            log_to_driver=verbose,
            logging_level=logging.INFO if verbose else logging.WARNING,
        )
    except BaseException:
        local.shutdown()
        raise
    return local


@contextmanager
def local_cluster(nodes: Sequence[FakeNode] = DEFAULT_FAKE_NODES) -> Iterator[LocalCluster]:
    """``with local_cluster() as lc:`` — a started cluster, shut down on exit."""
    lc = start_local_cluster(nodes)
    try:
        yield lc
    finally:
        lc.shutdown()


def fake_node_descriptors(nodes: Sequence[FakeNode] = DEFAULT_FAKE_NODES) -> list[NodeDescriptor]:
    """The planner's view of ``nodes`` without starting Ray (ids ``fake-0``, ``fake-1`` …;
    a started cluster names them by Ray node id instead)."""
    return [
        NodeDescriptor(
            id=f"fake-{i}",
            gpu_name=n.gpu_name,
            vram_bytes=n.vram_bytes,
            num_gpus=n.num_gpus,
            labels=(("source", "fake"),),
        )
        for i, n in enumerate(nodes)
    ]
