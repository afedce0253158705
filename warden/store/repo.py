"""The repository: every read and write the control plane makes, one short transaction each.

`Store` wraps an Engine and holds no other state, so one instance may be shared by threads.
Reads return plain frozen dataclasses (never live ORM objects): they can cross threads, be
cached and compared, and cannot lazily hit the database after the transaction is gone. JSON
lists come back as tuples; JSON objects as fresh dicts the caller owns.

Writes on SQLite start with BEGIN IMMEDIATE (see `warden.store.db.WRITE_OPTION`), so two
writers queue on the lock instead of failing half-way; on PostgreSQL a row is locked with
SELECT ... FOR UPDATE where a compare-and-set needs it, and submissions take an advisory lock.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import math
import secrets
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple, cast

from sqlalchemy import (
    Connection,
    CursorResult,
    Engine,
    Row,
    Table,
    bindparam,
    delete,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.types import JSON

from warden.engine.cycles import Preempted
from warden.engine.model import DEFAULT_FLAVOR, Attempt, Job, JobState, Node, ReplicaPlacement, UsageLedger
from warden.store.db import connect, migrate, writer
from warden.store.schema import (
    AttemptRow,
    AuditRow,
    EventRow,
    JobRow,
    LedgerRow,
    MetaRow,
    NodeRow,
    PolicyRow,
    SampleRow,
    TokenRow,
)

JOBS = cast(Table, JobRow.__table__)
ATTEMPTS = cast(Table, AttemptRow.__table__)
EVENTS = cast(Table, EventRow.__table__)
TOKENS = cast(Table, TokenRow.__table__)
AUDIT = cast(Table, AuditRow.__table__)
POLICIES = cast(Table, PolicyRow.__table__)
LEDGER = cast(Table, LedgerRow.__table__)
NODES = cast(Table, NodeRow.__table__)
SAMPLES = cast(Table, SampleRow.__table__)
META = cast(Table, MetaRow.__table__)

TERMINAL_STATES = frozenset(s.value for s in JobState if s.terminal)
WAITING_STATES = frozenset(s.value for s in JobState if s.waiting)
SUBMIT_STATES = frozenset({JobState.PENDING.value, JobState.AWAITING_APPROVAL.value})
PLACEMENTS = frozenset({"pack", "block", "any"})
ROLES = frozenset({"user", "admin"})
ATTEMPT_STATES = frozenset({"running", "terminating", "exited"})
LIVE_ATTEMPT_STATES = frozenset({"running", "terminating"})
END_REASONS = frozenset({"completed", "failed", "preempted", "cancelled", "killed", "evicted"})
PREEMPTION_KINDS = frozenset({"preemption", "reclaim", "eviction"})
"""Why an attempt got SIGTERM when no cancel sent it (`attempts.preemption_kind`)."""
ANY_QUEUE = "*"

SUBMIT_TICK = 1e-6
"""The least gap between two submissions' `submit_at`, so (submit_at, id) order is id order."""
SUBMIT_LOCK_KEY = 0x7761726465_6E01
"""PostgreSQL advisory lock serializing submissions (read the newest submit_at, then insert)."""
TOKEN_LOCK_KEY = 0x7761726465_6E02
"""PostgreSQL advisory lock serializing `ensure_token` (look up, then insert or update)."""

_JOB_IMMUTABLE = frozenset({"id", "state", "version", "submit_at", "tier"})
"""Columns `transition`/`update` refuse: the id and submit order are fixed, the state moves only
through `transition`'s compare-and-set, the version only by the store, and a tier is immutable
(DESIGN §2)."""
_ATTEMPT_IMMUTABLE = frozenset({"job_id", "number"})


class JobNotFound(LookupError):
    """No job has this id."""


class EarlierSubmission(NamedTuple):
    """The job a user's earlier submission with an idempotency key created."""

    job_id: int
    request_digest: str | None
    first_state: str


class DuplicateSubmission(Exception):
    """`submit` was given an idempotency key its user already used; nothing was inserted."""

    def __init__(self, earlier: EarlierSubmission) -> None:
        super().__init__(f"idempotency key already used by job {earlier.job_id}")
        self.earlier = earlier


# ---------------------------------------------------------------------------------------------
# What the store returns


@dataclass(frozen=True, slots=True)
class StoredJob:
    """A row of `jobs`. `id` is the database key; users see `job_id` (its string form)."""

    id: int
    name: str
    user: str
    queue: str
    tier: int
    state: JobState
    replicas: int
    gpus: int
    cpu: int
    memory: int
    flavor: str | None
    placement: str
    lease_s: float | None
    grace_s: float | None
    expected_duration_s: float | None
    command: tuple[str, ...]
    workdir: str
    env: dict[str, str]
    submit_at: float
    pending_since: float | None
    waited_s: float
    not_before: float | None
    preempted_at: tuple[float, ...]
    attempt: int
    approved_by: str | None
    approved_at: float | None
    exit_code: int | None
    explanation: dict[str, Any] | None
    finished_at: float | None
    cancel_requested: bool
    version: int
    held_reason: str | None = None
    """Why the job is held out of scheduling while it waits (None: it is not held)."""
    claim: bool = False
    """It waits for capacity its victims are freeing, held for it (`Job.claim`)."""

    @property
    def job_id(self) -> str:
        return str(self.id)

    @property
    def held(self) -> bool:
        """Held out of scheduling: it waits, and no pass sees it until it is released."""
        return self.held_reason is not None and self.state.waiting

    def to_engine(self, attempt: StoredAttempt | None = None) -> Job:
        """The engine's view of this job; `attempt` only counts while it is live (not exited)."""
        live = attempt if attempt is not None and attempt.state in LIVE_ATTEMPT_STATES else None
        return Job(
            id=self.job_id,
            queue=self.queue,
            tier=self.tier,
            submit=self.submit_at,
            state=self.state,
            replicas=self.replicas,
            gpus=self.gpus,
            cpu=self.cpu,
            memory=self.memory,
            flavor=self.flavor,
            placement=cast(Any, self.placement),
            user=self.user,
            lease=self.lease_s,
            grace=self.grace_s,
            expected_duration=self.expected_duration_s,
            waited=self.waited_s,
            pending_since=self.pending_since,
            not_before=self.not_before,
            preempted_at=self.preempted_at,
            claim=self.claim and self.state.waiting,
            attempt=None if live is None else live.to_engine(),
        )


@dataclass(frozen=True, slots=True)
class StoredAttempt:
    """A row of `attempts`: one run of a job, with what executors and the SDK reported."""

    job_id: int
    number: int
    state: str
    started_at: float
    assignment: tuple[ReplicaPlacement, ...]
    flavor: str | None
    borrowing: bool
    startup_s: float | None
    checkpoint_s: float
    last_checkpoint_at: float | None
    sigterm_save_s: float | None
    sigterm_at: float | None
    kill_at: float | None
    ended_at: float | None
    exit_codes: tuple[int, ...] | None
    handle: dict[str, Any] | None
    log_dir: str
    preempted_for: str | None
    reason: str | None
    progress_step: int | None = None
    progress_samples: int | None = None
    progress_at: float | None = None
    checkpoints: int = 0
    lost_work_gpu_s: float | None = None
    preemption_kind: str | None = None
    """`preemption`, `reclaim` or `eviction` once SIGTERM came for one of them (None: a
    cancel's, or none)."""

    def to_engine(self) -> Attempt:
        return Attempt(
            number=self.number,
            started_at=self.started_at,
            assignment=self.assignment,
            borrowing=self.borrowing,
            startup_s=self.startup_s,
            checkpoint_s=self.checkpoint_s,
            last_checkpoint_at=self.last_checkpoint_at,
            sigterm_save_s=self.sigterm_save_s,
            sigterm_at=self.sigterm_at,
            kill_at=self.kill_at,
        )


