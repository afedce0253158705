"""What one pass reads and changes, under one undo journal (`PassState`).

The free-capacity index and the quota usage are the journal: every what-if (a placement tried
with the holds released, the victims of a search, a forecast's releases) runs after `mark()`
and is undone by `rollback()`. What the pass keeps — admissions, holds, claims — it keeps by
not rolling back; `Engine.plan` rolls the whole pass back at the end, so what the engine keeps
between passes is untouched.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from warden.engine.lifecycle import admitted
from warden.engine.model import Attempt, Job, JobState
from warden.engine.phases.memo import Memo, Part
from warden.engine.plan import Admission, Preemption, Reservation
from warden.engine.rules import RuleContext, estimate_matters, grace_of, reservation_takes

if TYPE_CHECKING:
    from warden.engine.allocation import Allocation
    from warden.engine.model import Snapshot
    from warden.engine.preemption import Candidate


@dataclass(slots=True)
class Hold:
    """Capacity a waiting job keeps from lower-ranked ones: a claim or a reservation."""

    job_id: str
    due: float | None
    parts: list[Part] = field(default_factory=list)
    backfill: bool = False
    """True for a reservation, whose capacity lower jobs may use until `due` (`PassState.lent`)."""
    tier: int = 0
    """The holder's tier."""


