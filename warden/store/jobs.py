"""Jobs, their attempts and their lifecycle events: `Store.submit`, `Store.transition` (the
state's compare-and-set) and every other read and write of the `jobs`, `attempts` and `events`
tables."""

from __future__ import annotations

import builtins
import math
import threading
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any, NamedTuple, cast, get_args

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Row,
    Table,
    bindparam,
    func,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy.types import JSON

from warden.engine import lifecycle
from warden.engine.accounting import LossBasis
from warden.engine.lifecycle import Event
from warden.engine.model import Attempt, Job, JobState, ReplicaPlacement
from warden.store.base import _READ_CHUNK, StoreBase, _advisory_lock, _new_id, _record, _str_list
from warden.store.schema import AttemptRow, EventRow, JobRow, UserStorageRow

JOBS = cast(Table, JobRow.__table__)
ATTEMPTS = cast(Table, AttemptRow.__table__)
EVENTS = cast(Table, EventRow.__table__)
USER_STORAGE = cast(Table, UserStorageRow.__table__)

TERMINAL_STATES = frozenset(s.value for s in JobState if s.terminal)
WAITING_STATES = frozenset(s.value for s in JobState if s.waiting)
EXPORT_FINISHED = frozenset({JobState.SUCCEEDED.value, JobState.FAILED.value})
"""The states in which a job has shown all the work it needs (it ended by itself): an exported
duration of any other rests on an assumption (`warden.server.export.FINISHED`)."""
PLACEMENTS = frozenset({"pack", "block", "any"})
ATTEMPT_STATES = frozenset({"running", "terminating", "exited"})
LIVE_ATTEMPT_STATES = frozenset({"running", "terminating"})
END_REASONS = frozenset({"completed", "failed", "preempted", "cancelled", "killed", "evicted", "timeout"})
PREEMPTION_KINDS = frozenset({"preemption", "reclaim", "eviction"})
"""Why an attempt got SIGTERM when neither a cancel nor a time limit sent it (`attempts.preemption_kind`)."""
LOSS_BASES = frozenset(get_args(LossBasis))
"""What an attempt's lost work rests on (`attempts.lost_work_basis`)."""
SUBMIT_TICK = 1e-6
"""The least gap between two submissions' `submit_at`, so (submit_at, id) order is id order."""
SUBMIT_LOCK_KEY = 0x7761726465_6E01
"""PostgreSQL advisory lock serializing submissions (read the newest submit_at, then insert)."""
_JOB_IMMUTABLE = frozenset({"id", "state", "version", "submit_at", "tier"})
"""Columns `transition`/`update` refuse: the id and submit order are fixed, the state moves only
through `transition`'s compare-and-set, the version only by the store, and a tier is immutable
(DESIGN §2)."""
_JOB_WRITTEN = frozenset({"command", "workdir", "env"})
"""What the submitter wrote to run the job, fixed once stored (`update` refuses it; only
`_drop_oldest` empties a finished job's): its bytes are counted in the user's `user_storage`
row (`stored_bytes`), and that count stays exact."""
_ATTEMPT_IMMUTABLE = frozenset({"job_id", "number"})
HEAD_COLUMNS = tuple(c for c in JOBS.c if c.name not in _JOB_WRITTEN)
"""The columns of a `JobHead`, read where the command, workdir and env are not shown."""


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


@dataclass(frozen=True, slots=True)
class WaitingLimits:
    """The most waiting jobs a submission may join: its user's (None: no limit, as for an
    admin) and its queue's. `submit` counts them in the transaction that inserts the job,
    under the submission lock every server takes, so that servers submitting at once on one
    database never overshoot them."""

    per_user: int | None
    per_queue: int | None


class TooManyWaiting(Exception):
    """`submit` found `waiting` jobs of the user (`field` "user") or of the queue (`field`
    "queue") named `value` waiting, `limit` or more: nothing was inserted."""

    def __init__(self, field: str, value: str, waiting: int, limit: int) -> None:
        super().__init__(f"{field} {value!r} has {waiting} jobs waiting, the limit of {limit}")
        self.field, self.value, self.waiting, self.limit = field, value, waiting, limit