class ActiveJob(NamedTuple):
    """A job not in a terminal state, with its live attempt (None while it holds no run)."""

    job: StoredJob
    attempt: StoredAttempt | None

    def to_engine(self) -> Job:
        return self.job.to_engine(self.attempt)


@dataclass(frozen=True, slots=True)
class EventRecord:
    """A lifecycle transition of one job (`from_state` None for the submission)."""

    id: int
    job_id: int
    at: float
    from_state: str | None
    to_state: str
    reason: str
    actor: str
    details: dict[str, Any]


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """Who a token belongs to and what it may do; never the token itself."""

    id: int
    user: str
    role: str
    queues: tuple[str, ...]
    created_at: float
    created_by: str
    revoked_at: float | None
    expires_at: float | None = None
    """When the token stops working (epoch seconds); None: never."""

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def may_submit_to(self, queue: str) -> bool:
        return ANY_QUEUE in self.queues or queue in self.queues


@dataclass(frozen=True, slots=True)
class AuditEntry:
    id: int
    at: float
    actor: str
    action: str
    target: str
    details: dict[str, Any]


class JobDemand(NamedTuple):
    """What owed vs delivered GPU-hours read of a job (`Store.accounting_rows`)."""

    id: int
    queue: str
    tier: int
    gpus: int
    """replicas × gpus"""
    submit_at: float
    finished_at: float | None


class AttemptSpan(NamedTuple):
    """When an attempt held its job's GPUs (`ended_at` None: it still does)."""

    job_id: int
    started_at: float
    ended_at: float | None


@dataclass(frozen=True, slots=True)
class HistorySample:
    """One sample of the cluster's history: the figures at `at` (`warden.server.history`)."""

    at: float
    cluster: dict[str, Any]
    queues: dict[str, Any]
    lost_totals: dict[str, float]
    """Lost work of every preemption recorded by `at`, GPU-seconds per leaf queue."""


@dataclass(frozen=True, slots=True)
class PreemptionRecord:
    """An attempt that got SIGTERM for a preemption, a reclaim or an eviction, with its victim
    and preemptor jobs and the reason its PREEMPTING event gave."""

    job_id: int
    attempt: int
    victim_queue: str
    victim_tier: int
    victim_user: str
    kind: str
    sigterm_at: float
    kill_at: float | None
    ended_at: float | None
    lost_work_gpu_s: float | None
    preemptor: str | None
    preemptor_queue: str | None
    preemptor_tier: int | None
    reason: str | None


class CurrentPolicy(NamedTuple):
    """The policy in force: unpacks as `(version, source, resolved)`."""

    version: int
    source: str
    resolved: dict[str, Any]


@dataclass(frozen=True, slots=True)
class PolicyRecord:
    version: int
    applied_at: float
    applied_by: str
    source: str
    resolved: dict[str, Any]


class LedgerState(NamedTuple):
    """The persisted fair-share ledger: unpacks as `(at, {queue: usage})`."""

    at: float
    usage: dict[str, float]

    def to_engine(self) -> UsageLedger:
        return UsageLedger(at=self.at, usage=dict(self.usage))


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """A node as discovered; `gpu_names` are the device names (e.g. "NVIDIA H100 80GB HBM3")."""

    name: str
    gpus: int
    cpu: int = 0
    memory: int = 0
    flavor: str = DEFAULT_FLAVOR
    block: str | None = None
    gpu_names: tuple[str, ...] = field(default=())
    updated_at: float = 0.0

    @classmethod
    def from_engine(cls, node: Node, *, updated_at: float, gpu_names: Sequence[str] = ()) -> NodeRecord:
        return cls(node.name, node.gpus, node.cpu, node.memory, node.flavor, node.block, tuple(gpu_names), updated_at)

    def to_engine(self) -> Node:
        return Node(self.name, self.gpus, cpu=self.cpu, memory=self.memory, flavor=self.flavor, block=self.block)


# ---------------------------------------------------------------------------------------------
# The repository


class GroupCommit:
    """Commit concurrent writes together: each caller returns once its item is durable.

    A commit waits for the disk (fsync); while one runs, the writes that arrive queue up and
    the next caller to get the turn commits all of them in one transaction. One writer pays
    one fsync per item as before; many concurrent writers share each fsync. If a batch fails,
    its items are retried one by one, so one bad item fails only its own caller.
    """

    def __init__(self, apply: Any) -> None:
        self._apply = apply
        self._queue: list[tuple[Any, list[Any]]] = []
        self._queue_lock = threading.Lock()
        self._turn = threading.Lock()

    def run(self, item: Any) -> Any:
        slot: list[Any] = [None, None, False]  # result, error, done
        with self._queue_lock:
            self._queue.append((item, slot))
        with self._turn:
            if not slot[2]:
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                self._commit(batch)
        if slot[1] is not None:
            raise slot[1]
        return slot[0]

    def _commit(self, batch: list[tuple[Any, list[Any]]]) -> None:
        try:
            results = self._apply([item for item, _ in batch])
        except Exception as err:
            if len(batch) == 1:
                batch[0][1][1:] = [err, True]  # handed to its caller
                return
            for one in batch:
                self._commit([one])
            return
        for (_, slot), result in zip(batch, results):
            slot[0], slot[2] = result, True


