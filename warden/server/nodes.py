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
        before = self.ctx.cluster
        for name, gpus in inventory.foreign_counts().items():
            which = inventory.foreign.get(name, ())
            if gpus != before.foreign_count(name) or which != before.foreign.get(name, ()):
                log.warning(
                    "node %s: %d GPU(s) held by work that is not warden's (%s) are kept out of scheduling",
                    name,
                    gpus,
                    f"indices {','.join(map(str, which))}" if len(which) == gpus else "which is not known",
                )
        self.take(inventory, now)

    def take(self, inventory: Inventory, now: float | None = None) -> None:
        """Schedule on `inventory` from now on: the snapshot keeps a down node only while jobs
        still hold resources on it, shrunk to exactly what they hold, so that nothing new is
        placed there, and GPUs that work which is not warden's holds (`Inventory.foreign`) are
        unavailable to the engine (`Node.unavailable`, `unavailable_gpus`). With `now` (the
        leader's pass), a gang on a down node is evicted; without (a standby), nothing is done
        to it."""
        self.ctx.cluster = inventory
        if not inventory.down and not inventory.foreign and not inventory.foreign_unknown:
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
                unavailable = unavailable_gpus(
                    node,
                    inventory.foreign.get(node.name, ()),
                    inventory.foreign_unknown.get(node.name, 0),
                    indices.get(node.name, set()),
                    held.get(node.name, [0])[0],
                )
                nodes.append(replace(node, unavailable=unavailable) if unavailable else node)
            elif node.name in held:
                gpus, cpu, memory = held[node.name]
                nodes.append(replace(node, gpus=gpus, cpu=min(cpu, node.cpu), memory=min(memory, node.memory)))
        self.ctx.nodes = tuple(nodes)


def node_records(inventory: Inventory, now: float) -> list[NodeRecord]:
    """`inventory` as the database records it."""
    return [
        NodeRecord.from_engine(
            n,
            updated_at=now,
            down=inventory.down.get(n.name),
            foreign_gpus=inventory.foreign_count(n.name),
            foreign_indices=inventory.foreign.get(n.name, ()),
        )
        for n in inventory.nodes
    ]


def recorded_inventory(records: Iterable[NodeRecord]) -> Inventory:
    """The inventory the database records (`node_records` read back)."""
    kept = tuple(records)
    return Inventory(
        tuple(r.to_engine() for r in kept),
        {r.name: r.down for r in kept if r.down is not None},
        {r.name: r.foreign_indices for r in kept if r.foreign_indices},
        {r.name: r.foreign_gpus - len(r.foreign_indices) for r in kept if r.foreign_gpus > len(r.foreign_indices)},
    )


def unavailable_gpus(
    node: Node, foreign: Iterable[int], unknown: int, held: set[int], holding: int | None = None
) -> tuple[int, ...]:
    """The GPU indices of `node` the engine must not place on: those work that is not warden's
    holds (`foreign`), and for `unknown` more that it holds where the substrate cannot say which
    (Ray), as many of the lowest indices warden's own attempts do not hold (`held`): foreign
    work that began first holds the lowest where a substrate hands out the lowest free ones, so
    the guess keeps warden's plan and the substrate's choice alike most often.

    A foreign index that warden's record of an attempt also names is a record not corrected yet
    (`Executor.devices` corrects it once the attempt runs): it is still one GPU fewer, so it is
    unavailable too. They never leave fewer usable GPUs than warden's attempts hold there
    (`holding`, default `len(held)`): the engine must be able to count them all, and an attempt
    whose exit is not collected yet may still count GPUs the substrate has given to other work.
    Foreign GPUs known by index come first, the guesses next, those warden's record names last."""
    room = max(0, node.gpus - (len(held) if holding is None else holding))
    known = sorted({g for g in foreign if 0 <= g < node.gpus})
    order = [g for g in known if g not in held]
    order += [g for g in range(node.gpus) if g not in held and g not in order][: max(unknown, 0)]
    order += [g for g in known if g in held]
    return tuple(sorted(order[:room]))
