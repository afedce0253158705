"""Expected starts: the engine run forward from a snapshot, for every waiting job.

The engine's own reservations forecast where a few blocked jobs fit first. An expected start
for *every* waiting job needs more: who starts before it, whom they preempt, when those
victims come back. So the forecast replays the future the snapshot implies through the engine
itself (`Engine.plan`, warm, told what changed), on a virtual clock, under stated assumptions
(`ASSUMES`): running jobs end at their runtime estimates, jobs sent SIGTERM leave when their
save on SIGTERM is done (else at SIGKILL), nobody submits, cancels or fails meanwhile. A
waiting job's expected start is the first pass of that future that admits it.

It is an estimate, and says so. A job whose start depends on a job with no known end (no time
limit, or past it) gets none: `Estimate.at` is None, with why, never a made-up time. The
forecast also stops after `max_passes` passes or `horizon` seconds; a job that had not started
by then gets none either.

Pure like the rest of the engine: the same snapshot, `now` and bounds give the same estimates.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from warden.engine import lifecycle
from warden.engine.accounting import expected_end, save_fits_grace
from warden.engine.fairshare import accrue, cluster_capacity
from warden.engine.model import Attempt, Job, JobState, Snapshot
from warden.engine.overcommit import cluster_totals
from warden.engine.plan import Plan
from warden.engine.quota import QuotaTree
from warden.engine.rules import RuleContext, closes_at, grace_of, protection
from warden.engine.scheduler import Engine

if TYPE_CHECKING:
    from warden.engine.policy import Policy

INF = math.inf
MAX_PASSES = 2000
"""Passes one forecast runs at most, unless told otherwise."""
HORIZON_S = 30 * 86400.0
"""How far ahead one forecast looks at most, unless told otherwise."""

ASSUMES = (
    "running jobs end at their time limits; jobs sent SIGTERM leave when their save on SIGTERM "
    "is done, else at SIGKILL; no job is submitted, cancelled or fails meanwhile"
)
"""What every estimate assumes, as shown next to it."""

NO_END = "it waits for capacity held by jobs with no known end (no time limit, or past it)"
AWAITS_APPROVAL = "it starts only after an admin approves it"


@dataclass(frozen=True, slots=True)
class Estimate:
    """A waiting job's expected start, or why there is none."""

    at: float | None
    """When the forecast admits it (None: nothing bounds it, see `why`)."""
    why: str = ""
    """Why `at` is None (empty when it is not)."""


@dataclass(frozen=True, slots=True)
class StartForecast:
    """What one forecast found, and how far it looked."""

    starts: dict[str, Estimate]
    """Per waiting job asked about, its estimate."""
    passes: int
    """Scheduling passes it ran."""


def expected_starts(
    snapshot: Snapshot,
    now: float,
    jobs: Collection[str] | None = None,
    max_passes: int = MAX_PASSES,
    horizon: float = HORIZON_S,
) -> StartForecast:
    """The expected start of each waiting job of the snapshot (of `jobs` only, when given).

    The first pass of the forecast is the pass a shell runs on this snapshot at `now`: a job
    it admits is expected to start at `now`."""
    run = _Forecast(snapshot, now, max_passes, horizon)
    starts = run.run(jobs)
    return StartForecast(starts, run.passes)


_END, _EXIT = 0, 1
"""Event kinds: a running job ends (it leaves), a signalled one exits (it is requeued)."""


