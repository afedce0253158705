"""What the jobs that hold resources take: node capacity, GPU indices and quota usage.

Kept between passes by `warden.engine.scheduler.Engine`, which applies only the jobs that
started, stopped or moved since the last pass; a pass changes it only under a mark and rolls it
back, so the state always equals a fresh build from the last snapshot (the plan stays a
function of the snapshot and `now`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from warden.engine.model import Job, Node
from warden.engine.overcommit import cluster_totals
from warden.engine.placement import CapacityIndex, gpu_mask
from warden.engine.quota import QuotaTree
from warden.engine.releases import ReleaseIndex
from warden.engine.rules import RuleContext, takeable_tiers

if TYPE_CHECKING:
    from warden.engine.policy import Policy


VictimFacts = tuple[
    Job,
    float,
    float,
    "float | None",
    float,
    tuple[tuple[str, int], ...],
    int,
    "tuple[float | int | str, ...]",
    str,
    float,
    float,
    float,
    float,
]
"""(the job as seen, seen at, protected until, progress at risk since, restart cost, GPUs freed
per node, GPUs, victim-order ties, flavor, expected end, protected from tier 1 until, protected
again from, protected from tier 1 again from): what pricing a running job as a victim needs
that does not change with time (the ties: `preemption.ties`, its victim key after cost). Tiers
2–4 and reclaims may take it from the first time until the twelfth (`rules.protection`,
`rules.closes_at`), a tier-1 preemptor from the eleventh until the last (`rules.guarded`: rules
of the thrash guard's reach never delay tier 1)."""


class Allocation:
    __slots__ = (
        "charged_tiers",
        "flavor_of_job",
        "in_quota_tiers",
        "index",
        "jobs",
        "node_gpus",
        "nodes",
        "nodes_of_block",
        "policy",
        "quota",
        "releases",
        "releases_t1",
        "takeable",
        "tiers",
        "unavailable",
        "used",
        "victim_facts",
    )

    def __init__(self, nodes: tuple[Node, ...], policy: Policy) -> None:
        self.nodes = nodes
        self.policy = policy
        self.index = CapacityIndex(nodes)
        self.quota = QuotaTree(policy, cluster_totals(nodes))
        governed = self.quota.governed()
        self.charged_tiers = {t: governed and spec.charged for t, spec in policy.tiers.items()}
        self.in_quota_tiers = frozenset(
            t for t, spec in policy.tiers.items() if governed and spec.charged and not spec.preemptible
        )
        """Tiers admitted only in-quota: charged, and not preemptible, so what their jobs hold
        could never be taken back were it borrowed (DESIGN §4.2)."""
        self.takeable = takeable_tiers(RuleContext(policy, self.quota, 0.0))
        """Per tier, the tiers whose running jobs the rules could ever let it take (the tier
        tests read neither the usage nor the time)."""
        self.jobs: dict[str, Job] = {}
        self.flavor_of_job: dict[str, str] = {}
        self.unavailable = {n.name: gpu_mask(n.unavailable) for n in nodes if n.unavailable}
        """Per node with any, its unavailable GPU indices as a bit set: never placed on."""
        self.used: dict[str, int] = dict(self.unavailable)
        """GPU indices in use per node, as bit sets (`gpu_mask`): held by jobs, or unavailable."""
        self.victim_facts: dict[str, VictimFacts] = {}
        """Per running job, what pricing it as a victim needs that does not change with time
        (`warden.engine.phases.victims.Victims.facts`)."""
        self.node_gpus = {n.name: n.gpus for n in nodes}
        self.nodes_of_block: dict[str, list[str]] = {}
        for n in nodes:
            self.nodes_of_block.setdefault(self.index.block_of(n.name), []).append(n.name)
        self.tiers: dict[int, int] = {}
        """How many holding jobs each tier has: who could be a victim, without a scan."""
        self.releases = ReleaseIndex()
        """The holding jobs in the order their capacity frees (`warden.engine.releases`), each
        protected as the victim rules protect it from tiers 2–4 and reclaims."""
        self.releases_t1 = ReleaseIndex()
        """The same, each protected as from a tier-1 preemptor (`rules.guarded`)."""

    def matches(self, nodes: tuple[Node, ...], policy: Policy) -> bool:
        return (nodes is self.nodes or nodes == self.nodes) and (policy is self.policy or policy == self.policy)

    def charged(self, job: Job) -> bool:
        """Does the job's usage count against quota (a governed tree, a charged tier)?"""
        return self.charged_tiers.get(job.tier, False) and job.queue in self.quota.paths

    def sync(self, holding: Iterable[Job]) -> None:
        """Make the state that of exactly these jobs, touching only those that changed.

        Departures first: a job may start on what another one just gave back.
        """
        arriving = []
        current: dict[str, Job] = {}
        for job in holding:
            current[job.id] = job
            old = self.jobs.get(job.id)
            if old is job:
                continue
            if old is not None and _same_footprint(old, job):
                self.jobs[job.id] = job
                self._reindex(job)  # its protection or expected end may have moved
                continue
            if old is not None:
                self._remove(old)
            arriving.append(job)
        for gone in [i for i in self.jobs if i not in current]:
            self._remove(self.jobs[gone])
        for job in arriving:
            self._add(job)
        self.quota.forget()

    def apply(self, changed: Iterable[Job]) -> None:
        """Take only these jobs' new versions (any state); every other job is as before. A job
        named more than once counts as its last version."""
        arriving = []
        for job in {j.id: j for j in changed}.values():
            old = self.jobs.get(job.id)
            holds = job.state.holds_resources and job.attempt is not None
            if old is job:
                continue
            if holds and old is not None and _same_footprint(old, job):
                self.jobs[job.id] = job
                self._reindex(job)  # its protection or expected end may have moved
                continue
            if old is not None:
                self._remove(old)
            if holds:
                arriving.append(job)
        for job in arriving:
            self._add(job)
        self.quota.forget()

    def _add(self, job: Job) -> None:
        a = job.attempt
        assert a is not None
        for rp in a.assignment:
            self.index.take(rp.node, job.gpus, job.cpu, job.memory)
            self.used[rp.node] = self.used.get(rp.node, 0) | gpu_mask(rp.gpus)
        flavor = self.index.flavor_of(a.assignment[0].node) if a.assignment else ""
        self.flavor_of_job[job.id] = flavor
        if self.charged(job):
            self.quota.add(job.queue, self.quota.demand(job, flavor))
        self.jobs[job.id] = job
        self._reindex(job)
        self.tiers[job.tier] = self.tiers.get(job.tier, 0) + 1

    def _remove(self, job: Job) -> None:
        a = job.attempt
        assert a is not None
        for rp in a.assignment:
            self.index.give(rp.node, job.gpus, job.cpu, job.memory)
            self.used[rp.node] = self.used[rp.node] & ~gpu_mask(rp.gpus) | self.unavailable.get(rp.node, 0)
        if self.charged(job):
            self.quota.remove(job.queue, self.quota.demand(job, self.flavor_of_job[job.id]))
        del self.flavor_of_job[job.id]
        del self.jobs[job.id]
        self.victim_facts.pop(job.id, None)
        self.releases.forget(job.id)
        self.releases_t1.forget(job.id)
        self.tiers[job.tier] -= 1

    def _reindex(self, job: Job) -> None:
        self.releases.add(job)
        self.releases_t1.add(job)


def _same_footprint(a: Job, b: Job) -> bool:
    """Do two versions of a job hold the same resources in the same queue and tier?"""
    return (
        a.queue == b.queue
        and a.tier == b.tier
        and a.gpus == b.gpus
        and a.cpu == b.cpu
        and a.memory == b.memory
        and a.attempt is not None
        and b.attempt is not None
        and a.attempt.assignment == b.attempt.assignment
    )
