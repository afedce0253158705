"""Nominal quotas that add up to more than the cluster has (DESIGN §2, §4.3).

A queue's nominal quota is what it is guaranteed: reclaim takes back capacity that another
queue borrows beyond its own nominal. When the nominal quotas together exceed the cluster,
every queue can be at or under its nominal while the cluster is full: nobody is ever
borrowing, so nothing is reclaimed, and a queue's nominal promises GPUs that do not exist.
Shells report it where a policy meets a cluster (`warden policy check --gpus/--cluster`, the
simulator, the server at start and when a policy is applied).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from warden.engine.fairshare import cluster_capacity
from warden.engine.model import Node
from warden.engine.policy import Policy


@dataclass(frozen=True, slots=True)
class Overcommit:
    """The root's nominal of one resource against the cluster's total of it."""

    resource: str
    nominal: int
    capacity: int

    @property
    def message(self) -> str:
        scale = self.capacity / self.nominal
        return (
            f"The nominal {self.resource} quotas add up to {self.nominal:,} but the cluster has "
            f"{self.capacity:,}: every queue can be within its nominal while the cluster is full, "
            f"so no job counts as borrowing, nothing is ever reclaimed for a queue that is owed "
            f"its quota, and a nominal quota is no guarantee. Scale the nominal quotas to the "
            f"cluster (× {scale:.3g}), or leave them out and let the queues' weights share it "
            f"(fair share)."
        )

    def to_dict(self) -> dict[str, object]:
        return {"resource": self.resource, "nominal": self.nominal, "capacity": self.capacity, "message": self.message}


def cluster_totals(nodes: Iterable[Node]) -> dict[str, int]:
    """What the cluster has of every resource a quota can name: gpu, gpu:FLAVOR, cpu, memory."""
    nodes = tuple(nodes)
    gpus, cpu, memory = cluster_capacity(nodes)
    totals = {"gpu": gpus, "cpu": cpu, "memory": memory}
    for n in nodes:
        totals[f"gpu:{n.flavor}"] = totals.get(f"gpu:{n.flavor}", 0) + n.gpus
    return totals


def overcommitted(policy: Policy, nodes: Iterable[Node]) -> tuple[Overcommit, ...]:
    """The resources whose nominal quotas, summed at the root, exceed the cluster's, by name.

    A resource the cluster does not report (CPU or memory of nodes that give none, a flavor it
    has no nodes of) is left out: there is nothing to compare it with."""
    totals = cluster_totals(nodes)
    found = []
    for resource, nominal in sorted(policy.queues.nominal.items()):
        capacity = totals.get(resource, 0)
        if capacity > 0 and nominal > capacity:
            found.append(Overcommit(resource, nominal, capacity))
    return tuple(found)
