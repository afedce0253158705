"""The waiting jobs, kept between passes in classes of jobs that fail alike (`WaitingIndex`).

A pass ranks the waiting jobs and answers most of them from a job like one that already
failed (`phases.walk`). Both would cost a walk over every waiting job if the jobs were a
flat list; here they are grouped by what a pass's outcome for them depends on — queue, tier,
flavor asked for, shape, CPU and memory, how their runtime estimate meets a reservation, and
what a reservation's holder would read of them to take them back (`JobClass`) — and each class keeps its members in rank order between passes. That order is
time-invariant: the governed order ranks by how long a job has waited, which is `now` minus a
fixed instant (`anchor`: when it started waiting, less what it waited before), so as time
passes no two members swap. A pass merges the classes by their first members, skips a class
once its outcome is known, and never touches the members it skips (`phases.order`).

A job that may not be considered — it awaits approval, or it is in its requeue back-off — sits
in a gated class of its own; a job in back-off moves to its class when the back-off ends. Jobs
that hold a claim (`Job.claim`) are kept apart: a pass considers each of them on its own.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from warden.engine.model import Job, JobState

_AWAITING = JobState.AWAITING_APPROVAL
_new = tuple.__new__

Entry = tuple[float, float, str, Job]
"""(anchor, second, id, job): a member of a class, in rank order within it."""


class ClassKey(NamedTuple):
    """What a pass's outcome for a waiting job depends on: jobs with one key are one class.

    Built with `tuple.__new__` (`class_key`): a named tuple's own constructor is a Python
    function, and every waiting job gets a key as it is indexed.
    """

    queue: str
    tier: int
    flavor: str | None
    """The flavor asked for (None: any)."""
    replicas: int
    gpus: int
    placement: str
    cpu: int
    memory: int
    estimate: int
    """How its runtime estimate meets a reservation (`NO_RESERVATION`, `BY_ESTIMATE`)."""
    lent: tuple[float | None, float | None, tuple[float, ...], float | None]
    """(lease, grace, preemption record, runtime estimate where a victim rule reads it): with
    the tier, what decides whether a reservation's holder could take the job back, and so
    whether it may start in reserved capacity whatever its estimate
    (`phases.state.PassState.taken_back`)."""
    gate: int
    """Whether its members are considered (`OPEN`, `AWAITING`, `BACKOFF`)."""


OPEN, AWAITING, BACKOFF = 0, 1, 2
"""A class's gate: its members are considered, await approval, or are in requeue back-off."""
NO_RESERVATION, BY_ESTIMATE = 1, 2
"""How a job's runtime estimate meets a reservation (`phases.walk.usable_of`): a job without one
ends before none, any other job before those due after it. (A job may also use a reservation
whose holder could take it back: that is the same for a whole class, `ClassKey.lent`.)"""


def _estimate(job: Job) -> float:
    """A member's runtime estimate (its time limit) as its class's range counts it (none: 0)."""
    return job.time_limit or 0.0


@dataclass(slots=True, eq=False)
class JobClass:
    """Waiting jobs one pass answers alike: same queue, tier, flavor asked for, shape, CPU and
    memory, the same way of meeting reservations, and the same gate."""

    key: ClassKey
    members: list[Entry] = field(default_factory=list)
    estimates: tuple[float, float] | None = None
    """(shortest, longest) runtime estimate of the members, worked out when first needed and
    kept up as members come and go (`joined`, `left`)."""

    def estimate_range(self) -> tuple[float, float]:
        known = self.estimates
        if known is None:
            ends = [_estimate(e[3]) for e in self.members]
            known = self.estimates = (min(ends), max(ends))
        return known

    def joined(self, job: Job) -> None:
        known = self.estimates
        if known is not None:
            end = _estimate(job)
            if end < known[0] or end > known[1]:
                self.estimates = (min(known[0], end), max(known[1], end))

    def left(self, job: Job) -> None:
        """A member left: the range holds unless it was one of its ends (then worked out anew)."""
        known = self.estimates
        if known is not None and not known[0] < _estimate(job) < known[1]:
            self.estimates = None

    @property
    def queue(self) -> str:
        return self.key.queue

    @property
    def tier(self) -> int:
        return self.key.tier

    @property
    def gate(self) -> int:
        return self.key.gate


@dataclass(frozen=True, slots=True)
class OrderMode:
    """What a member's anchor is, per the policy's `scheduling` section."""

    governed: bool
    by_eviction: bool

    def entry(self, job: Job) -> Entry:
        if self.governed:
            since = job.submit if job.pending_since is None else job.pending_since
            return (since - job.waited, job.submit, job.id, job)
        stamp = job.pending_since if self.by_eviction and job.pending_since is not None else job.submit
        return (stamp, 0.0, job.id, job)


def gate_of(job: Job, now: float) -> int:
    """The gate of a waiting job at `now` (`ClassKey.gate`): the one part of its class that
    moves with time."""
    if job.state is _AWAITING:
        return AWAITING
    if job.not_before is not None and job.not_before > now:
        return BACKOFF
    return OPEN


