"""One scheduling pass: snapshot in, plan out (DESIGN §1, §4).

`schedule` is the engine's one entry point; `Engine` runs pass after pass, keeping what running
jobs hold between them. A pass (`Cycle`) runs the same fixed sequence of phases, one module of
`warden.engine.phases` each:

1. **snapshot** — the free-capacity index and quota usage of the jobs that hold resources (jobs
   in their grace period included: they hold their GPUs until they exit), as the engine keeps
   them (`warden.engine.allocation`), with the usage already leaving counted as such;
2. **order** — rank the waiting jobs (tier, starvation breach, Fair Tree share, aging, submit,
   id), claimants first;
3. **admit** — walk the ranking; admit every job whose quota path and gang placement fit, with
   no head-of-line blocking (unless the policy asks for it);
4. **preempt** — for a job that does not fit, count capacity already terminating first, then
   pick the least-cost minimal set of eligible victims, and claim what they will free;
5. **reserve** — the top blocked jobs reserve the capacity that frees first; lower jobs start in
   it only if they end before it is due, or if the holder may preempt them at due − their
   grace (strictly lower tier, protection over by then), which it does then, exempt from
   `scope`;
6. **explain** — every job that still waits gets one primary reason, its sort key and position.

Phases 3–6 run job by job in the walk over the ranking (`phases.walk.Walker.run`), which
also reuses the reason of a job like one that already failed in the pass, and never visits the
jobs whose reason it reuses: the engine keeps the waiting jobs between passes in classes of
jobs that fail alike, each in rank order (`warden.engine.waiting`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from warden.engine.allocation import Allocation
from warden.engine.demand import Demand, cluster_gpus
from warden.engine.model import Job, JobState, Snapshot
from warden.engine.phases import order
from warden.engine.phases.admit import Admit
from warden.engine.phases.claim import Claim
from warden.engine.phases.explain import Explain
from warden.engine.phases.nextstep import NextSteps
from warden.engine.phases.preempt import Preempt
from warden.engine.phases.reserve import Reserve
from warden.engine.phases.state import PassState
from warden.engine.phases.victims import Victims
from warden.engine.plan import Plan, SortKey
from warden.engine.reasons import PreemptionWouldNotPay, Reason, UnknownQueue
from warden.engine.rules import estimate_matters
from warden.engine.waiting import WaitingIndex


def schedule(snapshot: Snapshot, now: float) -> Plan:
    """The engine's one entry point: the same snapshot and `now` always give the same plan."""
    return Engine().plan(snapshot, now)


class Engine:
    """Runs passes, keeping what running jobs hold between them (`Allocation`).

    A shell that calls `plan` again and again pays only for the jobs that changed; the plan is
    the one `schedule` gives for the same snapshot and `now`. A shell that knows what changed
    since the snapshot of its previous call passes those jobs as `changed` (new versions, in
    any state: a terminal one has left) and promises that every other job is as it was; the
    engine then never walks the whole snapshot, which keeps a pass over a quiet cluster cheap.
    """

    def __init__(self) -> None:
        self._alloc: Allocation | None = None
        self._index: WaitingIndex | None = None
        self._waiting: dict[str, Job] = {}
        self._terminating: dict[str, Job] = {}
        self._claims: dict[str, Job] = {}
        """The waiting jobs that come into a pass holding a claim (`Job.claim`)."""
        self._demand = Demand()
        """Charged GPU demand per queue: what each queue is owed (`warden.engine.demand`)."""

    def plan(self, snapshot: Snapshot, now: float, changed: Iterable[Job] | None = None) -> Plan:
        alloc = self._alloc
        if alloc is None or not alloc.matches(snapshot.nodes, snapshot.policy):
            alloc = self._alloc = Allocation(snapshot.nodes, snapshot.policy)
            changed = None
        before = self._waiting
        if changed is None:
            self._waiting, self._terminating, holding = _classify(snapshot.jobs)
            self._claims = {i: j for i, j in self._waiting.items() if j.claim}
            alloc.sync(holding)
            self._demand.sync(snapshot.policy, snapshot.jobs)
        else:
            changed = list(changed)
            for job in changed:
                waiting = job.state.waiting
                _put(self._waiting, job, waiting)
                _put(self._claims, job, waiting and job.claim)
                _put(self._terminating, job, _terminating(job))
            alloc.apply(changed)
            self._demand.apply(snapshot.policy, changed)
        index = self._index
        mode = order.mode_of(snapshot.policy)
        exact = estimate_matters(snapshot.policy)
        if index is None or index.mode != mode or index.exact_estimates != exact:
            index = self._index = WaitingIndex(mode, exact)
            index.sync(self._waiting.values(), now)
        else:
            if changed is None:  # the whole snapshot: what differs from the last one changed
                now_waiting = self._waiting
                for job_id in before:
                    if job_id not in now_waiting:
                        index.discard(job_id)
                changed = [j for i, j in now_waiting.items() if before.get(i) is not j]
            index.apply(changed)
            index.advance(now)
        owed = None
        if alloc.quota.gpu >= 0:
            owed = self._demand.owed(snapshot.policy, alloc.quota, cluster_gpus(snapshot.nodes))
        index_mark, quota_mark = alloc.index.mark(), alloc.quota.mark()
        used = dict(alloc.used)
        try:
            cycle = Cycle(snapshot, now, alloc, index, self._waiting.values(), self._terminating, self._claims, owed)
            return cycle.run()
        finally:
            alloc.index.rollback(index_mark)
            alloc.index.release(index_mark)
            alloc.quota.rollback(quota_mark)
            alloc.used = used


