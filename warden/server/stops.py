"""Stopped attempts: a job whose processes something else stopped (a SIGSTOP from another
process of its account) holds its GPUs and runs nothing, while it would show RUNNING. The
executor reports them (`Executor.stopped`, from what each replica's supervisor saw); each stop
is noted in the job's events, and one that lasts the policy's `containment.stopped_limit` is
evicted the way a lost node's job is (`Preemptions.evict`: SIGTERM and SIGCONT, its grace,
SIGKILL) and its job requeued.
"""

from __future__ import annotations

from warden.engine.policy import format_duration
from warden.server.context import Duty, ReconcileContext
from warden.server.preempt import Preemptions
from warden.store.jobs import ActiveJob

STOPPED_SINCE = "stopped_since"
"""The detail of a stop's event: when the job's processes were first seen stopped."""


class Stops(Duty):
    """Notes each attempt whose processes are stopped, and evicts one stopped too long."""

    def __init__(self, ctx: ReconcileContext, preemptions: Preemptions) -> None:
        super().__init__(ctx)
        self.preemptions = preemptions
        self._noted: dict[tuple[str, int], float] = {}
        """The stops noted, by attempt: when each began (a new stop of the same attempt is noted again)."""

    def watch(self, active: tuple[ActiveJob, ...], now: float) -> tuple[ActiveJob, ...]:
        """Note every stop that began or ended since the last pass; evict each attempt stopped
        for `containment.stopped_limit` or more. Returns `active` read again when one was."""
        stopped = self.executor.stopped()
        if not stopped and not self._noted:
            return active
        limit = self.policy.containment.stopped_limit
        changed = False
        for a in active:
            job, attempt = a.job, a.attempt
            if attempt is None or attempt.ended_at is not None:
                continue
            key = (str(job.id), attempt.number)
            seen = stopped.get(key)
            if seen is None:
                if self._noted.pop(key, None) is not None:
                    self.store.note(job.id, job.state, reason="its processes run again", now=now)
                continue
            if self._noted.get(key) != seen.since:
                self._noted[key] = seen.since
                self.store.note(
                    job.id,
                    job.state,
                    reason=f"its processes are stopped ({seen.what}), not by warden: it holds its resources and "
                    f"runs nothing; it is evicted if still stopped after {format_duration(limit)}",
                    details={STOPPED_SINCE: seen.since},
                    now=now,
                )
            if attempt.sigterm_at is None and not job.cancel_requested and now - seen.since >= limit:
                self.preemptions.evict(
                    job, attempt, f"its processes were stopped for {format_duration(limit)} ({seen.what})", now
                )
                changed = True
        live = {(str(a.job.id), a.attempt.number) for a in active if a.attempt is not None}
        for key in [k for k in self._noted if k not in live]:
            del self._noted[key]
        return self.store.active() if changed else active
