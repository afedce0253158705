"""Nominal quotas that do not match the cluster: more than it has, or less (DESIGN §2, §4.2, §4.3).

A queue's nominal quota is what it is guaranteed: reclaim takes back capacity that another
queue borrows beyond its own nominal. When the nominal quotas together exceed the cluster,
every queue can be at or under its nominal while the cluster is full: nobody is ever
borrowing, so nothing is reclaimed, and a queue's nominal promises GPUs that do not exist.
When they cover less than the cluster, the rest is guaranteed to nobody: the root is the
cluster (`QuotaTree`'s `capacity`), so every queue may borrow it within its borrowing limit,
but a tier that is not preemptible, never admitted as borrowing, cannot use it. Both are reported
by `quota_warnings`, wherever a policy meets a cluster (`warden policy check --gpus/--cluster`,
the simulator, the server at start and when a policy is applied).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from warden.engine.fairshare import cluster_capacity
from warden.engine.model import Node
from warden.engine.policy import Policy


@dataclass(frozen=True, slots=True)
class Overcommit:
    """The root's children's nominal of one resource against the cluster's total of it: more."""

    kind: ClassVar[str] = "overcommit"
    headline: ClassVar[str] = "the policy's quotas exceed this cluster"
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
        return _as_dict(self)


@dataclass(frozen=True, slots=True)
class Uncovered:
    """The root's children's nominal of one resource against the cluster's total of it: less."""

    kind: ClassVar[str] = "uncovered"
    headline: ClassVar[str] = "the policy's quotas cover less than this cluster"
    resource: str
    nominal: int
    capacity: int

    @property
    def message(self) -> str:
        return (
            f"{self.capacity - self.nominal:,} of the cluster's {self.capacity:,} {_units(self.resource)} "
            f"are covered by no queue's nominal quota: every queue may borrow them (within its "
            f"borrowing limit), and a tier that is not preemptible never runs on them. Raise the "
            f"nominal quotas to the cluster to guarantee them to the queues."
        )

    def to_dict(self) -> dict[str, object]:
        return _as_dict(self)


QuotaWarning = Overcommit | Uncovered


def _as_dict(w: QuotaWarning) -> dict[str, object]:
    return {
        "kind": w.kind,
        "resource": w.resource,
        "nominal": w.nominal,
        "capacity": w.capacity,
        "message": w.message,
    }


def _units(resource: str) -> str:
    """How a sentence counts a resource: "GPUs", "a100 GPUs", "cpu"."""
    if resource == "gpu":
        return "GPUs"
    if resource.startswith("gpu:"):
        return f"{resource.removeprefix('gpu:')} GPUs"
    return resource


def cluster_totals(nodes: Iterable[Node]) -> dict[str, int]:
    """What the cluster has of every resource a quota can name: gpu, gpu:FLAVOR, cpu, memory
    (unavailable GPUs left out: `Node.usable_gpus`)."""
    nodes = tuple(nodes)
    gpus, cpu, memory = cluster_capacity(nodes)
    totals = {"gpu": gpus, "cpu": cpu, "memory": memory}
    for n in nodes:
        totals[f"gpu:{n.flavor}"] = totals.get(f"gpu:{n.flavor}", 0) + n.usable_gpus
    return totals


def covered(policy: Policy) -> dict[str, int]:
    """What the root's children's nominal quotas add up to, per resource the policy governs
    (the root's own nominal where it has no children): the capacity some queue is guaranteed."""
    root = policy.queues
    if not root.children:
        return dict(root.nominal)
    sums = dict.fromkeys(root.nominal, 0)
    for child in root.children:
        for resource, amount in child.nominal.items():
            sums[resource] = sums.get(resource, 0) + amount
    return sums


def quota_warnings(policy: Policy, nodes: Iterable[Node]) -> tuple[QuotaWarning, ...]:
    """Per resource, by name, where the nominal quotas exceed the cluster or cover less of it;
    nothing where they cover exactly what it has.

    A resource the cluster does not report (CPU or memory of nodes that give none, a flavor it
    has no nodes of) is left out: there is nothing to compare it with."""
    totals = cluster_totals(nodes)
    found: list[QuotaWarning] = []
    for resource, nominal in sorted(covered(policy).items()):
        capacity = totals.get(resource, 0)
        if capacity > 0 and nominal > capacity:
            found.append(Overcommit(resource, nominal, capacity))
        elif capacity > 0 and nominal < capacity:
            found.append(Uncovered(resource, nominal, capacity))
    return tuple(found)
