"""What each queue asks for and is owed now: the entitlement fair-share reclaim enforces.

A queue's charged demand is the GPUs of its jobs of charged tiers that are waiting or hold
resources; what it is owed is the cluster water-filled over those demands
(`accounting.owed_now`), the same function the simulator integrates into owed GPU-hours and
`GET /v1/queues` shows. The engine keeps the demand between passes, job by job, so a pass reads
the owed share of every queue without a walk over the waiting jobs.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from typing import TYPE_CHECKING

from warden.engine.accounting import owed_now, policy_entitlement

if TYPE_CHECKING:
    from warden.engine.model import Job, Node
    from warden.engine.policy import Policy
    from warden.engine.quota import QuotaTree


def charged_gpus(policy: Policy, leaves: Container[str], job: Job) -> int:
    """The GPUs a job adds to its queue's demand: all of them for a live job of a charged tier
    in one of the policy's `leaves`, else none."""
    if job.state.terminal or job.queue not in leaves or not policy.tier(job.tier).charged:
        return 0
    return job.total_gpus


class Demand:
    """Charged GPU demand per leaf queue, kept job by job (`sync`, `apply`)."""

    __slots__ = ("_jobs", "_leaves", "_owed", "_policy", "_shown", "by_queue", "version")

    def __init__(self) -> None:
        self._policy: Policy | None = None
        self._leaves: frozenset[str] = frozenset()
        self._jobs: dict[str, tuple[str, int]] = {}
        self._shown: dict[str, Job] = {}
        """The jobs of the last `sync`, by id: a job shown again unchanged is not looked at."""
        self.by_queue: dict[str, int] = {}
        self.version = 0
        """Bumped whenever a queue's demand changes (what `owed` remembers)."""
        self._owed: tuple[int, int, list[float]] | None = None

    def sync(self, policy: Policy, jobs: Iterable[Job]) -> None:
        """Make the demand that of exactly these jobs, touching only those that changed since
        the last `sync` (the same object) under the same policy: the demand, and so what each
        queue is owed, is worked out again only when it changed."""
        shown, before = {}, self._shown
        if policy is not self._policy:
            self._policy = policy
            self._leaves = frozenset(q.name for q in policy.leaves())
            self._jobs.clear()
            self.by_queue.clear()
            self.version += 1
            before = {}
        for job in jobs:
            shown[job.id] = job
            if before.get(job.id) is not job:
                self._put(policy, job)
        for job_id in before.keys() - shown.keys():
            self._drop(job_id)
        self._shown = shown

    def apply(self, policy: Policy, changed: Iterable[Job]) -> None:
        """Take these jobs' new versions; every other job is as before."""
        shown = self._shown
        for job in changed:
            self._put(policy, job)
            if job.state.terminal:
                shown.pop(job.id, None)
            else:
                shown[job.id] = job

    def _drop(self, job_id: str) -> None:
        old = self._jobs.pop(job_id, None)
        if old is not None:
            self.by_queue[old[0]] -= old[1]
            self.version += 1

    def _put(self, policy: Policy, job: Job) -> None:
        gpus = charged_gpus(policy, self._leaves, job)
        old = self._jobs.get(job.id)
        new = (job.queue, gpus) if gpus else None
        if old == new:
            return
        if old is not None:
            del self._jobs[job.id]
            self.by_queue[old[0]] -= old[1]
        if new is not None:
            self._jobs[job.id] = new
            self.by_queue[new[0]] = self.by_queue.get(new[0], 0) + gpus
        self.version += 1

    def owed(self, policy: Policy, quota: QuotaTree, capacity: int) -> list[float]:
        """GPUs owed now to each queue of the tree, by its index (an inner queue: the sum over
        its leaves), for a cluster of `capacity` GPUs. Worked out again only when the demand or
        the capacity changed."""
        seen = self._owed
        if seen is not None and seen[0] == self.version and seen[1] == capacity:
            return seen[2]
        out = owed_by_queue(policy, quota, self.by_queue, capacity)
        self._owed = (self.version, capacity, out)
        return out


def owed_by_queue(policy: Policy, quota: QuotaTree, demand: Mapping[str, float], capacity: float) -> list[float]:
    """`accounting.owed_now` of each leaf's demand, summed up the tree, by queue index."""
    leaves = [q.name for q in policy.leaves()]
    owed = owed_now({q: demand.get(q, 0) for q in leaves}, policy_entitlement(policy), capacity)
    out = [0.0] * len(quota.names)
    for leaf, gpus in owed.items():
        if gpus and leaf in quota.paths:
            for q in quota.paths[leaf]:
                out[q] += gpus
    return out


def cluster_gpus(nodes: Iterable[Node]) -> int:
    """All the GPUs of the cluster a job may be placed on (`Node.usable_gpus`)."""
    return sum(n.usable_gpus for n in nodes)
