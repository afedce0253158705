"""Time limits, as Slurm's `--time`: an attempt that outlives its job's time limit, counted from
the attempt's start (each attempt of a requeued job gets the whole limit again), is stopped the
way a cancel stops a job — marked (`attempts.timed_out`), then SIGTERM, its grace and SIGKILL
(`Cancels.stop`) — and its exit ends the job TIMEOUT, never requeued (`lifecycle.outcome`).

The deadline is the forecast's and the reservations' expected end of the attempt
(`accounting.run_end`): what the engine plans with is what the server enforces.
"""

from __future__ import annotations

from warden.engine.accounting import effective_grace, run_end
from warden.engine.lifecycle import Event
from warden.engine.policy import format_duration
from warden.server.cancels import Cancels
from warden.server.context import Duty, ReconcileContext
from warden.server.explanations import KILL_AT
from warden.store.jobs import ActiveJob, StoredJob


def ran_out(job: StoredJob) -> str:
    """The words every event of a time limit starts with: "ran out its time limit of 10s"."""
    limit = job.time_limit_s
    return "ran out its time limit" + ("" if limit is None else f" of {format_duration(limit)}")


class TimeLimits(Duty):
    """Stops every attempt that ran out its job's time limit, through the cancel's SIGTERM."""

    def __init__(self, ctx: ReconcileContext, cancels: Cancels) -> None:
        super().__init__(ctx)
        self.cancels = cancels

    def enforce(self, active: tuple[ActiveJob, ...], now: float) -> tuple[ActiveJob, ...]:
        """Mark each running attempt whose time limit is over at `now` and SIGTERM it; SIGTERM
        one marked earlier whose processes were not tracked then (a server stopped in between).
        An attempt already terminating (a preemption's SIGTERM came first) is marked only: it
        ends TIMEOUT, its SIGKILL deadline unchanged. A job a cancel marked is left to end
        CANCELLED. Returns `active` read again when any attempt changed."""
        changed = False
        for a in active:
            job, attempt = a.job, a.attempt
            if attempt is None or attempt.handle is None or job.time_limit_s is None or job.cancel_requested:
                continue  # nothing runs, no limit, or a cancel ends it
            if not attempt.timed_out:
                if now < run_end(attempt.started_at, job.time_limit_s):
                    continue
                terminating = attempt.sigterm_at is not None
                if terminating:
                    reason = (
                        f"{ran_out(job)} while already terminating: it ends TIMEOUT, its SIGKILL deadline unchanged"
                    )
                    marked = self._note(
                        job, reason, {} if attempt.kill_at is None else {KILL_AT: attempt.kill_at}, now, Event.TIMED_OUT
                    )
                else:
                    marked = self._note(job, f"{ran_out(job)}: it ends TIMEOUT", {}, now, Event.TIMED_OUT)
                if not marked:
                    continue  # the job moved on since it was read: the next pass sees it as it is
                changed = True
                if terminating:
                    continue
            elif attempt.sigterm_at is not None:
                continue
            grace = effective_grace(self.policy, job.tier, job.grace_s)
            kill_at = self.cancels.stop(job, attempt, grace, now)
            if kill_at is None:  # not adopted yet: the next pass sends it
                continue
            changed = True
            self._note(
                job,
                f"{ran_out(job)}: SIGTERM; grace {format_duration(grace)}",
                {KILL_AT: kill_at, "grace_s": grace},
                now,
            )
        return self.store.active() if changed else active

    def _note(
        self, job: StoredJob, reason: str, details: dict[str, float | None], now: float, event: Event = Event.NOTED
    ) -> bool:
        """Record a time limit's event, the limit in its details: its mark (`Event.TIMED_OUT`)
        or the SIGTERM that follows it."""
        details = {**details, "time_limit_s": job.time_limit_s}
        if event is Event.NOTED:
            return self.store.note(job.id, job.state, reason=reason, details=details, now=now)
        return self.store.flag(job.id, job.state, event, reason=reason, details=details, now=now)
