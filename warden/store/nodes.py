"""Nodes: the cluster as the leading server's executor last reported it, which standbys follow."""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import cast

from sqlalchemy import Table, delete, insert, select

from warden.engine.model import DEFAULT_FLAVOR, Node
from warden.store.base import StoreBase
from warden.store.schema import NodeRow

NODES = cast(Table, NodeRow.__table__)


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """A node as discovered; `gpu_names` are the device names (e.g. "NVIDIA H100 80GB HBM3"),
    `down` why it takes no job now (None: it does), `foreign_gpus` how many of its GPUs work that
    is not warden's holds, `foreign_indices` which of those are known by index (sorted; the rest,
    a substrate could not name: Ray's)."""

    name: str
    gpus: int
    cpu: int = 0
    memory: int = 0
    flavor: str = DEFAULT_FLAVOR
    block: str | None = None
    gpu_names: tuple[str, ...] = field(default=())
    updated_at: float = 0.0
    down: str | None = None
    foreign_gpus: int = 0
    foreign_indices: tuple[int, ...] = ()

    @classmethod
    def from_engine(
        cls,
        node: Node,
        *,
        updated_at: float,
        gpu_names: Sequence[str] = (),
        down: str | None = None,
        foreign_gpus: int = 0,
        foreign_indices: Sequence[int] = (),
    ) -> NodeRecord:
        return cls(
            node.name,
            node.gpus,
            node.cpu,
            node.memory,
            node.flavor,
            node.block,
            tuple(gpu_names),
            updated_at,
            down,
            foreign_gpus,
            tuple(foreign_indices),
        )

    def to_engine(self) -> Node:
        return Node(self.name, self.gpus, cpu=self.cpu, memory=self.memory, flavor=self.flavor, block=self.block)


class NodeStore(StoreBase):
    """The nodes part of `Store`."""

    def replace_nodes(self, nodes: Iterable[NodeRecord]) -> None:
        """Replace the recorded cluster with `nodes`."""
        params = [
            {
                "name": n.name,
                "gpus": n.gpus,
                "cpu": n.cpu,
                "memory": n.memory,
                "flavor": n.flavor,
                "block": n.block,
                "gpu_names": builtins.list(n.gpu_names),
                "updated_at": n.updated_at,
                "down": n.down,
                "foreign_gpus": n.foreign_gpus,
                "foreign_indices": builtins.list(n.foreign_indices),
            }
            for n in nodes
        ]
        with self._write() as conn:
            conn.execute(delete(NODES))
            if params:
                conn.execute(insert(NODES), params)

    def nodes(self) -> tuple[NodeRecord, ...]:
        """The recorded nodes, by name."""
        with self._read() as conn:
            rows = conn.execute(select(NODES).order_by(NODES.c.name)).all()
        return tuple(
            NodeRecord(
                r.name,
                r.gpus,
                r.cpu,
                r.memory,
                r.flavor,
                r.block,
                tuple(r.gpu_names),
                r.updated_at,
                r.down,
                r.foreign_gpus,
                tuple(int(i) for i in r.foreign_indices or ()),
            )
            for r in rows
        )