class TooMuchStored(Exception):
    """`submit` found that the job's `adding` bytes (`stored_bytes`) would take what `user`'s
    jobs keep past `limit` even were every finished job's dropped: its unfinished jobs keep
    `kept` bytes. Nothing was inserted, and nothing dropped."""

    def __init__(self, user: str, kept: int, adding: int, limit: int) -> None:
        super().__init__(
            f"user {user!r} keeps {kept} bytes in unfinished jobs; {adding} more would pass the limit of {limit}"
        )
        self.user, self.kept, self.adding, self.limit = user, kept, adding, limit


def stored_bytes(command: Sequence[str], env: Mapping[str, str], workdir: str) -> int:
    """What a job keeps of what its submitter wrote, as `limits.max_stored_bytes_per_user`
    counts it: the UTF-8 bytes of its command's words, of its env's names and values, and of
    its workdir. A finished job keeps them too (`GET /v1/jobs/{id}` shows them) until they are
    dropped to make room for a newer job of its user (`_drop_oldest`)."""
    words = sum(len(w.encode()) for w in command)
    return words + sum(len(k.encode()) + len(v.encode()) for k, v in env.items()) + len(workdir.encode())


@dataclass(frozen=True, slots=True, kw_only=True)
class JobHead:
    """A row of `jobs` without what its submitter wrote to run it (command, workdir, env): all
    that a listing shows, an export reads and the engine schedules, and small, whatever those
    are. `id` is the database key; users see `job_id` (its string form)."""

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
    time_limit_s: float | None
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
    saves_on_sigterm: bool = False
    """Its submitter declared that it saves on SIGTERM (`jobs.saves_on_sigterm`)."""
    command_expired_at: float | None = None
    """When its command, env and workdir were dropped to keep its user within the policy's
    `limits.max_stored_bytes_per_user` (`jobs.command_expired_at`); None while they are kept."""

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
            time_limit=self.time_limit_s,
            waited=self.waited_s,
            pending_since=self.pending_since,
            not_before=self.not_before,
            preempted_at=self.preempted_at,
            claim=self.claim and self.state.waiting,
            attempt=None if live is None else live.to_engine(),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredJob(JobHead):
    """A whole row of `jobs`: its head and what its submitter wrote to run it."""

    command: tuple[str, ...]
    workdir: str
    env: dict[str, str]


def moved(before: Job, after: Job) -> dict[str, Any]:
    """The job-row fields a lifecycle function changed from `before` to `after`, named as the
    jobs table names them: what the server writes is what the lifecycle says."""
    return {
        column: _stored(getattr(after, name))
        for name, column in _MOVED
        if getattr(after, name) != getattr(before, name)
    }


# A job's fields the lifecycle may change, and their columns (state and attempt are written by
# `transition` itself and by the attempt rows).
_MOVED = (
    ("waited", "waited_s"),
    ("pending_since", "pending_since"),
    ("not_before", "not_before"),
    ("preempted_at", "preempted_at"),
    ("claim", "claim"),
    ("time_limit", "time_limit_s"),
)


