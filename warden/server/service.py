"""The state behind the API: validation, governance and the audit log, in front of the store
and the reconcile loop. Every method either changes nothing and raises `ApiError`, or makes
its change durable before it returns."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import yaml

from warden.engine.model import JobState, Node
from warden.engine.policy import Policy, PolicyError, parse_policy
from warden.executors.base import Executor
from warden.server.auth import CHALLENGE, Principal, bearer, forbidden
from warden.server.errors import ApiError
from warden.server.metrics import ServerMetrics
from warden.server.reconcile import Reconciler
from warden.store.repo import Store, StoredJob

if TYPE_CHECKING:
    from warden.server.api import ReportRequest, SubmitRequest, TokenRequest

TOKEN_CACHE_S = 1.0


class Submitted(NamedTuple):
    id: int
    state: JobState


class Service:
    def __init__(
        self,
        store: Store,
        executor: Executor,
        nodes: tuple[Node, ...],
        policy: Policy,
        state_dir: Path,
        clock: Callable[[], float] = time.time,
        url: str = "",
    ) -> None:
        self.store = store
        self.executor = executor
        self.nodes = nodes
        self.state_dir = state_dir
        self.clock = clock
        self.url = url
        """Where jobs send their reports (`WARDEN_URL` inside a job)."""
        self._report_key = _secret(state_dir / "report-secret")
        self.reconciler = Reconciler(store, executor, nodes, policy, state_dir, clock, self.report_env)
        self.metrics = ServerMetrics(self)
        self.reconciler.metrics = self.metrics
        self._stop = threading.Event()
        self._tokens: dict[str, tuple[Principal, float]] = {}
        self._thread: threading.Thread | None = None

    @property
    def policy(self) -> Policy:
        return self.reconciler.policy

    def now(self) -> float:
        return self.clock()

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        """Recover what a stopped server left (re-adopting running jobs), then run the
        reconcile loop in a thread."""
        self.reconciler.recover()
        self._thread = threading.Thread(
            target=self.reconciler.run, args=(self._stop,), name="warden-reconcile", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.reconciler.poke()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.executor.close()

    # -- who --------------------------------------------------------------------------------
    def authenticate(self, header: str | None) -> Principal:
        """The caller of a request. A token's grant is remembered for `TOKEN_CACHE_S`, so a
        storm of requests does not read the tokens table every time; a revoked token stops
        working within that time."""
        token = bearer(header)
        now = time.monotonic()
        cached = self._tokens.get(token)
        if cached is not None and cached[1] > now:
            return cached[0]
        info = self.store.token_for(token)
        if info is None:
            self._tokens.pop(token, None)
            raise ApiError(401, "Authorization", "Bearer ***", "unknown or revoked token", CHALLENGE)
        who = Principal(info.user, info.role, tuple(info.queues))
        if len(self._tokens) > 10_000:
            self._tokens.clear()
        self._tokens[token] = (who, now + TOKEN_CACHE_S)
        return who

    def require_admin(self, who: Principal, what: str) -> None:
        if not who.is_admin:
            raise forbidden(who, what)

    def job(self, job_id: str) -> StoredJob:
        if not job_id.isdigit():
            raise ApiError(404, "id", job_id, "no such job")
        job = self.store.get(int(job_id))
        if job is None:
            raise ApiError(404, "id", job_id, "no such job")
        return job

    # -- submit -----------------------------------------------------------------------------
    def submit(self, req: SubmitRequest, who: Principal) -> Submitted:
        policy = self.policy
        leaves = [q.name for q in policy.leaves()]
        if req.queue not in leaves:
            raise ApiError(422, "queue", req.queue, f"is not a leaf queue; allowed: {', '.join(leaves)}")
        if not who.may_submit_to(req.queue):
            raise forbidden(who, f"submit to queue {req.queue!r}")
        self._check_shape(req)
        tier = policy.tier(req.tier)
        if req.grace is not None and req.grace < policy.min_grace:
            raise ApiError(422, "grace", req.grace, f"is below the policy's minimum grace of {policy.min_grace:g} s")
        if req.lease is not None and req.lease > policy.max_lease:
            raise ApiError(422, "lease", req.lease, f"is above the policy's maximum lease of {policy.max_lease:g} s")
        workdir = req.workdir or os.getcwd()
        if not Path(workdir).is_dir():
            raise ApiError(422, "workdir", workdir, "is not a directory on the server's machine")
        state = JobState.AWAITING_APPROVAL if policy.needs_approval(req.tier, who.is_admin) else JobState.PENDING
        job_id = self.store.submit(
            name=req.name,
            user=who.user,
            queue=req.queue,
            tier=req.tier,
            state=state,
            replicas=req.replicas,
            gpus=req.gpus,
            cpu=req.cpu,
            memory=req.memory,
            flavor=req.flavor,
            # The lease is fixed at submission: a later policy keeps this job's lease (and its tier).
            placement=req.placement,
            lease_s=req.lease if req.lease is not None else tier.lease,
            grace_s=req.grace,
            expected_duration_s=req.time_limit,
            command=list(req.command),
            workdir=workdir,
            env=dict(req.env),
            actor=who.user,
            now=self.now(),
            reason=f"submitted to {req.queue} at tier {req.tier} ({tier.name})"
            + ("; waits for an admin's approval" if state is JobState.AWAITING_APPROVAL else ""),
        )
        self.reconciler.poke()
        return Submitted(job_id, state)

    def _check_shape(self, req: SubmitRequest) -> None:
        """A job the cluster could never hold is refused now, not left pending forever."""
        nodes = [n for n in self.nodes if req.flavor is None or n.flavor == req.flavor]
        if req.flavor is not None and not nodes:
            flavors = sorted({n.flavor for n in self.nodes})
            raise ApiError(422, "flavor", req.flavor, f"no node has this GPU flavor; allowed: {', '.join(flavors)}")
        total = sum(n.gpus for n in nodes)
        if req.gpus * req.replicas > total:
            raise ApiError(422, "gpus", req.gpus * req.replicas, f"more GPUs than the cluster has ({total})")
        if req.gpus > max((n.gpus for n in nodes), default=0):
            raise ApiError(422, "gpus", req.gpus, "more GPUs per replica than any node has")

    # -- cancel, approve, release -----------------------------------------------------------
    def cancel(self, job_id: str, who: Principal) -> StoredJob:
        job = self.job(job_id)
        if job.user != who.user and not who.is_admin:
            raise forbidden(who, f"cancel job {job_id} of user {job.user!r}")
        if job.state.terminal:
            raise ApiError(409, "id", job_id, f"the job already ended ({job.state.value})")
        self.reconciler.cancel(job, who.user)
        self.store.audit(who.user, "cancel", f"job/{job_id}", {"state": job.state.value}, self.now())
        return self._reread(job)

    def approve(self, job_id: str, who: Principal) -> StoredJob:
        self.require_admin(who, f"approve job {job_id}")
        job = self.job(job_id)
        if job.state is not JobState.AWAITING_APPROVAL:
            raise ApiError(409, "id", job_id, f"the job does not await approval ({job.state.value})")
        now = self.now()
        if not self.store.transition(
            job.id,
            JobState.PENDING,
            reason=f"approved by {who.user}",
            actor=who.user,
            now=now,
            expect_state={JobState.AWAITING_APPROVAL},
            approved_by=who.user,
            approved_at=now,
        ):
            raise ApiError(409, "id", job_id, "the job changed state meanwhile")
        self.store.audit(who.user, "approve", f"job/{job_id}", {"tier": job.tier, "queue": job.queue}, now)
        self.reconciler.poke()
        return self._reread(job)

    def release(self, job_id: str, who: Principal) -> StoredJob:
        """Let a held job be scheduled again (Slurm's `scontrol release`), e.g. once the cause
        of the failing passes it was quarantined for is fixed. Should they fail again because
        of it, it is held again."""
        self.require_admin(who, f"release job {job_id}")
        job = self.job(job_id)
        if job.held_reason is None or not job.state.waiting:
            raise ApiError(409, "id", job_id, f"the job is not held ({job.state.value})")
        now = self.now()
        if not self.store.transition(
            job.id,
            job.state,
            reason=f"released by {who.user}",
            actor=who.user,
            now=now,
            expect_state={job.state},
            held_reason=None,
            explanation=None,
        ):
            raise ApiError(409, "id", job_id, "the job changed state meanwhile")
        self.store.audit(who.user, "release", f"job/{job_id}", {"held_reason": job.held_reason}, now)
        self.reconciler.poke()
        return self._reread(job)

    def _reread(self, job: StoredJob) -> StoredJob:
        """The job as it is now (as it was, should it have been purged meanwhile)."""
        return self.store.get(job.id) or job

    # -- logs -------------------------------------------------------------------------------
    def logs(self, job_id: str, attempt: int | None, rank: int, offset: int) -> dict[str, Any]:
        job = self.job(job_id)
        number = attempt if attempt is not None else job.attempt
        if number < 1:
            return {"id": job_id, "attempt": 0, "rank": rank, "text": "", "offset": 0, "eof": job.state.terminal}
        row = self.store.attempt(job.id, number)
        if row is None:
            raise ApiError(404, "attempt", attempt, f"job {job_id} has no such attempt")
        if rank < 0 or rank >= job.replicas:
            raise ApiError(422, "rank", rank, f"the job has ranks 0..{job.replicas - 1}")
        replicas = (row.handle or {}).get("replicas") or []
        path = Path(replicas[rank]["log_path"]) if rank < len(replicas) else Path(row.log_dir) / f"rank-{rank}.log"
        text = b""
        if path.exists():
            with path.open("rb") as f:
                f.seek(offset)
                text = f.read(1 << 20)
        return {
            "id": job_id,
            "attempt": number,
            "rank": rank,
            "text": text.decode("utf-8", "replace"),
            "offset": offset + len(text),
            "eof": row.state == "exited" and len(text) < (1 << 20),
        }

    # -- reports from the workload SDK ------------------------------------------------------
    def report_token(self, job_id: str, attempt: int) -> str:
        """A bearer token good for one attempt's reports only: an HMAC the server can check
        without storing it."""
        return hmac.new(self._report_key, f"{job_id}:{attempt}".encode(), hashlib.sha256).hexdigest()

    def report_env(self, job_id: str, attempt: int) -> dict[str, str]:
        return {"WARDEN_URL": self.url, "WARDEN_REPORT_TOKEN": self.report_token(job_id, attempt)} if self.url else {}

    def report(self, job_id: str, header: str | None, req: ReportRequest) -> dict[str, Any]:
        """Startup, progress and checkpoint reports: what the engine's victim cost (the last
        checkpoint, the measured SIGTERM save) and efficiency (startup and checkpoint time)
        are computed from."""
        job = self.job(job_id)
        token = bearer(header)
        if not hmac.compare_digest(token, self.report_token(job_id, req.attempt)):
            who = self.authenticate(header)
            if who.user != job.user and not who.is_admin:
                raise forbidden(who, f"report for job {job_id} of user {job.user!r}")
        attempt = self.store.attempt(job.id, req.attempt)
        if attempt is None or attempt.ended_at is not None:
            raise ApiError(409, "attempt", req.attempt, f"is not a running attempt of job {job_id}")
        at = min(req.at if req.at is not None else self.now(), self.now())
        fields: dict[str, Any] = {}
        if req.kind == "startup":
            fields["startup_s"] = req.startup_s if req.startup_s is not None else max(0.0, at - attempt.started_at)
        elif req.kind == "progress":
            fields.update(progress_step=req.step, progress_samples=req.samples, progress_at=at)
        elif req.kind == "checkpoint_finished":
            duration = req.duration_s or 0.0
            # A job that saves through the SDK saves the same state on SIGTERM: its latest save
            # time is the best estimate of what a preemption's save will take.
            fields.update(
                checkpoint_s=attempt.checkpoint_s + duration,
                last_checkpoint_at=at,
                checkpoints=attempt.checkpoints + 1,
                sigterm_save_s=duration,
            )
            if req.step is not None:
                fields["progress_step"] = max(req.step, attempt.progress_step or 0)
        if fields:
            self.store.update_attempt(job.id, req.attempt, **fields)
        return {"id": job_id, "attempt": req.attempt, "kind": req.kind}

    # -- admin ------------------------------------------------------------------------------
    def apply_policy(self, source: str, who: Principal) -> int:
        """Validate and version a new policy; jobs keep their tier and lease."""
        self.require_admin(who, "apply a policy")
        try:
            data = yaml.safe_load(source)
            policy = parse_policy(data, "policy")
        except yaml.YAMLError as err:
            raise ApiError(422, "source", None, f"not valid YAML: {err}") from None
        except PolicyError as err:
            first = err.issues[0]
            raise ApiError(422, first.path or "source", _plain(first.value), str(err)) from None
        leaves = {q.name for q in policy.leaves()}
        orphaned = sorted({a.job.queue for a in self.store.active()} - leaves)
        if orphaned:
            raise ApiError(
                422, "queues", orphaned[0], "unfinished jobs use this queue, which the new policy does not have"
            )
        now = self.now()
        version = self.store.apply_policy(source, policy.to_dict(), who.user, now)
        self.store.audit(who.user, "policy.apply", f"policy/{version}", {}, now)
        self.reconciler.set_policy(policy)
        return version

    def create_token(self, req: TokenRequest, who: Principal) -> str:
        self.require_admin(who, "create tokens")
        leaves = {q.name for q in self.policy.leaves()}
        unknown = [q for q in req.queues if q != "*" and q not in leaves]
        if unknown:
            raise ApiError(422, "queues", unknown[0], f"is not a leaf queue; allowed: {', '.join(sorted(leaves))}")
        now = self.now()
        token = self.store.create_token(req.user, req.role, list(req.queues), who.user, now)
        self.store.audit(who.user, "token.create", f"user/{req.user}", {"role": req.role, "queues": req.queues}, now)
        return token


def _plain(value: Any) -> Any:
    return None if value.__class__.__name__ == "_Missing" else value


def _secret(path: Path) -> bytes:
    """A per-installation secret kept in the state directory (created once, mode 0600)."""
    try:
        return bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError):
        key = secrets.token_bytes(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key.hex() + "\n")
        return key
