"""Exits: an attempt whose every process is gone ends, and its job moves on — requeued after a
preemption or an eviction, CANCELLED once a cancel marked it, TIMEOUT once it ran out its time
limit, else SUCCEEDED or FAILED by the exit codes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from warden.engine import lifecycle
from warden.engine.accounting import MeasuredLoss, assumed_startup, clean_exit_in_grace, measured_loss
from warden.engine.lifecycle import Event
from warden.engine.model import Job, JobState
from warden.executors.base import Exit
from warden.server.context import CAS_TRIES, Duty, _codes, log
from warden.server.timelimits import ran_out
from warden.store.jobs import StoredAttempt, StoredJob, moved
from warden.store.repo import Store


class Exits(Duty):
    """Collects the executor's exits each pass and ends each attempt and its job."""

    def collect(self, now: float) -> None:
        for ex in self.executor.exits():
            self._ended(ex, now)

    def _ended(self, ex: Exit, now: float) -> None:
        attempt = self.store.attempt(int(ex.job_id), ex.attempt)
        job = self.store.get(int(ex.job_id))
        if job is None or attempt is None or attempt.ended_at is not None:
            return
        # An end outside the attempt's life is no fact (a record a job could write): never
        # before it started, never after now, so no charge or lost work comes out negative.
        if not attempt.started_at <= ex.ended_at <= now:  # NaN included
            ex = replace(ex, ended_at=attempt.started_at if ex.ended_at < attempt.started_at else now)
        if ex.timed_out_at is not None and not attempt.timed_out and attempt.sigterm_at is None:
            attempt = self._timed_out_unwatched(job, attempt, ex, now)
        for _ in range(CAS_TRIES):
            self._phase("exit")
            loss = self._loss(job, attempt, ex)
            if self._end(job, attempt, ex, now, loss):
                if self.metrics is not None and loss is not None and loss.basis != "cancelled":
                    self.metrics.lost_work(job.queue, loss.gpu_s)
                break
            job = self.store.get(job.id) or job
        else:
            log.error("job %s: its exit could not be recorded (it kept changing); the next restart finishes it", job.id)
        self.stats.finished += 1

    def _timed_out_unwatched(self, job: StoredJob, attempt: StoredAttempt, ex: Exit, now: float) -> StoredAttempt:
        """The attempt ran out its time limit while no server ran, and its supervisors sent
        SIGTERM (and SIGKILL after its grace): record it as `TimeLimits` records its own, so
        it ends TIMEOUT. A time outside the attempt's life is no fact: never before it started."""
        sigterm_at = min(max(ex.timed_out_at or now, attempt.started_at), ex.ended_at)
        self.store.flag(
            job.id,
            job.state,
            Event.TIMED_OUT,
            reason=f"{ran_out(job)}: SIGTERM from its supervisor, no server running then",
            details={"sigterm_at": sigterm_at, "time_limit_s": job.time_limit_s},
            attempt_fields={"sigterm_at": sigterm_at, "kill_at": ex.killed_at},
            now=now,
        )
        return self.store.attempt(job.id, attempt.number) or attempt

    def _loss(self, job: StoredJob, attempt: StoredAttempt, ex: Exit) -> MeasuredLoss | None:
        """The work a preemption, reclaim or eviction of the attempt threw away, from its SIGTERM
        or from the moment something else ended it; None when none stopped it (a cancel alone,
        or no stop at all). A job a cancel ends runs no more: its preemption is charged nothing."""
        if attempt.preemption_kind is None and ex.ended_by is None:
            return None
        if job.cancel_requested:
            return MeasuredLoss(0.0, "cancelled")
        stopped_at = attempt.sigterm_at if attempt.sigterm_at is not None else ex.ended_at
        declared = job.saves_on_sigterm and clean_exit_in_grace(
            attempt.sigterm_at, attempt.kill_at, ex.ended_at, ex.killed, ex.exit_codes
        )
        return measured_loss(
            job.gpus * job.replicas,
            stopped_at,
            attempt.started_at,
            assumed_startup(self.policy, attempt.startup_s),
            attempt.last_checkpoint_at,
            ex.ended_at,
            declared,
        )

    def _end(self, job: StoredJob, attempt: StoredAttempt, ex: Exit, now: float, loss: MeasuredLoss | None) -> bool:
        """End the attempt, with its `loss`, and move the job as `job` (just read) says:
        CANCELLED once a cancel marked it, TIMEOUT once it ran out its time limit, REQUEUED after
        SIGTERM, else by the exit codes. The move is a compare-and-set on the state and cancel
        mark read, so a cancel landing in between makes it fail (False) rather than requeue a
        cancelled job."""
        codes = list(ex.exit_codes)
        first_bad = next((c for c in codes if c != 0), None)
        out = lifecycle.outcome(
            cancel_requested=job.cancel_requested,
            timed_out=attempt.timed_out,
            signalled=attempt.sigterm_at is not None,
            killed=ex.killed,
            evicted=ex.ended_by is not None,
            exit_codes=codes,
        )
        reason = out.reason
        # An exit status nobody could read (the supervisor was lost) is recorded as -1.
        self.store.end_attempt(
            job.id,
            ex.attempt,
            ended_at=ex.ended_at,
            exit_codes=[-1 if c is None else c for c in codes],
            reason=reason,
            lost_work_gpu_s=None if loss is None else loss.gpu_s,
            lost_work_basis=None if loss is None else loss.basis,
        )
        read: dict[str, Any] = {"expect_state": {job.state}, "expect_cancel_requested": job.cancel_requested}
        # an eviction from a node that went down is no preemption (the thrash guard's count)
        before = job.to_engine()
        gone = lifecycle.exited(before, out.state, preempted_at=attempt.sigterm_at if attempt.preempted_for else None)
        after_sigterm = f"exited {_codes(codes)} after SIGTERM" + (" and SIGKILL at the deadline" if ex.killed else "")
        if out.state is not JobState.REQUEUED:
            code = first_bad if first_bad is not None else 0
            said = (
                f"{ran_out(job)}: {after_sigterm}"
                if out.state is JobState.TIMEOUT
                else f"{reason}: exit {_codes(codes)}" + (f" ({ex.error})" if ex.error else "")
            )
            return self.store.transition(
                job.id,
                out.state,
                event=Event.EXITED,
                reason=said,
                actor="warden",
                now=now,
                exit_code=code,
                **moved(before, gone),
                **read,
            )
        if reason == "evicted":
            detail = f"evicted: {ex.ended_by} (exit {_codes(codes)}); the job is requeued"
        else:
            detail = after_sigterm
        if not self.store.transition(
            job.id,
            JobState.REQUEUED,
            event=Event.EXITED,
            reason=detail,
            actor="warden",
            now=now,
            **moved(before, gone),
            **read,
        ):
            return False
        requeue(self.store, job.id, gone, backoff=self.policy.thrash.requeue_backoff, now=now)
        return True


def requeue(store: Store, job_id: int, gone: Job, *, backoff: float, now: float) -> None:
    """REQUEUED → PENDING for a job its exit left REQUEUED (`gone`): it waits again, not before
    the thrash guard's back-off. A cancel between the two moves finds the job REQUEUED (waiting)
    and ends it: then this does nothing."""
    back = lifecycle.requeued(gone, now, backoff=backoff)
    store.transition(
        job_id,
        JobState.PENDING,
        event=Event.REQUEUED,
        reason="requeued",
        actor="warden",
        now=now,
        expect_state={JobState.REQUEUED},
        expect_cancel_requested=False,
        **moved(gone, back),
    )