def _stored(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


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
    lost_work_basis: str | None = None
    """What `lost_work_gpu_s` rests on (`LOSS_BASES`); None while nothing was measured."""
    last_checkpoint_step: int | None = None
    preemption_kind: str | None = None
    """`preemption`, `reclaim` or `eviction` once SIGTERM came for one of them (None: a
    cancel's, a time limit's, or none)."""
    lent: bool = False
    """Started in capacity reserved for a higher-ranked job that may take it back
    (`warden.engine.model.Attempt.lent`)."""
    timed_out: bool = False
    """It ran out its job's time limit: its exit ends the job TIMEOUT (`warden.server.timelimits`)."""

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
            lent=self.lent,
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


class FinishedPart(NamedTuple):
    """The finished jobs of a listing (`JobStore.finished_part`), read in one transaction."""

    ended: frozenset[int]
    """Of the unfinished jobs the listing shows first, those that have ended since they were
    read (into a state it shows): it lists them here, once, as they are now."""
    total: int
    """How many finished jobs match its filters."""
    page: tuple[JobHead, ...]
    """Those of them on its page, by id."""


class ExportWindow(NamedTuple):
    """What `GET /v1/history/export` writes (`JobStore.export_window`), read in one transaction."""

    ids: array[int]
    """The jobs submitted in the window that have had an attempt, in (submit, id) order."""
    unfinished: int
    """How many of them are not SUCCEEDED or FAILED (their duration is `at_least`)."""
    assumed: int
    """How many of the others had a preemption's lost work assumed (their duration is `assumed`)."""


def _check_waiting(conn: Connection, user: str, queue: str, limits: WaitingLimits) -> None:
    """Raise `TooManyWaiting` when `user` or `queue` has as many jobs waiting as `limits` allow."""
    waiting = select(func.count()).select_from(JOBS).where(JOBS.c.state.in_(sorted(WAITING_STATES)))
    for field, value, limit, column in (
        ("user", user, limits.per_user, JOBS.c.user),
        ("queue", queue, limits.per_queue, JOBS.c.queue),
    ):
        if limit is None:
            continue
        count = int(conn.execute(waiting.where(column == value)).scalar_one())
        if count >= limit:
            raise TooManyWaiting(field, value, count, limit)


def _keep_bytes(conn: Connection, values: Mapping[str, Any], limit: int | None, now: float) -> None:
    """Add the job's `stored_bytes` to its user's `user_storage` row. Where that would pass
    `limit` (None: no limit, as for an admin), first drop the command, env and workdir of the
    user's finished jobs, oldest first, until the job fits (`_drop_oldest`); raise
    `TooMuchStored` where even that would not make room. Called under the submission lock, so
    the read and the writes are one step for every server."""
    user = values["user"]
    adding = stored_bytes(values["command"], values["env"], values["workdir"])
    row = USER_STORAGE.c
    found = conn.execute(select(row.stored_bytes).where(row.user == user)).scalar()
    stored = int(found or 0)
    if limit is not None and stored + adding > limit:
        stored -= _drop_oldest(conn, user, stored + adding - limit, limit, adding, stored, now)
    if found is None:
        conn.execute(insert(USER_STORAGE), {"user": user, "stored_bytes": adding})
    else:
        conn.execute(update(USER_STORAGE).where(row.user == user).values(stored_bytes=stored + adding))


_DROP_BATCH = 16
"""Finished jobs read at a time when making room: what dropping holds, whatever the history."""
_TRIM_BYTES = 16 << 20
"""What one transaction of `JobStore._trim_stored` frees at most (and so about what it reads)."""


def _drop_oldest(conn: Connection, user: str, need: int, limit: int, adding: int, stored: int, now: float) -> int:
    """Drop the command, env and workdir of `user`'s oldest finished jobs that still keep them
    until they free `need` bytes; return the bytes freed. Only the jobs dropped are read whole
    (`_DROP_BATCH` at a time), so this reads about what it frees. Raise `TooMuchStored`, having
    dropped nothing (the caller's transaction rolls back), where every one would not do."""
    job = JOBS.c
    candidates = (
        select(job.id, job.command, job.env, job.workdir)
        .where(job.user == user, job.state.in_(sorted(TERMINAL_STATES)), job.command_expired_at.is_(None))
        .order_by(job.id)
    )
    freed, dropped, last = 0, [], 0
    while freed < need:
        batch = conn.execute(candidates.where(job.id > last).limit(_DROP_BATCH)).all()
        if not batch:  # every finished job read: what is left is the unfinished ones'
            raise TooMuchStored(user, stored - freed, adding, limit)
        for job_id, command, env, workdir in batch:
            freed += stored_bytes(command or (), env or {}, workdir or "")
            dropped.append(int(job_id))
            last = int(job_id)
            if freed >= need:
                break
    for start in range(0, len(dropped), _READ_CHUNK):
        conn.execute(
            update(JOBS)
            .where(job.id.in_(dropped[start : start + _READ_CHUNK]))
            .values(command=[], env={}, workdir="", command_expired_at=now, version=job.version + 1)
        )
    return freed


class _Submission(NamedTuple):
    """One `submit` waiting for its turn in `GroupCommit`: the row, its first event and its limits."""

    values: dict[str, Any]
    now: float
    reason: str
    actor: str
    details: Mapping[str, Any] | None
    waiting_limits: WaitingLimits | None
    stored_bytes_limit: int | None


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


class JobStore(StoreBase):
    """The jobs, attempts and events part of `Store`."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self._submissions = GroupCommit(self._insert_jobs)
        self._active: dict[int, ActiveJob] = {}
        """`active()`'s rows as last read, by job id: a row is read again only once its
        `version` moved (every write to a job or its attempts bumps it)."""
        self._active_lock = threading.Lock()

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
        time_limit_s: float | None = None,
        workdir: str = "",
        env: Mapping[str, str] | None = None,
        not_before: float | None = None,
        reason: str = "submitted",
        details: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        request_digest: str | None = None,
        waiting_limits: WaitingLimits | None = None,
        saves_on_sigterm: bool = False,
        stored_bytes_limit: int | None = None,
    ) -> int:
        """Insert a job and its first event atomically; return its id.

        `submit_at` is `max(now, newest submit_at + 1e-6)`, read and written under a lock, so
        submission times strictly increase in id order even when clocks or threads race.
        `pending_since` stays None (the engine reads that as "since submit").

        With an `idempotency_key` the user already used, nothing is inserted and
        `DuplicateSubmission` names the earlier job (checked under the submission lock, so
        two concurrent retries create one job). With `waiting_limits`, `TooManyWaiting` when the
        user or the queue already has that many jobs waiting (counted under the same lock). The
        job's `stored_bytes` are added to its user's `user_storage` row in the same transaction;
        with `stored_bytes_limit`, `TooMuchStored` when they would take it past that limit.
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
            time_limit_s=time_limit_s,
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
            saves_on_sigterm=bool(saves_on_sigterm),
        )
        if stored_bytes_limit is not None:
            self._trim_stored(user, stored_bytes_limit, now)
        return self._submissions.run(
            _Submission(values, now, reason, actor, details, waiting_limits, stored_bytes_limit)
        )

    def _trim_stored(self, user: str, limit: int, now: float) -> None:
        """Bring what `user`'s jobs keep down to `limit` where it is already past it (a limit
        lowered, or jobs kept from before there was one), `_TRIM_BYTES` a transaction: the
        submission then drops no more than its own size under the submission lock, and no
        other write (a lease's renewal) waits behind gigabytes of reads."""
        row = USER_STORAGE.c
        kept = select(row.stored_bytes).where(row.user == user)
        with self._read() as conn:  # the common case, under the limit: no write's turn taken
            found = conn.execute(kept).scalar()
        while found is not None and found > limit:
            try:
                with self._write() as conn:
                    _advisory_lock(conn, SUBMIT_LOCK_KEY)
                    found = conn.execute(kept).scalar()
                    if found is None or found <= limit:
                        return
                    stored = int(found)
                    freed = _drop_oldest(conn, user, min(stored - limit, _TRIM_BYTES), limit, 0, stored, now)
                    conn.execute(update(USER_STORAGE).where(row.user == user).values(stored_bytes=stored - freed))
                    found = stored - freed
            except TooMuchStored:
                return  # nothing finished left to drop: the submission says whether it fits

    def _insert_jobs(self, batch: Sequence[_Submission]) -> list[int]:
        """One transaction for every submission that arrived while the previous one committed."""
        ids = []
        with self._write() as conn:
            _advisory_lock(conn, SUBMIT_LOCK_KEY)
            newest = conn.execute(select(JOBS.c.submit_at).order_by(JOBS.c.id.desc()).limit(1)).scalar()
            for values, now, reason, actor, details, limits, bytes_limit in batch:
                if values["idempotency_key"] is not None:
                    earlier = _earlier_submission(conn, values["user"], values["idempotency_key"])
                    if earlier is not None:
                        raise DuplicateSubmission(earlier)  # the batch is retried item by item
                if limits is not None:
                    _check_waiting(conn, values["user"], values["queue"], limits)
                _keep_bytes(conn, values, bytes_limit, now)
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

    def stored_bytes_of(self, user: str) -> int:
        """The bytes `user`'s jobs keep of what they wrote (`stored_bytes`), every job counted."""
        with self._read() as conn:
            found = conn.execute(select(USER_STORAGE.c.stored_bytes).where(USER_STORAGE.c.user == user)).scalar()
        return int(found or 0)

    def finished_part(
        self,
        *,
        states: Iterable[JobState | str],
        queue: str | None = None,
        user: str | None = None,
        before: Sequence[int] = (),
        offset: int = 0,
        limit: int | None = None,
    ) -> FinishedPart:
        """The finished jobs in `states` (terminal ones) of `queue` and `user` as a listing
        shows them after `before`, the ids of the unfinished jobs it lists first (as read
        from `active()`): how many match (a COUNT), and those that fall in the listing's
        page, `limit` jobs from `offset` (None: every one), by id. The ids of the page are
        found first, then only those jobs' heads are read: whatever the jobs wrote to run
        (command, env) is never read, and a job off the page costs an index entry.

        One read transaction (a snapshot on PostgreSQL too), so that `ended`, the total and
        the page agree: a job of `before` that has ended since is counted here, not there."""
        wanted = sorted(_state_set(states) or ())
        where: builtins.list[ColumnElement[bool]] = [JOBS.c.state.in_(wanted)]
        if queue is not None:
            where.append(JOBS.c.queue == queue)
        if user is not None:
            where.append(JOBS.c.user == user)
        with self._snapshot() as conn:
            ended: set[int] = set()
            for start in range(0, len(before), _READ_CHUNK):
                chunk = before[start : start + _READ_CHUNK]
                ended.update(
                    int(i) for i in conn.execute(select(JOBS.c.id).where(*where, JOBS.c.id.in_(chunk))).scalars()
                )
            total = int(conn.execute(select(func.count()).select_from(JOBS).where(*where)).scalar_one())
            first = len(before) - len(ended)  # the listing's position of the first finished job
            skip = max(0, offset - first)
            take = None if limit is None else offset + limit - max(offset, first)
            if skip >= total or (take is not None and take <= 0):
                return FinishedPart(frozenset(ended), total, ())
            ids = select(JOBS.c.id).where(*where).order_by(JOBS.c.id).offset(skip)
            page = [int(i) for i in conn.execute(ids if take is None else ids.limit(take)).scalars()]
            heads = _heads(conn, page)
        return FinishedPart(frozenset(ended), total, tuple(heads[i] for i in page if i in heads))

    def export_window(self, since: float) -> ExportWindow:
        """The jobs submitted at `since` or later that have had an attempt, in (submit, id)
        order, and how many of them have a duration that rests on an assumption (as
        `warden.server.export.exported_job` decides it), in one read: what the export's
        headers say before its rows are read, `export_batch` at a time."""
        ran = (JOBS.c.submit_at >= since) & (JOBS.c.attempt > 0)
        finished = JOBS.c.state.in_(sorted(EXPORT_FINISHED))
        assumed = (
            select(ATTEMPTS.c.job_id)
            .where(ATTEMPTS.c.job_id == JOBS.c.id, ATTEMPTS.c.lost_work_basis == "assumed")
            .exists()
        )
        count = select(func.count()).select_from(JOBS)
        with self._snapshot() as conn:
            ids = array("q", conn.execute(select(JOBS.c.id).where(ran).order_by(JOBS.c.submit_at, JOBS.c.id)).scalars())
            unfinished = int(conn.execute(count.where(ran, ~finished)).scalar_one())
            guessed = int(conn.execute(count.where(ran, finished, assumed)).scalar_one())
        return ExportWindow(ids, unfinished, guessed)

    def export_batch(self, ids: Sequence[int]) -> builtins.list[tuple[JobHead, tuple[StoredAttempt, ...]]]:
        """The heads of the jobs `ids` (in that order) with their attempts (first first), read
        in one transaction: one batch of an export's rows. A job no longer stored is left out."""
        attempts = select(ATTEMPTS).where(ATTEMPTS.c.job_id.in_(builtins.list(ids)))
        runs: dict[int, builtins.list[StoredAttempt]] = {}
        with self._read() as conn:
            heads = _heads(conn, ids)
            for row in conn.execute(attempts.order_by(ATTEMPTS.c.job_id, ATTEMPTS.c.number)):
                a = _attempt(row)
                runs.setdefault(a.job_id, []).append(a)
        return [(heads[i], tuple(runs.get(i, ()))) for i in ids if i in heads]

    @contextmanager
    def _snapshot(self) -> Iterator[Connection]:
        """A read transaction whose statements all see the database as of its first one: what
        SQLite's read transactions are, and PostgreSQL's at REPEATABLE READ (its default,
        READ COMMITTED, lets each statement see later commits)."""
        with self.engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                yield conn

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
        event: Event,
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
        """Move a job to `to_state` by `event` if it is in `expect_state` (any state when None) and, when
        `expect_cancel_requested` is given, its cancel flag has that value (a cancel of a job
        that holds resources marks it without changing its state). In the same transaction,
        `new_attempt` (the arguments of `start_attempt` but the job id) records a new attempt and
        makes it the job's current one; `attempt_fields` then updates the current attempt's
        fields (as `update_attempt`).

        Compare-and-set: returns False and changes nothing when the job is elsewhere (another
        actor got there first). Otherwise applies `field_updates`, bumps `version` and records
        the event, in one transaction. Unless given: entering a terminal state sets
        `finished_at = now`; leaving the waiting states clears the pending `explanation`.
        Raises JobNotFound for an unknown id, and `lifecycle.IllegalTransition` when the job's
        state has no `event` edge to `to_state` (a bug in the caller: the lifecycle's table is the
        only way a state changes). The flags the event sets (`lifecycle.sets`: a cancel's mark)
        are written with it; `field_updates` may name no flag (ValueError) but one a lifecycle
        function's result carries (`lifecycle.CARRIED_FLAGS`, as `moved` gives it): a flag
        changes by its event alone (`flag`).
        """
        _no_flags({k: v for k, v in field_updates.items() if k not in lifecycle.CARRIED_FLAGS}, attempt_fields)
        return self._move(
            job_id,
            to_state,
            event,
            reason,
            actor,
            now,
            expect_state,
            expect_cancel_requested,
            details,
            {**(attempt_fields or {})},
            new_attempt,
            {**field_updates, **lifecycle.sets(event)},
        )

    def _move(
        self,
        job_id: int | str,
        to_state: JobState | str,
        event: Event,
        reason: str,
        actor: str,
        now: float,
        expect_state: JobState | str | Iterable[JobState | str] | None,
        expect_cancel_requested: bool | None,
        details: Mapping[str, Any] | None,
        attempt_fields: Mapping[str, Any],
        new_attempt: Mapping[str, Any] | None,
        field_updates: Mapping[str, Any],
    ) -> bool:
        """`transition` with its flags checked: the write itself, flags included."""
        target = JobState(to_state).value
        expected = _state_set(expect_state)
        values = _job_updates(dict(field_updates))
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
            lifecycle.check(event, JobState(current), JobState(target))
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

    def note(
        self,
        job_id: int | str,
        state: JobState | str,
        /,
        *,
        reason: str,
        now: float,
        actor: str = "warden",
        **changes: Any,
    ) -> bool:
        """Record an event that changes no state (`Event.NOTED`): the job stays in `state`, where
        it must still be (else False and nothing changes); `changes` go to `transition` (details,
        fields, a cancel-flag expectation)."""
        return self.transition(
            job_id, state, event=Event.NOTED, reason=reason, actor=actor, now=now, expect_state={state}, **changes
        )

    def flag(
        self,
        job_id: int | str,
        state: JobState | str,
        event: Event,
        /,
        *,
        reason: str,
        now: float,
        actor: str = "warden",
        given: object = None,
        expect_cancel_requested: bool | None = None,
        details: Mapping[str, Any] | None = None,
        attempt_fields: Mapping[str, Any] | None = None,
        **field_updates: Any,
    ) -> bool:
        """Record the flag event `event` (`lifecycle.FLAGS`: a hold, a release, a cancel's mark, a
        claim or its end, a time limit run out) on a job that must still be in `state` (else
        False and nothing changes): the flags the table gives for it (`given`: the value it
        carries, a hold's reason) on the job or its current attempt, with the other
        `field_updates` and `attempt_fields`, in one transaction with the event. Raises
        `lifecycle.IllegalTransition` where the event may not happen in `state`."""
        _no_flags(field_updates, attempt_fields)
        changes = lifecycle.flagged(event, JobState(state), given)
        on_attempt = lifecycle.flag(event).attempt
        return self._move(
            job_id,
            state,
            event,
            reason,
            actor,
            now,
            {state},
            expect_cancel_requested,
            details,
            {**(attempt_fields or {}), **(changes if on_attempt else {})},
            None,
            {**field_updates, **({} if on_attempt else changes)},
        )

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
        keep a pass cheap. Unknown ids are ignored (the job may have been purged), and so are
        jobs no longer waiting (cancelled meanwhile, on another server: a finished job keeps
        no "why pending").
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
            # the states written out, not bound: an executemany takes no expanding IN
            .where(
                JOBS.c.id == bindparam("b_id"),
                JOBS.c.state.in_([literal_column(f"'{w}'") for w in sorted(WAITING_STATES)]),
            )
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
        lost_work_gpu_s: float | None = None,
        lost_work_basis: str | None = None,
    ) -> bool:
        """Mark an attempt exited, with why (completed|failed|preempted|cancelled|killed|evicted|
        timeout) and, when a preemption stopped it, the work it lost and what that rests on.
        Returns False when there is no such attempt."""
        if reason not in END_REASONS:
            raise ValueError(f"reason: expected one of {sorted(END_REASONS)}, got {reason!r}")
        key = job_key(job_id)
        if key is None:
            return False
        values = {"state": "exited", "ended_at": ended_at, "exit_codes": [int(c) for c in exit_codes], "reason": reason}
        if lost_work_basis is not None:
            values.update(_attempt_updates({"lost_work_gpu_s": lost_work_gpu_s, "lost_work_basis": lost_work_basis}))
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

    def running_attempts(self) -> tuple[StoredAttempt, ...]:
        """Attempts still running or terminating: what executors must re-adopt after a restart."""
        query = (
            select(ATTEMPTS)
            .where(ATTEMPTS.c.state.in_(sorted(LIVE_ATTEMPT_STATES)))
            .order_by(ATTEMPTS.c.job_id, ATTEMPTS.c.number)
        )
        with self._read() as conn:
            return tuple(_attempt(row) for row in conn.execute(query))


