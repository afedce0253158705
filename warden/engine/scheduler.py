"""One scheduling pass: snapshot in, plan out (DESIGN §1, §4).

Every pass runs the same fixed sequence:

1. **snapshot** — build the free-capacity index and the quota usage from the jobs that hold
   resources (jobs in their grace period included: they hold their GPUs until they exit);
2. **order** — rank the waiting jobs (tier, starvation breach, Fair Tree share, aging, submit, id);
3. **assign** — walk the ranking; admit every job whose quota path and gang placement fit, with
   no head-of-line blocking;
4. **preempt** — for a job that does not fit, count capacity already terminating first, then
   pick the least-cost minimal set of eligible victims (`warden.engine.preemption`);
5. **reserve** — the top blocked jobs reserve the capacity that frees first; lower jobs start in
   it only if they end before it is due, or are tier 4;
6. **explain** — every job that still waits gets one primary reason and its sort key.

Within a pass free capacity only shrinks and quota usage only grows (a claim for a job waiting
on its victims holds the part that is free now and charges its quota where the victims' usage
does not already cover it), so a shape that failed
once fails for the rest of the pass: quota, hold and preemption failures are cached here, and
placement failures inside the capacity index, which keeps deep queues cheap.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

from warden.engine.allocation import Allocation, VictimFacts
from warden.engine.fairshare import fair_order
from warden.engine.model import Job, JobState, Snapshot
from warden.engine.placement import assign_gpu_indices
from warden.engine.plan import Admission, Explanation, Plan, Preemption, Reservation, SortKey
from warden.engine.reasons import (
    AwaitingApproval,
    Fragmented,
    InsufficientCapacity,
    Position,
    Reason,
    Reserved,
    ThrashBackoff,
    UnknownQueue,
    WaitingForGrace,
    WaitingForLease,
)
from warden.engine.model import ReplicaPlacement
from warden.engine.preemption import Candidate, CandidatePool, freed_gpus, search, victim_key
from warden.engine.rules import (
    Preemptor,
    RuleContext,
    allowed,
    at_risk_since,
    grace_of,
    protection,
    startup_of,
)

if TYPE_CHECKING:
    from warden.engine.policy import Policy

INF = math.inf


ReleaseOrders = tuple[list[tuple[float, str, Job, float]], list[tuple[float, str, Job, float]],
                      dict[tuple[int, str], Job]]
"""`Cycle._release_orders`: running jobs by expected end, by when they may be preempted, and
one job of each (tier, queue)."""


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
        self._waiting: dict[str, Job] = {}
        self._terminating: dict[str, Job] = {}
        self._claims: dict[str, Job] = {}
        """The waiting jobs that come into a pass holding a claim (`Job.claim`)."""

    def plan(self, snapshot: Snapshot, now: float, changed: Iterable[Job] | None = None) -> Plan:
        alloc = self._alloc
        if alloc is None or not alloc.matches(snapshot.nodes, snapshot.policy):
            alloc = self._alloc = Allocation(snapshot.nodes, snapshot.policy)
            changed = None
        if changed is None:
            self._waiting, self._terminating, holding = _classify(snapshot.jobs)
            self._claims = {i: j for i, j in self._waiting.items() if j.claim}
            alloc.sync(holding)
        else:
            changed = list(changed)
            for job in changed:
                waiting = job.state.waiting
                _put(self._waiting, job, waiting)
                _put(self._claims, job, waiting and job.claim)
                _put(self._terminating, job, _terminating(job))
            alloc.apply(changed)
        index_mark, quota_mark = alloc.index.mark(), alloc.quota.mark()
        used = dict(alloc.used)
        try:
            return Cycle(snapshot, now, alloc, self._waiting.values(), self._terminating, self._claims).run()
        finally:
            alloc.index.rollback(index_mark)
            alloc.index.release(index_mark)
            alloc.quota.rollback(quota_mark)
            alloc.used = used


_PENDING, _REQUEUED, _AWAITING = JobState.PENDING, JobState.REQUEUED, JobState.AWAITING_APPROVAL
_RUNNING, _PREEMPTING, _ADMITTED, _STARTING = (
    JobState.RUNNING, JobState.PREEMPTING, JobState.ADMITTED, JobState.STARTING)


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
    return job.state.holds_resources and job.attempt is not None and (
        job.attempt.sigterm_at is not None or job.state is JobState.PREEMPTING)


def _put(table: dict[str, Job], job: Job, member: bool) -> None:
    if member:
        table[job.id] = job
    else:
        table.pop(job.id, None)


def rank(snapshot: Snapshot, now: float, waiting: Iterable[Job] | None = None) -> list[tuple[SortKey, Job]]:
    """The waiting jobs of a snapshot in scheduling order, each with its sort key.

    `waiting` may name the snapshot's waiting jobs when the caller already knows them.
    """
    return [(key, job) for *_, key, job in _ranked(snapshot, now, waiting)]


Ranked = tuple[float, float, str, int, SortKey, Job]
"""(−waited, submit, id, arrival, sort key, job): a job as `_ranked` sorts it."""


def _ranked(snapshot: Snapshot, now: float, waiting: Iterable[Job] | None = None) -> list[Ranked]:
    """`rank`, each job as (−waited, submit, id, arrival, sort key, job).

    Jobs are grouped by (tier, breach, fair rank) first and each group sorted by the rest: the
    groups are few, and inside one the first field compared is a float that rarely ties, which
    is several times cheaper than comparing whole keys field by field. The rest leads each
    entry, so a group sorts without a key function; `arrival` (unique) settles any full tie
    as a stable sort would, and the key and job are never compared.
    """
    policy = snapshot.policy
    new = tuple.__new__  # SortKey's own constructor is a Python function; this is C
    groups: dict[tuple[int, int, int], list[Ranked]] = {}
    order = policy.scheduling.order
    fifo = order != "governed"
    by_tier = order == "priority"
    by_eviction = policy.scheduling.requeue_timestamp == "eviction"
    fair = {} if fifo else fair_order(policy, snapshot.ledger.usage)
    default_wait = policy.fair_share.aging.max_wait.get("default", INF)
    # queue → (fair rank, ratios, max wait); a queue the policy does not know ranks last.
    queues = {q: (fr, ratios, policy.max_wait_for(q)) for q, (fr, ratios) in fair.items()}
    unknown = (len(fair), (), default_wait)
    for n, j in enumerate(snapshot.jobs if waiting is None else waiting):
        state = j.state
        if not (state is _PENDING or state is _REQUEUED or state is _AWAITING):  # not state.waiting
            continue
        if fifo:
            tier = j.tier if by_tier else 0
            stamp = j.pending_since if by_eviction and j.pending_since is not None else j.submit
            key = new(SortKey, (tier, 1, 0, 0.0, stamp, j.id, ()))
            entry = (0.0, stamp, j.id, n, key, j)
            group_key = (tier, 1, 0)
        else:
            fr, ratios, max_wait = queues.get(j.queue, unknown)
            since = j.submit if j.pending_since is None else j.pending_since
            waited = j.waited + (now - since if now > since else 0.0)  # Job.wait_at, inlined
            breach = 0 if waited >= max_wait else 1
            neg_waited = -waited
            key = new(SortKey, (j.tier, breach, fr, neg_waited, j.submit, j.id, ratios))
            entry = (neg_waited, j.submit, j.id, n, key, j)
            group_key = (j.tier, breach, fr)
        group = groups.get(group_key)
        if group is None:
            groups[group_key] = [entry]
        else:
            group.append(entry)
    ranked: list[Ranked] = []
    for g in sorted(groups):
        members = groups[g]
        members.sort()
        ranked.extend(members)
    return ranked


Outcome = tuple[int, int, int, Reason]
"""(CPU, memory, hold version or −1, reason): why a job asking that much failed (`Cycle._consider`)."""
_UNKNOWN: Any = object()
"""`Cycle.run`: no remembered outcome applies (a sentinel, never in a plan)."""
Part = tuple[str, int, int, int]
"""(node, gpus, cpu, memory): a share of one node's capacity."""
HeldParts = tuple[list[Part], list[Part], int, dict[str, list[int]]]
"""`Cycle._held_parts`: held parts on a flavor, elsewhere, the GPUs of the first, the first per node."""


