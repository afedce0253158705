"""Reports from the workload SDK: startup, progress and checkpoint timings, what the engine's
victim cost (the last checkpoint, the measured SIGTERM save) and efficiency (startup and
checkpoint time) are computed from.

Every server takes them, a standby as the leader: a report is written to the database at once
(the attempt's row, whose job's version it bumps), never held in this server's memory, and the
leader's next pass reads it there (`Store.active` re-reads a job whose version moved). Refusing
reports on a standby would lose those sent while no server leads (from the leader's death until
a standby takes over) and cost each report a round trip to a server that does not take it.

What one kind of report changes of the attempt is a function of its own (`HANDLERS`): it reads
the report, the attempt's row and the time it counts as, and says which fields to write and
which claims were cut to what warden saw.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from warden.engine.durations import span
from warden.server.auth import bearer, forbidden
from warden.server.authenticator import Authenticator
from warden.server.errors import ApiError
from warden.server.peers import Peers
from warden.server.requests import ReportRequest
from warden.server.serving import ServiceContext, log
from warden.store.jobs import StoredAttempt, StoredJob


@dataclass(frozen=True, slots=True)
class Clamp:
    """A report that claimed more than warden saw, and what was kept of it."""

    what: str
    reported: float
    kept: float
    bound_by: str


@dataclass(frozen=True, slots=True)
class Taken:
    """What a report changes of its attempt's row, and the claims it had cut."""

    fields: dict[str, Any] = field(default_factory=dict)
    clamps: tuple[Clamp, ...] = ()


def startup(req: ReportRequest, attempt: StoredAttempt, at: float) -> Taken:
    """No startup lasts longer than the attempt has run (by `at`, never after now)."""
    ran = max(0.0, at - attempt.started_at)
    if req.startup_s is None:
        return Taken({"startup_s": ran})
    clamps = (Clamp("startup", req.startup_s, ran, "the time the attempt has run"),) if req.startup_s > ran else ()
    return Taken({"startup_s": min(req.startup_s, ran)}, clamps)


def progress(req: ReportRequest, attempt: StoredAttempt, at: float) -> Taken:
    return Taken({"progress_step": req.step, "progress_samples": req.samples, "progress_at": at})


def checkpoint_started(req: ReportRequest, attempt: StoredAttempt, at: float) -> Taken:
    """A save begun changes nothing: its end says how long it took."""
    return Taken()


def checkpoint_finished(req: ReportRequest, attempt: StoredAttempt, at: float) -> Taken:
    """No save lasts longer than the time since the attempt started, nor since the end of the
    previous save it reported. A job that saves through the SDK saves the same state on
    SIGTERM: its latest save time is the best estimate of what a preemption's save will take."""
    since = attempt.started_at
    last = attempt.last_checkpoint_at
    if last is not None and since <= last <= at:
        since = last
    bound = max(0.0, at - since)
    reported = req.duration_s or 0.0
    duration = min(reported, bound)
    clamps: tuple[Clamp, ...] = ()
    if reported > bound:
        what = (
            "the time since its previous checkpoint" if since > attempt.started_at else "the time the attempt has run"
        )
        clamps = (Clamp("checkpoint", reported, bound, what),)
    fields: dict[str, Any] = {
        "checkpoint_s": attempt.checkpoint_s + duration,
        "last_checkpoint_at": at,
        "last_checkpoint_step": req.step,
        "checkpoints": attempt.checkpoints + 1,
        "sigterm_save_s": duration,
    }
    if req.step is not None:
        fields["progress_step"] = max(req.step, attempt.progress_step or 0)
    return Taken(fields, clamps)


HANDLERS: dict[str, Callable[[ReportRequest, StoredAttempt, float], Taken]] = {
    "startup": startup,
    "progress": progress,
    "checkpoint_started": checkpoint_started,
    "checkpoint_finished": checkpoint_finished,
}
"""One handler per kind of report (`ReportRequest.kind`)."""


class Reports:
    """Takes the SDK's reports, and gives each attempt the token and the addresses it reports
    with (`env`)."""

    def __init__(self, ctx: ServiceContext, auth: Authenticator, peers: Peers) -> None:
        self.ctx = ctx
        self.auth = auth
        self.peers = peers
        self._key = ctx.store.shared_secret("report_secret", secrets.token_bytes(32))
        """The key of the report tokens, in the database: every server of it mints and checks
        the same tokens, so a job's reports are taken by whichever server is up."""

    def token(self, job_id: str, attempt: int) -> str:
        """A bearer token good for one attempt's reports only: an HMAC the server can check
        without storing it."""
        return hmac.new(self._key, f"{job_id}:{attempt}".encode(), hashlib.sha256).hexdigest()

    def env(self, job_id: str, attempt: int) -> dict[str, str]:
        """Where an attempt reports, and its token: `WARDEN_URL` lists every server up when it
        starts (`Peers.servers`), the job's reporter tries them in turn (`warden.workload.report`)."""
        if not self.ctx.url:
            return {}
        env = {"WARDEN_URL": ",".join(self.peers.servers()), "WARDEN_REPORT_TOKEN": self.token(job_id, attempt)}
        cas = self.peers.trusted_cas()
        if cas:
            env["WARDEN_CA"] = "".join(cas)
        return env

    def take(self, job_id: str, header: str | None, req: ReportRequest) -> dict[str, Any]:
        """Take one report of `job_id`'s attempt: from the attempt's own token, or from its
        owner or an admin."""
        ctx = self.ctx
        # Authentication first: without a valid token, every job id gets the same 401.
        token = bearer(header)
        if hmac.compare_digest(token.encode(), self.token(job_id, req.attempt).encode()):
            job = ctx.job(job_id)
        else:
            who = self.auth.authenticate(header)
            job = ctx.job(job_id)
            if who.user != job.user and not who.is_admin:
                raise forbidden(who, f"report for job {job_id} of user {job.user!r}")
        # A read-modify-write of the attempt: under the reconcile lock, no exit is recorded and
        # no other report is counted in between.
        with ctx.reconciler.lock:
            attempt = ctx.store.attempt(job.id, req.attempt)
            if attempt is None or attempt.ended_at is not None:
                raise ApiError(409, "attempt", req.attempt, f"is not a running attempt of job {job_id}")
            at = min(req.at if req.at is not None else ctx.now(), ctx.now())
            taken = HANDLERS[req.kind](req, attempt, at)
            if taken.fields:
                ctx.store.update_attempt(job.id, req.attempt, **taken.fields)
            for clamp in taken.clamps:
                self._record(job, req.attempt, clamp)
        return {"id": job_id, "attempt": req.attempt, "kind": req.kind}

    def _record(self, job: StoredJob, attempt: int, clamp: Clamp) -> None:
        """A report that claimed more than warden saw leaves a trace in the job's events."""
        now = self.ctx.now()
        job = self.ctx.reread(job)  # under the reconcile lock: its state cannot change meanwhile
        what, reported, kept = clamp.what, clamp.reported, clamp.kept
        self.ctx.store.note(
            job.id,
            job.state,
            reason=f"{what} report of {span(reported)} clamped to {span(kept)}, {clamp.bound_by}",
            now=now,
            details={"attempt": attempt, "report": what, "reported_s": reported, "kept_s": kept},
        )
        log.warning("job %s attempt %s: %s report of %.6g s clamped to %.3f s", job.id, attempt, what, reported, kept)