_PENDING, _REQUEUED, _AWAITING = JobState.PENDING, JobState.REQUEUED, JobState.AWAITING_APPROVAL
_RUNNING, _PREEMPTING, _ADMITTED, _STARTING = (
    JobState.RUNNING,
    JobState.PREEMPTING,
    JobState.ADMITTED,
    JobState.STARTING,
)


def _classify(jobs: Iterable[Job]) -> tuple[dict[str, Job], dict[str, Job], list[Job]]:
    """The waiting jobs, the terminating ones (`_terminating`) and those that hold resources
    with an attempt, in one walk over a snapshot.

    States are told apart by identity: `JobState.waiting` and `holds_resources` look the state
    up in a frozenset, which hashes the enum member in Python — per job, per pass, it adds up.
    """
    waiting: dict[str, Job] = {}
    terminating: dict[str, Job] = {}
    holding: list[Job] = []
    for j in jobs:
        state = j.state
        if state is _PENDING or state is _REQUEUED or state is _AWAITING:
            waiting[j.id] = j
        elif state is _RUNNING or state is _PREEMPTING or state is _ADMITTED or state is _STARTING:
            a = j.attempt
            if a is not None:
                holding.append(j)
                if a.sigterm_at is not None or state is _PREEMPTING:
                    terminating[j.id] = j
    return waiting, terminating, holding


def _terminating(job: Job) -> bool:
    """Does the job hold resources it is about to give back (signalled, or in its grace)?"""
    return (
        job.state.holds_resources
        and job.attempt is not None
        and (job.attempt.sigterm_at is not None or job.state is JobState.PREEMPTING)
    )


def _put(table: dict[str, Job], job: Job, member: bool) -> None:
    if member:
        table[job.id] = job
    else:
        table.pop(job.id, None)


def rank(snapshot: Snapshot, now: float, waiting: Iterable[Job] | None = None) -> list[tuple[SortKey, Job]]:
    """The waiting jobs of a snapshot in scheduling order, each with its sort key
    (`phases.order.rank`)."""
    return order.rank(snapshot, now, waiting)


class Cycle:
    """One pass, phase by phase (`warden.engine.phases`). Built from a snapshot and the
    engine's allocation, consumed by `run()`."""

    def __init__(
        self,
        snapshot: Snapshot,
        now: float,
        alloc: Allocation,
        index: WaitingIndex,
        waiting: Collection[Job],
        terminating: dict[str, Job],
        claims: dict[str, Job] | None = None,
        owed: Sequence[float] | None = None,
    ) -> None:
        self.index = index
        self.waiting = waiting
        self.state = state = PassState(snapshot, now, alloc, terminating, claims or {}, owed)
        victims = Victims(state)
        self.admit = Admit(state)
        self.steps = NextSteps(state, victims)
        self.reserve = Reserve(state, victims, self.steps)
        self.preempt = Preempt(state, victims, Claim(state, victims), self.reserve)
        self.explain = Explain(state)
        self.reservations = state.policy.scheduling.reservations
        """How many blocked jobs may reserve capacity in a pass."""

    def run(self) -> Plan:
        """The pass: snapshot, order, then every job in turn — held at a gate, answered by a job
        like it, or decided (`decide`) — and explained; the plan."""
        state = self.state
        state.count_leaving()  # 1. snapshot
        borrows = order.borrowing_test(state.policy, state.quota, state.index.flavors(), state.charged_tiers)
        ranking = order.Order(state.policy, state.snapshot.ledger.usage, state.now, borrows)  # 2. order
        walk = self.explain.walk(self.index, ranking, self.decide)  # 3–6, job by job
        return self.explain.plan(walk, tuple(self.waiting), ranking)

    def decide(self, job: Job) -> Reason | None:
        """Admit the job (None); else make room for it by preemption; else reserve capacity for
        it; and say why it waits."""
        blocked = self.admit.attempt(job)  # 3. admit
        if blocked is None or blocked.__class__ is UnknownQueue:
            return blocked  # admitted, or in no queue of the policy: nothing else can help
        waiting = self.preempt.attempt(job)  # 4. preempt, and claim
        if isinstance(waiting, PreemptionWouldNotPay):
            blocked = waiting  # it waits for what frees by itself: reserve that
        elif waiting is not None:
            return waiting
        else:
            blocked = self.steps.refused(job, blocked)  # what the job can do instead
        taken = len(self.state.reservations) >= self.reservations
        if not taken:  # 5. reserve
            natural = blocked is waiting or self.preempt.skipped
            frees = self.preempt.frees
            first = frees[1] if natural and frees is not None and frees[0] == job.id else None
            reserved = self.reserve.attempt(job, blocked, natural, first)
            if reserved is not None:
                return reserved
        return self.steps.unreserved(blocked, taken)
