"""Cancels, by three paths: a user's cancel (`cancel`), one recorded but never signalled
(`cancels_pending`: the processes were not tracked yet, or a server stopped), and a waiting job
a cancel marked (`cancel_marked`). A cancelled job always ends CANCELLED, never requeued.
`stop` is the SIGTERM of every attempt that ends for good: a cancel's and a time limit's
(`warden.server.timelimits`).
"""

from __future__ import annotations

from warden.engine.accounting import effective_grace
from warden.engine.durations import format_duration
from warden.engine.lifecycle import Event
from warden.engine.model import JobState
from warden.executors.base import UnknownAttempt
from warden.server.context import Duty
from warden.server.explanations import KILL_AT
from warden.store.jobs import ActiveJob, StoredAttempt, StoredJob


class Cancels(Duty):
    """Carries out every cancel: at once for a waiting job, by SIGTERM, grace and SIGKILL for
    one that holds resources."""

    def cancel(self, job: StoredJob, actor: str) -> str | None:
        """Cancel `job` as the caller read it under the loop's lock (held, so no pass runs in
        between): a waiting job ends CANCELLED now; one holding resources is marked, so that
        its exit ends it CANCELLED (never requeued), and gets SIGTERM, grace, SIGKILL unless
        it is terminating already. Each write is a compare-and-set on what was read. Returns
        what was done, or None when a write found the job changed: read it again and retry."""
        if job.state.terminal:
            return None
        if job.state.waiting:
            return self._cancel_waiting(job, actor, self.clock())
        if job.cancel_requested:
            return "nothing: a cancel is already under way"
        return self._cancel_holding(job, actor, self.clock())

    def _cancel_waiting(self, job: StoredJob, actor: str, now: float) -> str | None:
        done = self.store.transition(
            job.id,
            JobState.CANCELLED,
            event=Event.CANCELLED,
            reason=f"cancelled by {actor}",
            actor=actor,
            now=now,
            expect_state={job.state},
        )
        return f"cancelled while {job.state.value}, before it started" if done else None

    def _cancel_holding(self, job: StoredJob, actor: str, now: float) -> str | None:
        if not self.store.flag(
            job.id,
            job.state,
            Event.CANCEL_MARKED,
            reason=f"cancel requested by {actor}",
            actor=actor,
            now=now,
            expect_cancel_requested=False,
        ):
            return None
        attempt = self.store.attempt(job.id, job.attempt)
        if attempt is None or attempt.ended_at is not None:
            return f"marked cancelled while {job.state.value} (its attempt has no processes)"
        if attempt.sigterm_at is not None:
            return (
                f"marked cancelled while {job.state.value}: already terminating, its SIGKILL deadline "
                "unchanged; it ends CANCELLED when its processes exit"
            )
        grace = effective_grace(self.policy, job.tier, job.grace_s)
        kill_at = self.stop(job, attempt, grace, now)
        if kill_at is None:  # not started or not adopted yet, or a standby: a pass of the leader signals it
            return (
                f"marked cancelled while {job.state.value}; the leading server sends SIGTERM at its next pass "
                "that tracks its processes"
            )
        return f"SIGTERM sent while {job.state.value}; SIGKILL when its grace of {format_duration(grace)} is over"

    def stop(self, job: StoredJob, attempt: StoredAttempt, grace: float, now: float) -> float | None:
        """SIGTERM an attempt that ends for good, a cancelled job's or one past its time limit
        (SIGKILL after `grace`, the executor's timer); its SIGKILL deadline, or None while the
        executor does not track its processes (not started or not adopted yet): a later pass
        sends it."""
        try:
            kill_at = self.executor.terminate(str(job.id), attempt.number, grace)
        except UnknownAttempt:
            return None
        self.store.update_attempt(job.id, attempt.number, state="terminating", sigterm_at=now, kill_at=kill_at)
        return kill_at

    def cancels_pending(self, active: tuple[ActiveJob, ...], now: float) -> tuple[ActiveJob, ...]:
        """Carry out every cancel that was recorded but never signalled: one sent while the
        job's processes were not tracked yet, or before a server stopped (a restarted server
        adopts the attempt, then this pass sends its SIGTERM). Returns `active` read again when
        any was signalled."""
        signalled = False
        for a in active:
            job, attempt = a.job, a.attempt
            if not (job.cancel_requested and job.state.holds_resources) or attempt is None:
                continue
            if attempt.sigterm_at is not None or attempt.ended_at is not None or attempt.handle is None:
                continue
            grace = effective_grace(self.policy, job.tier, job.grace_s)
            kill_at = self.stop(job, attempt, grace, now)
            if kill_at is None:
                continue
            signalled = True
            self.store.note(
                job.id,
                job.state,
                reason=f"SIGTERM sent for the cancel requested earlier; grace {format_duration(grace)}",
                details={KILL_AT: kill_at, "grace_s": grace},
                now=now,
            )
        return self.store.active() if signalled else active

    def cancel_marked(self, active: tuple[ActiveJob, ...], now: float) -> tuple[ActiveJob, ...]:
        """Waiting jobs a cancel marked (an older server could requeue them) end CANCELLED
        here instead of being scheduled."""
        marked = {a.job.id: a.job for a in active if a.job.cancel_requested and a.job.state.waiting}
        for job in marked.values():
            self._cancel_waiting(job, "warden", now)
        return tuple(a for a in active if a.job.id not in marked) if marked else active