class Store:
    """The control plane's database. Every method is one transaction; see the module docstring."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._writer = writer(engine)
        self._submissions = GroupCommit(self._insert_jobs)
        self._write_lock: threading.Lock | contextlib.nullcontext[None] = (
            threading.Lock() if engine.dialect.name == "sqlite" else contextlib.nullcontext()
        )
        self._active: dict[int, ActiveJob] = {}
        """`active()`'s rows as last read, by job id: a row is read again only once its
        `version` moved (every write to a job or its attempts bumps it)."""
        self._active_lock = threading.Lock()

    @classmethod
    def open(cls, url: str | None = None, *, upgrade: bool = True) -> Store:
        """Connect to `url` (default: the user's SQLite file) and, unless told not to, migrate."""
        engine = connect(url)
        if upgrade:
            migrate(engine)
        return cls(engine)

    def close(self) -> None:
        """Close the pooled connections."""
        self.engine.dispose()

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        # SQLite admits one writer at a time and makes the others poll with growing sleeps
        # (its busy handler); queueing this process's writers on a lock instead hands the
        # database over the moment a commit ends. PostgreSQL needs no such help.
        with self._write_lock, self._writer.begin() as conn:
            yield conn

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            yield conn

    # --- jobs ----------------------------------------------------------------------------------

    def submit(
        self,
        *,
        name: str,
        user: str,
        queue: str,
        tier: int,
        command: Sequence[str],
        actor: str,
        now: float,
        state: JobState | str = JobState.PENDING,
        replicas: int = 1,
        gpus: int = 1,
        cpu: int = 0,
        memory: int = 0,
        flavor: str | None = None,
        placement: str = "any",
        lease_s: float | None = None,
        grace_s: float | None = None,
        expected_duration_s: float | None = None,
        workdir: str = "",
        env: Mapping[str, str] | None = None,
        not_before: float | None = None,
        reason: str = "submitted",
        details: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        request_digest: str | None = None,
    ) -> int:
        """Insert a job and its first event atomically; return its id.

        `submit_at` is `max(now, newest submit_at + 1e-6)`, read and written under a lock, so
        submission times strictly increase in id order even when clocks or threads race.
        `pending_since` stays None (the engine reads that as "since submit").

        With an `idempotency_key` the user already used, nothing is inserted and
        `DuplicateSubmission` names the earlier job (checked under the submission lock, so
        two concurrent retries create one job).
        """
        initial = _submit_state(state)
        _check_request(tier=tier, replicas=replicas, gpus=gpus, cpu=cpu, memory=memory, placement=placement)
        values: dict[str, Any] = dict(
            name=name,
            user=user,
            queue=queue,
            tier=tier,
            state=initial,
            replicas=replicas,
            gpus=gpus,
            cpu=cpu,
            memory=memory,
            flavor=flavor,
            placement=placement,
            lease_s=lease_s,
            grace_s=grace_s,
            expected_duration_s=expected_duration_s,
            command=_str_list("command", command),
            workdir=workdir,
            env=_str_dict("env", env or {}),
            pending_since=None,
            waited_s=0.0,
            not_before=not_before,
            preempted_at=[],
            attempt=0,
            explanation=None,
            cancel_requested=False,
            version=1,
            idempotency_key=idempotency_key,
            request_digest=request_digest,
        )
        return self._submissions.run((values, now, reason, actor, details))

    def _insert_jobs(
        self, batch: Sequence[tuple[dict[str, Any], float, str, str, Mapping[str, Any] | None]]
    ) -> list[int]:
        """One transaction for every submission that arrived while the previous one committed."""
        ids = []
        with self._write() as conn:
            _advisory_lock(conn, SUBMIT_LOCK_KEY)
            newest = conn.execute(select(JOBS.c.submit_at).order_by(JOBS.c.id.desc()).limit(1)).scalar()
            for values, now, reason, actor, details in batch:
                if values["idempotency_key"] is not None:
                    earlier = _earlier_submission(conn, values["user"], values["idempotency_key"])
                    if earlier is not None:
                        raise DuplicateSubmission(earlier)  # the batch is retried item by item
                newest = values["submit_at"] = _next_submit_at(now, newest)
                job_id = _new_id(conn.execute(insert(JOBS), values))
                _add_event(conn, job_id, now, None, values["state"], reason, actor, details)
                ids.append(job_id)
        return ids

    def next_submission(self, now: float) -> tuple[int, float]:
        """The id and `submit_at` a submission at `now` would get if it were the next one (a
        dry run's job): the id after the newest, and `submit` as `submit` computes it."""
        with self._read() as conn:
            newest = conn.execute(select(JOBS.c.id, JOBS.c.submit_at).order_by(JOBS.c.id.desc()).limit(1)).first()
        if newest is None:
            return 1, now
        return newest[0] + 1, _next_submit_at(now, newest[1])

    def find_submission(self, user: str, idempotency_key: str) -> EarlierSubmission | None:
        """The job `user` submitted with `idempotency_key`, if any."""
        with self._read() as conn:
            return _earlier_submission(conn, user, idempotency_key)

    def get(self, job_id: int | str) -> StoredJob | None:
        key = job_key(job_id)
        if key is None:
            return None
        with self._read() as conn:
            row = conn.execute(select(JOBS).where(JOBS.c.id == key)).first()
        return None if row is None else _job(row)

    def list(
        self,
        queue: str | None = None,
        state: JobState | str | Iterable[JobState | str] | None = None,
        user: str | None = None,
        limit: int | None = None,
    ) -> tuple[StoredJob, ...]:
        """Jobs matching every filter given, oldest (lowest id) first."""
        query = select(JOBS).order_by(JOBS.c.id)
        if queue is not None:
            query = query.where(JOBS.c.queue == queue)
        states = _state_set(state)
        if states is not None:
            query = query.where(JOBS.c.state.in_(sorted(states)))
        if user is not None:
            query = query.where(JOBS.c.user == user)
        if limit is not None:
            query = query.limit(limit)
        with self._read() as conn:
            return tuple(_job(row) for row in conn.execute(query))

    def count_jobs(self, states: Iterable[JobState | str], *, user: str | None = None, queue: str | None = None) -> int:
        """How many jobs are in one of `states`, of `user` and in `queue` where given."""
        query = select(func.count()).select_from(JOBS).where(JOBS.c.state.in_(sorted(_state_set(states) or ())))
        if user is not None:
            query = query.where(JOBS.c.user == user)
        if queue is not None:
            query = query.where(JOBS.c.queue == queue)
        with self._read() as conn:
            return int(conn.execute(query).scalar_one())

    def events(self, job_id: int | str) -> tuple[EventRecord, ...]:
        """The job's transitions, oldest first (empty for an unknown job)."""
        key = job_key(job_id)
        if key is None:
            return ()
        query = select(EVENTS).where(EVENTS.c.job_id == key).order_by(EVENTS.c.id)
        with self._read() as conn:
            return tuple(_record(EventRecord, row) for row in conn.execute(query))

    def active(self) -> tuple[ActiveJob, ...]:
        """Every job not in a terminal state, with its live attempt, in id order: what a
        restarted server hands the engine, and each pass's snapshot.

        A pass asks for this every time while thousands of jobs wait and few change, so it
        reads the ids and versions of the unfinished jobs, then whole rows only for the jobs
        whose version moved since the last call (`fresh_active` reads every row)."""
        with self._active_lock, self._read() as conn:
            unfinished = select(JOBS.c.id, JOBS.c.version).where(JOBS.c.state.not_in(sorted(TERMINAL_STATES)))
            versions = {int(i): int(v) for i, v in conn.execute(unfinished)}
            known = self._active
            stale = [i for i, v in versions.items() if (a := known.get(i)) is None or a.job.version != v]
            rows: dict[int, ActiveJob] = {i: known[i] for i in versions if i in known}
            for start in range(0, len(stale), _READ_CHUNK):
                for a in _active_rows(conn, JOBS.c.id.in_(stale[start : start + _READ_CHUNK])):
                    rows[a.job.id] = a
            # A job that ended between the two reads is read as ended: leave it out.
            self._active = {i: a for i, a in rows.items() if not a.job.state.terminal}
            return tuple(self._active[i] for i in sorted(self._active))

    def fresh_active(self) -> tuple[ActiveJob, ...]:
        """`active()` read whole from the database, every row (what the cached one must equal)."""
        with self._read() as conn:
            return tuple(_active_rows(conn, None))

    def transition(
        self,
        job_id: int | str,
        to_state: JobState | str,
        /,
        *,
        reason: str,
        actor: str,
        now: float,
        expect_state: JobState | str | Iterable[JobState | str] | None = None,
        expect_cancel_requested: bool | None = None,
        details: Mapping[str, Any] | None = None,
        attempt_fields: Mapping[str, Any] | None = None,
        new_attempt: Mapping[str, Any] | None = None,
        **field_updates: Any,
    ) -> bool:
        """Move a job to `to_state` if it is in `expect_state` (any state when None) and, when
        `expect_cancel_requested` is given, its cancel flag has that value (a cancel of a job
        that holds resources marks it without changing its state). In the same transaction,
        `new_attempt` (the arguments of `start_attempt` but the job id) records a new attempt and
        makes it the job's current one; `attempt_fields` then updates the current attempt's
        fields (as `update_attempt`).

        Compare-and-set: returns False and changes nothing when the job is elsewhere (another
        actor got there first). Otherwise applies `field_updates`, bumps `version` and records
        the event, in one transaction. Unless given: entering a terminal state sets
        `finished_at = now`; leaving the waiting states clears the pending `explanation`.
        Raises JobNotFound for an unknown id.
        """
        target = JobState(to_state).value
        expected = _state_set(expect_state)
        values = _job_updates(field_updates)
        if target in TERMINAL_STATES:
            values.setdefault("finished_at", now)
        if target not in WAITING_STATES:
            values.setdefault("explanation", None)
        key = _require_key(job_id)
        with self._write() as conn:
            row = conn.execute(
                select(JOBS.c.state, JOBS.c.cancel_requested).where(JOBS.c.id == key).with_for_update()
            ).first()
            if row is None:
                raise JobNotFound(job_id)
            current, cancel_requested = row
            if expected is not None and current not in expected:
                return False
            if expect_cancel_requested is not None and bool(cancel_requested) is not expect_cancel_requested:
                return False
            conn.execute(
                update(JOBS).where(JOBS.c.id == key).values(state=target, version=JOBS.c.version + 1, **values)
            )
            _add_event(conn, key, now, current, target, reason, actor, details)
            if new_attempt is not None:
                created = _new_attempt(key, **new_attempt)
                conn.execute(update(JOBS).where(JOBS.c.id == key).values(attempt=created["number"]))
                conn.execute(insert(ATTEMPTS), created)
            if attempt_fields:
                number = conn.execute(select(JOBS.c.attempt).where(JOBS.c.id == key)).scalar_one()
                _update_attempt(conn, key, number, _attempt_updates(attempt_fields))
        return True

    def update(self, job_id: int | str, /, *, expect_version: int | None = None, **field_updates: Any) -> bool:
        """Change a job's fields without a state change (no event); bumps `version`.

        With `expect_version`, only if the job is still at that version (optimistic locking).
        Returns False when that check fails; raises JobNotFound for an unknown id.
        """
        values = _job_updates(field_updates)
        key = _require_key(job_id)
        query = update(JOBS).where(JOBS.c.id == key)
        if expect_version is not None:
            query = query.where(JOBS.c.version == expect_version)
        with self._write() as conn:
            if conn.execute(query.values(version=JOBS.c.version + 1, **values)).rowcount:
                return True
            if conn.execute(select(JOBS.c.id).where(JOBS.c.id == key)).first() is None:
                raise JobNotFound(job_id)
        return False

    def set_explanations(self, explanations: Mapping[int | str, Mapping[str, Any] | None]) -> None:
        """Store the engine's latest explanation of many pending jobs in one executemany.

        Each changed row's `version` is bumped; pass only the explanations that changed to
        keep a pass cheap. Unknown ids are ignored (the job may have been purged).
        """
        params = []
        for job_id, explanation in explanations.items():
            key = job_key(job_id)
            if key is not None:
                params.append({"b_id": key, "b_explanation": None if explanation is None else dict(explanation)})
        if not params:
            return
        query = (
            update(JOBS)
            .where(JOBS.c.id == bindparam("b_id"))
            .values(explanation=bindparam("b_explanation", type_=JSON(none_as_null=True)), version=JOBS.c.version + 1)
        )
        with self._write() as conn:
            conn.execute(query, params)

    # --- attempts ------------------------------------------------------------------------------

    def start_attempt(
        self,
        job_id: int | str,
        number: int,
        started_at: float,
        assignment: Iterable[ReplicaPlacement | Mapping[str, Any]],
        flavor: str | None = None,
        borrowing: bool = False,
        handle: Mapping[str, Any] | None = None,
        log_dir: str = "",
        *,
        startup_s: float | None = None,
        sigterm_save_s: float | None = None,
    ) -> StoredAttempt:
        """Record a new running attempt and make it the job's current one (`jobs.attempt`).

        The job's state is the caller's to move (`transition`); the two are separate so an
        executor can record the run as soon as it exists. Raises JobNotFound for an unknown id
        and IntegrityError when this attempt number was already used.
        """
        key = _require_key(job_id)
        values = _new_attempt(
            key, number, started_at, assignment, flavor, borrowing, handle, log_dir, startup_s, sigterm_save_s
        )
        with self._write() as conn:
            bumped = conn.execute(
                update(JOBS).where(JOBS.c.id == key).values(attempt=number, version=JOBS.c.version + 1)
            ).rowcount
            if not bumped:
                raise JobNotFound(job_id)
            conn.execute(insert(ATTEMPTS), values)
            row = conn.execute(_attempt_query(key, number)).one()
        return _attempt(row)

    def update_attempt(self, job_id: int | str, number: int, /, **field_updates: Any) -> bool:
        """Record facts about an attempt (checkpoints, SIGTERM, kill deadline, handle…).

        Bumps the job's `version` too, since what `describe` shows changed. Returns False when
        there is no such attempt.
        """
        values = _attempt_updates(field_updates)
        key = job_key(job_id)
        if key is None:
            return False
        if not values:
            return self.attempt(key, number) is not None
        with self._write() as conn:
            return _update_attempt(conn, key, number, values)

    def end_attempt(
        self,
        job_id: int | str,
        number: int,
        ended_at: float,
        exit_codes: Sequence[int],
        reason: str,
        *,
        preempted_for: str | None = None,
    ) -> bool:
        """Mark an attempt exited, with why (completed|failed|preempted|cancelled|killed|evicted).
        Returns False when there is no such attempt."""
        if reason not in END_REASONS:
            raise ValueError(f"reason: expected one of {sorted(END_REASONS)}, got {reason!r}")
        key = job_key(job_id)
        if key is None:
            return False
        values = {"state": "exited", "ended_at": ended_at, "exit_codes": [int(c) for c in exit_codes], "reason": reason}
        if preempted_for is not None:
            values["preempted_for"] = str(preempted_for)
        with self._write() as conn:
            return _update_attempt(conn, key, number, values)

    def attempt(self, job_id: int | str, number: int) -> StoredAttempt | None:
        key = job_key(job_id)
        if key is None:
            return None
        with self._read() as conn:
            row = conn.execute(_attempt_query(key, number)).first()
        return None if row is None else _attempt(row)

    def attempts(self, job_id: int | str) -> tuple[StoredAttempt, ...]:
        """Every attempt of a job, first first."""
        key = job_key(job_id)
        if key is None:
            return ()
        query = select(ATTEMPTS).where(ATTEMPTS.c.job_id == key).order_by(ATTEMPTS.c.number)
        with self._read() as conn:
            return tuple(_attempt(row) for row in conn.execute(query))

    def all_attempts(self) -> tuple[StoredAttempt, ...]:
        """Every attempt of every job (the history owed-vs-delivered accounting reads)."""
        query = select(ATTEMPTS).order_by(ATTEMPTS.c.job_id, ATTEMPTS.c.number)
        with self._read() as conn:
            return tuple(_attempt(row) for row in conn.execute(query))

    def accounting_rows(self) -> tuple[tuple[JobDemand, ...], tuple[AttemptSpan, ...]]:
        """Every job's demand (id order) and every attempt's span (job, number order), in one
        transaction and without the JSON columns: what owed vs delivered GPU-hours are
        computed from, at every `GET /v1/queues` and every history sample."""
        jobs = select(
            JOBS.c.id,
            JOBS.c.queue,
            JOBS.c.tier,
            JOBS.c.gpus * JOBS.c.replicas,
            JOBS.c.submit_at,
            JOBS.c.finished_at,
        ).order_by(JOBS.c.id)
        spans = select(ATTEMPTS.c.job_id, ATTEMPTS.c.started_at, ATTEMPTS.c.ended_at).order_by(
            ATTEMPTS.c.job_id, ATTEMPTS.c.number
        )
        with self._read() as conn:
            demands = tuple(
                JobDemand(int(i), q, int(t), int(g), float(s), f) for i, q, t, g, s, f in conn.execute(jobs)
            )
            return demands, tuple(AttemptSpan(int(j), float(a), b) for j, a, b in conn.execute(spans))

    def ran_since(self, since: float) -> tuple[tuple[StoredJob, tuple[StoredAttempt, ...]], ...]:
        """The jobs submitted at `since` or later that have had an attempt, in (submit, id)
        order, each with its attempts (first first), read in one transaction: what `warden
        history export` turns into a trace."""
        ran = select(JOBS.c.id).where(JOBS.c.submit_at >= since, JOBS.c.attempt > 0)
        jobs = select(JOBS).where(JOBS.c.id.in_(ran)).order_by(JOBS.c.submit_at, JOBS.c.id)
        attempts = select(ATTEMPTS).where(ATTEMPTS.c.job_id.in_(ran)).order_by(ATTEMPTS.c.job_id, ATTEMPTS.c.number)
        with self._read() as conn:
            rows = [_job(row) for row in conn.execute(jobs)]
            runs: dict[int, builtins.list[StoredAttempt]] = {}
            for row in conn.execute(attempts):
                a = _attempt(row)
                runs.setdefault(a.job_id, []).append(a)
        return tuple((job, tuple(runs.get(job.id, ()))) for job in rows)

    def running_attempts(self) -> tuple[StoredAttempt, ...]:
        """Attempts still running or terminating: what executors must re-adopt after a restart."""
        query = (
            select(ATTEMPTS)
            .where(ATTEMPTS.c.state.in_(sorted(LIVE_ATTEMPT_STATES)))
            .order_by(ATTEMPTS.c.job_id, ATTEMPTS.c.number)
        )
        with self._read() as conn:
            return tuple(_attempt(row) for row in conn.execute(query))

    # --- tokens --------------------------------------------------------------------------------

    def create_token(
        self,
        user: str,
        role: str,
        queues: Sequence[str],
        created_by: str,
        now: float,
        expires_at: float | None = None,
    ) -> str:
        """Mint a token, good until `expires_at` (None: until revoked); return it. Only its
        SHA-256 is stored: this is the one time it is seen."""
        if expires_at is not None and not expires_at > now:
            raise ValueError(f"expires_at: {expires_at!r} is not after now ({now!r})")
        token = secrets.token_urlsafe(32)
        values = _token_values(token, user, role, queues)
        with self._write() as conn:
            conn.execute(
                insert(TOKENS), {**values, "created_at": now, "created_by": created_by, "expires_at": expires_at}
            )
        return token

    def ensure_token(
        self, token: str, user: str, role: str, queues: Sequence[str], now: float, created_by: str = "warden"
    ) -> TokenInfo:
        """Make an operator-given (bootstrap) token exist with this user, role and queues.

        Idempotent: a second call updates the grant to what the operator gives now. A token
        that was revoked stays revoked (the returned `revoked_at` says so); restarting the
        server with the same flag must not resurrect it.
        """
        if not token:
            raise ValueError("token: must not be empty")
        values = _token_values(token, user, role, queues)
        with self._write() as conn:
            _advisory_lock(conn, TOKEN_LOCK_KEY)
            by_hash = TOKENS.c.token_hash == values["token_hash"]
            if conn.execute(select(TOKENS.c.id).where(by_hash)).first() is None:
                conn.execute(insert(TOKENS), {**values, "created_at": now, "created_by": created_by})
            else:
                conn.execute(
                    update(TOKENS)
                    .where(by_hash)
                    .values(user=values["user"], role=values["role"], queues=values["queues"])
                )
            row = conn.execute(select(TOKENS).where(by_hash)).one()
        return _token(row)

    def token_for(self, token: str) -> TokenInfo | None:
        """Who presents this token, or None when it is unknown or revoked (an expired one is
        returned: its `expires_at` says so)."""
        info = self.lookup_token(token)
        return None if info is None or info.revoked_at is not None else info

    def lookup_token(self, token: str) -> TokenInfo | None:
        """The grant of this token, revoked or not; None when it is unknown."""
        query = select(TOKENS).where(TOKENS.c.token_hash == hash_token(token))
        with self._read() as conn:
            row = conn.execute(query).first()
        return None if row is None else _token(row)

    def token_by_id(self, token_id: int) -> TokenInfo | None:
        with self._read() as conn:
            row = conn.execute(select(TOKENS).where(TOKENS.c.id == token_id)).first()
        return None if row is None else _token(row)

    def revoke_token(self, token_id: int, now: float) -> bool:
        """Revoke by id (as `list_tokens` shows). False when unknown or already revoked."""
        query = update(TOKENS).where(TOKENS.c.id == token_id, TOKENS.c.revoked_at.is_(None)).values(revoked_at=now)
        with self._write() as conn:
            return bool(conn.execute(query).rowcount)

    def list_tokens(self) -> tuple[TokenInfo, ...]:
        """Every token's grant, revoked ones included, in creation order; never a secret."""
        with self._read() as conn:
            return tuple(_token(row) for row in conn.execute(select(TOKENS).order_by(TOKENS.c.id)))

    # --- the database itself --------------------------------------------------------------------

    def database_id(self) -> str:
        """The database's identity, made once by its migration: what a state directory is bound to."""
        with self._read() as conn:
            value = conn.execute(select(META.c.value).where(META.c.key == "database_id")).scalar_one_or_none()
        if value is None:
            raise RuntimeError("the database has no database_id in its meta table: it was not migrated by warden")
        return str(value)

    # --- audit ---------------------------------------------------------------------------------

    def audit(self, actor: str, action: str, target: str, details: Mapping[str, Any] | None, now: float) -> int:
        """Append to the audit trail; return the entry's id. The database refuses any change
        to an entry once written."""
        with self._write() as conn:
            result = conn.execute(
                insert(AUDIT),
                {"at": now, "actor": actor, "action": action, "target": target, "details": dict(details or {})},
            )
            return _new_id(result)

    def audit_log(self, limit: int | None = None) -> tuple[AuditEntry, ...]:
        """The audit trail, newest first (`limit`: only the newest that many)."""
        query = select(AUDIT).order_by(AUDIT.c.id.desc())
        if limit is not None:
            query = query.limit(limit)
        with self._read() as conn:
            return tuple(_record(AuditEntry, row) for row in conn.execute(query))

    # --- policies ------------------------------------------------------------------------------

    def apply_policy(self, source_text: str, resolved: Mapping[str, Any], actor: str, now: float) -> int:
        """Record a new policy version (the text as given and its resolved form); return it."""
        with self._write() as conn:
            result = conn.execute(
                insert(POLICIES),
                {"applied_at": now, "applied_by": actor, "source": source_text, "resolved": dict(resolved)},
            )
            return _new_id(result)

    def current_policy(self) -> CurrentPolicy | None:
        """The newest policy as `(version, source, resolved)`, or None before any was applied."""
        query = (
            select(POLICIES.c.version, POLICIES.c.source, POLICIES.c.resolved)
            .order_by(POLICIES.c.version.desc())
            .limit(1)
        )
        with self._read() as conn:
            row = conn.execute(query).first()
        return None if row is None else CurrentPolicy(int(row.version), row.source, dict(row.resolved))

    def policy_history(self, limit: int | None = None) -> tuple[PolicyRecord, ...]:
        """Applied policies, newest first."""
        query = select(POLICIES).order_by(POLICIES.c.version.desc())
        if limit is not None:
            query = query.limit(limit)
        with self._read() as conn:
            return tuple(_record(PolicyRecord, row) for row in conn.execute(query))

    # --- fair-share ledger ---------------------------------------------------------------------

    def load_ledger(self) -> LedgerState:
        """The saved ledger as `(at, {queue: usage})`; `(0.0, {})` when none was saved."""
        with self._read() as conn:
            rows = conn.execute(select(LEDGER)).all()
        if not rows:
            return LedgerState(0.0, {})
        return LedgerState(max(float(r.at) for r in rows), {r.queue: float(r.usage) for r in rows})

    def save_ledger(self, at: float, usage: Mapping[str, float]) -> None:
        """Replace the saved ledger with `usage` as of `at` (queues absent now are dropped)."""
        params = [{"queue": q, "usage": float(u), "at": at} for q, u in usage.items()]
        with self._write() as conn:
            conn.execute(delete(LEDGER))
            if params:
                conn.execute(insert(LEDGER), params)

    # --- nodes ---------------------------------------------------------------------------------

    def replace_nodes(self, nodes: Iterable[NodeRecord]) -> None:
        """Replace the recorded cluster with `nodes` (as discovered at the server's start)."""
        params = [
            {
                "name": n.name,
                "gpus": n.gpus,
                "cpu": n.cpu,
                "memory": n.memory,
                "flavor": n.flavor,
                "block": n.block,
                "gpu_names": builtins.list(n.gpu_names),
                "updated_at": n.updated_at,
            }
            for n in nodes
        ]
        with self._write() as conn:
            conn.execute(delete(NODES))
            if params:
                conn.execute(insert(NODES), params)

    def nodes(self) -> tuple[NodeRecord, ...]:
        """The recorded nodes, by name."""
        with self._read() as conn:
            rows = conn.execute(select(NODES).order_by(NODES.c.name)).all()
        return tuple(
            NodeRecord(r.name, r.gpus, r.cpu, r.memory, r.flavor, r.block, tuple(r.gpu_names), r.updated_at)
            for r in rows
        )

    # --- history -------------------------------------------------------------------------------

    def record_sample(self, sample: HistorySample, keep_after: float) -> None:
        """Store a sample and drop the samples older than `keep_after`, in one transaction."""
        values = {
            "at": sample.at,
            "cluster": dict(sample.cluster),
            "queues": dict(sample.queues),
            "lost_totals": dict(sample.lost_totals),
        }
        with self._write() as conn:
            conn.execute(insert(SAMPLES), values)
            conn.execute(delete(SAMPLES).where(SAMPLES.c.at < keep_after))

    def last_sample(self) -> HistorySample | None:
        """The newest sample: what the next one counts from."""
        query = select(SAMPLES).order_by(SAMPLES.c.at.desc(), SAMPLES.c.id.desc()).limit(1)
        with self._read() as conn:
            row = conn.execute(query).first()
        return None if row is None else _sample(row)

    def samples(self, since: float, until: float, most: int) -> tuple[HistorySample, ...]:
        """The samples taken from `since` to `until`, oldest first. Of more than `most`, `most`
        spread evenly from the first to the last: only their ids are read to choose them."""
        where = (SAMPLES.c.at >= since) & (SAMPLES.c.at <= until)
        rows: builtins.list[Row[Any]] = []
        with self._read() as conn:
            ids = builtins.list(
                conn.execute(select(SAMPLES.c.id).where(where).order_by(SAMPLES.c.at, SAMPLES.c.id)).scalars()
            )
            chosen = evenly(ids, most)
            for start in range(0, len(chosen), _READ_CHUNK):
                rows.extend(conn.execute(select(SAMPLES).where(SAMPLES.c.id.in_(chosen[start : start + _READ_CHUNK]))))
        rows.sort(key=lambda r: (r.at, r.id))
        return tuple(_sample(r) for r in rows)

    def preemption_counts(self, after: float, until: float) -> dict[str, int]:
        """Per leaf queue, the attempts whose SIGTERM for a preemption, reclaim or eviction came
        after `after`, up to `until`."""
        query = (
            select(JOBS.c.queue, func.count())
            .select_from(ATTEMPTS.join(JOBS, JOBS.c.id == ATTEMPTS.c.job_id))
            .where(
                ATTEMPTS.c.preemption_kind.is_not(None), ATTEMPTS.c.sigterm_at > after, ATTEMPTS.c.sigterm_at <= until
            )
            .group_by(JOBS.c.queue)
        )
        with self._read() as conn:
            return {str(q): int(n) for q, n in conn.execute(query)}

    def lost_work_totals(self) -> dict[str, float]:
        """Per leaf queue, the lost work (GPU-seconds) of every preempted, reclaimed or evicted
        attempt whose exit was recorded so far."""
        query = (
            select(JOBS.c.queue, func.sum(ATTEMPTS.c.lost_work_gpu_s))
            .select_from(ATTEMPTS.join(JOBS, JOBS.c.id == ATTEMPTS.c.job_id))
            .where(ATTEMPTS.c.preemption_kind.is_not(None), ATTEMPTS.c.lost_work_gpu_s.is_not(None))
            .group_by(JOBS.c.queue)
        )
        with self._read() as conn:
            return {str(q): float(total or 0.0) for q, total in conn.execute(query)}

    def preemptions(self, since: float, limit: int) -> tuple[PreemptionRecord, ...]:
        """The attempts preempted, reclaimed or evicted at `since` or later, newest first, at most
        `limit`: each with its victim and preemptor jobs and its PREEMPTING event's reason."""
        query = (
            select(
                ATTEMPTS.c.job_id,
                ATTEMPTS.c.number,
                ATTEMPTS.c.preemption_kind,
                ATTEMPTS.c.sigterm_at,
                ATTEMPTS.c.kill_at,
                ATTEMPTS.c.ended_at,
                ATTEMPTS.c.lost_work_gpu_s,
                ATTEMPTS.c.preempted_for,
                ATTEMPTS.c.reason,
                JOBS.c.queue,
                JOBS.c.tier,
                JOBS.c.user,
            )
            .select_from(ATTEMPTS.join(JOBS, JOBS.c.id == ATTEMPTS.c.job_id))
            .where(ATTEMPTS.c.preemption_kind.is_not(None), ATTEMPTS.c.sigterm_at >= since)
            .order_by(ATTEMPTS.c.sigterm_at.desc(), ATTEMPTS.c.job_id.desc(), ATTEMPTS.c.number.desc())
            .limit(limit)
        )
        events: dict[int, builtins.list[tuple[float, str]]] = {}
        with self._read() as conn:
            rows = conn.execute(query).all()
            preemptors = _queues_and_tiers(conn, (r.preempted_for for r in rows))
            victims = sorted({int(r.job_id) for r in rows})
            for start in range(0, len(victims), _READ_CHUNK):
                chunk = victims[start : start + _READ_CHUNK]
                preempting = select(EVENTS.c.job_id, EVENTS.c.at, EVENTS.c.reason).where(
                    EVENTS.c.job_id.in_(chunk), EVENTS.c.to_state == JobState.PREEMPTING.value
                )
                for j, at, reason in conn.execute(preempting):
                    events.setdefault(int(j), []).append((float(at), str(reason)))
        out = []
        for r in rows:
            key = job_key(r.preempted_for) if r.preempted_for else None
            by = preemptors.get(key) if key is not None else None
            said = events.get(int(r.job_id))
            reason = min(said, key=lambda e: abs(e[0] - r.sigterm_at))[1] if said else r.reason
            out.append(
                PreemptionRecord(
                    job_id=int(r.job_id),
                    attempt=int(r.number),
                    victim_queue=r.queue,
                    victim_tier=int(r.tier),
                    victim_user=r.user,
                    kind=r.preemption_kind,
                    sigterm_at=float(r.sigterm_at),
                    kill_at=r.kill_at,
                    ended_at=r.ended_at,
                    lost_work_gpu_s=r.lost_work_gpu_s,
                    preemptor=r.preempted_for,
                    preemptor_queue=by[0] if by else None,
                    preemptor_tier=by[1] if by else None,
                    reason=reason,
                )
            )
        return tuple(out)

    def preemption_links(self, job_ids: Iterable[int | str]) -> tuple[Preempted, ...]:
        """What `warden.engine.cycles` reads to tell whether these jobs are in a preemption
        cycle: every preemption, reclaim or eviction of one of them, and every preemption one
        of them caused of a job that also preempted one of them (the only ones that can make
        a pair alternate), oldest first."""
        ids = sorted({k for j in job_ids if (k := job_key(j)) is not None})
        kinds = ATTEMPTS.c.preemption_kind.is_not(None)
        columns = (ATTEMPTS.c.sigterm_at, ATTEMPTS.c.job_id, ATTEMPTS.c.preempted_for, ATTEMPTS.c.preemption_kind)
        links: builtins.list[Preempted] = []

        def read(conn: Connection, where: Any) -> None:
            for at, victim, by, kind in conn.execute(
                select(*columns).where(kinds, ATTEMPTS.c.sigterm_at.is_not(None), where)
            ):
                links.append(Preempted(float(at), str(victim), by, str(kind)))

        with self._read() as conn:
            for start in range(0, len(ids), _READ_CHUNK):
                read(conn, ATTEMPTS.c.job_id.in_(ids[start : start + _READ_CHUNK]))
            # by the primary key: the jobs that preempted ours, and only what ours did to them
            partners = sorted({k for p in links if p.by is not None and (k := job_key(p.by)) is not None} - set(ids))
            names = [str(i) for i in ids]
            for start in range(0, len(partners), _READ_CHUNK):
                for n in range(0, len(names), _READ_CHUNK):
                    read(
                        conn,
                        ATTEMPTS.c.job_id.in_(partners[start : start + _READ_CHUNK])
                        & ATTEMPTS.c.preempted_for.in_(names[n : n + _READ_CHUNK]),
                    )
        links.sort(key=lambda p: (p.at, int(p.victim)))
        return tuple(links)

    def queues_and_tiers(self, job_ids: Iterable[int | str | None]) -> dict[int, tuple[str, int]]:
        """The queue and tier of each of these jobs that exists (ids that name none are left out)."""
        with self._read() as conn:
            return _queues_and_tiers(conn, job_ids)


# ---------------------------------------------------------------------------------------------
# Helpers


def _queues_and_tiers(conn: Connection, job_ids: Iterable[int | str | None]) -> dict[int, tuple[str, int]]:
    wanted = sorted({k for j in job_ids if j is not None and (k := job_key(j)) is not None})
    out: dict[int, tuple[str, int]] = {}
    for start in range(0, len(wanted), _READ_CHUNK):
        chunk = wanted[start : start + _READ_CHUNK]
        for i, q, t in conn.execute(select(JOBS.c.id, JOBS.c.queue, JOBS.c.tier).where(JOBS.c.id.in_(chunk))):
            out[int(i)] = (str(q), int(t))
    return out


def evenly(items: Sequence[Any], most: int) -> builtins.list[Any]:
    """`items` whole when there are at most `most`, else `most` of them spread evenly from the
    first to the last."""
    n = len(items)
    if n <= most:
        return builtins.list(items)
    if most <= 1:
        return builtins.list(items[-most:]) if most == 1 else []
    return [items[round(i * (n - 1) / (most - 1))] for i in range(most)]


def _sample(row: Row[Any]) -> HistorySample:
    return HistorySample(float(row.at), dict(row.cluster), dict(row.queues), dict(row.lost_totals))


def hash_token(token: str) -> str:
    """The stored form of a token: SHA-256, hex. Tokens are 256-bit random, so no salt or
    slow hash is needed: nothing about them can be guessed from the hash."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _new_id(result: CursorResult[Any]) -> int:
    """The autoincrement key of the row a single-row INSERT created."""
    key = result.inserted_primary_key
    if key is None or key[0] is None:
        raise RuntimeError("the database returned no key for the inserted row")
    return int(key[0])


def _advisory_lock(conn: Connection, key: int) -> None:
    """Serialize a read-then-write on PostgreSQL until commit. SQLite needs nothing: its
    writers already hold the database's single write lock (BEGIN IMMEDIATE)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})


def _next_submit_at(now: float, newest: float | None) -> float:
    if newest is None:
        return float(now)
    floor = max(newest + SUBMIT_TICK, math.nextafter(newest, math.inf))
    return max(float(now), floor)


def _add_event(
    conn: Connection,
    job_id: int,
    at: float,
    from_state: str | None,
    to_state: str,
    reason: str,
    actor: str,
    details: Mapping[str, Any] | None,
) -> None:
    conn.execute(
        insert(EVENTS),
        {
            "job_id": job_id,
            "at": at,
            "from_state": from_state,
            "to_state": to_state,
            "reason": reason,
            "actor": actor,
            "details": dict(details or {}),
        },
    )


_READ_CHUNK = 500
"""Ids per `IN (...)` when re-reading changed rows (well under every backend's bound)."""


def _active_rows(conn: Connection, which: Any) -> Iterator[ActiveJob]:
    """Unfinished jobs (of `which`, a condition on `jobs`, or all) with their live attempt, in
    id order: one query."""
    live = (
        (ATTEMPTS.c.job_id == JOBS.c.id)
        & (ATTEMPTS.c.number == JOBS.c.attempt)
        & ATTEMPTS.c.state.in_(sorted(LIVE_ATTEMPT_STATES))
    )
    attempt_cols = [c.label(f"a__{c.name}") for c in ATTEMPTS.c]
    where = JOBS.c.state.not_in(sorted(TERMINAL_STATES))
    query = (
        select(*JOBS.c, *attempt_cols)
        .select_from(JOBS.outerjoin(ATTEMPTS, live))
        .where(where if which is None else where & which)
        .order_by(JOBS.c.id)
    )
    for row in conn.execute(query):
        m = row._mapping
        job = _job_from({c.name: m[c.name] for c in JOBS.c})
        attempt = None
        if m["a__job_id"] is not None:
            attempt = _attempt_from({c.name: m[f"a__{c.name}"] for c in ATTEMPTS.c})
        yield ActiveJob(job, attempt)


def _new_attempt(
    key: int,
    number: int,
    started_at: float,
    assignment: Iterable[ReplicaPlacement | Mapping[str, Any]],
    flavor: str | None = None,
    borrowing: bool = False,
    handle: Mapping[str, Any] | None = None,
    log_dir: str = "",
    startup_s: float | None = None,
    sigterm_save_s: float | None = None,
) -> dict[str, Any]:
    """The row of a new running attempt."""
    return dict(
        job_id=key,
        number=number,
        state="running",
        started_at=started_at,
        assignment=_assignment_json(assignment),
        flavor=flavor,
        borrowing=borrowing,
        startup_s=startup_s,
        checkpoint_s=0.0,
        sigterm_save_s=sigterm_save_s,
        handle=None if handle is None else dict(handle),
        log_dir=log_dir,
    )


def _update_attempt(conn: Connection, job_id: int, number: int, values: Mapping[str, Any]) -> bool:
    where = (ATTEMPTS.c.job_id == job_id) & (ATTEMPTS.c.number == number)
    if not conn.execute(update(ATTEMPTS).where(where).values(**values)).rowcount:
        return False
    conn.execute(update(JOBS).where(JOBS.c.id == job_id).values(version=JOBS.c.version + 1))
    return True


def _attempt_query(job_id: int, number: int) -> Any:
    return select(ATTEMPTS).where(ATTEMPTS.c.job_id == job_id, ATTEMPTS.c.number == number)


def _earlier_submission(conn: Connection, user: str, idempotency_key: str) -> EarlierSubmission | None:
    row = conn.execute(
        select(JOBS.c.id, JOBS.c.request_digest).where(JOBS.c.user == user, JOBS.c.idempotency_key == idempotency_key)
    ).first()
    if row is None:
        return None
    first = conn.execute(
        select(EVENTS.c.to_state).where(EVENTS.c.job_id == row.id).order_by(EVENTS.c.id).limit(1)
    ).scalar()
    return EarlierSubmission(int(row.id), row.request_digest, str(first or JobState.PENDING.value))


def job_key(job_id: int | str) -> int | None:
    """The database key of a user-facing id ("42" or 42); None when it cannot be one."""
    if isinstance(job_id, bool):
        return None
    if isinstance(job_id, int):
        return job_id
    text_id = str(job_id).strip()
    # isdigit() alone takes '¹' and '٣', which int() refuses; ids are int64.
    if not (text_id.isascii() and text_id.isdigit()) or len(text_id) > 19 or int(text_id) >= 2**63:
        return None
    return int(text_id)


def _require_key(job_id: int | str) -> int:
    key = job_key(job_id)
    if key is None:
        raise JobNotFound(job_id)
    return key


def _submit_state(state: JobState | str) -> str:
    value = JobState(state).value
    if value not in SUBMIT_STATES:
        raise ValueError(f"state: a job is submitted PENDING or AWAITING_APPROVAL, got {value!r}")
    return value


def _state_set(state: JobState | str | Iterable[JobState | str] | None) -> frozenset[str] | None:
    if state is None:
        return None
    if isinstance(state, str):  # JobState is a str too
        return frozenset({JobState(state).value})
    return frozenset(JobState(s).value for s in state)


def _check_request(*, tier: int, replicas: int, gpus: int, cpu: int, memory: int, placement: str) -> None:
    if tier not in (1, 2, 3, 4):
        raise ValueError(f"tier: expected 1, 2, 3 or 4, got {tier!r}")
    if replicas < 1:
        raise ValueError(f"replicas: expected at least 1, got {replicas!r}")
    for name, value in (("gpus", gpus), ("cpu", cpu), ("memory", memory)):
        if value < 0:
            raise ValueError(f"{name}: expected a non-negative number, got {value!r}")
    if placement not in PLACEMENTS:
        raise ValueError(f"placement: expected one of pack, block, any, got {placement!r}")


def _str_list(name: str, items: Sequence[str]) -> builtins.list[str]:
    if isinstance(items, str) or not all(isinstance(i, str) for i in items):
        raise ValueError(f"{name}: expected a list of strings, got {items!r}")
    return builtins.list(items)


def _str_dict(name: str, items: Mapping[str, str]) -> dict[str, str]:
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in items.items()):
        raise ValueError(f"{name}: expected a mapping of strings to strings, got {items!r}")
    return dict(items)