def _next_submit_at(now: float, newest: float | None) -> float:
    if newest is None:
        return float(now)
    floor = max(newest + SUBMIT_TICK, math.nextafter(newest, math.inf))
    return max(float(now), floor)


def _no_flags(*updates: Mapping[str, Any] | None) -> None:
    """Refuse a write that names a flag: the lifecycle's events alone set them."""
    named = sorted(c for u in updates for c in (u or {}) if c in lifecycle.FLAG_COLUMNS)
    if named:
        raise ValueError(f"{', '.join(named)}: set by the lifecycle's flag events only (Store.flag)")


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
    lent: bool = False,
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
        lent=lent,
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
    if not lifecycle.allows(Event.SUBMITTED, None, JobState(value)):
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


def _str_dict(name: str, items: Mapping[str, str]) -> dict[str, str]:
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in items.items()):
        raise ValueError(f"{name}: expected a mapping of strings to strings, got {items!r}")
    return dict(items)


def _job_updates(updates: Mapping[str, Any]) -> dict[str, Any]:
    """Validate `transition`/`update` keyword fields and turn them into column values."""
    values: dict[str, Any] = {}
    for name, value in updates.items():
        if name in _JOB_IMMUTABLE or name in _JOB_WRITTEN or name not in JOBS.c:
            raise ValueError(f"{name}: not a job field that can be updated")
        if name == "placement" and value not in PLACEMENTS:
            raise ValueError(f"placement: expected one of pack, block, any, got {value!r}")
        if name == "preempted_at":
            value = builtins.list(value)
        elif name == "explanation" and value is not None:
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
        if name == "lost_work_basis" and value is not None and value not in LOSS_BASES:
            raise ValueError(f"lost_work_basis: expected one of {sorted(LOSS_BASES)}, got {value!r}")
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


