"""Crash recovery: what a server that was killed mid-pass left half done is completed or undone
at the next start, and every attempt still running is tracked again.

A pass changes the database in several short transactions; the server may have died between
any two. Each half-done step is finished in the direction that never gives one GPU to two
jobs: an attempt row holds its GPUs until it ends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from warden.engine import lifecycle
from warden.engine.lifecycle import Event
from warden.engine.model import JobState
from warden.executors.base import Handle
from warden.server.context import Duty, ReconcileContext, _codes
from warden.server.exits import requeue
from warden.server.preempt import Preemptions
from warden.store.jobs import StoredJob, moved


class Recovery(Duty):
    """Brings the store and the executor back in step after a start (`recover`)."""

    def __init__(self, ctx: ReconcileContext, preemptions: Preemptions) -> None:
        super().__init__(ctx)
        self.preemptions = preemptions

    def recover(self) -> None:
        """Finish whatever a killed server left half done, and track every attempt that is
        still running again (its SIGKILL re-armed if it was terminating). The caller holds
        the loop's lock."""
        now = self.clock()
        for active in self.store.active():
            job, attempt = active.job, active.attempt
            if not job.state.holds_resources:
                continue
            if attempt is None:
                self._recover_without_attempt(job, now)
                continue
            handle = attempt.handle
            if handle is None:
                recovered = self.executor.recover(job.job_id, attempt.number, Path(attempt.log_dir), job.replicas)
                if recovered is None:  # stopped before any process started
                    self.store.end_attempt(job.id, attempt.number, ended_at=now, exit_codes=[], reason="failed")
                    self.store.transition(
                        job.id,
                        JobState.PENDING,
                        event=Event.UNSTARTED,
                        reason="requeued: the server stopped before the job's processes started",
                        actor="warden",
                        now=now,
                        **_unstarted(job, now),
                    )
                    continue
                handle = recovered.to_dict()
                self.store.update_attempt(job.id, attempt.number, handle=handle)
            self.executor.adopt(Handle.from_dict(handle), self.bounded_kill_at(attempt.sigterm_at, attempt.kill_at))
            for state, event in ((JobState.STARTING, Event.LAUNCHED), (JobState.RUNNING, Event.STARTED)):
                if job.state in (JobState.ADMITTED, JobState.STARTING) and job.state is not state:
                    self.store.transition(
                        job.id, state, event=event, reason="processes started (recovered)", actor="warden", now=now
                    )
                    job = self.store.get(job.id) or job
            if job.state is JobState.RUNNING:  # a preemption recorded, its SIGTERM not: finish it
                self.preemptions.complete(job, self.store.attempt(job.id, attempt.number) or attempt, now)
        self.executor.cancel_unowned(self.executor.running())

    def bounded_kill_at(self, sigterm_at: float | None, kill_at: float | None) -> float | None:
        """A recorded SIGKILL deadline no later than SIGTERM + the policy's `max_grace`: one stored
        before that bound existed, or written by hand, cannot keep a job past it."""
        if sigterm_at is None or kill_at is None:
            return kill_at
        return min(kill_at, sigterm_at + self.policy.max_grace)

    def _recover_without_attempt(self, job: StoredJob, now: float) -> None:
        """A job holding resources without a live attempt: its attempt ended (or was never
        written) but the job's own transition was lost. Finish it from the attempt's record."""
        last = self.store.attempt(job.id, job.attempt) if job.attempt else None
        if last is None:  # the attempt was numbered but never written: undo the number too
            self.store.transition(
                job.id,
                JobState.PENDING,
                event=Event.UNSTARTED,
                reason="requeued: the server stopped before the job started",
                actor="warden",
                now=now,
                attempt=max(0, job.attempt - 1),
                **_unstarted(job, now),
            )
            return
        before = job.to_engine()
        if last.reason in ("preempted", "killed", "evicted") and not job.cancel_requested:
            # as an exit collected live (`Exits`): only a preemption counts for the thrash guard
            preempted_at = (last.sigterm_at or now) if last.preempted_for else None
            gone = lifecycle.exited(before, JobState.REQUEUED, preempted_at=preempted_at)
            self.store.transition(
                job.id,
                JobState.REQUEUED,
                event=Event.EXITED,
                reason=f"{last.reason} (recovered)",
                actor="warden",
                now=now,
                **moved(before, gone),
            )
            requeue(self.store, job.id, gone, backoff=self.policy.thrash.requeue_backoff, now=now)
            return
        codes = list(last.exit_codes or ())
        if job.cancel_requested:
            to = JobState.CANCELLED
        elif last.reason == "timeout":
            to = JobState.TIMEOUT
        else:
            to = JobState.SUCCEEDED if last.reason == "completed" else JobState.FAILED
        self.store.transition(
            job.id,
            to,
            event=Event.EXITED,
            reason=f"{last.reason} (recovered): exit {_codes(codes)}",
            actor="warden",
            now=now,
            exit_code=next((c for c in codes if c != 0), 0),
        )


def _unstarted(job: StoredJob, now: float) -> dict[str, Any]:
    """The fields `lifecycle.unstarted` changes on `job`, as the store writes them."""
    before = job.to_engine()
    return moved(before, lifecycle.unstarted(before, now))