def class_key(job: Job, now: float, exact_estimates: bool = False) -> ClassKey:
    """The class of a waiting job at `now`; `exact_estimates`: a victim rule reads the runtime
    estimate (`rules.estimate_matters`), so members share it exactly."""
    gate = gate_of(job, now)
    kind = NO_RESERVATION if job.time_limit is None else BY_ESTIMATE
    lent = (job.lease, job.grace, job.preempted_at, job.time_limit if exact_estimates else None)
    return _new(
        ClassKey,
        (job.queue, job.tier, job.flavor, job.replicas, job.gpus, job.placement, job.cpu, job.memory, kind, lent, gate),
    )


class WaitingIndex:
    """The waiting jobs as of the last pass, by class (`JobClass`), and the claimants apart.

    `sync` takes the whole set, `apply` the jobs that changed; `advance` moves the jobs whose
    back-off ended at `now`. Membership and order depend only on the jobs, the order mode and
    `now`, so a warm index equals one built afresh.
    """

    __slots__ = ("_backoff", "_where", "claimants", "classes", "exact_estimates", "mode", "now")

    def __init__(self, mode: OrderMode, exact_estimates: bool = False) -> None:
        self.mode = mode
        self.exact_estimates = exact_estimates
        """Classes split by runtime estimate (`class_key`)."""
        self.now = -float("inf")
        self.classes: dict[ClassKey, JobClass] = {}
        self.claimants: dict[str, Job] = {}
        """Waiting jobs holding a claim, not awaiting approval: a pass places each itself."""
        self._where: dict[str, tuple[JobClass, Entry] | None] = {}
        """Job id → its class and entry (None: a claimant)."""
        self._backoff: list[tuple[float, str]] = []
        """(not before, id) of the members of back-off classes: a heap."""

    def sync(self, jobs: Iterable[Job], now: float) -> None:
        """Hold exactly these waiting jobs, as of `now`."""
        self.classes.clear()
        self.claimants.clear()
        self._where.clear()
        self._backoff.clear()
        self.now = now
        for job in jobs:
            self._add(job, in_order=False)
        for cls in self.classes.values():
            cls.members.sort()  # entries are unique by id: the jobs are never compared
        heapq.heapify(self._backoff)

    def apply(self, changed: Iterable[Job]) -> None:
        """The jobs that changed since the last call (any state: one no longer waiting leaves)."""
        for job in changed:
            self._remove(job.id)
            if job.state.waiting:
                self._add(job)

    def advance(self, now: float) -> None:
        """Bring the gates up to `now`: a job whose back-off has ended joins its class."""
        if now < self.now:
            self.sync(self.jobs(), now)
            return
        self.now = now
        heap = self._backoff
        while heap and heap[0][0] <= now:
            _, job_id = heapq.heappop(heap)
            where = self._where.get(job_id)
            if where is not None and where[0].gate == BACKOFF:
                job = where[1][3]
                self._remove(job_id)
                self._add(job)

    def _add(self, job: Job, in_order: bool = True) -> None:
        """Hold the job; `in_order=False` (a bulk load) leaves its class and the back-off heap
        for the caller to sort."""
        if job.claim and job.state is not _AWAITING:
            self.claimants[job.id] = job
            self._where[job.id] = None
            return
        key = class_key(job, self.now, self.exact_estimates)
        cls = self.classes.get(key)
        if cls is None:
            cls = self.classes[key] = JobClass(key)
        entry = self.mode.entry(job)
        if in_order:
            insort(cls.members, entry)
            cls.joined(job)
        else:
            cls.members.append(entry)
            cls.estimates = None
        self._where[job.id] = (cls, entry)
        if key.gate == BACKOFF:
            assert job.not_before is not None
            if in_order:
                heapq.heappush(self._backoff, (job.not_before, job.id))
            else:
                self._backoff.append((job.not_before, job.id))

    def discard(self, job_id: str) -> None:
        """The job no longer waits (held or not, it leaves)."""
        self._remove(job_id)

    def _remove(self, job_id: str) -> None:
        if job_id not in self._where:
            return
        where = self._where.pop(job_id)
        if where is None:
            del self.claimants[job_id]
            return
        cls, entry = where
        members = cls.members
        i = bisect_left(members, entry)
        assert members[i][2] == job_id
        del members[i]
        cls.left(entry[3])
        if not members:
            del self.classes[cls.key]

    def check(self) -> None:
        """Assert what the index derives is true to its definition: each member in the class
        of its key, every class in rank order, each kept estimate range the members' own."""
        for key, cls in self.classes.items():
            assert cls.members and cls.members == sorted(cls.members), key
            for entry in cls.members:
                assert class_key(entry[3], self.now, self.exact_estimates) == key, (entry[2], key)
                assert self._where[entry[2]] == (cls, entry), entry[2]
            if cls.estimates is not None:
                ends = [_estimate(e[3]) for e in cls.members]
                assert cls.estimates == (min(ends), max(ends)), (key, cls.estimates)
        assert len(self._where) == len(self.claimants) + sum(len(c.members) for c in self.classes.values())

    def jobs(self) -> list[Job]:
        """Every waiting job held, claimants first, then class by class."""
        out = list(self.claimants.values())
        for c in self.classes.values():
            out.extend(e[3] for e in c.members)
        return out
