"""The nodes a pass schedules on: the executor's inventory followed each pass, a gang on a node
that went down evicted, and GPUs held by work that is not warden's kept out. The leader records
the inventory in the database whenever it changes; standbys take it from there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from warden.engine.model import Node
from warden.executors.base import Inventory
from warden.server.context import Duty, ReconcileContext, log
from warden.server.preempt import Preemptions
from warden.store.nodes import NodeRecord


class NodeFollower(Duty):
    """Keeps the context's `nodes` and `cluster` as the executor reports them."""

    def __init__(self, ctx: ReconcileContext, preemptions: Preemptions) -> None:
        super().__init__(ctx)
        self.preemptions = preemptions
        self._recorded: Inventory | None = None
        """The inventory this reconciler last wrote to the database (None: nothing yet)."""

    def record(self, inventory: Inventory, now: float) -> None:
        """Write `inventory` to the database, for standbys and for `warden nodes` anywhere."""
        self.store.replace_nodes(node_records(inventory, now))
        self._recorded = inventory

    def follow(self, inventory: Inventory, now: float) -> None:
        """Take the executor's current nodes (recorded when they changed). A gang with a replica
        on a node that is down (DOWN, DRAIN, not responding) is evicted whole: SIGTERM, its
        grace, SIGKILL, then it is requeued."""
        if inventory != self._recorded:
            self.record(inventory, now)
        for name in inventory.down.keys() - self.ctx.cluster.down.keys():
            log.warning("node %s takes no jobs: %s", name, inventory.down[name])
        for name, gpus in sorted(inventory.foreign.items()):
            if gpus != self.ctx.cluster.foreign.get(name, 0):
                log.warning(
                    "node %s: %d GPU(s) held by work that is not warden's are kept out of scheduling", name, gpus
                )
        self.take(inventory, now)

    def take(self, inventory: Inventory, now: float | None = None) -> None:
        """Schedule on `inventory` from now on: the snapshot keeps a down node only while jobs
        still hold resources on it, shrunk to exactly what they hold, so that nothing new is
        placed there, and GPUs that work which is not warden's holds (`Inventory.foreign`) are
        never offered: the node is shrunk by them (`without_foreign`). With `now` (the leader's
        pass), a gang on a down node is evicted; without (a standby), nothing is done to it."""
        self.ctx.cluster = inventory
        if not inventory.down and not inventory.foreign:
            self.ctx.nodes = inventory.nodes
            return
        held: dict[str, list[int]] = {}
        indices: dict[str, set[int]] = {}
        for active in self.store.active():
            job, attempt = active.job, active.attempt
            if not job.state.holds_resources or attempt is None or attempt.ended_at is not None:
                continue
            for part in attempt.assignment:
                h = held.setdefault(part.node, [0, 0, 0])
                h[0] += job.gpus
                h[1] += job.cpu
                h[2] += job.memory
                indices.setdefault(part.node, set()).update(part.gpus)
            lost = sorted({p.node for p in attempt.assignment} & inventory.down.keys())
            if lost and attempt.sigterm_at is None and now is not None:
                self.preemptions.evict(job, attempt, ", ".join(f"node {n} is {inventory.down[n]}" for n in lost), now)
        nodes = []
        for node in inventory.nodes:
            if node.name not in inventory.down:
                nodes.append(without_foreign(node, inventory.foreign.get(node.name, 0), indices.get(node.name, set())))
            elif node.name in held:
                gpus, cpu, memory = held[node.name]
                nodes.append(replace(node, gpus=gpus, cpu=min(cpu, node.cpu), memory=min(memory, node.memory)))
        self.ctx.nodes = tuple(nodes)


def node_records(inventory: Inventory, now: float) -> list[NodeRecord]:
    """`inventory` as the database records it."""
    return [
        NodeRecord.from_engine(
            n, updated_at=now, down=inventory.down.get(n.name), foreign_gpus=inventory.foreign.get(n.name, 0)
        )
        for n in inventory.nodes
    ]


def recorded_inventory(records: Iterable[NodeRecord]) -> Inventory:
    """The inventory the database records (`node_records` read back)."""
    kept = tuple(records)
    return Inventory(
        tuple(r.to_engine() for r in kept),
        {r.name: r.down for r in kept if r.down is not None},
        {r.name: r.foreign_gpus for r in kept if r.foreign_gpus},
    )


def without_foreign(node: Node, foreign: int, held: set[int]) -> Node:
    """`node` as the engine may use it when `foreign` of its GPUs are held by work that is not
    warden's: that many fewer. The engine names GPUs by index below the node's count, so the
    count never drops below one past the highest index warden's own attempts hold there; while
    they hold the top ones, up to that many foreign GPUs stay offered until those attempts end
    (a job placed on them waits in Slurm or Ray, which never give one GPU to two jobs)."""
    if foreign <= 0:
        return node
    floor = max(held) + 1 if held else 0
    return replace(node, gpus=max(node.gpus - foreign, floor, 0))
