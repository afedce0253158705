"""What a user does to a job once it is stored: cancel it, approve it (an admin, for the tiers
that need approval), release it from a hold (an admin).

A user action is linearised with the reconcile loop: it reads the job and writes under the lock
every pass holds, so no pass runs in between, and each write is a compare-and-set on what it
read. A 202 for a cancel therefore means the job ends CANCELLED, and the audit entry says what
was done. From a standby the write wakes the leader (`ServiceContext.changed`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from warden.engine.lifecycle import Event
from warden.engine.model import JobState
from warden.executors.base import Fenced
from warden.server.auth import Principal, forbidden, require_admin
from warden.server.errors import ApiError
from warden.server.reconcile import Reconciler
from warden.server.serving import ServiceContext
from warden.store.jobs import StoredJob
from warden.store.leadership import NotLeader

ACTION_TRIES = 3
"""How often a user action re-reads a job whose compare-and-set lost before it answers 409."""

T = TypeVar("T")


class JobActions:
    """Cancel, approve and release, each under the reconcile lock and audited."""

    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx

    def _act(self, job_id: str, act: Callable[[StoredJob], T | None]) -> tuple[StoredJob, T]:
        """`act` on the job as it is now, under the reconcile lock. `act` returns None when a
        compare-and-set lost (a writer outside the lock got there first): the job is read
        again and `act` retried, up to `ACTION_TRIES` times, then 409."""
        with self.ctx.reconciler.lock:
            for _ in range(ACTION_TRIES):
                job = self.ctx.job(job_id)
                done = act(job)
                if done is not None:
                    return job, done
        raise ApiError(409, "id", job_id, "the job kept changing state meanwhile; try again")

    def cancel(self, job_id: str, who: Principal) -> StoredJob:
        def act(job: StoredJob) -> str | None:
            if job.user != who.user and not who.is_admin:
                raise forbidden(who, f"cancel job {job_id} of user {job.user!r}")
            if job.state.terminal:
                raise ApiError(409, "id", job_id, f"the job already ended ({job.state.value})")
            try:
                return _cancel(self.ctx.reconciler, job, who.user)
            except (NotLeader, Fenced):  # the lead was lost meanwhile: record it for the next leader
                if self.ctx.standby is None:
                    raise
                return _cancel(self.ctx.standby, job, who.user)

        job, done = self._act(job_id, act)
        self.ctx.store.audit(
            who.user, "cancel", f"job/{job_id}", {"state": job.state.value, "done": done}, self.ctx.now()
        )
        self.ctx.changed()
        return self.ctx.reread(job)

    def approve(self, job_id: str, who: Principal) -> StoredJob:
        require_admin(who, f"approve job {job_id}")
        now = self.ctx.now()

        def act(job: StoredJob) -> bool | None:
            if job.state is not JobState.AWAITING_APPROVAL:
                raise ApiError(409, "id", job_id, f"the job does not await approval ({job.state.value})")
            approved = self.ctx.store.transition(
                job.id,
                JobState.PENDING,
                event=Event.APPROVED,
                reason=f"approved by {who.user}",
                actor=who.user,
                now=now,
                expect_state={JobState.AWAITING_APPROVAL},
                approved_by=who.user,
                approved_at=now,
            )
            return approved or None

        job, _ = self._act(job_id, act)
        self.ctx.store.audit(who.user, "approve", f"job/{job_id}", {"tier": job.tier, "queue": job.queue}, now)
        self.ctx.changed()
        return self.ctx.reread(job)

    def release(self, job_id: str, who: Principal) -> StoredJob:
        """Let a held job be scheduled again (Slurm's `scontrol release`), e.g. once the cause
        of the failing passes it was quarantined for is fixed. Should they fail again because
        of it, it is held again."""
        require_admin(who, f"release job {job_id}")
        now = self.ctx.now()

        def act(job: StoredJob) -> bool | None:
            if not job.held:
                raise ApiError(409, "id", job_id, f"the job is not held ({job.state.value})")
            released = self.ctx.store.flag(
                job.id,
                job.state,
                Event.RELEASED,
                reason=f"released by {who.user}",
                actor=who.user,
                now=now,
                expect_cancel_requested=False,
                explanation=None,
            )
            return released or None

        job, _ = self._act(job_id, act)
        self.ctx.store.audit(who.user, "release", f"job/{job_id}", {"held_reason": job.held_reason}, now)
        self.ctx.changed()
        return self.ctx.reread(job)


def _cancel(reconciler: Reconciler, job: StoredJob, actor: str) -> str | None:
    """Cancel `job` as the caller read it under the loop's lock, through `reconciler`'s cancels
    (`Cancels.cancel`), and wake its loop whatever came of it: the pass that follows sends the
    SIGTERM or ends the job. Returns what was done, or None when a write found the job changed:
    read it again and retry."""
    with reconciler.lock:
        try:
            return reconciler.cancels.cancel(job, actor)
        finally:
            reconciler.poke()
