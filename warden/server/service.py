"""The state behind the API: validation, governance and the audit log, in front of the store
and the reconcile loop. Every method either changes nothing and raises `ApiError`, or makes
its change durable before it returns."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeVar

from prometheus_client import Counter

from warden.engine.durations import span
from warden.engine.lifecycle import Event
from warden.engine.model import Job, JobState, Node, Snapshot
from warden.engine.overcommit import quota_warnings
from warden.engine.policy import Limits, Policy, PolicyError, format_duration, parse_policy, parse_policy_source
from warden.engine.whatif import Verdict, what_if
from warden.executors.base import Executor, Fenced, Inventory
from warden.server.auth import CHALLENGE, DEFAULT_TOKEN_LIFETIME_S, Principal, bearer, forbidden
from warden.server.errors import ApiError, shorten
from warden.server.explanations import wall_times
from warden.server.export import Export, export
from warden.server.fairuse import SubmissionRate
from warden.server.forecasts import INTERVAL_S as FORECAST_INTERVAL_S
from warden.server.forecasts import Forecasts
from warden.server.history import INTERVAL_S as HISTORY_INTERVAL_S
from warden.server.leader import Leading, StandbyExecutor
from warden.server.metrics import ServerMetrics
from warden.server.nodes import recorded_inventory
from warden.server.offload import in_worker
from warden.server.policydiff import policy_diff
from warden.server.reconcile import Reconciler
from warden.server.requests import ReportRequest, SubmitRequest, TokenRequest, stored_id
from warden.store.jobs import (
    DuplicateSubmission,
    EarlierSubmission,
    StoredJob,
    TooManyWaiting,
    TooMuchStored,
    WaitingLimits,
)
from warden.store.leadership import Lease, NotLeader
from warden.store.repo import Store
from warden.store.servers import BEAT_S, Roster
from warden.store.tokens import TokenInfo
from warden.store.wakeups import listen, listens, wake_leader

TOKEN_CACHE_S = 1.0
PrivateData = Literal["jobs", "none"]
THREAD_PREFIX = "warden-"
"""The name prefix of the server's helper threads, watched by `Service._watch_threads`."""
log = logging.getLogger("warden.server")
ACTION_TRIES = 3
"""How often a user action re-reads a job whose compare-and-set lost before it answers 409."""
FOLLOW_S = 1.0
"""How often a standby reads the policy in force, the cluster and the fair-share ledger."""

T = TypeVar("T")


class Checked(NamedTuple):
    """A submission that passed every check, as it would be stored."""

    state: JobState
    lease_s: float
    time_limit_s: float | None
    """Its own, else its tier's default (`TierSpec.default_time_limit`); None: none."""
    workdir: str


@dataclass(eq=False)
class _Term:
    """One term this server leads: its epoch, its reconciler and executor, and its loop."""

    epoch: int
    reconciler: Reconciler
    executor: Executor
    stop: threading.Event
    thread: threading.Thread | None = None