class PassState:
    """The state of one pass: what it reads of the engine's allocation, the journal it changes,
    and what it has decided so far. Satisfies `preemption.Workspace`."""

    __slots__ = (
        "admissions",
        "charged_tiers",
        "claim_queues",
        "claimants",
        "claimed",
        "claims",
        "cpu_memory_governed",
        "ctx",
        "exact_estimates",
        "flavor_of_job",
        "hold_ids",
        "holding",
        "holds",
        "in_quota_tiers",
        "index",
        "kinds",
        "memo",
        "node_gpus",
        "nodes_of_block",
        "now",
        "policy",
        "preemptions",
        "quota",
        "releases",
        "releases_t1",
        "reservations",
        "reserved",
        "rest_quota",
        "rests",
        "snapshot",
        "takeable",
        "terminating",
        "tiers",
        "used",
        "victim_facts",
    )

    def __init__(
        self,
        snapshot: Snapshot,
        now: float,
        alloc: Allocation,
        terminating: dict[str, Job],
        claims: dict[str, Job],
        owed: Sequence[float] | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.now = now
        self.policy = snapshot.policy
        self.index = alloc.index
        self.quota = alloc.quota
        self.ctx = RuleContext(self.policy, self.quota, now, owed)
        self.charged_tiers = alloc.charged_tiers
        self.in_quota_tiers = alloc.in_quota_tiers
        self.flavor_of_job = alloc.flavor_of_job
        self.used = alloc.used
        """GPU indices in use per node, as bit sets; admissions add to it."""
        self.node_gpus = alloc.node_gpus
        self.nodes_of_block = alloc.nodes_of_block
        self.victim_facts = alloc.victim_facts
        self.releases = alloc.releases
        self.releases_t1 = alloc.releases_t1
        self.holding = alloc.jobs
        self.tiers = alloc.tiers
        self.takeable = alloc.takeable
        self.terminating = terminating
        """Jobs holding resources they are about to give back (signalled, or in their grace)."""
        self.claims = claims
        """The waiting jobs that come into the pass holding a claim (`Job.claim`)."""
        self.claim_queues: dict[int, str] = {}
        """The queues below the root on a claimant's path → a claimant under each: no job under
        one of them starts borrowing in this pass (its usage is what the claimant counts on)."""
        for c in sorted(claims.values(), key=lambda j: j.id):
            self.claiming(c)
        self.claimants: set[str] = set()
        """The jobs that claimed their victims in this pass (`Plan.claims`)."""
        self.cpu_memory_governed = any(r in ("cpu", "memory") for r in self.quota.resources)
        self.exact_estimates = estimate_matters(self.policy)
        """A victim rule reads the runtime estimate (`rules.estimate_matters`)."""
        self.memo = Memo()
        self.holds: list[Hold] = []
        self.hold_ids: tuple[int, ...] = ()
        """`id` of each of `holds`, in order (a key while they live: the pass keeps them)."""
        self.reserved: list[Hold] = []
        """The holds of reservations: the ones lower jobs may backfill."""
        self.claimed: set[str] = set()
        """Jobs on their way out that a claimant counts on (signalled in this pass or before)."""
        self.rests: dict[str, tuple[Job, tuple[Part, ...], float]] = {}
        self.rest_quota: dict[str, list[tuple[int, tuple[float, ...]]]] = {}
        """Leaving jobs others count on: what of them is still unpromised, and when it frees."""
        self.kinds: dict[str, str] = {}
        """How the rules let a search take each victim (`preemption.Workspace.kinds`)."""
        self.admissions: list[Admission] = []
        self.preemptions: list[Preemption] = []
        self.reservations: list[Reservation] = []

    def claiming(self, job: Job) -> None:
        """The job counts on jobs leaving for it (a claim, or a reservation that signalled its
        victims). Where it may start only in-quota (`Allocation.in_quota_tiers`: tier 1), no
        job sharing a queue below the root with it starts borrowing from now on in the pass
        (`Admit._claimed`): it would be preempted for it again at once."""
        if job.tier in self.in_quota_tiers:
            for q in self.quota.paths.get(job.queue, ())[:-1]:
                self.claim_queues.setdefault(q, job.id)

    def count_leaving(self) -> None:
        """Usage of jobs already on their way out still counts against limits until they exit,
        but a branch no longer borrows what is leaving (`QuotaTree.depart`)."""
        for job in self.terminating.values():
            if self.charged(job) and job.queue in self.quota.paths:
                self.quota.depart(job.queue, self.quota.demand(job, self.flavor_of_job[job.id]))

    # -- reading ------------------------------------------------------------------------------
    def charged(self, job: Job) -> bool:
        """Does the job's usage count against quota (a governed tree, a charged tier)?"""
        return self.charged_tiers.get(job.tier, False)

    def demand(self, job: Job, flavor: str) -> tuple[float, ...]:
        """The job's quota demand on `flavor`; () for a job quota does not count."""
        return self.quota.demand(job, flavor) if self.charged_tiers.get(job.tier, False) else ()

    def flavors(self, job: Job) -> Sequence[str]:
        return (job.flavor,) if job.flavor is not None else self.index.flavors()

    def find(self, flavor: str, job: Job) -> tuple[str, ...] | None:
        return self.index.find(flavor, job.replicas, job.gpus, job.cpu, job.memory, job.placement)

    def placeable(self, job: Job, flavor: str) -> bool:
        return self.find(flavor, job) is not None

    def fits(self, job: Job, flavor: str, d: tuple[float, ...]) -> bool:
        """Within its quota path and placeable; for a tier admitted only in-quota
        (`Allocation.in_quota_tiers`), within nominal too: a search or a forecast that makes
        room for it makes it in-quota room."""
        return self.within_quota(job, d) and self.find(flavor, job) is not None

    def within_quota(self, job: Job, d: tuple[float, ...]) -> bool:
        """`fits`, but for the placement."""
        if d:
            quota = self.quota
            if quota.violation(job.queue, d) is not None:
                return False
            if job.tier in self.in_quota_tiers and quota.over_nominal_at(job.queue, d) is not None:
                return False
        return True

    def block_nodes(self, block: str) -> Sequence[str]:
        return self.nodes_of_block[block]

    def lent(self, job: Job, hold: Hold) -> bool:
        """May the job start in the reservation's capacity (DESIGN §4.2)? It ends before the
        reservation is due, or the holder may take it back then (`taken_back`)."""
        due = hold.due
        if due is None:
            return False
        d = job.time_limit
        return (d is not None and self.now + d <= due) or self.taken_back(job, hold)

    def taken_back(self, job: Job, hold: Hold) -> bool:
        """May the reservation's holder preempt the job, were it started now, at due − its
        grace (`rules.reservation_takes`, on the job as it would run if admitted now), and is
        that still to come?

        The answer reads the job's tier, lease, grace and preemption record, and its runtime
        estimate where a victim rule reads it (fields `waiting.class_key` keeps alike within a
        class), so it is remembered per hold."""
        due = hold.due
        if due is None or job.tier <= hold.tier or job.state is JobState.AWAITING_APPROVAL:
            return False  # (a job awaiting approval starts nowhere)
        key = (
            id(hold),
            job.tier,
            job.lease,
            job.grace,
            job.preempted_at,
            job.time_limit if self.exact_estimates else None,
        )
        known = self.memo.lent.get(key)
        if known is None:
            at = due - grace_of(self.policy, job)
            started = as_admitted(job, self.now)
            known = at > self.now and reservation_takes(self.ctx, hold.tier, started, due) <= at
            self.memo.lent[key] = known
        return known

    # -- the journal ---------------------------------------------------------------------------
    def mark(self) -> tuple[int, int]:
        return self.index.mark(), self.quota.mark()

    def rollback(self, mark: tuple[int, int]) -> None:
        self.index.rollback(mark[0])
        self.quota.rollback(mark[1])

    def release_job(self, job: Job, only: str | None = None) -> None:
        """What-if: the job's resources and quota usage are free (its resources on nodes of
        flavor `only` alone, when given: a caller that only places on that flavor)."""
        a = job.attempt
        assert a is not None
        for rp in a.assignment:
            if only is None or self.index.flavor_of(rp.node) == only:
                self.index.give(rp.node, job.gpus, job.cpu, job.memory)
        if self.charged(job) and job.queue in self.quota.paths:
            self.quota.remove(job.queue, self.quota.demand(job, self.flavor_of_job[job.id]))

    def retake_job(self, job: Job, only: str | None = None) -> None:
        """Undo `release_job` (with the same `only`)."""
        a = job.attempt
        assert a is not None
        for rp in a.assignment:
            if only is None or self.index.flavor_of(rp.node) == only:
                self.index.take(rp.node, job.gpus, job.cpu, job.memory)
        if self.charged(job) and job.queue in self.quota.paths:
            self.quota.add(job.queue, self.quota.demand(job, self.flavor_of_job[job.id]))

    def release(self, c: Candidate) -> None:
        """What-if: the candidate has left. Of a job another waiting job already counts on, only
        what that one does not take over is freed: the capacity and quota usage left over."""
        if c.parts is None:
            self.release_job(c.job)
        else:
            for part in c.parts:
                self.index.give(*part)
            self.quota.adjust(self.rest_quota.get(c.job.id, []), -1)

    def retake(self, c: Candidate) -> None:
        if c.parts is None:
            self.retake_job(c.job)
        else:
            for part in c.parts:
                self.index.take(*part)
            self.quota.adjust(self.rest_quota.get(c.job.id, []), 1)

    def frees_quota_in(self, c: Candidate, queue: int) -> bool:
        """Would the candidate's exit lower the usage of that queue?"""
        if c.parts is not None:
            return any(q == queue for q, _ in self.rest_quota.get(c.job.id, ()))
        return self.charged(c.job) and queue in self.quota.paths.get(c.job.queue, ())

    # -- holds ---------------------------------------------------------------------------------
    def take_free(self, parts: Iterable[Part]) -> list[Part]:
        """Take, of each wanted (node, gpus, cpu, memory), what is free now; return what was taken."""
        taken = []
        for node, g, c, m in parts:
            fg, fc, fm = self.index.free(node)
            part = (node, min(g, fg), min(c, fc), min(m, fm))
            if part[1] or part[2] or part[3]:
                self.index.take(*part)
                taken.append(part)
        return taken

    def hold(self, job: Job, names: Sequence[str], due: float | None, backfill: bool) -> Hold:
        """Keep the part of a future placement that is free now away from lower-ranked jobs."""
        need = need_of(job, names)
        hold = Hold(job.id, due, self.take_free((n, g, c, m) for n, (g, c, m) in need.items()), backfill, job.tier)
        self.holds.append(hold)
        self.hold_ids += (id(hold),)
        if backfill:
            self.reserved.append(hold)
        self.memo.hold_version += 1
        self.memo.capacity_version += 1
        return hold


def need_of(job: Job, names: Sequence[str]) -> dict[str, list[int]]:
    """(gpus, cpu, memory) a placement takes per node."""
    need: dict[str, list[int]] = {}
    for name in names:
        n = need.setdefault(name, [0, 0, 0])
        n[0] += job.gpus
        n[1] += job.cpu
        n[2] += job.memory
    return need


def as_admitted(job: Job, now: float) -> Job:
    """The waiting job as it would run if admitted now (`lifecycle.admitted`, a new attempt
    on no placement yet): what the victim rules would read of it."""
    number = 1 if job.attempt is None else job.attempt.number + 1
    return admitted(job, now, Attempt(number, now, ()), starts=True)
