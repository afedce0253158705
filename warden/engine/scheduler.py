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

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Iterable, Sequence

from warden.engine.fairshare import fair_order
from warden.engine.model import Job, JobState, Snapshot
from warden.engine.placement import CapacityIndex, assign_gpu_indices
from warden.engine.plan import Admission, Explanation, Plan, Preemption, Reservation, SortKey
from warden.engine.quota import QuotaTree
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
from warden.engine.rules import Preemptor, RuleContext, blocks, grace_of, victim_cost

if TYPE_CHECKING:
    from warden.engine.policy import Policy

INF = math.inf


def schedule(snapshot: Snapshot, now: float) -> Plan:
    """The engine's one entry point: the same snapshot and `now` always give the same plan."""
    return Cycle(snapshot, now).run()


def rank(snapshot: Snapshot, now: float) -> list[tuple[SortKey, Job]]:
    """The waiting jobs of a snapshot in scheduling order, each with its sort key."""
    policy = snapshot.policy
    waiting = [j for j in snapshot.jobs if j.state.waiting]
    if policy.scheduling.order == "fifo":
        ranked = [(SortKey(0, 1, 0, 0.0, j.submit, j.id), j) for j in waiting]
    else:
        fair = fair_order(policy, snapshot.ledger.usage)
        unknown = (len(fair), ())
        max_wait = {q: policy.max_wait_for(q) for q in fair}
        default_wait = policy.fair_share.aging.max_wait.get("default", INF)
        ranked = []
        for j in waiting:
            fr, ratios = fair.get(j.queue, unknown)
            waited = j.wait_at(now)
            breach = 0 if waited >= max_wait.get(j.queue, default_wait) else 1
            ranked.append((SortKey(j.tier, breach, fr, -waited, j.submit, j.id, ratios), j))
    ranked.sort(key=lambda kj: kj[0])
    return ranked


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

    def __init__(self, snapshot: Snapshot, now: float) -> None:
        self.snapshot = snapshot
        self.now = now
        self.policy: Policy = snapshot.policy
        self.index = CapacityIndex(snapshot.nodes)
        self.quota = QuotaTree(self.policy)
        self.ctx = RuleContext(self.policy, self.quota, now)
        self.node_gpus = {n.name: n.gpus for n in snapshot.nodes}
        self.used_indices: dict[str, set[int]] = {}
        self.holding: list[Job] = []
        self.flavor_of_job: dict[str, str] = {}
        self.terminating: dict[str, Job] = {}
        self.claimed: set[str] = set()
        self.admissions: list[Admission] = []
        self.preemptions: list[Preemption] = []
        self.reservations: list[Reservation] = []
        self.holds: list[_Hold] = []
        self.explanations: dict[str, Explanation] = {}
        self.quota_fail: dict[tuple, Reason] = {}
        self.preempt_fail: set[tuple] = set()
        self.held_fail: set[tuple] = set()
        self.held_ok: dict[tuple, tuple[int, Reason]] = {}
        self.hold_version = 0
        self.attempts_left = self.policy.preemption.max_attempts_per_pass
        self.victim_order: list[tuple[Job, float, float]] | None = None
        self.max_victim_tier: int | None = None
        for job in snapshot.jobs:
            if job.state.holds_resources and job.attempt is not None:
                self._load_holding(job)

    # -- 1. snapshot ------------------------------------------------------------------------
    def _load_holding(self, job: Job) -> None:
        a = job.attempt
        assert a is not None
        for rp in a.assignment:
            self.index.take(rp.node, job.gpus, job.cpu, job.memory)
            self.used_indices.setdefault(rp.node, set()).update(rp.gpus)
        flavor = self.index.flavor_of(a.assignment[0].node) if a.assignment else ""
        self.flavor_of_job[job.id] = flavor
        if self._charged(job) and job.queue in self.quota.paths:
            self.quota.add(job.queue, self.quota.demand(job, flavor))
        self.holding.append(job)
        if a.sigterm_at is not None or job.state is JobState.PREEMPTING:
            self.terminating[job.id] = job

    def _charged(self, job: Job) -> bool:
        return self.quota.governed() and self.policy.tier(job.tier).charged

    # -- the pass ---------------------------------------------------------------------------
    def run(self) -> Plan:
        strict = self.policy.scheduling.head_of_line_blocking
        head: Job | None = None
        approval: dict[int, Reason] = {}
        for position, (key, job) in enumerate(rank(self.snapshot, self.now), 1):
            reason: Reason | None
            if job.state is JobState.AWAITING_APPROVAL:
                reason = approval.get(job.tier) or approval.setdefault(job.tier, AwaitingApproval(job.tier))
            elif job.not_before is not None and job.not_before > self.now:
                reason = ThrashBackoff(job.not_before)
            elif head is not None:
                reason = Position(position, head.id)
            else:
                reason = self._consider(job)
                if reason is not None and strict:
                    head = job
            if reason is not None:
                self.explanations[job.id] = Explanation(job.id, reason, key, position)
        return Plan(
            now=self.now,
            admissions=tuple(self.admissions),
            preemptions=tuple(self.preemptions),
            reservations=tuple(self.reservations),
            explanations=self.explanations,
        )

    def _flavors(self, job: Job) -> Sequence[str]:
        return (job.flavor,) if job.flavor is not None else self.index.flavors()

    # -- 3. assign --------------------------------------------------------------------------
    def _consider(self, job: Job) -> Reason | None:
        """Admit the job if it fits; otherwise preempt, reserve, or say why it waits."""
        if job.queue not in self.quota.paths:
            return UnknownQueue(job.queue)
        charged = self._charged(job)
        shape = (job.replicas, job.gpus, job.cpu, job.memory, job.placement)
        first: Reason | None = None
        for flavor in self._flavors(job):
            d = self.quota.demand(job, flavor) if charged else ()
            in_quota = True
            if charged:
                qkey = (job.queue, d)
                failed = self.quota_fail.get(qkey)
                if failed is None:
                    verdict = self.quota.check(job.queue, d)
                    if not verdict.fits:
                        failed = self.quota_fail[qkey] = verdict.reason
                if failed is not None:
                    first = first or failed
                    continue
                in_quota = self.quota.in_quota(job.queue, d)
            pkey = (flavor,) + shape
            names = self._find(flavor, job)
            failed = None if names is not None else self._capacity_reason(job, flavor)
            if names is None and self.holds:
                names = self._backfill(job, flavor)
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

    def _capacity_reason(self, job: Job, flavor: str) -> Reason:
        need = job.total_gpus
        free = self.index.free_gpus(flavor) if flavor in self.index.flavors() else 0
        if free >= need and need > 0:
            return Fragmented(job.placement, need, free, self.index.largest_domain(flavor, job.placement))
        return InsufficientCapacity("gpu" if flavor == "default" else f"gpu:{flavor}", need, free)

    def _admit(self, job: Job, flavor: str, names: Sequence[str], d: tuple[float, ...],
               borrowing: bool) -> None:
        self.index.place(names, job.gpus, job.cpu, job.memory)
        if d:
            self.quota.add(job.queue, d)
        placement = []
        for name in names:
            used = self.used_indices.setdefault(name, set())
            gpus = assign_gpu_indices(self.node_gpus[name], used, job.gpus)
            used.update(gpus)
            placement.append(ReplicaPlacement(name, gpus))
        self.admissions.append(Admission(job.id, tuple(placement), flavor, borrowing))

    # -- backfill into reservations ---------------------------------------------------------
    def _backfill(self, job: Job, flavor: str) -> tuple[str, ...] | None:
        """Try the capacity reserved for higher-ranked jobs that this job may use until due."""
        ends = None if job.expected_duration is None else self.now + job.expected_duration
        usable = [h for h in self.holds if h.backfill
                  and (job.tier == 4 or (ends is not None and h.due is not None and ends <= h.due))]
        if not usable:
            return None
        mark = self.index.mark()
        self._release_holds(usable)
        names = self._find(flavor, job)
        if names is None:
            self.index.rollback(mark)
            return None
        # The job takes its share; each reservation keeps what is left of its part.
        self.index.place(names, job.gpus, job.cpu, job.memory)
        for h in usable:
            h.parts = self._take_free(h.parts)
        self.hold_version += 1
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
        mark = self.index.mark()
        self._release_holds(self.holds)
        fits = self._find(flavor, job) is not None
        self.index.rollback(mark)
        if not fits:
            self.held_fail.add(pkey)
            return None
        holder = self.holds[0]
        reason = Reserved(holder.job_id, holder.due)
        self.held_ok[pkey] = (self.hold_version, reason)
        return reason

    def _release_holds(self, holds: Iterable[_Hold]) -> None:
        for h in holds:
            for node, g, c, m in h.parts:
                self.index.give(node, g, c, m)

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

    def _hold(self, job: Job, names: Sequence[str], due: float | None, backfill: bool) -> _Hold:
        """Keep the part of a future placement that is free now away from lower-ranked jobs."""
        need: dict[str, list[int]] = {}
        for name in names:
            n = need.setdefault(name, [0, 0, 0])
            n[0] += job.gpus
            n[1] += job.cpu
            n[2] += job.memory
        hold = _Hold(job.id, due, self._take_free((n, g, c, m) for n, (g, c, m) in need.items()), backfill)
        self.holds.append(hold)
        self.hold_version += 1
        return hold

    # -- 4. preempt -------------------------------------------------------------------------
    def _release(self, job: Job) -> None:
        a = job.attempt
        assert a is not None
        for rp in a.assignment:
            self.index.give(rp.node, job.gpus, job.cpu, job.memory)
        if self._charged(job) and job.queue in self.quota.paths:
            self.quota.remove(job.queue, self.quota.demand(job, self.flavor_of_job[job.id]))

    def _retake(self, job: Job) -> None:
        a = job.attempt
        assert a is not None
        for rp in a.assignment:
            self.index.take(rp.node, job.gpus, job.cpu, job.memory)
        if self._charged(job) and job.queue in self.quota.paths:
            self.quota.add(job.queue, self.quota.demand(job, self.flavor_of_job[job.id]))

    def _fits(self, job: Job, flavor: str, d: tuple[float, ...]) -> bool:
        if d and not self.quota.check(job.queue, d).fits:
            return False
        return self._find(flavor, job) is not None

    def _mark(self) -> tuple[int, int]:
        return self.index.mark(), self.quota.mark()

    def _rollback(self, mark: tuple[int, int]) -> None:
        self.index.rollback(mark[0])
        self.quota.rollback(mark[1])

    def _victims_by_cost(self) -> list[tuple[Job, float, float]]:
        """Running jobs not yet signalled, in the policy's victim order, with (cost, lost)."""
        if self.victim_order is None:
            order = self.policy.preemption.victim_order
            rows = []
            for v in self.holding:
                if v.id in self.terminating:
                    continue
                cost, lost = victim_cost(self.policy, v, self.now)
                started = v.attempt.started_at if v.attempt else 0.0
                if order == "newest":
                    k: tuple = (-v.tier, -started, v.id)
                elif order == "smallest":
                    k = (-v.tier, v.total_gpus, -started, v.id)
                else:
                    k = (cost, -v.tier, -started, v.id)
                rows.append((k, v, cost, lost))
            rows.sort(key=lambda r: r[0])
            self.victim_order = [(v, cost, lost) for _, v, cost, lost in rows]
        return self.victim_order

    def _preempt(self, job: Job) -> Reason | None:
        """Make room for `job` from terminating jobs first, then from eligible victims."""
        key = (job.queue, job.tier, job.flavor, job.replicas, job.gpus, job.cpu, job.memory, job.placement)
        if key in self.preempt_fail or self.attempts_left <= 0:
            return None
        if not self._could_preempt(job):
            self.preempt_fail.add(key)
            return None
        self.attempts_left -= 1
        for flavor in self._flavors(job):
            result = self._preempt_in(job, flavor)
            if result is not None:
                return result
        self.preempt_fail.add(key)
        return None

    def _could_preempt(self, job: Job) -> bool:
        """A cheap necessary condition: something terminating, or a possible victim's tier."""
        if any(t not in self.claimed for t in self.terminating):
            return True
        if self.max_victim_tier is None:
            self.max_victim_tier = max(
                (v.tier for v in self.holding
                 if v.id not in self.terminating and self.policy.tier(v.tier).preemptible), default=0)
        if self.max_victim_tier > job.tier:
            return True
        return self.max_victim_tier == job.tier and self._charged(job)

    def _preempt_in(self, job: Job, flavor: str) -> Reason | None:
        d = self.quota.demand(job, flavor) if self._charged(job) else ()
        p = Preemptor(job, self.quota.in_quota(job.queue, d, reclaim=True) if d else True, d)
        mark = self._mark()
        term = sorted((t for t in self.terminating.values() if t.id not in self.claimed),
                      key=lambda t: (t.attempt.kill_at or self.now, t.id))  # type: ignore[union-attr]
        for t in term:
            self._release(t)
        victims: list[tuple[Job, float, float]] = []
        if not self._fits(job, flavor, d):
            for v, cost, lost in self._victims_by_cost():
                if v.id in self.claimed or blocks(self.ctx, p, v) != 0.0:
                    continue
                if v.tier <= job.tier and not self._still_borrowing(p, v):
                    continue
                self._release(v)
                victims.append((v, cost, lost))
                if self._fits(job, flavor, d):
                    break
            else:
                self._rollback(mark)
                return None
            # Minimal: give back every victim the job can do without, the costliest first.
            for row in sorted(victims, key=lambda r: -r[1]):
                self._retake(row[0])
                if self._fits(job, flavor, d):
                    victims.remove(row)
                else:
                    self._release(row[0])
        # Depend on as few terminating jobs as possible, the latest to exit first.
        needed = list(term)
        for t in reversed(term):
            self._retake(t)
            if self._fits(job, flavor, d):
                needed.remove(t)
            else:
                self._release(t)
        names = self._find(flavor, job)
        assert names is not None
        self._rollback(mark)
        return self._claim(job, flavor, names, d, victims, needed)

    def _still_borrowing(self, p: Preemptor, v: Job) -> bool:
        """Reclaim takes a victim only while its side is still above nominal."""
        _, _, v_side = self.quota.lowest_common_ancestor(p.job.queue, v.queue)
        return v_side >= 0 and self.quota.over_nominal(v_side)

    def _claim(self, job: Job, flavor: str, names: Sequence[str], d: tuple[float, ...],
               victims: list[tuple[Job, float, float]], terminating: list[Job]) -> Reason:
        """Signal the victims and hold what the job will need, so nobody takes it meanwhile."""
        etas = []
        for v, cost, lost in victims:
            grace = grace_of(self.policy, v)
            kind = "downward" if v.tier > job.tier else "reclaim"
            self.preemptions.append(Preemption(v.id, job.id, kind, grace, cost, lost))
            self.claimed.add(v.id)
            etas.append(self.now + grace)
        for t in terminating:
            self.claimed.add(t.id)
            a = t.attempt
            etas.append(a.kill_at if a is not None and a.kill_at is not None else self.now)
        self._hold(job, names, max(etas, default=self.now), backfill=False)
        if d:
            leaving = [(j.queue, self.quota.demand(j, self.flavor_of_job[j.id]))
                       for j in [v for v, _, _ in victims] + terminating
                       if self._charged(j) and j.queue in self.quota.paths]
            self.quota.transfer(job.queue, d, leaving)
        ids = tuple(v.id for v, _, _ in victims) + tuple(t.id for t in terminating)
        return WaitingForGrace(ids, max(etas) if etas else None)

    # -- 5. reserve -------------------------------------------------------------------------
    def _reserve(self, job: Job, blocked: Reason) -> Reason | None:
        """Find when capacity for `job` frees first, and hold what of it is free now."""
        best: tuple[float, str, tuple[str, ...], list[Job], list[Job]] | None = None
        for flavor in self._flavors(job):
            found = self._forecast(job, flavor)
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

    def _forecast(self, job: Job, flavor: str) -> tuple[float, str, tuple[str, ...], list[Job], list[Job]] | None:
        d = self.quota.demand(job, flavor) if self._charged(job) else ()
        p = Preemptor(job, self.quota.in_quota(job.queue, d, reclaim=True) if d else True, d)
        events: list[tuple[float, str, Job, bool]] = []
        for v in self.holding:
            if v.id in self.claimed:
                continue
            a = v.attempt
            assert a is not None
            if v.id in self.terminating:
                events.append((a.kill_at if a.kill_at is not None else self.now, v.id, v, False))
                continue
            end = a.started_at + v.expected_duration if v.expected_duration is not None else INF
            free_at = blocks(self.ctx, p, v)
            preempt = free_at < end
            t = min(end, max(free_at, self.now))
            if t < INF:
                events.append((t, v.id, v, preempt))
        events.sort(key=lambda e: (e[0], e[1]))
        mark = self._mark()
        released: list[tuple[Job, bool]] = []
        result = None
        for t, _, v, preempt in events:
            self._release(v)
            released.append((v, preempt))
            if self._fits(job, flavor, d):
                names = self._find(flavor, job)
                assert names is not None
                lease_victims = [v for v, pre in released if pre]
                result = (max(t, self.now), flavor, names, [v for v, _ in released], lease_victims)
                break
        self._rollback(mark)
        return result