class Submitted(NamedTuple):
    id: int
    state: JobState
    replayed: bool = False
    """The job was submitted earlier with the same Idempotency-Key: this is its first answer."""


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
        inventory: Callable[[], Inventory] | None = None,
        history_interval_s: float = HISTORY_INTERVAL_S,
        forecast_interval_s: float = FORECAST_INTERVAL_S,
        token_lifetime_s: float | None = DEFAULT_TOKEN_LIFETIME_S,
        private_data: PrivateData = "jobs",
        lease: Lease | None = None,
        make_executor: Callable[[], Executor] | None = None,
        ca_pem: str | None = None,
    ) -> None:
        """`ca_pem`: the CA that signed this server's own TLS certificate, which the jobs it
        starts are given to trust (`WARDEN_CA`). With a `lease` the server shares its database with others and leads only while it
        holds the lease (`warden.server.leader`): `executor` serves its first term,
        `make_executor` each later one. Without one it leads from `start` to `stop` (one
        server, and the in-process tests)."""
        self.store = store
        self.private_data: PrivateData = private_data
        """What a user may not read of other users' jobs: "jobs", their command, workdir and
        logs (only the owner and admins read them); "none", everything is readable."""
        self.token_lifetime_s = token_lifetime_s
        """The lifetime of a token created without one; None: such a token never expires."""
        self.executor = executor
        self.state_dir = state_dir
        self.clock = clock
        self.url = url
        """This server's API: where the jobs it starts send their reports first (`servers`)."""
        self._report_key = store.shared_secret(
            "report_secret", _legacy_secret(state_dir / "report-secret") or secrets.token_bytes(32)
        )
        """The key of the report tokens, in the database: every server of it mints and checks
        the same tokens, so a job's reports are taken by whichever server is up."""
        self.lease = lease
        """The lease this server contends for; None: it leads alone."""
        self.ca_pem = ca_pem
        self._roster = Roster(store.engine, lease.holder, ca=ca_pem) if lease is not None and lease.holder.url else None
        """This server's row of the `servers` table (with a lease); None: it knows only itself."""
        self._servers: tuple[str, ...] = ()
        """The servers' URLs the roster read last."""
        self._roster_thread: threading.Thread | None = None
        self._make_executor = make_executor
        self._spare: Executor | None = executor if lease is not None else None
        """The executor of this server's first term, until one begins."""
        self._term: _Term | None = None
        self._next_follow = 0.0
        """When a standby next reads the cluster and the ledger (`_follow`, monotonic clock)."""
        self._policy_version: int | None = None
        """The stored policy version the leader's loop runs (`_newer_policy`)."""
        self.lock = threading.RLock()
        """The reconcile loop's lock, one for every term's reconciler (`Reconciler.lock`)."""
        self._nodes, self._inventory, self._history_interval_s = nodes, inventory, history_interval_s
        self.metrics = ServerMetrics(self)
        self._standby: Reconciler | None = None
        """A standby's reconciler: it runs no pass and acts on nothing (`StandbyExecutor`);
        user actions go through it to the database."""
        if lease is None:
            self.reconciler = self._reconciler(store, executor, policy)
        else:
            self._standby = self.reconciler = self._reconciler(store, StandbyExecutor(), policy)
        self.forecasts = Forecasts(lambda: self.reconciler.last_planned, forecast_interval_s)
        """Each waiting job's expected start, from the last pass (a thread of its own)."""
        self._stop = threading.Event()
        self._tokens: dict[str, tuple[Principal, float, TokenInfo]] = {}
        self._tokens_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._forecast_thread: threading.Thread | None = None
        self._dry_runs = threading.Lock()
        self.submission_rate = SubmissionRate()
        self._dead: dict[str, str] = {}
        self._unwatch: Callable[[], None] = lambda: None
        """Helper threads that died, and of what: scheduling stopped then (`dead_threads`)."""
        self._thread_deaths = Counter(
            "warden_server_thread_deaths",
            "Server helper threads (reconcile loop, kill timer) that died; scheduling stops.",
            registry=self.metrics.registry,
        )

    def _reconciler(self, store: Store, executor: Executor, policy: Policy) -> Reconciler:
        rec = Reconciler(
            store,
            executor,
            self._nodes,
            policy,
            self.state_dir,
            self.clock,
            self.report_env,
            self._inventory,
            self._history_interval_s,
            lock=self.lock,
        )
        rec.metrics = self.metrics
        return rec

    @property
    def policy(self) -> Policy:
        return self.reconciler.policy

    @property
    def leading(self) -> bool:
        """Whether this server leads now (always, without a lease): it began a term and its
        lease is valid by its own clock, in that term. A term whose lease ran out is not led
        any more, even before it has ended (a server that was stalled says so at once)."""
        if self.lease is None:
            return True
        term = self._term
        return term is not None and self.lease.may_act_in(term.epoch)

    def leading_term(self) -> bool:
        """Whether a term of this server's has begun and not ended yet (its loop may run)."""
        return self._term is not None

    @property
    def epoch(self) -> int | None:
        """The epoch of this server's term while it leads (`leading`); None otherwise (and
        without a lease)."""
        term = self._term
        return term.epoch if term is not None and self.leading else None

    @property
    def role(self) -> Literal["leader", "standby"]:
        return "leader" if self.leading else "standby"

    def leader_url(self) -> str | None:
        """The API of the server that leads, as far as this one knows (None: unknown, none)."""
        if self.leading:
            return self.url or None
        seen = self.lease.last_seen if self.lease is not None else None
        return seen.url if seen is not None and seen.live else None

    def servers(self) -> list[str]:
        """The URLs of the servers a job this server starts reports to (`WARDEN_URL`): this
        one first, then every other of its database seen up within `SEEN_S` (the `servers`
        table, read every `BEAT_S`)."""
        if not self.url:
            return []
        return [self.url, *(u for u in self._servers if u != self.url)]

    def _keep_roster(self) -> None:
        """Until the server stops: refresh this server's row of `servers` every `BEAT_S` and
        keep the URLs of the servers seen up; then delete the row."""
        assert self._roster is not None
        while True:
            try:
                self._servers = self._roster.beat() or self._servers
            except Exception as err:  # the database away: the last list stands
                log.warning("could not refresh this server's row of the servers table: %s", err)
            if self._stop.wait(BEAT_S):
                break
        try:
            self._roster.leave()
        except Exception as err:  # it is forgotten once not seen for SEEN_S
            log.warning("could not delete this server's row of the servers table: %s", err)

    @property
    def nodes(self) -> tuple[Node, ...]:
        """Every node of the cluster, down ones included (a job that fits only there waits)."""
        return self.reconciler.cluster.nodes

    def now(self) -> float:
        return self.clock()

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        """Recover what a stopped server left (re-adopting running jobs), then run the
        reconcile loop in a thread. With a lease, contend for it in a thread instead: each
        term that this server leads does the same (`_begin_term`)."""
        if self.lease is None:
            self.reconciler.recover()
            self.reconciler.executor.watch(self.reconciler.poke)
            self._watch_threads()
            self._thread = threading.Thread(
                target=self.reconciler.run, args=(self._stop,), name="warden-reconcile", daemon=True
            )
        else:
            self._watch_threads()
            leading = Leading(self.lease, self._begin_term, self._end_term, self._term_lost, standing_by=self._follow)
            self._thread = threading.Thread(target=leading.run, args=(self._stop,), name="warden-leader", daemon=True)
        self._thread.start()
        self._forecast_thread = threading.Thread(
            target=self.forecasts.run, args=(self._stop,), name="warden-forecast", daemon=True
        )
        self._forecast_thread.start()
        if self._roster is not None:
            self._roster_thread = threading.Thread(target=self._keep_roster, name="warden-roster", daemon=True)
            self._roster_thread.start()

    # -- terms (with a lease) ----------------------------------------------------------------
    def _begin_term(self, epoch: int) -> None:
        """This server leads, in term `epoch`: a reconciler of its own on the fenced store and
        a fenced executor, the stored policy, then recovery as after a restart (adopting every
        running attempt, re-arming each SIGKILL deadline from the database) and the loop."""
        assert self.lease is not None
        executor = self._spare if self._spare is not None else self._make_executor() if self._make_executor else None
        self._spare = None
        if executor is None:
            raise RuntimeError("no executor for a new term: the service was given no make_executor")
        fence = self.lease.term_fence(epoch)  # what this term decided is done in this term or not at all
        executor.fence(fence.may_act)
        rec = self._reconciler(self.store.fenced(fence), executor, self._stored_policy())
        rec.follow_policy = self._newer_policy
        term = _Term(epoch, rec, executor, threading.Event())
        with self.lock:
            self._term, self.reconciler = term, rec
        # Recovery runs in the term's own thread: the lease thread goes on renewing meanwhile,
        # however many attempts there are to adopt.
        term.thread = threading.Thread(target=self._run_term, args=(term,), name="warden-reconcile", daemon=True)
        term.thread.start()

    def _run_term(self, term: _Term) -> None:
        """The term's thread: recovery, then the loop, until the term ends or is refused."""
        assert self.lease is not None
        rec = term.reconciler
        try:
            rec.recover()
        except (NotLeader, Fenced) as err:
            rec.lost = f"recovery was refused: {err}"
            return
        except Exception as err:
            log.exception("recovery at the start of epoch %d failed", term.epoch)
            rec.lost = f"recovery failed: {type(err).__name__}: {err}"
            return
        try:
            with rec.lock:
                rec.follower.record(rec.cluster, self.now())
        except (NotLeader, Fenced) as err:
            rec.lost = f"recording the cluster was refused: {err}"
            return
        term.executor.watch(rec.poke)
        if listens(self.store.engine):  # a standby's writes wake this term's loop
            threading.Thread(
                target=listen, args=(self.store.engine, rec.poke, term.stop), name="warden-wakeups", daemon=True
            ).start()
        rec.run(term.stop, gate=self.lease.term_fence(term.epoch).may_act)

    def _end_term(self, why: str) -> None:
        """The term ends (the lease is no longer held): its loop stops, its executor is closed
        (timers and threads; the jobs run on, the next leader adopts them), and user actions go
        to the database again."""
        term = self._term
        if term is None:
            return
        term.stop.set()
        term.reconciler.poke()
        if term.thread is not None and term.thread is not threading.current_thread():
            term.thread.join(timeout=30)
            if term.thread.is_alive():
                log.error("the reconcile loop of epoch %d did not stop within 30 s; it is fenced", term.epoch)
        term.executor.close()
        assert self._standby is not None
        with self.lock:
            self._standby.ctx.policy = term.reconciler.policy
            self._term, self.reconciler = None, self._standby
        log.warning("term of epoch %d ended: %s", term.epoch, why)

    def _term_lost(self) -> str | None:
        """Why the term's loop stopped by itself (refused a write or an action), else None."""
        term = self._term
        if term is None or term.thread is None or term.thread.is_alive() or term.stop.is_set():
            return None
        return term.reconciler.lost or "the reconcile loop ended"

    def _follow(self) -> None:
        """A standby keeps up with the database, every `FOLLOW_S` between two tries for the
        lead: the policy in force (another server may have applied one), its API's checks and
        answers being against it; the cluster as the leader records it (nodes down,
        GPUs held by others) and the fair-share ledger as the leader saved it, which its dry
        runs and `warden nodes` read, and the snapshot its expected-start forecasts start from
        (a standby runs no pass, so the snapshot is the database's as it is then)."""
        standby = self._standby
        if standby is None or self._term is not None or time.monotonic() < self._next_follow:
            return
        self._next_follow = time.monotonic() + FOLLOW_S
        newer = self._newer_policy()
        if newer is not None:
            standby.set_policy(newer)
        inventory = recorded_inventory(self.store.nodes())
        ledger = self.store.load_ledger().to_engine()
        with self.lock:
            if self._term is not None:
                return
            if inventory.nodes and inventory != standby.cluster:
                standby.follower.take(inventory)
            standby.charging.ledger = ledger
            now = self.now()
            standby.last_planned = (standby.live_snapshot(now), now)

    def _stored_policy(self) -> Policy:
        """The policy in force in the database (another server may have applied one)."""
        current = self.store.current_policy()
        if current is None:
            return self.policy
        self._policy_version = current.version
        return parse_policy(current.source, f"stored policy version {current.version}")

    def _newer_policy(self) -> Policy | None:
        """A policy applied since the loop's (on any server), or None."""
        version = self.store.policy_version()
        if version is None or version == self._policy_version:
            return None
        try:
            return self._stored_policy()
        except PolicyError as err:
            self._policy_version = version  # not again every pass
            log.error("stored policy version %s does not load; keeping the one in force: %s", version, err)
            return None

    def _watch_threads(self) -> None:
        """A server thread (`warden-*`: the reconcile loop, the kill timer) that dies of an
        exception stops scheduling, loudly: preempting without a working SIGKILL, or running
        without passes, must not go on unnoticed."""
        previous = threading.excepthook

        def hook(args: threading.ExceptHookArgs) -> None:
            if args.thread is not None and args.thread.name.startswith(THREAD_PREFIX):
                self._thread_died(args.thread.name, args.exc_value)
            previous(args)

        threading.excepthook = hook
        self._unwatch = lambda: setattr(threading, "excepthook", previous) if threading.excepthook is hook else None

    def _thread_died(self, name: str, err: BaseException | None) -> None:
        self._dead[name] = f"{type(err).__name__}: {err}" if err is not None else "exited"
        self._thread_deaths.inc()
        log.critical("server thread %s died (%s): scheduling is stopped; restart the server", name, self._dead[name])
        self._stop.set()
        self.reconciler.poke()

    def dead_threads(self) -> list[str]:
        """Each helper thread that died, with its cause; empty while the server is healthy."""
        dead = dict(self._dead)
        if self._thread is not None and not self._thread.is_alive() and not self._stop.is_set():
            dead.setdefault(self._thread.name, "exited")
        return [f"{name}: {cause}" for name, cause in sorted(dead.items())]

    def stop(self) -> None:
        self._unwatch()
        self._stop.set()
        self.reconciler.poke()
        for thread in (self._thread, self._forecast_thread, self._roster_thread):
            if thread is not None:
                thread.join(timeout=40)
        if self.lease is None:
            self.executor.close()
        elif self._spare is not None:
            self._spare.close()
        if self.lease is not None and self.lease.watch is not None and not self.leading_term():
            self.lease.watch.close()  # the lease was given back: nothing left to watch

    # -- who --------------------------------------------------------------------------------
    def authenticate(self, header: str | None) -> Principal:
        """The caller of a request. A token's grant is remembered for `TOKEN_CACHE_S`, so a
        storm of requests does not read the tokens table every time; its expiry is checked on
        every request, cached or not. `revoke_token` drops the token from the cache at once; a
        token revoked in the database by other means stops working within `TOKEN_CACHE_S`."""
        token = bearer(header)
        now = time.monotonic()
        cached = self._tokens.get(token)
        if cached is not None and cached[1] > now:
            who, info = cached[0], cached[2]
        else:
            found = self.store.lookup_token(token)
            if found is None or found.revoked_at is not None:
                self._tokens.pop(token, None)
                why = "unknown token" if found is None else "token revoked"
                raise ApiError(401, "Authorization", "Bearer ***", why, CHALLENGE)
            info = found
            who = Principal(info.user, info.role, tuple(info.queues))
            with self._tokens_lock:
                if len(self._tokens) > 10_000:
                    self._tokens.clear()
                self._tokens[token] = (who, now + TOKEN_CACHE_S, info)
        wall = self.now()
        if info.expires_at is not None and wall >= info.expires_at:
            message = f"token expired at {wall_times(wall)(info.expires_at)}"
            raise ApiError(401, "Authorization", "Bearer ***", message, CHALLENGE)
        return who

    def require_admin(self, who: Principal, what: str) -> None:
        if not who.is_admin:
            raise forbidden(who, what)

    def job(self, job_id: str) -> StoredJob:
        job = self.store.get(stored_id("job", job_id))
        if job is None:
            raise ApiError(404, "id", job_id, "no such job")
        return job

    # -- submit -----------------------------------------------------------------------------
    def submit(self, req: SubmitRequest, who: Principal, idempotency_key: str | None = None) -> Submitted:
        """Validate and store a job. With an `idempotency_key`, a retry of the same request by
        the same user returns the job the first one created (`replayed`), and another request
        with that key is refused (409)."""
        digest = _request_digest(req) if idempotency_key is not None else None
        if idempotency_key is not None:
            earlier = self.store.find_submission(who.user, idempotency_key)
            if earlier is not None:
                return self._replay(idempotency_key, earlier, digest)
        limits = self.policy.limits
        self._check_rate(who, limits)
        try:
            return self._store_submission(req, who, idempotency_key, digest, limits)
        except BaseException:
            self.submission_rate.give_back(who.user, limits.submission_burst_per_user)
            raise

    def _check_rate(self, who: Principal, limits: Limits, dry_run: bool = False) -> None:
        """Each user's submissions and dry runs together are limited to a rate with a burst
        (`limits.submissions_per_second_per_user`, `limits.submission_burst_per_user`); admins'
        are not."""
        if who.is_admin:
            return
        rate, burst = limits.submissions_per_second_per_user, limits.submission_burst_per_user
        wait = self.submission_rate.take(who.user, rate, burst)
        if wait is not None:
            what = "dry-runs and submits" if dry_run else "submits"
            raise ApiError(
                429,
                "user",
                who.user,
                f"{what} faster than the limit of {rate:g} jobs per second after a burst of {burst}, dry "
                "runs counted (the policy's limits.submissions_per_second_per_user and "
                f"limits.submission_burst_per_user); retry in {span(wait)}",
                {"Retry-After": str(max(1, math.ceil(wait)))},
            )

    @staticmethod
    def _too_many_waiting(err: TooManyWaiting) -> ApiError:
        """At most `limits.max_pending_per_user` waiting jobs per user (admins are exempt) and
        `limits.max_pending_per_queue` per queue (admins' jobs too), counted by the database in
        the transaction that would store the job (`WaitingLimits`), whichever server takes it."""
        setting = "max_pending_per_user" if err.field == "user" else "max_pending_per_queue"
        return ApiError(
            429,
            err.field,
            err.value,
            f"has {err.waiting} jobs waiting, the limit of {err.limit} (the policy's limits.{setting}); "
            "submit more once some have started or been cancelled",
        )

    @staticmethod
    def _too_much_stored(err: TooMuchStored) -> ApiError:
        """At most `limits.max_stored_bytes_per_user` bytes of command, env and workdir kept
        per user (admins are exempt): warden keeps every job, so what one user writes is what
        it must bound. A finished job's are dropped, oldest first, to make room; the refusal
        comes only where the unfinished jobs keep too much. Counted in the transaction that
        would store the job, under the submission lock, as the waiting limits are."""
        return ApiError(
            422,
            "user",
            err.user,
            f"keeps {err.kept} bytes of commands, envs and workdirs in unfinished jobs; this job's "
            f"{err.adding} more would pass the limit of {err.limit} bytes (the policy's "
            "limits.max_stored_bytes_per_user); submit it once some have finished",
        )

    def _store_submission(
        self, req: SubmitRequest, who: Principal, idempotency_key: str | None, digest: str | None, limits: Limits
    ) -> Submitted:
        checked = self._check_submission(req, who)
        state, tier, workdir = checked.state, self.policy.tier(req.tier), checked.workdir
        try:
            job_id = self.store.submit(
                name=req.name or default_name(req.command, limits.max_name_chars),
                user=who.user,
                queue=req.queue,
                tier=req.tier,
                state=state,
                replicas=req.replicas,
                gpus=req.gpus,
                cpu=req.cpu,
                memory=req.memory,
                flavor=req.flavor,
                placement=req.placement,
                # The lease and the time limit are fixed at submission: a later policy keeps this
                # job's (and its tier).
                lease_s=checked.lease_s,
                grace_s=req.grace,
                expected_duration_s=checked.time_limit_s,
                command=list(req.command),
                workdir=workdir,
                env=dict(req.env),
                actor=who.user,
                now=self.now(),
                reason=f"submitted to {req.queue} at tier {req.tier} ({tier.name})"
                + ("; waits for an admin's approval" if state is JobState.AWAITING_APPROVAL else ""),
                idempotency_key=idempotency_key,
                request_digest=digest,
                saves_on_sigterm=req.saves_on_sigterm,
                waiting_limits=WaitingLimits(
                    None if who.is_admin else limits.max_pending_per_user, limits.max_pending_per_queue
                ),
                stored_bytes_limit=None if who.is_admin else limits.max_stored_bytes_per_user,
            )
        except TooManyWaiting as err:
            raise self._too_many_waiting(err) from None
        except TooMuchStored as err:
            raise self._too_much_stored(err) from None
        except DuplicateSubmission as dup:  # a concurrent retry with the same key got there first
            assert idempotency_key is not None
            replayed = self._replay(idempotency_key, dup.earlier, digest)
            self.submission_rate.give_back(who.user, limits.submission_burst_per_user)  # one job: one token
            return replayed
        self._changed()
        return Submitted(job_id, state)

    def _check_submission(self, req: SubmitRequest, who: Principal, dry_run: bool = False) -> Checked:
        """Refuse a submission the policy, the caller's grants or the cluster do not allow;
        else what storing it would record. A user's dry run does not check that the workdir
        exists; an admin's does."""
        policy = self.policy
        leaves = [q.name for q in policy.leaves()]
        if req.queue not in leaves:
            raise ApiError(422, "queue", req.queue, f"is not a leaf queue; allowed: {', '.join(leaves)}")
        if not who.may_submit_to(req.queue):
            raise forbidden(who, f"submit to queue {req.queue!r}")
        _check_limits(req, policy.limits)
        self._check_shape(req)
        tier = policy.tier(req.tier)
        _check_durations(req, policy)
        workdir = req.workdir or os.getcwd()
        if (who.is_admin or not dry_run) and not _is_dir(workdir):
            # A user's dry run does not look: as the server (root) it would tell them whether
            # any path on the machine exists, without leaving a trace.
            raise ApiError(422, "workdir", workdir, "is not a directory on the server's machine")
        state = JobState.AWAITING_APPROVAL if policy.needs_approval(req.tier, who.is_admin) else JobState.PENDING
        # The lease and the time limit are fixed at submission: a later policy keeps this job's.
        lease = req.lease if req.lease is not None else tier.lease
        time_limit = req.time_limit if req.time_limit is not None else tier.default_time_limit
        return Checked(state, lease, time_limit, workdir)

    def dry_run(self, req: SubmitRequest, who: Principal) -> tuple[Verdict, JobState, float]:
        """What the engine would decide for this submission now, on the live snapshot: it is
        checked as `submit` checks it, planned as the next pass would plan it, and nothing is
        stored, signalled or started. The job gets the id the store would give it next. A
        dry run that passes the checks takes one of the user's submission tokens (`_check_rate`):
        planning costs what a submission's pass does, so a user's dry runs and submissions share
        one rate."""
        checked = self._check_submission(req, who, dry_run=True)
        self._check_rate(who, self.policy.limits, dry_run=True)
        # One dry run at a time, planned outside the loop's lock: a storm of them costs the
        # API's callers, not the reconcile loop.
        with self._dry_runs:
            with self.reconciler.lock:
                now = self.now()
                job_id, submit_at = self.store.next_submission(now)
                snapshot = self.reconciler.live_snapshot(now)
            job = Job(
                id=str(job_id),
                queue=req.queue,
                tier=req.tier,
                submit=submit_at,
                state=checked.state,
                replicas=req.replicas,
                gpus=req.gpus,
                cpu=req.cpu,
                memory=req.memory,
                flavor=req.flavor,
                placement=req.placement,
                user=who.user,
                lease=checked.lease_s,
                grace=req.grace,
                expected_duration=checked.time_limit_s,
            )
            return what_if(snapshot, job, now, self.forecasts.passes), checked.state, now

    def _replay(self, key: str, earlier: EarlierSubmission, digest: str | None) -> Submitted:
        if earlier.request_digest != digest:
            raise ApiError(
                409,
                "Idempotency-Key",
                key,
                f"was used for a different request (job {earlier.job_id}); use a new key for a new job",
            )
        return Submitted(earlier.job_id, JobState(earlier.first_state), replayed=True)

    def _check_shape(self, req: SubmitRequest) -> None:
        """A job the cluster could never hold is refused now, not left pending forever."""
        nodes = [n for n in self.nodes if req.flavor is None or n.flavor == req.flavor]
        if req.flavor is not None and not nodes:
            flavors = sorted({n.flavor for n in self.nodes})
            raise ApiError(422, "flavor", req.flavor, f"no node has this GPU flavor; allowed: {', '.join(flavors)}")
        total = sum(n.gpus for n in nodes)
        if req.gpus * req.replicas > total:
            raise ApiError(
                422, "gpus", req.gpus * req.replicas, f"replicas × gpus is more GPUs than the cluster has ({total})"
            )
        largest = max((n.gpus for n in nodes), default=0)
        if req.gpus > largest:
            raise ApiError(
                422, "gpus", req.gpus, f"more GPUs per replica than any node has (the largest has {largest})"
            )
        for field, asked, unit in (("cpu", req.cpu, "millicores"), ("memory", req.memory, "MiB")):
            sizes = [getattr(n, field) for n in nodes]
            if asked and sizes and all(sizes) and asked > max(sizes):
                raise ApiError(
                    422, field, asked, f"more {unit} per replica than any node has (the largest has {max(sizes)})"
                )

    # -- cancel, approve, release -----------------------------------------------------------
    # A user action is linearised with the reconcile loop: it reads the job and writes under
    # the lock every pass holds, so no pass runs in between, and each write is a
    # compare-and-set on what it read. A 202 for a cancel therefore means the job ends
    # CANCELLED, and the audit entry says what was done.
    def _act(self, job_id: str, act: Callable[[StoredJob], T | None]) -> tuple[StoredJob, T]:
        """`act` on the job as it is now, under the reconcile lock. `act` returns None when a
        compare-and-set lost (a writer outside the lock got there first): the job is read
        again and `act` retried, up to `ACTION_TRIES` times, then 409."""
        with self.reconciler.lock:
            for _ in range(ACTION_TRIES):
                job = self.job(job_id)
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
                return self.reconciler.cancel(job, who.user)
            except (NotLeader, Fenced):  # the lead was lost meanwhile: record it for the next leader
                if self._standby is None:
                    raise
                return self._standby.cancel(job, who.user)

        job, done = self._act(job_id, act)
        self.store.audit(who.user, "cancel", f"job/{job_id}", {"state": job.state.value, "done": done}, self.now())
        self._changed()
        return self._reread(job)

    def approve(self, job_id: str, who: Principal) -> StoredJob:
        self.require_admin(who, f"approve job {job_id}")
        now = self.now()

        def act(job: StoredJob) -> bool | None:
            if job.state is not JobState.AWAITING_APPROVAL:
                raise ApiError(409, "id", job_id, f"the job does not await approval ({job.state.value})")
            approved = self.store.transition(
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
        self.store.audit(who.user, "approve", f"job/{job_id}", {"tier": job.tier, "queue": job.queue}, now)
        self._changed()
        return self._reread(job)

    def release(self, job_id: str, who: Principal) -> StoredJob:
        """Let a held job be scheduled again (Slurm's `scontrol release`), e.g. once the cause
        of the failing passes it was quarantined for is fixed. Should they fail again because
        of it, it is held again."""
        self.require_admin(who, f"release job {job_id}")
        now = self.now()

        def act(job: StoredJob) -> bool | None:
            if not job.held:
                raise ApiError(409, "id", job_id, f"the job is not held ({job.state.value})")
            released = self.store.note(
                job.id,
                job.state,
                reason=f"released by {who.user}",
                actor=who.user,
                now=now,
                expect_cancel_requested=False,
                held_reason=None,
                explanation=None,
            )
            return released or None

        job, _ = self._act(job_id, act)
        self.store.audit(who.user, "release", f"job/{job_id}", {"held_reason": job.held_reason}, now)
        self._changed()
        return self._reread(job)

    def _changed(self) -> None:
        """A user's write is stored: a pass soon, here or, from a standby, on the leader."""
        self.reconciler.poke()
        if self.leading:
            return
        try:
            wake_leader(self.store.engine)
        except Exception as err:  # the leader's next pass finds the write anyway
            log.warning("could not wake the leader: %s", err)

    def _reread(self, job: StoredJob) -> StoredJob:
        """The job as it is now (as it was, should it have been purged meanwhile)."""
        return self.store.get(job.id) or job

    # -- logs -------------------------------------------------------------------------------
    def may_read(self, who: Principal, job: StoredJob) -> bool:
        """Whether `who` may read the job's command, workdir and logs: its owner and admins
        always, anyone under `--private-data none`."""
        return who.is_admin or who.user == job.user or self.private_data == "none"

    def private(self, who: Principal, job: StoredJob, what: str) -> ApiError:
        return ApiError(
            403,
            "id",
            str(job.id),
            f"user {who.user!r} may not read {what} of job {job.id}, which is {job.user!r}'s "
            "(the server's --private-data jobs: only a job's owner and admins do)",
        )

    def logs(self, job_id: str, attempt: int | None, rank: int, offset: int, who: Principal) -> dict[str, Any]:
        """Up to 1 MiB of one replica's output from `offset` (the API bounds `attempt` >= 1,
        `rank` >= 0 and `offset` to int64); 403 for another user's job under `--private-data jobs`."""
        job = self.job(job_id)
        if not self.may_read(who, job):
            raise self.private(who, job, "the logs")
        if rank >= job.replicas:
            raise ApiError(422, "rank", rank, f"the job has ranks 0..{job.replicas - 1}")
        number = attempt if attempt is not None else job.attempt
        if number < 1:
            return {"id": job_id, "attempt": 0, "rank": rank, "text": "", "offset": 0, "eof": job.state.terminal}
        row = self.store.attempt(job.id, number)
        if row is None:
            raise ApiError(404, "attempt", attempt, f"job {job_id} has no such attempt")
        replicas = (row.handle or {}).get("replicas") or []
        path = Path(replicas[rank]["log_path"]) if rank < len(replicas) else Path(row.log_dir) / f"rank-{rank}.log"
        text = b""
        try:
            # A job may own its attempt's directory (Slurm): a link planted there is never followed.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            fd = None  # not written yet, or not a file the server will read
        if fd is not None:
            with os.fdopen(fd, "rb") as f:
                if stat.S_ISREG(os.fstat(fd).st_mode) and offset < f.seek(0, os.SEEK_END):
                    f.seek(offset)  # seeking far past the end fails on some file systems
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
        """Where an attempt reports, and its token: `WARDEN_URL` lists every server up when it
        starts (`servers`), the job's reporter tries them in turn (`warden.workload.report`)."""
        if not self.url:
            return {}
        env = {"WARDEN_URL": ",".join(self.servers()), "WARDEN_REPORT_TOKEN": self.report_token(job_id, attempt)}
        cas = self.trusted_cas()
        if cas:
            env["WARDEN_CA"] = "".join(cas)
        return env

    def trusted_cas(self) -> tuple[str, ...]:
        """The CAs of this server's own certificate and of the other servers seen up: what a
        job given their URLs trusts (`WARDEN_CA`, PEM text). None of them for servers with an
        admin's certificate, which jobs check against the system's store."""
        seen = self._roster.cas if self._roster is not None else ()
        return tuple(dict.fromkeys(ca for ca in (self.ca_pem, *seen) if ca))

    def report(self, job_id: str, header: str | None, req: ReportRequest) -> dict[str, Any]:
        """Startup, progress and checkpoint reports: what the engine's victim cost (the last
        checkpoint, the measured SIGTERM save) and efficiency (startup and checkpoint time)
        are computed from.

        Every server takes them, a standby as the leader: a report is written to the
        database at once (the attempt's row, whose job's version it bumps), never held in
        this server's memory, and the leader's next pass reads it there (`Store.active`
        re-reads a job whose version moved). Refusing reports on a standby would lose those
        sent while no server leads (from the leader's death until a standby takes over) and
        cost each report a round trip to a server that does not take it."""
        # Authentication first: without a valid token, every job id gets the same 401.
        token = bearer(header)
        if hmac.compare_digest(token.encode(), self.report_token(job_id, req.attempt).encode()):
            job = self.job(job_id)
        else:
            who = self.authenticate(header)
            job = self.job(job_id)
            if who.user != job.user and not who.is_admin:
                raise forbidden(who, f"report for job {job_id} of user {job.user!r}")
        # A read-modify-write of the attempt: under the reconcile lock, no exit is recorded and
        # no other report is counted in between.
        with self.reconciler.lock:
            attempt = self.store.attempt(job.id, req.attempt)
            if attempt is None or attempt.ended_at is not None:
                raise ApiError(409, "attempt", req.attempt, f"is not a running attempt of job {job_id}")
            at = min(req.at if req.at is not None else self.now(), self.now())
            fields: dict[str, Any] = {}
            clamped: list[tuple[str, float, float, str]] = []
            if req.kind == "startup":
                # No startup lasts longer than the attempt has run (by `at`, never after now).
                ran = max(0.0, at - attempt.started_at)
                fields["startup_s"] = ran if req.startup_s is None else min(req.startup_s, ran)
                if req.startup_s is not None and req.startup_s > ran:
                    clamped.append(("startup", req.startup_s, ran, "the time the attempt has run"))
            elif req.kind == "progress":
                fields.update(progress_step=req.step, progress_samples=req.samples, progress_at=at)
            elif req.kind == "checkpoint_finished":
                # No save lasts longer than the time since the attempt started, nor since the
                # end of the previous save it reported.
                since = attempt.started_at
                last = attempt.last_checkpoint_at
                if last is not None and since <= last <= at:
                    since = last
                bound = max(0.0, at - since)
                duration = min(req.duration_s or 0.0, bound)
                if (req.duration_s or 0.0) > bound:
                    what = (
                        "the time since its previous checkpoint"
                        if since > attempt.started_at
                        else "the time the attempt has run"
                    )
                    clamped.append(("checkpoint", req.duration_s or 0.0, bound, what))
                # A job that saves through the SDK saves the same state on SIGTERM: its latest save
                # time is the best estimate of what a preemption's save will take.
                fields.update(
                    checkpoint_s=attempt.checkpoint_s + duration,
                    last_checkpoint_at=at,
                    last_checkpoint_step=req.step,
                    checkpoints=attempt.checkpoints + 1,
                    sigterm_save_s=duration,
                )
                if req.step is not None:
                    fields["progress_step"] = max(req.step, attempt.progress_step or 0)
            if fields:
                self.store.update_attempt(job.id, req.attempt, **fields)
            for what, reported, kept, bound_by in clamped:
                self._record_clamp(job, req.attempt, what, reported, kept, bound_by)
        return {"id": job_id, "attempt": req.attempt, "kind": req.kind}

    def _record_clamp(self, job: StoredJob, attempt: int, what: str, reported: float, kept: float, why: str) -> None:
        """A report that claimed more than warden saw leaves a trace in the job's events."""
        now = self.now()
        job = self._reread(job)  # under the reconcile lock: its state cannot change meanwhile
        self.store.note(
            job.id,
            job.state,
            reason=f"{what} report of {span(reported)} clamped to {span(kept)}, {why}",
            now=now,
            details={"attempt": attempt, "report": what, "reported_s": reported, "kept_s": kept},
        )
        log.warning("job %s attempt %s: %s report of %.6g s clamped to %.3f s", job.id, attempt, what, reported, kept)

    # -- admin ------------------------------------------------------------------------------
    def apply_policy(self, source: str, who: Principal) -> tuple[int, bool]:
        """Validate and version a new policy; jobs keep their tier and lease. Returns the
        version in force and whether it is new: the source in force again is no new version.
        An empty source is refused (it would silently reset every setting to its default)."""
        self.require_admin(who, "apply a policy")
        current = self.store.current_policy()
        if current is not None and current.source == source:
            return current.version, False
        policy = _parse_source(source)
        leaves = {q.name for q in policy.leaves()}
        orphaned = sorted({a.job.queue for a in self.store.active()} - leaves)
        if orphaned:
            raise ApiError(
                422, "queues", orphaned[0], "unfinished jobs use this queue, which the new policy does not have"
            )
        now = self.now()
        version = self.store.apply_policy(source, policy.to_dict(), who.user, now)
        self._policy_version = version
        self.store.audit(who.user, "policy.apply", f"policy/{version}", {}, now)
        self.reconciler.set_policy(policy)
        self._changed()
        for w in quota_warnings(policy, self.nodes):
            log.warning("policy version %s: %s. %s", version, w.headline, w.message)
        return version, True

    def diff_policy(self, source: str) -> dict[str, Any]:
        """What `source` would change for the jobs in the system now, were it applied
        (`warden.server.policydiff`); validated as `apply_policy` validates it, and nothing is
        changed. The snapshot is read under the reconcile lock; the policy is parsed and both
        plans are made after it, in a worker process (`warden.server.offload`)."""
        with self.reconciler.lock:
            now = self.now()
            snapshot = self.reconciler.live_snapshot(now)
        return in_worker(_diff, source, snapshot, now)

    def export_history(self, since: float) -> Export:
        """The jobs submitted at `since` or later that have run, as trace rows read as they are
        sent (`warden.server.export`)."""
        return export(self.store, since, self.policy, self.now())

    def create_token(self, req: TokenRequest, who: Principal) -> tuple[str, float | None]:
        """A new token and when it expires (None: never): after `req.expires_in_s`, else the
        server's `token_lifetime_s`."""
        self.require_admin(who, "create tokens")
        leaves = {q.name for q in self.policy.leaves()}
        unknown = [q for q in req.queues if q != "*" and q not in leaves]
        if unknown:
            raise ApiError(422, "queues", unknown[0], f"is not a leaf queue; allowed: {', '.join(sorted(leaves))}")
        now = self.now()
        lifetime = req.expires_in_s if req.expires_in_s is not None else self.token_lifetime_s
        expires_at = None if lifetime is None else now + lifetime
        token = self.store.create_token(req.user, req.role, list(req.queues), who.user, now, expires_at)
        details = {"role": req.role, "queues": req.queues, "expires_at": expires_at}
        self.store.audit(who.user, "token.create", f"user/{req.user}", details, now)
        return token, expires_at

    def list_tokens(self, who: Principal) -> tuple[TokenInfo, ...]:
        self.require_admin(who, "list tokens")
        return self.store.list_tokens()

    def revoke_token(self, token: str, who: Principal) -> TokenInfo:
        """Revoke a token by id; it is refused from the next request on (the cache forgets it
        here). 404 when there is no such token, 409 when it is revoked already."""
        self.require_admin(who, "revoke tokens")
        token_id = stored_id("token", token)
        if self.store.token_by_id(token_id) is None:
            raise ApiError(404, "id", token, "no such token")
        now = self.now()
        if not self.store.revoke_token(token_id, now):
            raise ApiError(409, "id", token, "the token is revoked already")
        with self._tokens_lock:
            for secret in [k for k, v in self._tokens.items() if v[2].id == token_id]:
                self._tokens.pop(secret, None)
        info = self.store.token_by_id(token_id)
        assert info is not None
        self.store.audit(who.user, "token.revoke", f"token/{token_id}", {"user": info.user, "role": info.role}, now)
        return info


def _diff(source: str, snapshot: Snapshot, now: float) -> dict[str, Any]:
    """`Service.diff_policy`'s work, in a worker process."""
    return policy_diff(snapshot, _parse_source(source), now)


def _parse_source(source: str) -> Policy:
    """A policy from its YAML source, as `PUT /v1/policy` and `POST /v1/policy/diff` take it
    (`parse_policy_source`: one without settings is refused, as `warden policy check` refuses
    it); a refusal names the first problem's path and value and lists every problem (422)."""
    try:
        return parse_policy_source(source, "policy")  # aliases and duplicate keys refused
    except PolicyError as err:
        first = err.issues[0]  # a problem of the YAML itself (syntax, an alias, a key twice): the source's
        field = "source" if first.path in ("", "<file>") else first.path
        raise ApiError(422, field, _plain(first.value), shorten(str(err), 2000)) from None
    except RecursionError:
        raise ApiError(422, "source", None, "the YAML is nested too deeply") from None


def default_name(command: list[str], most: int) -> str:
    """The name of a job submitted without one, as Slurm names it: its program, the last part
    of the command's first word (`python3` for `/usr/bin/python3 train.py`), cut to `most`
    characters (the policy's `limits.max_name_chars`)."""
    program = command[0].rstrip("/")
    return (program.rsplit("/", 1)[-1] or command[0])[:most]


def _check_limits(req: SubmitRequest, limits: Limits) -> None:
    """The policy's `limits` on the sizes of a submission, each refusal naming its limit."""
    if len(req.name) > limits.max_name_chars:
        _too_big("name", req.name, f"{limits.max_name_chars} characters", "max_name_chars")
    if len(req.command) > limits.max_command_args:
        _too_big("command", len(req.command), f"{limits.max_command_args} words", "max_command_args")
    command_bytes = sum(len(w.encode()) for w in req.command)
    if command_bytes > limits.max_command_bytes:
        _too_big("command", command_bytes, f"{limits.max_command_bytes} bytes", "max_command_bytes")
    if len(req.env) > limits.max_env_vars:
        _too_big("env", len(req.env), f"{limits.max_env_vars} variables", "max_env_vars")
    env_bytes = sum(len(k.encode()) + len(v.encode()) for k, v in req.env.items())
    if env_bytes > limits.max_env_bytes:
        _too_big("env", env_bytes, f"{limits.max_env_bytes} bytes", "max_env_bytes")
    if req.workdir is not None and len(req.workdir) > limits.max_path_chars:
        _too_big("workdir", req.workdir, f"{limits.max_path_chars} characters", "max_path_chars")
    if req.replicas > limits.max_replicas:
        _too_big("replicas", req.replicas, f"{limits.max_replicas} replicas", "max_replicas")


def _too_big(field: str, value: Any, limit: str, setting: str) -> None:
    raise ApiError(422, field, value, f"is above the limit of {limit} (the policy's limits.{setting})")


def _check_durations(req: SubmitRequest, policy: Policy) -> None:
    """Grace, lease and time limit within the policy's bounds (the time limit within its tier's
    maximum too): every timer stays finite."""
    if req.grace is not None and req.grace < policy.min_grace:
        raise ApiError(
            422,
            "grace",
            format_duration(req.grace),
            f"is below the policy's minimum grace of {format_duration(policy.min_grace)}",
        )
    if req.grace is not None and req.grace > policy.max_grace:
        raise ApiError(
            422,
            "grace",
            format_duration(req.grace),
            f"is above the policy's maximum grace of {format_duration(policy.max_grace)} (max_grace)",
        )
    if req.lease is not None and req.lease > policy.max_lease:
        raise ApiError(
            422,
            "lease",
            format_duration(req.lease),
            f"is above the policy's maximum lease of {format_duration(policy.max_lease)}",
        )
    if req.time_limit is not None and req.time_limit <= 0:
        raise ApiError(422, "time_limit", req.time_limit, "is no time limit: give one above 0s, or leave it out")
    tier_max = policy.tier(req.tier).max_time_limit
    if req.time_limit is not None and tier_max is not None and req.time_limit > tier_max:
        raise ApiError(
            422,
            "time_limit",
            format_duration(req.time_limit),
            f"is above tier {req.tier}'s maximum of {format_duration(tier_max)} (the policy's tiers.{req.tier}.max_time_limit)",
        )
    limit = policy.limits.max_time_limit
    if req.time_limit is not None and req.time_limit > limit:
        raise ApiError(
            422,
            "time_limit",
            format_duration(req.time_limit),
            f"is above the limit of {format_duration(limit)} (the policy's limits.max_time_limit)",
        )


def _is_dir(path: str) -> bool:
    try:
        return Path(path).is_dir()
    except (OSError, ValueError):  # a name too long for the file system is no directory either
        return False


def _request_digest(req: SubmitRequest) -> str:
    """What makes two submissions the same request, for Idempotency-Key."""
    canonical = json.dumps(req.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _plain(value: Any) -> Any:
    return None if value.__class__.__name__ == "_Missing" else value


def _legacy_secret(path: Path) -> bytes | None:
    """The report key an older server kept in its state directory, if there is one: the first
    server of a database to start stores it there (`Store.shared_secret`), so the attempts it
    started before keep their tokens."""
    try:
        return bytes.fromhex(path.read_text().strip()) or None
    except (OSError, ValueError):
        return None