@dataclass(slots=True)
class _Hold:
    """Capacity a waiting job keeps from lower-ranked ones: a claim or a reservation."""

    job_id: str
    due: float | None
    parts: list[tuple[str, int, int, int]] = field(default_factory=list)
    backfill: bool = False
    """True for a reservation, whose capacity jobs that end before `due` (or tier 4) may use."""


class Cycle:
    """The state of one pass. Built from a snapshot, consumed by `run()`."""

    def __init__(self, snapshot: Snapshot, now: float, alloc: Allocation, waiting: Iterable[Job],
                 terminating: dict[str, Job], claims: dict[str, Job] | None = None) -> None:
        self.snapshot = snapshot
        self.now = now
        self.policy: Policy = snapshot.policy
        self.index = alloc.index
        self.quota = alloc.quota
        self.charged_tiers = alloc.charged_tiers
        self.flavor_of_job = alloc.flavor_of_job
        self.used_indices: dict[str, int] = alloc.used
        self.victim_facts = alloc.victim_facts
        self.ctx = RuleContext(self.policy, self.quota, now)
        self.node_gpus = alloc.node_gpus
        self.waiting = waiting
        self.claims: dict[str, Job] = claims or {}
        self.holding = alloc.jobs
        self.tiers = alloc.tiers
        self.terminating = terminating
        for job in terminating.values():
            if self.charged(job) and job.queue in self.quota.paths:
                self.quota.depart(job.queue, self.quota.demand(job, self.flavor_of_job[job.id]))
        self.claimed: set[str] = set()
        self.leaving_now: list[Candidate] | None = None
        """`_leaving`, until the next claim."""
        self.rests: dict[str, tuple[Job, tuple[tuple[str, int, int, int], ...], float]] = {}
        self.rest_quota: dict[str, list[tuple[int, tuple[float, ...]]]] = {}
        """Leaving jobs others count on: what of them is still unpromised, and when it frees."""
        self.admissions: list[Admission] = []
        self.preemptions: list[Preemption] = []
        self.reservations: list[Reservation] = []
        self.holds: list[_Hold] = []
        self.hold_ids: tuple[int, ...] = ()
        """`id` of each of `holds`, in order (a key while they live: the pass keeps them)."""
        self.reserved: list[_Hold] = []
        """The holds of reservations: the ones lower jobs may backfill."""
        self.explanations: dict[str, Explanation] = {}
        self.quota_seen: dict[tuple, tuple[int, Reason | None, bool]] = {}
        self.quota_version = 0
        self.capacity_seen: dict[tuple, tuple[int, Reason]] = {}
        self.capacity_version = 0
        self.preempt_fail: set[tuple] = set()
        self.held_fail: set[tuple] = set()
        self.backfill_fail: dict[tuple, int] = {}
        self.held_ok: dict[tuple, tuple[int, Reason]] = {}
        self.held_parts: dict[tuple, tuple[int, HeldParts]] = {}
        self.outcomes: dict[tuple, list[Outcome]] = {}
        self.cpu_memory_governed = any(r in ("cpu", "memory") for r in self.quota.resources)
        self.hold_version = 0
        self.attempts_left = self.policy.preemption.max_attempts_per_pass
        self.candidates: CandidatePool | None = None
        self.releases: ReleaseOrders = ([], [], {})
        """What `_release_orders` is made of, listed by `_candidates`."""
        self.release_orders: ReleaseOrders | None = None
        self.nodes_of_block = alloc.nodes_of_block
        self.max_victim_tier: int | None = None

    def charged(self, job: Job) -> bool:
        """Does the job's usage count against quota (a governed tree, a charged tier)?"""
        return self.charged_tiers.get(job.tier, False)

    # -- the pass ---------------------------------------------------------------------------
    def run(self) -> Plan:
        strict = self.policy.scheduling.head_of_line_blocking
        head: Job | None = None
        approval: dict[int, Reason] = {}
        explanations = self.explanations
        new = tuple.__new__  # Explanation's own constructor is a Python function; this is C
        now = self.now
        outcomes = self.outcomes
        governed = self.cpu_memory_governed
        reserved = self.reserved  # grows in place during the pass
        for position, (_, _, _, _, key, job) in enumerate(self._order(), 1):
            reason: Reason | None
            if job.state is _AWAITING:
                reason = approval.get(job.tier) or approval.setdefault(job.tier, AwaitingApproval(job.tier))
            elif job.not_before is not None and job.not_before > now:
                reason = ThrashBackoff(job.not_before)
            elif head is not None:
                reason = Position(position, head.id)
            else:
                # `_consider`'s outcome cache, looked up here rather than in a call: it answers
                # most jobs of a deep queue, and a call per job is a sizeable share of a pass.
                if not reserved:
                    usable: bool | tuple[bool, ...] | None = None
                elif len(reserved) == 1:  # `_usable_signature`, inlined for the usual case
                    if job.tier == 4:
                        usable = True
                    elif job.expected_duration is None:
                        usable = False
                    else:
                        due = reserved[0].due
                        usable = due is not None and now + job.expected_duration <= due
                else:
                    usable = self._usable_signature(job)
                okey = (job.queue, job.tier, job.flavor, job.replicas, job.gpus, job.placement, usable)
                fronts = outcomes.get(okey)
                reason = _UNKNOWN
                if fronts is not None:
                    # A job asking at least the CPU and memory of one that failed fails too.
                    job_cpu, job_memory = job.cpu, job.memory
                    for cpu, memory, version, known in fronts:
                        if version == -1:
                            if (job_cpu == cpu and job_memory == memory) if governed \
                                    else (job_cpu >= cpu and job_memory >= memory):
                                reason = known
                                break
                        elif version == self.hold_version and job_cpu == cpu and job_memory == memory:
                            reason = known
                            break
                if reason is _UNKNOWN:
                    reason = self._consider(job, okey, fronts)
                if reason is not None and strict:
                    head = job
            if reason is not None:
                explanations[job.id] = new(Explanation, (job.id, reason, key, position))
        claims = frozenset(i for i, e in explanations.items() if isinstance(e.reason, WaitingForGrace))
        return Plan(
            now=self.now,
            admissions=tuple(self.admissions),
            preemptions=tuple(self.preemptions),
            reservations=tuple(self.reservations),
            explanations=self.explanations,
            claims=claims,
            released_claims=tuple(sorted(i for i in self.claims if i in explanations and i not in claims)),
        )

    def _order(self) -> list[Ranked]:
        """The ranking, with the jobs that hold a claim first (in rank order among them).

        A claimant's victims are leaving for it: considered first, it takes what they free (or
        claims it again while they are still in their grace) before any other job could be
        admitted into it, which would only be preempted again in turn.
        """
        ranked = _ranked(self.snapshot, self.now, self.waiting)
        claims = self.claims
        if not claims:
            return ranked
        first = [r for r in ranked if r[2] in claims and r[5].state is not _AWAITING]
        if not first:
            return ranked
        held = {r[2] for r in first}
        return first + [r for r in ranked if r[2] not in held]

    def _flavors(self, job: Job) -> Sequence[str]:
        return (job.flavor,) if job.flavor is not None else self.index.flavors()

    # -- 3. assign --------------------------------------------------------------------------
    def _consider(self, job: Job, key: tuple, fronts: list[Outcome] | None) -> Reason | None:
        """Admit the job if it fits; otherwise preempt, reserve, or say why it waits; remember
        why it failed under `key` (`fronts`: what is remembered there already).

        A job like one that already failed in this pass (same queue, tier, shape and runtime
        estimate, at least its CPU and memory) fails the same way: free capacity, and free plus
        held capacity, only shrank and quota usage only grew since. Its reason is reused (`run`
        looks it up), which keeps a deep queue cheap. `Reserved` depends on which holds exist
        and says the job would fit without them, so only an identical job reuses it while the
        holds are unchanged; where quota governs CPU or memory the reason names the amounts
        asked, so the same goes there.
        """
        reason = self._try(job)
        if reason is not None and not isinstance(reason, (WaitingForGrace, WaitingForLease)) \
                and getattr(reason, "reserved_at", None) is None:
            entry = (job.cpu, job.memory, self.hold_version if isinstance(reason, Reserved) else -1, reason)
            if fronts is None:
                self.outcomes[key] = [entry]
            elif len(fronts) < 8:
                fronts.append(entry)
        return reason

    def _usable_signature(self, job: Job) -> bool | tuple[bool, ...]:
        """Which reservations the job may backfill: all that its runtime estimate matters for.

        Jobs that end at different times but before (or after) the same reservations are due
        fail the same way, so they share one cached outcome. With one reservation (the
        default) the answer is a bool rather than a 1-tuple: one allocation less per job
        (`run` works that case out inline, the same way)."""
        reserved = self.reserved
        if len(reserved) == 1:
            if job.tier == 4:
                return True
            if job.expected_duration is None:
                return False
            due = reserved[0].due
            return due is not None and self.now + job.expected_duration <= due
        if job.tier == 4:
            return (True,) * len(reserved)
        if job.expected_duration is None:
            return (False,) * len(reserved)
        ends = self.now + job.expected_duration
        return tuple([h.due is not None and ends <= h.due for h in reserved])

    def _try(self, job: Job) -> Reason | None:
        if job.queue not in self.quota.paths:
            return UnknownQueue(job.queue)
        charged = self.charged(job)
        shape = (job.replicas, job.gpus, job.cpu, job.memory, job.placement)
        first: Reason | None = None
        find = self.index.find  # `_find`, `_flavors` and `_capacity_reason`'s cache, inlined
        for flavor in (job.flavor,) if job.flavor is not None else self.index.flavors():
            d = self.quota.demand(job, flavor) if charged else ()
            in_quota = True
            if charged:
                # A failure stays one for the pass; a fit holds until quota usage changes.
                qkey = (job.queue, d)
                seen = self.quota_seen.get(qkey)
                if seen is None or (seen[1] is None and seen[0] != self.quota_version):
                    verdict = self.quota.verdict(job.queue, d)
                    seen = self.quota_seen[qkey] = (self.quota_version, verdict.reason, verdict.in_quota)
                if seen[1] is not None:
                    first = first or seen[1]
                    continue
                in_quota = seen[2]
            pkey = (flavor,) + shape
            names = find(flavor, job.replicas, job.gpus, job.cpu, job.memory, job.placement)
            failed = None
            if names is None:
                seen_capacity = self.capacity_seen.get(pkey)
                failed = seen_capacity[1] if seen_capacity is not None and seen_capacity[0] == self.capacity_version \
                    else self._capacity_reason(job, flavor, pkey)
            if names is None and self.holds:
                names = self._backfill(job, flavor) if self.reserved else None
                if names is None:
                    failed = self._held(job, flavor, pkey) or failed
            if names is not None:
                self._admit(job, flavor, names, d, borrowing=not in_quota)
                return None
            first = first or failed
        if first is None:  # a cluster without nodes
            first = InsufficientCapacity("gpu", job.total_gpus, 0)
        waiting = self._preempt(job)
        if waiting is not None:
            return waiting
        if len(self.reservations) < self.policy.scheduling.reservations:
            reserved = self._reserve(job, first)
            if reserved is not None:
                return reserved
        return first

    def _find(self, flavor: str, job: Job) -> tuple[str, ...] | None:
        return self.index.find(flavor, job.replicas, job.gpus, job.cpu, job.memory, job.placement)

    def _capacity_reason(self, job: Job, flavor: str, pkey: tuple) -> Reason:
        """InsufficientCapacity or Fragmented, with the free GPUs as of the last change."""
        seen = self.capacity_seen.get(pkey)
        if seen is not None and seen[0] == self.capacity_version:
            return seen[1]
        reason = self._capacity_reason_now(job, flavor)
        self.capacity_seen[pkey] = (self.capacity_version, reason)
        return reason

    def _capacity_reason_now(self, job: Job, flavor: str) -> Reason:
        need = job.total_gpus
        free = self.index.free_gpus(flavor) if flavor in self.index.flavors() else 0
        if free >= need and need > 0:
            return Fragmented(job.placement, need, free, self.index.largest_domain(flavor, job.placement))
        return InsufficientCapacity("gpu" if flavor == "default" else f"gpu:{flavor}", need, free)

    def _admit(self, job: Job, flavor: str, names: Sequence[str], d: tuple[float, ...],
               borrowing: bool) -> None:
        self.index.place(names, job.gpus, job.cpu, job.memory)
        self.capacity_version += 1
        if d:
            self.quota.add(job.queue, d)
            self.quota_version += 1
        placement = []
        for name in names:
            used = self.used_indices.get(name, 0)
            gpus, taken = assign_gpu_indices(self.node_gpus[name], used, job.gpus)
            self.used_indices[name] = used | taken
            placement.append(ReplicaPlacement(name, gpus))
        self.admissions.append(Admission(job.id, tuple(placement), flavor, borrowing))

    # -- backfill into reservations ---------------------------------------------------------
    def _backfill(self, job: Job, flavor: str) -> tuple[str, ...] | None:
        """Try the capacity reserved for higher-ranked jobs that this job may use until due."""
        if job.tier == 4:
            usable = self.reserved
        elif job.expected_duration is None:
            return None
        else:
            ends = self.now + job.expected_duration
            usable = [h for h in self.reserved if h.due is not None and ends <= h.due]
        if not usable:
            return None
        # Free plus usable held capacity only shrinks while the holds stay as they are.
        ids = tuple([id(h) for h in usable])
        key = (flavor, job.replicas, job.gpus, job.cpu, job.memory, job.placement, ids)
        if self.backfill_fail.get(key) == self.hold_version:
            return None
        # Only the flavor's own nodes matter to a placement on it: release the holds there
        # first, and the rest only once the job is found to fit.
        here, elsewhere, _, per_node = self._held_parts(usable, ids, flavor)
        if job.replicas == 1 and not self._one_fits_with(job, per_node):
            self.backfill_fail[key] = self.hold_version
            return None
        mark = self.index.mark()
        for part in here:
            self.index.give(*part)
        names = self._find(flavor, job)
        if names is None:
            self.index.rollback(mark)
            self.backfill_fail[key] = self.hold_version
            return None
        for part in elsewhere:
            self.index.give(*part)
        # The job takes its share; each reservation keeps what is left of its part.
        self.index.place(names, job.gpus, job.cpu, job.memory)
        for h in usable:
            h.parts = self._take_free(h.parts)
        self.hold_version += 1
        self.capacity_version += 1
        for name in names:
            self.index.give(name, job.gpus, job.cpu, job.memory)
        self.index.release(mark)
        return names

    def _held(self, job: Job, flavor: str, pkey: tuple) -> Reason | None:
        """`Reserved` when the job would fit but for capacity held for a higher-ranked job.

        Free plus held capacity only shrinks during a pass, so a shape that does not fit even
        with every hold released never will; a `Reserved` answer holds until the holds change.
        """
        if pkey in self.held_fail:
            return None
        known = self.held_ok.get(pkey)
        if known is not None and known[0] == self.hold_version:
            return known[1]
        # Only the flavor's own nodes matter to a placement on it: release the holds there.
        parts, _, held, per_node = self._held_parts(self.holds, self.hold_ids, flavor)
        if self.index.free_gpus(flavor) + held < job.total_gpus:
            self.held_fail.add(pkey)
            return None
        if job.replicas == 1:
            fits = self._one_fits_with(job, per_node)
        else:
            mark = self.index.mark()
            for part in parts:
                self.index.give(*part)
            fits = self._find(flavor, job) is not None
            self.index.rollback(mark)
        if not fits:
            self.held_fail.add(pkey)
            return None
        holder = self.holds[0]
        reason = Reserved(holder.job_id, holder.due)
        self.held_ok[pkey] = (self.hold_version, reason)
        return reason

    def _held_parts(self, holds: Sequence[_Hold], ids: tuple[int, ...], flavor: str) -> HeldParts:
        """The parts of `holds` (whose `id`s are `ids`) on the flavor's nodes, those elsewhere,
        the GPUs of the first, and the first summed per node; kept until the holds change
        (`hold_version`)."""
        key = (flavor, ids)
        seen = self.held_parts.get(key)
        if seen is not None and seen[0] == self.hold_version:
            return seen[1]
        flavor_of = self.index.flavor_of
        here: list[Part] = []
        elsewhere: list[Part] = []
        for h in holds:
            for part in h.parts:
                (here if flavor_of(part[0]) == flavor else elsewhere).append(part)
        per_node: dict[str, list[int]] = {}
        for node, g, c, m in here:
            total = per_node.setdefault(node, [0, 0, 0])
            total[0] += g
            total[1] += c
            total[2] += m
        found = (here, elsewhere, sum(part[1] for part in here), per_node)
        self.held_parts[key] = (self.hold_version, found)
        return found

    def _one_fits_with(self, job: Job, extra: dict[str, list[int]]) -> bool:
        """Would one replica of the job fit on one of these nodes, with `extra` (node → gpus,
        cpu, memory) added to what is free there?

        `_find` after giving `extra` back, for a single-replica job the current free capacity
        cannot place, without changing the index: every placement constraint then asks for one
        node with room (`placement` module docstring), and only the nodes given to can have it.
        Untracked CPU or memory (a node declaring 0) never limits, as in the index.
        """
        g, c, m = job.gpus, job.cpu, job.memory
        index = self.index
        for node, (hg, hc, hm) in extra.items():
            fg, fc, fm = index.free(node)
            if fg + hg < g:
                continue
            _, cc, cm = index.capacity(node)
            if (c and cc and fc + hc < c) or (m and cm and fm + hm < m):
                continue
            return True
        return False

    def _take_free(self, parts: Iterable[tuple[str, int, int, int]]) -> list[tuple[str, int, int, int]]:
        """Take, of each wanted (node, gpus, cpu, memory), what is free now; return what was taken."""
        taken = []
        for node, g, c, m in parts:
            fg, fc, fm = self.index.free(node)
            part = (node, min(g, fg), min(c, fc), min(m, fm))
            if part[1] or part[2] or part[3]:
                self.index.take(*part)
                taken.append(part)
        return taken

    @staticmethod
    def _need(job: Job, names: Sequence[str]) -> dict[str, list[int]]:
        """(gpus, cpu, memory) a placement takes per node."""
        need: dict[str, list[int]] = {}
        for name in names:
            n = need.setdefault(name, [0, 0, 0])
            n[0] += job.gpus
            n[1] += job.cpu
            n[2] += job.memory
        return need

    def _hold(self, job: Job, names: Sequence[str], due: float | None, backfill: bool) -> _Hold:
        """Keep the part of a future placement that is free now away from lower-ranked jobs."""
        need = self._need(job, names)
        hold = _Hold(job.id, due, self._take_free((n, g, c, m) for n, (g, c, m) in need.items()), backfill)
        self.holds.append(hold)
        self.hold_ids += (id(hold),)
        if backfill:
            self.reserved.append(hold)
        self.hold_version += 1
        self.capacity_version += 1
        return hold

    # -- 4. preempt -------------------------------------------------------------------------
    def _release_job(self, job: Job, only: str | None = None) -> None:
        """What-if: the job's resources and quota usage are free (its resources on nodes of
        flavor `only` alone, when given: a caller that only places on that flavor)."""
        a = job.attempt
        assert a is not None
        for rp in a.assignment:
            if only is None or self.index.flavor_of(rp.node) == only:
                self.index.give(rp.node, job.gpus, job.cpu, job.memory)
        if self.charged(job) and job.queue in self.quota.paths:
            self.quota.remove(job.queue, self.quota.demand(job, self.flavor_of_job[job.id]))

    def _retake_job(self, job: Job) -> None:
        a = job.attempt
        assert a is not None
        for rp in a.assignment:
            self.index.take(rp.node, job.gpus, job.cpu, job.memory)
        if self.charged(job) and job.queue in self.quota.paths:
            self.quota.add(job.queue, self.quota.demand(job, self.flavor_of_job[job.id]))

    def release(self, c: Candidate) -> None:
        """What-if: the candidate has left. Of a job another waiting job already counts on, only
        what that one does not take over is freed: the capacity and quota usage left over."""
        if c.parts is None:
            self._release_job(c.job)
        else:
            for part in c.parts:
                self.index.give(*part)
            self.quota.adjust(self.rest_quota.get(c.job.id, []), -1)

    def retake(self, c: Candidate) -> None:
        if c.parts is None:
            self._retake_job(c.job)
        else:
            for part in c.parts:
                self.index.take(*part)
            self.quota.adjust(self.rest_quota.get(c.job.id, []), 1)

    def frees_quota_in(self, c: Candidate, queue: int) -> bool:
        """Would the candidate's exit lower the usage of that queue?"""
        if c.parts is not None:
            return any(q == queue for q, _ in self.rest_quota.get(c.job.id, ()))
        return self.charged(c.job) and queue in self.quota.paths.get(c.job.queue, ())

    def _footprint(self, c: Candidate) -> list[tuple[str, int, int, int]]:
        if c.parts is not None:
            return list(c.parts)
        a = c.job.attempt
        assert a is not None
        return [(rp.node, c.job.gpus, c.job.cpu, c.job.memory) for rp in a.assignment]

    def fits(self, job: Job, flavor: str, d: tuple[float, ...]) -> bool:
        if d and self.quota.violation(job.queue, d) is not None:
            return False
        return self._find(flavor, job) is not None

    def _mark(self) -> tuple[int, int]:
        return self.index.mark(), self.quota.mark()

    def _rollback(self, mark: tuple[int, int]) -> None:
        self.index.rollback(mark[0])
        self.quota.rollback(mark[1])

    def block_nodes(self, block: str) -> Sequence[str]:
        return self.nodes_of_block[block]

    def _candidates(self) -> CandidatePool:
        """Running jobs not yet signalled, in the policy's victim order, priced once a pass.

        Everything about a victim but its cost at `now` is kept between passes
        (`_victim_facts`); the cost is `rules.cost_at`, inlined (same arithmetic, same floats).
        Only the jobs the rules let go now are candidates: no search takes the others. Where the
        policy makes reservations, the same walk lists what `_release_orders` needs of all.
        """
        if self.candidates is None:
            releases = self.policy.scheduling.reservations > 0
            at_end: list[tuple[float, str, Job, float]] = []
            at_lift: list[tuple[float, str, Job, float]] = []
            kinds: dict[tuple[int, str], Job] = {}
            order = self.policy.preemption.victim_order
            by_cost = order == "cost"
            now = self.now
            known = self.victim_facts
            terminating = self.terminating
            new = tuple.__new__  # Candidate's own constructor is a Python function; this is C
            rows: list[tuple[Any, ...]] = []  # victim key (or its fields) first
            held_on: dict[str, int] = {}  # GPUs the rows hold per node
            nonnegative = True
            for v in self.holding.values():
                if v.id in terminating:
                    continue
                facts = known.get(v.id)
                if facts is None or facts[0] is not v or facts[1] > now:
                    facts = self._victim_facts(v)
                _, _, protected, since, restart, freed, gpus, neg_tier, neg_started, flavor, end = facts
                if protected <= now:
                    protected = 0.0
                if releases:
                    kind = (v.tier, v.queue)
                    if kind not in kinds:
                        kinds[kind] = v
                    if end < INF:
                        at_end.append((end, v.id, v, protected))
                    if protected < end:
                        lifts = now if now > protected else protected  # max(protected, now)
                        at_lift.append((lifts if lifts < end else end, v.id, v, protected))  # min(end, lifts)
                if protected == 0.0:
                    if since is None:
                        lost = 0.0
                    else:
                        at_risk = now - since
                        lost = gpus * (at_risk if at_risk > 0.0 else 0.0)  # max(0.0, now - since)
                    cost = lost + restart
                    if not cost >= 0.0:  # negative, or NaN
                        nonnegative = False
                    if by_cost:
                        # `victim_key` leads the row, so rows sort as tuples (no key function;
                        # the id is unique, so nothing after it is ever compared).
                        rows.append((cost, neg_tier, neg_started, v.id, v, lost, freed, flavor))
                    else:
                        rows.append((victim_key(order, v, cost), v, cost, lost, freed, flavor))
                    for node, gpus in freed:
                        held_on[node] = held_on.get(node, 0) + gpus
            if by_cost:
                rows.sort()
                free = [new(Candidate, (v, cost, lost, 0.0, flavor, rank, freed, False, None, 0.0))
                        for rank, (cost, _, _, _, v, lost, freed, flavor) in enumerate(rows)]
            else:
                rows.sort(key=itemgetter(0))
                free = [new(Candidate, (v, cost, lost, 0.0, flavor, rank, freed, False, None, 0.0))
                        for rank, (_, v, cost, lost, freed, flavor) in enumerate(rows)]
            self.candidates = CandidatePool(free, held_on, by_cost=by_cost, ascending=by_cost and nonnegative)
            self.releases = (at_end, at_lift, kinds)
        return self.candidates

    def _victim_facts(self, v: Job) -> VictimFacts:
        """What pricing a running job as a victim needs that does not change with time, kept
        between passes per job: (job, seen at, protected until, at risk since, restart cost,
        GPUs freed per node, GPUs, −tier, −started, flavor, expected end).

        A job's protection only ever lifts as time passes (a lease or stretched lease runs
        out, old preemptions leave the budget window), so what was computed at an earlier
        `now` holds later; a job whose facts change arrives as a new object and is priced anew.
        """
        facts = self.victim_facts.get(v.id)
        if facts is None or facts[0] is not v or facts[1] > self.now:
            started = v.attempt.started_at if v.attempt is not None else 0.0
            end = started + v.expected_duration if v.expected_duration is not None else INF
            facts = (v, self.now, protection(self.ctx, v), at_risk_since(self.policy, v),
                     startup_of(self.policy, v) * v.total_gpus, freed_gpus(v), v.total_gpus,
                     -v.tier, -started, self.flavor_of_job[v.id], end)
            self.victim_facts[v.id] = facts
        return facts

    def _preempt(self, job: Job) -> Reason | None:
        """Make room for `job` from terminating jobs first, then from eligible victims.

        Every flavor the job may use is searched and the cheapest set wins; then every victim
        the job can do without on any flavor is given back, so the set is minimal overall.
        """
        key = (job.queue, job.tier, job.flavor, job.replicas, job.gpus, job.cpu, job.memory, job.placement)
        if key in self.preempt_fail or self.attempts_left <= 0:
            return None
        if not self._could_preempt(job):
            self.preempt_fail.add(key)
            return None
        self.attempts_left -= 1
        flavors = self._flavors(job)
        best: tuple[float, int, int, list[Candidate], bool] | None = None
        for i, flavor in enumerate(flavors):
            mark = self._mark()
            chosen, reclaims = self._search(job, flavor)
            self._rollback(mark)
            if chosen:
                found = (*_set_cost(chosen), i, chosen, reclaims)
                if best is None or found[:3] < best[:3]:
                    best = found
        if best is None:
            self.preempt_fail.add(key)
            return None
        victims, reclaims = best[3], best[4]

        def enough(f: str) -> bool:
            """The search's own test: the job fits (and, for a set chosen to reclaim its way
            into quota, is in-quota) on flavor f."""
            d = self.quota.demand(job, f) if self.charged(job) else ()
            return self.fits(job, f, d) and (not reclaims or self.quota.in_quota(job.queue, d))

        mark = self._mark()
        for c in victims:
            self.release(c)
        needed = []
        for c in sorted(victims, key=lambda c: (-c.cost, -c.rank)):
            self.retake(c)
            if not any(enough(f) for f in flavors):
                self.release(c)
                needed.append(c)
        flavor = next((f for f in flavors if enough(f)), None)
        names = self._find(flavor, job) if flavor is not None else None
        self._rollback(mark)
        if flavor is None or names is None:
            # The search and this fit test read the same state, so they agree; were they ever
            # not to, the job waits with the reason its placement gives, and the pass goes on.
            self.preempt_fail.add(key)
            return None
        d = self.quota.demand(job, flavor) if self.charged(job) else ()
        return self._claim(job, names, d, sorted(needed, key=lambda c: c.rank))

    def placeable(self, job: Job, flavor: str) -> bool:
        return self._find(flavor, job) is not None

    def _fits_flavor(self, job: Job, flavor: str) -> bool:
        return self.fits(job, flavor, self.quota.demand(job, flavor) if self.charged(job) else ())

    def _could_preempt(self, job: Job) -> bool:
        """A cheap necessary condition: something terminating, or a possible victim's tier."""
        if any(t not in self.claimed for t in self.terminating):
            return True
        if self.max_victim_tier is None:
            leaving: dict[int, int] = {}
            for t in self.terminating.values():
                leaving[t.tier] = leaving.get(t.tier, 0) + 1
            self.max_victim_tier = max(
                (tier for tier, n in self.tiers.items()
                 if n > leaving.get(tier, 0) and self.policy.tier(tier).preemptible), default=0)
        if self.max_victim_tier > job.tier:
            return True
        return self.max_victim_tier == job.tier and self.charged(job)

    def _leaving(self) -> list[Candidate]:
        """Capacity already on its way out, soonest first, as free candidates: terminating jobs
        nobody counts on yet, and what is left of those others already count on. Kept until
        the next claim changes either."""
        if self.leaving_now is None:
            self.leaving_now = self._leaving_now()
        return self.leaving_now

    def _leaving_now(self) -> list[Candidate]:
        rows: list[tuple[float, str, Job, tuple[Part, ...] | None]] = []
        for t in self.terminating.values():
            if t.id not in self.claimed:
                kill_at = t.attempt.kill_at if t.attempt is not None else None
                rows.append((self.now if kill_at is None else kill_at, t.id, t, None))
        for job_id, (t, parts, eta) in self.rests.items():
            rows.append((eta, job_id, t, parts))
        rows.sort(key=lambda r: (r[0], r[1]))
        return [Candidate(t, 0.0, 0.0, 0.0, self.flavor_of_job[t.id], i - len(rows), freed_gpus(t, parts),
                          leaving=True, parts=parts, eta=eta) for i, (eta, _, t, parts) in enumerate(rows)]

    def _search(self, job: Job, flavor: str) -> tuple[list[Candidate], bool]:
        """Jobs whose exit makes room for `job` on `flavor` (released), or [] (nothing); and
        whether they were chosen to leave it in-quota (`Preemptor.reclaims`).

        A `scope: quota` job that is in-quota only once others' borrowing is reclaimed takes
        victims anywhere only if they leave it in-quota; failing that, it searches again as a
        borrower, which may take victims in its own queue alone (DESIGN §4.3).
        """
        d = self.quota.demand(job, flavor) if self.charged(job) else ()
        leaving = self._leaving()
        in_quota = self.quota.in_quota(job.queue, d, reclaim=True) if d else True
        reclaims = bool(in_quota and d and self.policy.tier(job.tier).scope == "quota"
                        and not self.quota.in_quota(job.queue, d))
        mark = self._mark()
        chosen = search(self, Preemptor(job, in_quota, d, reclaims), flavor, self._candidates(), leaving)
        if not reclaims:
            return chosen, False
        # Victims in its own queue alone may do for less: the cheaper set wins.
        self._rollback(mark)
        alone = search(self, Preemptor(job, False, d), flavor, self._candidates(), leaving)
        if chosen and (not alone or _set_cost(chosen) <= _set_cost(alone)):
            self._rollback(mark)
            for c in chosen:
                self.release(c)
            return chosen, True
        return alone, False

    def _claim(self, job: Job, names: Sequence[str], d: tuple[float, ...], chosen: list[Candidate]) -> Reason:
        """Signal the new victims and hold what the job will need, so nobody takes it meanwhile.

        The job's whole future placement is held now; what the jobs it waits for hold beyond
        that stays theirs, offered to the next preemptor as capacity on its way out.
        """
        etas = {}
        for c in chosen:
            if c.leaving:
                etas[c.job.id] = c.eta
                continue
            grace = grace_of(self.policy, c.job)
            kind = "downward" if c.job.tier > job.tier else "reclaim"
            self.preemptions.append(Preemption(c.job.id, job.id, kind, grace, c.cost, c.lost))
            if self.charged(c.job) and c.job.queue in self.quota.paths:
                self.quota.depart(c.job.queue, self.quota.demand(c.job, self.flavor_of_job[c.job.id]))
            etas[c.job.id] = self.now + grace
        due = max(etas.values(), default=self.now)
        hold = self._hold(job, names, due, backfill=False)
        # The rest of the placement comes out of the leaving jobs' capacity: promised to this
        # job, never shown free (a `Reserved` check releases only what a hold took from free).
        rest_of_need = self._need(job, names)
        for node, g, cpu, mem in hold.parts:
            n = rest_of_need[node]
            n[0] -= g
            n[1] -= cpu
            n[2] -= mem
        footprints = {c.job.id: self._footprint(c) for c in chosen}
        for parts in footprints.values():
            for part in parts:
                self.index.give(*part)
        for node, (g, cpu, mem) in rest_of_need.items():
            if g or cpu or mem:
                self.index.take(node, g, cpu, mem)
        pool = self._candidates()
        self.leaving_now = None
        for c in chosen:
            self.claimed.add(c.job.id)
            if not c.leaving:
                pool.drop(c)
            rest = self._take_free(footprints[c.job.id])
            if rest:
                self.rests[c.job.id] = (c.job, tuple(rest), etas[c.job.id])
            else:
                self.rests.pop(c.job.id, None)
        # The leaving usage this job takes over is charged to it; the rest vanishes at exit and
        # the next job waiting on the same exits may count on it.
        leaving = []
        for c in chosen:
            if c.parts is not None:
                leaving.append(self.rest_quota.get(c.job.id, []))
            elif self.charged(c.job) and c.job.queue in self.quota.paths:
                leaving.append(self.quota.path_usage(c.job.queue, self.quota.demand(c.job, self.flavor_of_job[c.job.id])))
            else:
                leaving.append([])
        if d:
            leaving = self.quota.transfer(job.queue, d, leaving)
            self.quota_version += 1
        for c, left in zip(chosen, leaving):
            self.rest_quota[c.job.id] = left
        return WaitingForGrace(tuple(etas), due)

    # -- 5. reserve -------------------------------------------------------------------------
    def _reserve(self, job: Job, blocked: Reason) -> Reason | None:
        """Find when capacity for `job` frees first, and hold what of it is free now."""
        best: tuple[float, str, tuple[str, ...], list[Job], list[Job]] | None = None
        for flavor in self._flavors(job):
            found = self._forecast(job, flavor, INF if best is None else best[0])
            if found is not None and (best is None or found[0] < best[0]):
                best = found
        if best is None:
            return None
        due, flavor, names, waits_for, lease_victims = best
        self._hold(job, names, due, backfill=True)
        self.reservations.append(
            Reservation(job.id, due, tuple(dict.fromkeys(names)), tuple(j.id for j in waits_for)))
        if lease_victims:
            return WaitingForLease(tuple(v.id for v in lease_victims), due)
        if isinstance(blocked, (InsufficientCapacity, Fragmented)):
            return replace(blocked, reserved_at=due)
        return blocked

    def _forecast(self, job: Job, flavor: str, before: float = INF
                  ) -> tuple[float, str, tuple[str, ...], list[Job], list[Job]] | None:
        """Release jobs in the order they will free capacity until the job fits: the due time,
        its placement then, the jobs it waits for, and which of those it will preempt. None
        when it never fits, or not before `before` (the due time another flavor already has).

        A running job frees its capacity at its expected end, or — if the job may preempt it
        (pair rules) and its protection lifts before that — when the protection lifts; a
        terminating one at its SIGKILL deadline. Both orders are sorted once a pass
        (`_release_orders`) and merged here, each job taken from the one that applies to it,
        so a forecast costs what it releases, not a sort of every running job.
        """
        d = self.quota.demand(job, flavor) if self.charged(job) else ()
        p = Preemptor(job, self.quota.in_quota(job.queue, d, reclaim=True) if d else True, d)
        at_end, at_lift, kinds = self._release_orders()
        # The pair rules read the quota usage, which the releases below change: ask them first.
        may = {kind: allowed(self.ctx, p, v) for kind, v in kinds.items()}
        claimed = self.claimed
        leaving: list[tuple[float, str, Job, bool]] = []
        for gone in self.terminating.values():
            if gone.id not in claimed:
                kill_at = gone.attempt.kill_at if gone.attempt is not None else None
                leaving.append((self.now if kill_at is None else kill_at, gone.id, gone, False))
        leaving.sort(key=_time_and_id)
        ending = (e for e in _drain(at_end)
                  if e[2].id not in claimed and not (e[3] < e[0] and may[e[2].tier, e[2].queue]))
        lifting = (e for e in _drain(at_lift) if e[2].id not in claimed and may[e[2].tier, e[2].queue])
        mark = self._mark()
        released: list[tuple[Job, bool]] = []
        result = None
        for t, _, v, preempt in heapq.merge(leaving, ((t, i, v, False) for t, i, v, _ in ending),
                                            ((t, i, v, True) for t, i, v, _ in lifting),
                                            key=_time_and_id):
            if max(t, self.now) >= before:
                break  # due no earlier than `before`, as is every later release
            self._release_job(v, only=flavor)  # the fit is tested on `flavor` alone
            released.append((v, preempt))
            if self.fits(job, flavor, d):
                names = self._find(flavor, job)
                assert names is not None
                lease_victims = [v for v, pre in released if pre]
                result = (max(t, self.now), flavor, names, [v for v, _ in released], lease_victims)
                break
        self._rollback(mark)
        return result

    def _release_orders(self) -> ReleaseOrders:
        """The running jobs not signalled before this pass, in the order they end (those with an
        expected end), and those whose protection lifts before their end, in the order they
        may be preempted: heaps of (time, id, job, protected until), smallest time and id first;
        and one job of each (tier, queue) among them, all the pair rules read of a victim. Once
        a pass (listed by `_candidates`, in the same walk over the running jobs). Heaps, not
        sorted lists: a forecast stops after the first few hundred."""
        if self.release_orders is None:
            self._candidates()
            at_end, at_lift, kinds = self.releases
            heapq.heapify(at_end)  # ids are unique: tuples never compare past them
            heapq.heapify(at_lift)
            self.release_orders = self.releases
        return self.release_orders


def _set_cost(chosen: Sequence[Candidate]) -> tuple[float, int]:
    """How victim sets compare (DESIGN §4.4): least cost, then fewest new victims."""
    return sum(c.cost for c in chosen), sum(not c.leaving for c in chosen)


def _time_and_id(e: tuple) -> tuple[float, str]:
    return e[0], e[1]


def _drain(heap: list[tuple[float, str, Job, float]]) -> Iterator[tuple[float, str, Job, float]]:
    """A heap's items, smallest first, leaving the heap as it was."""
    heap = heap.copy()
    while heap:
        yield heapq.heappop(heap)
