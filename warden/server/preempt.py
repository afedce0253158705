"""Preemptions and evictions: a running gang stopped for another job, or because one of its
nodes went down — SIGTERM, its grace, SIGKILL, then requeued once its processes are gone.
"""

from __future__ import annotations

from warden.engine.accounting import effective_grace
from warden.engine.cycles import preemption_cycles
from warden.engine.durations import format_duration
from warden.engine.lifecycle import Event
from warden.engine.model import JobState
from warden.executors.base import UnknownAttempt
from warden.server.context import Duty
from warden.server.explanations import KILL_AT
from warden.store.jobs import StoredAttempt, StoredJob


class Preemptions(Duty):
    """Signals the victims a plan chose and the gangs a lost node strands, and counts the
    preemption cycles each stop starts."""

    def preempt(
        self, job: StoredJob, attempt: StoredAttempt, grace: float, for_job: str, kind: str, lost: float, now: float
    ) -> None:
        """SIGTERM a victim the plan chose from the snapshot, unless it changed since (a cancel
        marked it: it is terminating already, and must end CANCELLED)."""
        current = self.store.get(job.id)
        if current is None or current.state is not job.state or current.cancel_requested:
            return
        preemption_kind = "reclaim" if kind in ("reclaim", "fair_share") else "preemption"
        # The decision is recorded before the SIGTERM leaves: a leader that stops in between
        # leaves a preemption its successor finishes (`complete`), never a signal nobody knows of.
        self.store.update_attempt(job.id, attempt.number, preempted_for=for_job, preemption_kind=preemption_kind)
        kill_at = self.executor.terminate(str(job.id), attempt.number, grace)
        self.store.update_attempt(job.id, attempt.number, state="terminating", sigterm_at=now, kill_at=kill_at)
        if not self.store.transition(
            job.id,
            JobState.PREEMPTING,
            event=Event.SIGNALLED,
            now=now,
            actor="warden",
            reason=f"preempted for job {for_job} ({kind}); expected lost work {lost:.0f} GPU-s"
            + (" (none if it exits 0 in its grace: declared saves-on-sigterm)" if job.saves_on_sigterm and lost else "")
            + f"; grace {format_duration(grace)}",
            details={KILL_AT: kill_at, "grace_s": grace, "expected_lost_gpu_s": lost},
            expect_state={job.state},
            expect_cancel_requested=False,
        ):
            return  # cancelled meanwhile: its exit ends it CANCELLED
        if self.metrics is not None:
            self.metrics.preemption(job.queue, job.tier, kind)
        self._count_cycles(job, for_job, now)

    def evict(self, job: StoredJob, attempt: StoredAttempt, why: str, now: float) -> None:
        """Stop a gang one of whose nodes went down, the way a preemption does (grace, then
        SIGKILL), but for no other job: it is requeued when its processes are gone, and the
        thrash guard does not count it as a preemption."""
        if job.cancel_requested:
            return
        grace = effective_grace(self.policy, job.tier, job.grace_s)
        if job.state is JobState.RUNNING and attempt.handle is None:
            return  # not tracked yet: its exit or recovery ends it
        self.store.update_attempt(job.id, attempt.number, preemption_kind="eviction")  # recorded first (`preempt`)
        try:
            kill_at = self.executor.terminate(str(job.id), attempt.number, grace)
        except UnknownAttempt:
            return  # not tracked yet: its exit or recovery ends it
        self.store.update_attempt(job.id, attempt.number, state="terminating", sigterm_at=now, kill_at=kill_at)
        if self.store.transition(
            job.id,
            JobState.PREEMPTING,
            event=Event.SIGNALLED,
            now=now,
            actor="warden",
            reason=f"evicted: {why}; the whole gang stops and is requeued; grace {format_duration(grace)}",
            details={KILL_AT: kill_at, "grace_s": grace},
            expect_state={job.state},
            expect_cancel_requested=False,
        ):
            self._count_cycles(job, None, now)

    def complete(self, job: StoredJob, attempt: StoredAttempt, now: float) -> bool:
        """Finish a preemption or eviction a leader recorded (`preempted_for`, `preemption_kind`)
        and stopped before recording its SIGTERM (it stalled, died or lost its lease in
        between): SIGTERM the adopted attempt unless it got one already (the executor keeps the
        first deadline: `terminate` is idempotent and reads back what the attempt's control
        file recorded), and record it as `preempt` does. Whether the SIGTERM left before the
        stop is unknown, so the job is stopped either way: its processes may be saving already.
        False when there is nothing to finish."""
        if attempt.preemption_kind is None or attempt.sigterm_at is not None or attempt.ended_at is not None:
            return False
        if job.cancel_requested or attempt.handle is None:
            return False  # a cancel ends it (`Cancels.cancels_pending`); an unstarted attempt is requeued
        grace = effective_grace(self.policy, job.tier, job.grace_s)
        try:
            kill_at = self.executor.terminate(str(job.id), attempt.number, grace)
        except UnknownAttempt:
            return False
        sigterm_at = min(now, kill_at - grace)
        self.store.update_attempt(job.id, attempt.number, state="terminating", sigterm_at=sigterm_at, kill_at=kill_at)
        what = (
            "evicted"
            if attempt.preemption_kind == "eviction"
            else f"preempted for job {attempt.preempted_for} ({attempt.preemption_kind})"
        )
        self.store.transition(
            job.id,
            JobState.PREEMPTING,
            event=Event.SIGNALLED,
            now=now,
            actor="warden",
            reason=f"{what}, as the leader that chose it decided before it stopped; grace {format_duration(grace)}",
            details={KILL_AT: kill_at, "grace_s": grace},
            expect_state={JobState.RUNNING},
            expect_cancel_requested=False,
        )
        return True

    def _count_cycles(self, victim: StoredJob, by: str | None, at: float) -> None:
        """Count the jobs the preemption of `victim` at `at` (for `by`) put into a preemption
        cycle of a kind they were not in before it (`warden_preemption_cycles_total`)."""
        if self.metrics is None:
            return
        ids = [victim.id, *([int(by)] if by is not None and by.isdigit() else [])]
        links = self.store.preemption_links(ids)
        before = [p for p in links if not (p.victim == victim.job_id and p.at == at)]
        budget = self.policy.thrash.max_preemptions
        for i in ids:
            was = {c.kind for c in preemption_cycles(str(i), before, budget)}
            for c in preemption_cycles(str(i), links, budget):
                if c.kind not in was:
                    self.metrics.cycle_entered(c.kind)