def _job_updates(updates: Mapping[str, Any]) -> dict[str, Any]:
    """Validate `transition`/`update` keyword fields and turn them into column values."""
    values: dict[str, Any] = {}
    for name, value in updates.items():
        if name in _JOB_IMMUTABLE or name not in JOBS.c:
            raise ValueError(f"{name}: not a job field that can be updated")
        if name == "placement" and value not in PLACEMENTS:
            raise ValueError(f"placement: expected one of pack, block, any, got {value!r}")
        if name in ("command", "preempted_at"):
            value = builtins.list(value)
        elif name in ("env", "explanation") and value is not None:
            value = dict(value)
        values[name] = value
    return values


def _attempt_updates(updates: Mapping[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, value in updates.items():
        if name in _ATTEMPT_IMMUTABLE or name not in ATTEMPTS.c:
            raise ValueError(f"{name}: not an attempt field that can be updated")
        if name == "state" and value not in ATTEMPT_STATES:
            raise ValueError(f"state: expected one of {sorted(ATTEMPT_STATES)}, got {value!r}")
        if name == "reason" and value is not None and value not in END_REASONS:
            raise ValueError(f"reason: expected one of {sorted(END_REASONS)}, got {value!r}")
        if name == "preemption_kind" and value is not None and value not in PREEMPTION_KINDS:
            raise ValueError(f"preemption_kind: expected one of {sorted(PREEMPTION_KINDS)}, got {value!r}")
        if name == "assignment":
            value = _assignment_json(value)
        elif name == "exit_codes" and value is not None:
            value = [int(c) for c in value]
        elif name == "handle" and value is not None:
            value = dict(value)
        values[name] = value
    return values


def _assignment_json(assignment: Iterable[ReplicaPlacement | Mapping[str, Any]]) -> builtins.list[dict[str, Any]]:
    out = []
    for replica in assignment:
        if isinstance(replica, ReplicaPlacement):
            node, gpus = replica.node, replica.gpus
        else:
            node, gpus = replica["node"], replica.get("gpus", ())
        out.append({"node": str(node), "gpus": [int(g) for g in gpus]})
    return out


def _token_values(token: str, user: str, role: str, queues: Sequence[str]) -> dict[str, Any]:
    if role not in ROLES:
        raise ValueError(f"role: expected user or admin, got {role!r}")
    if not user:
        raise ValueError("user: must not be empty")
    return {"token_hash": hash_token(token), "user": user, "role": role, "queues": _str_list("queues", queues)}


def _job(row: Row[Any]) -> StoredJob:
    return _job_from(row._mapping)


def _job_from(m: Mapping[Any, Any]) -> StoredJob:
    return StoredJob(
        **{
            **{f.name: m[f.name] for f in fields(StoredJob)},
            "state": JobState(m["state"]),
            "command": tuple(m["command"]),
            "env": dict(m["env"]),
            "preempted_at": tuple(float(t) for t in m["preempted_at"]),
            "cancel_requested": bool(m["cancel_requested"]),
            "claim": bool(m["claim"]),
        }
    )


def _attempt(row: Row[Any]) -> StoredAttempt:
    return _attempt_from(row._mapping)


def _attempt_from(m: Mapping[Any, Any]) -> StoredAttempt:
    exit_codes = m["exit_codes"]
    return StoredAttempt(
        **{
            **{f.name: m[f.name] for f in fields(StoredAttempt)},
            "assignment": tuple(ReplicaPlacement(r["node"], tuple(r["gpus"])) for r in m["assignment"]),
            "borrowing": bool(m["borrowing"]),
            "exit_codes": None if exit_codes is None else tuple(exit_codes),
        }
    )


def _token(row: Row[Any]) -> TokenInfo:
    m = row._mapping
    return TokenInfo(
        m["id"],
        m["user"],
        m["role"],
        tuple(m["queues"]),
        m["created_at"],
        m["created_by"],
        m["revoked_at"],
        m["expires_at"],
    )


def _record(cls: Any, row: Row[Any]) -> Any:
    """A dataclass whose fields are all columns of `row`, with JSON objects copied."""
    m = row._mapping
    return cls(**{f.name: (dict(m[f.name]) if isinstance(m[f.name], dict) else m[f.name]) for f in fields(cls)})