def _heads(conn: Connection, ids: Sequence[int]) -> dict[int, JobHead]:
    """The heads of the jobs `ids`, by id: `_READ_CHUNK` ids a query."""
    found: dict[int, JobHead] = {}
    for start in range(0, len(ids), _READ_CHUNK):
        chunk = builtins.list(ids[start : start + _READ_CHUNK])
        for row in conn.execute(select(*HEAD_COLUMNS).where(JOBS.c.id.in_(chunk))):
            head = _head_from(row._mapping)
            found[head.id] = head
    return found


def _job(row: Row[Any]) -> StoredJob:
    return _job_from(row._mapping)


def _job_from(m: Mapping[Any, Any]) -> StoredJob:
    return StoredJob(**_head_fields(m), command=tuple(m["command"]), workdir=m["workdir"], env=dict(m["env"]))


def _head_from(m: Mapping[Any, Any]) -> JobHead:
    return JobHead(**_head_fields(m))


def _head_fields(m: Mapping[Any, Any]) -> dict[str, Any]:
    """The fields of a `JobHead` from a row of `jobs` (whole, or its `HEAD_COLUMNS`)."""
    return {
        **{f.name: m[f.name] for f in fields(JobHead)},
        "state": JobState(m["state"]),
        "preempted_at": tuple(float(t) for t in m["preempted_at"]),
        "cancel_requested": bool(m["cancel_requested"]),
        "claim": bool(m["claim"]),
        "saves_on_sigterm": bool(m["saves_on_sigterm"]),
    }


def _attempt(row: Row[Any]) -> StoredAttempt:
    return _attempt_from(row._mapping)


def _attempt_from(m: Mapping[Any, Any]) -> StoredAttempt:
    exit_codes = m["exit_codes"]
    return StoredAttempt(
        **{
            **{f.name: m[f.name] for f in fields(StoredAttempt)},
            "assignment": tuple(ReplicaPlacement(r["node"], tuple(r["gpus"])) for r in m["assignment"]),
            "borrowing": bool(m["borrowing"]),
            "lent": bool(m["lent"]),
            "timed_out": bool(m["timed_out"]),
            "exit_codes": None if exit_codes is None else tuple(exit_codes),
        }
    )