class _Forecast:
    """One forward run: the jobs as the forecast has them, the events to come, and the engine."""

    def __init__(self, snapshot: Snapshot, now: float, max_passes: int, horizon: float) -> None:
        self.snapshot = snapshot
        self.policy = policy = snapshot.policy
        self.now = now
        self.max_passes = max_passes
        self.until = now + horizon
        self.capacity = cluster_capacity(snapshot.nodes)
        self.ctx = RuleContext(policy, QuotaTree(policy, cluster_totals(snapshot.nodes)), now)
        """For the victim rules alone, which read neither quota nor anything else of a pass."""
        self.passes = 0
        self.jobs: dict[str, Job] = {}
        self.events: list[tuple[float, int, str, int]] = []
        """(when, kind, job id, version): a heap; an entry whose version is stale is skipped."""
        self.version: dict[str, int] = {}
        self.claimed: set[str] = set()
        """Waiting jobs marked `claim` as the last plan named them."""
        self.wakes: list[float] = []
        """Times a pass must look again although no job ends then (protection lifts, back-off
        ends, reservations due, a holder's signal to a job in its capacity): a heap."""
        for job in snapshot.jobs:
            if job.state.terminal:
                continue
            self.jobs[job.id] = job
            if job.claim and job.state.waiting:
                self.claimed.add(job.id)
            if job.state.holds_resources and job.attempt is not None:
                self._track(job, now)
            elif job.state.waiting and job.not_before is not None and job.not_before > now:
                heapq.heappush(self.wakes, job.not_before)

    def run(self, wanted: Collection[str] | None) -> dict[str, Estimate]:
        jobs = self.jobs
        targets = {i for i, j in jobs.items() if j.state.waiting and (wanted is None or i in wanted)}
        out: dict[str, Estimate] = {}
        for i in list(targets):
            if jobs[i].state is JobState.AWAITING_APPROVAL:
                out[i] = Estimate(None, AWAITS_APPROVAL)
                targets.discard(i)
        engine = Engine()
        ledger = self.snapshot.ledger
        changed: list[Job] | None = None
        t = self.now
        passes = self.passes = 0
        while targets:
            if passes >= self.max_passes or t > self.until:
                why = f"it does not start within the forecast's reach ({passes} scheduling passes, {_ahead(t - self.now)})"
                out.update((i, Estimate(None, why)) for i in targets)
                break
            snapshot = Snapshot(self.snapshot.nodes, tuple(jobs.values()), self.policy, ledger)
            plan = engine.plan(snapshot, t, changed)
            passes = self.passes = passes + 1
            changed = self._apply(plan, t)
            for a in plan.admissions:
                if a.job_id in targets:
                    targets.discard(a.job_id)
                    out[a.job_id] = Estimate(t)
            if not targets:
                break
            nxt = self._next(t)
            if nxt is None:
                out.update((i, Estimate(None, NO_END)) for i in targets)
                break
            holding = [j for j in jobs.values() if j.state.holds_resources]
            ledger = accrue(ledger, holding, self.capacity, self.policy, nxt)
            changed.extend(self._happen(nxt))
            t = nxt
        return out

    # -- the future, event by event -----------------------------------------------------------
    def _track(self, job: Job, now: float) -> None:
        """Schedule what a job that holds resources will do: exit (signalled) or end, and when
        the victim rules will let it go."""
        a = job.attempt
        assert a is not None
        v = self.version[job.id] = self.version.get(job.id, 0) + 1
        if a.sigterm_at is not None or job.state is JobState.PREEMPTING:
            heapq.heappush(self.events, (_exit_at(self.policy, job, now), _EXIT, job.id, v))
            return
        end = expected_end(job)
        if now <= end < INF:
            heapq.heappush(self.events, (end, _END, job.id, v))
        ctx = replace(self.ctx, now=now)
        for guard in (True, False):  # from tiers 2–4; from tier 1
            for changes in (protection(ctx, job, guard), closes_at(ctx, job, guard)):
                if now < changes < INF:
                    heapq.heappush(self.wakes, changes)

    def _apply(self, plan: Plan, t: float) -> list[Job]:
        """The plan carried out at `t`: victims signalled, admitted jobs running, claims marked."""
        jobs = self.jobs
        changed: list[Job] = []
        for p in plan.preemptions:
            v = jobs[p.job_id]
            assert v.attempt is not None
            changed.append(self._put(lifecycle.signalled(v, t, t + p.grace), t))
        for a in plan.admissions:
            j = jobs[a.job_id]
            number = 1 if j.attempt is None else j.attempt.number + 1
            j = lifecycle.admitted(j, t, Attempt(number, t, a.placement, a.borrowing, lent=a.lent), starts=True)
            changed.append(self._put(j, t))
        claims = plan.claims
        for i in self.claimed | claims:
            w = jobs.get(i)
            if w is not None and w.state.waiting and w.claim != (i in claims):
                changed.append(self._put(lifecycle.claimed(w, i in claims), t))
        self.claimed = set(claims)
        for r in plan.reservations:
            if r.due is not None and r.due > t:
                heapq.heappush(self.wakes, r.due)
            if r.signal_at is not None and r.signal_at > t:
                heapq.heappush(self.wakes, r.signal_at)
        return changed

    def _put(self, job: Job, t: float) -> Job:
        self.jobs[job.id] = job
        if job.state.holds_resources:
            self._track(job, t)
        return job

    def _next(self, t: float) -> float | None:
        """When the next pass runs: the next end, exit or wake after `t` (None: none comes)."""
        events, wakes, version = self.events, self.wakes, self.version
        while events and version.get(events[0][2]) != events[0][3]:
            heapq.heappop(events)
        while wakes and wakes[0] <= t:
            heapq.heappop(wakes)
        times = [e[0] for e in events[:1]] + wakes[:1]
        return min(times) if times else None

    def _happen(self, t: float) -> list[Job]:
        """Every end and exit due by `t`: an ended job leaves, an exited one is requeued."""
        events, jobs, version = self.events, self.jobs, self.version
        changed: list[Job] = []
        backoff = self.policy.thrash.requeue_backoff
        while events and events[0][0] <= t:
            _, kind, job_id, v = heapq.heappop(events)
            if version.get(job_id) != v:
                continue
            del version[job_id]
            job = jobs.pop(job_id)
            if kind == _END:
                changed.append(lifecycle.finished(job))
                continue
            assert job.attempt is not None and job.attempt.sigterm_at is not None
            gone = lifecycle.exited(job, JobState.REQUEUED, preempted_at=job.attempt.sigterm_at)
            requeued = lifecycle.requeued(gone, t, backoff=backoff)
            jobs[job_id] = requeued
            changed.append(requeued)
            if requeued.not_before is not None:
                heapq.heappush(self.wakes, requeued.not_before)
        return changed


def _exit_at(policy: Policy, job: Job, now: float) -> float:
    """When a signalled job is gone: its save on SIGTERM done, if it reported one that fits its
    grace; else its SIGKILL deadline (now, if it has none)."""
    a = job.attempt
    assert a is not None
    sigterm_at = a.sigterm_at if a.sigterm_at is not None else now
    if a.sigterm_save_s is not None and save_fits_grace(a.sigterm_save_s, grace_of(policy, job)):
        return max(now, sigterm_at + a.sigterm_save_s)
    return max(now, a.kill_at if a.kill_at is not None else now)


def _ahead(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.0f} min ahead"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h ahead"
    return f"{seconds / 86400:.1f} days ahead"
