"""The control plane's tables, as SQLAlchemy 2 declarative classes.

These classes are the source of truth that `migrations/versions/*.py` must reproduce; the
migration tests compare a migrated database with `Base.metadata` column by column. A change
here needs a new migration (see docs/store.md).

Portable types only, so one schema serves SQLite (embedded default) and PostgreSQL:
`Double` for times and quantities (double precision on PostgreSQL, REAL on SQLite), `JSON`
for lists and documents, strings for enumerations (validated by `warden.store.repo`, not by
CHECK constraints, so that a new state name needs no table rebuild on SQLite). Times are epoch
seconds as floats, the engine's unit. CPU is in millicores and memory in MiB, per replica.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
"""Deterministic constraint names, identical on both databases, so a later migration can name
the constraint it alters."""

NullableJSON = JSON(none_as_null=True)
"""A nullable JSON column: Python None is stored as SQL NULL, not as the JSON text 'null'."""


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class JobRow(Base):
    """One submitted gang: its request, where it is in the lifecycle, and what it last heard."""

    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_state", "state"),
        Index("ix_jobs_queue_state", "queue", "state"),
        Index("ix_jobs_user", "user"),
        # What `GET /v1/history/export` selects and counts, read from the index alone: on SQLite
        # a row's later columns sit past its command and env.
        Index("ix_jobs_submit_at_attempt_state", "submit_at", "attempt", "state"),
        # A user's jobs that still keep their command, oldest first: what a submission at the
        # policy's limits.max_stored_bytes_per_user drops, found without its history's scan.
        Index("ix_jobs_user_command_expired_at_id", "user", "command_expired_at", "id"),
        UniqueConstraint("user", "idempotency_key"),
        {"sqlite_autoincrement": True},  # ids are never reused, even after the newest row goes
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(255))
    user: Mapped[str] = mapped_column(String(255))
    queue: Mapped[str] = mapped_column(String(255))
    tier: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(32))
    replicas: Mapped[int] = mapped_column(Integer)
    gpus: Mapped[int] = mapped_column(Integer)
    cpu: Mapped[int] = mapped_column(Integer)
    memory: Mapped[int] = mapped_column(Integer)
    flavor: Mapped[str | None] = mapped_column(String(255))
    placement: Mapped[str] = mapped_column(String(16))
    lease_s: Mapped[float | None] = mapped_column(Double)
    grace_s: Mapped[float | None] = mapped_column(Double)
    time_limit_s: Mapped[float | None] = mapped_column(Double)
    command: Mapped[list[str]] = mapped_column(JSON)
    workdir: Mapped[str] = mapped_column(Text)
    env: Mapped[dict[str, str]] = mapped_column(JSON)
    submit_at: Mapped[float] = mapped_column(Double)
    pending_since: Mapped[float | None] = mapped_column(Double)
    waited_s: Mapped[float] = mapped_column(Double, default=0.0, server_default=text("0"))
    not_before: Mapped[float | None] = mapped_column(Double)
    preempted_at: Mapped[list[float]] = mapped_column(JSON)
    attempt: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    approved_by: Mapped[str | None] = mapped_column(String(255))
    approved_at: Mapped[float | None] = mapped_column(Double)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    explanation: Mapped[dict[str, Any] | None] = mapped_column(NullableJSON)
    finished_at: Mapped[float | None] = mapped_column(Double)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    version: Mapped[int] = mapped_column(Integer, default=1, server_default=text("1"))
    held_reason: Mapped[str | None] = mapped_column(Text)
    """Why the job is held (left out of scheduling while it waits), e.g. quarantined after it
    made scheduling passes fail; None: not held."""
    claim: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """The job waits for capacity its victims are freeing, which is held for it (the engine's
    `Plan.claims` of the last pass)."""
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    """The submitter's `Idempotency-Key`: unique per user, so a retried submission finds its job."""
    request_digest: Mapped[str | None] = mapped_column(String(64))
    """SHA-256 of the submission that used the key: a different request with it is refused."""
    saves_on_sigterm: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """The submitter declared that the job saves its state on SIGTERM: a clean exit in its grace
    after one counts as a save (`accounting.measured_loss`)."""
    command_expired_at: Mapped[float | None] = mapped_column(Double)
    """When this finished job's command, env and workdir were dropped (emptied) to make room
    for a newer job of its user under the policy's `limits.max_stored_bytes_per_user`; None
    while they are kept."""


class AttemptRow(Base):
    """One run of a job between admission and exit, with the facts executors and the SDK report."""

    __tablename__ = "attempts"
    __table_args__ = (Index("ix_attempts_state", "state"), Index("ix_attempts_sigterm_at", "sigterm_at"))

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    state: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[float] = mapped_column(Double)
    assignment: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    flavor: Mapped[str | None] = mapped_column(String(255))
    borrowing: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    lent: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    startup_s: Mapped[float | None] = mapped_column(Double)
    checkpoint_s: Mapped[float] = mapped_column(Double, default=0.0, server_default=text("0"))
    last_checkpoint_at: Mapped[float | None] = mapped_column(Double)
    sigterm_save_s: Mapped[float | None] = mapped_column(Double)
    sigterm_at: Mapped[float | None] = mapped_column(Double)
    kill_at: Mapped[float | None] = mapped_column(Double)
    ended_at: Mapped[float | None] = mapped_column(Double)
    exit_codes: Mapped[list[int] | None] = mapped_column(NullableJSON)
    handle: Mapped[dict[str, Any] | None] = mapped_column(NullableJSON)
    log_dir: Mapped[str] = mapped_column(Text)
    preempted_for: Mapped[str | None] = mapped_column(String(32))
    reason: Mapped[str | None] = mapped_column(String(16))
    progress_step: Mapped[int | None] = mapped_column(BigInteger)
    progress_samples: Mapped[int | None] = mapped_column(BigInteger)
    progress_at: Mapped[float | None] = mapped_column(Double)
    checkpoints: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    last_checkpoint_step: Mapped[int | None] = mapped_column(BigInteger)
    """The step of its newest checkpoint, as the SDK reported it (None: not reported)."""
    lost_work_gpu_s: Mapped[float | None] = mapped_column(Double)
    """GPU-seconds of progress a preemption of this attempt threw away (measured at its exit;
    0 when its job was cancelled, None for an attempt no preemption stopped)."""
    lost_work_basis: Mapped[str | None] = mapped_column(String(16))
    """What `lost_work_gpu_s` rests on: `reported`, `declared`, `assumed` (`accounting.LossBasis`)
    or `cancelled`."""
    preemption_kind: Mapped[str | None] = mapped_column(String(16))
    """Why its SIGTERM came, when neither a cancel nor a time limit sent it: `preemption` (for a job of a higher tier),
    `reclaim` (capacity it borrowed, taken back) or `eviction` (one of its nodes went down)."""
    timed_out: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """It ran out its job's time limit: SIGTERM came for it (unless one was under way), and its
    exit ends the job TIMEOUT."""


class EventRow(Base):
    """One lifecycle transition (DESIGN §5): kept forever and shown by `describe`."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_job_id_id", "job_id", "id"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"))
    at: Mapped[float] = mapped_column(Double)
    from_state: Mapped[str | None] = mapped_column(String(32))
    to_state: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(String(255))
    actor: Mapped[str] = mapped_column(String(255))
    details: Mapped[dict[str, Any]] = mapped_column(JSON)


class SampleRow(Base):
    """One sample of the cluster's history (`warden.server.history`): what the dashboard plots.
    Kept 30 days."""

    __tablename__ = "history_samples"
    __table_args__ = (Index("ix_history_samples_at", "at"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Double)
    cluster: Mapped[dict[str, Any]] = mapped_column(JSON)
    queues: Mapped[dict[str, Any]] = mapped_column(JSON)
    lost_totals: Mapped[dict[str, float]] = mapped_column(JSON)
    """Lost work of every preemption recorded by `at`, in GPU-seconds per leaf queue: the next
    sample's lost work is the difference, so a victim whose exit came after a sample still
    counts once, in the next one."""


class TokenRow(Base):
    """An API token: only its SHA-256 is kept, so a copy of the database grants nothing."""

    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    user: Mapped[str] = mapped_column(String(255))
    role: Mapped[str] = mapped_column(String(16))
    queues: Mapped[list[str]] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Double)
    created_by: Mapped[str] = mapped_column(String(255))
    revoked_at: Mapped[float | None] = mapped_column(Double)
    expires_at: Mapped[float | None] = mapped_column(Double)
    """When the token stops working (epoch seconds); None: never."""


class AuditRow(Base):
    """Who did what to what: governance actions. Append-only, enforced by triggers in the migration."""

    __tablename__ = "audit"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Double)
    actor: Mapped[str] = mapped_column(String(255))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(255))
    details: Mapped[dict[str, Any]] = mapped_column(JSON)


class PolicyRow(Base):
    """Every policy ever applied, as written and as resolved; the highest version is in force."""

    __tablename__ = "policies"
    __table_args__ = ({"sqlite_autoincrement": True},)

    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    applied_at: Mapped[float] = mapped_column(Double)
    applied_by: Mapped[str] = mapped_column(String(255))
    source: Mapped[str] = mapped_column(Text)
    resolved: Mapped[dict[str, Any]] = mapped_column(JSON)


class LedgerRow(Base):
    """The fair-share usage ledger, one row a leaf queue, so a restart keeps everyone's history."""

    __tablename__ = "ledger"

    queue: Mapped[str] = mapped_column(String(255), primary_key=True)
    usage: Mapped[float] = mapped_column(Double)
    at: Mapped[float] = mapped_column(Double)


class MetaRow(Base):
    """Facts about the database itself: `database_id`, the random identity a state directory
    is bound to."""

    __tablename__ = "meta"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class NodeRow(Base):
    """The cluster as the leading server's executor last reported it."""

    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    gpus: Mapped[int] = mapped_column(Integer)
    cpu: Mapped[int] = mapped_column(Integer)
    memory: Mapped[int] = mapped_column(Integer)
    flavor: Mapped[str] = mapped_column(String(255))
    block: Mapped[str | None] = mapped_column(String(255))
    gpu_names: Mapped[list[str]] = mapped_column(JSON)
    updated_at: Mapped[float] = mapped_column(Double)
    down: Mapped[str | None] = mapped_column(String(1024))
    foreign_gpus: Mapped[int] = mapped_column(Integer, server_default="0")
    foreign_indices: Mapped[list[int] | None] = mapped_column(JSON)
    """Which of `foreign_gpus` are known by index (None or []: none are)."""


class LeaseRow(Base):
    """The leader's lease (docs/control-plane.md, "Several servers"): one row, id 1, made by
    its migration. The server that holds it unexpired leads; `epoch` goes up by one at every
    change of holder and is the fencing token every write of the leader checks. Times are the
    database's clock (epoch seconds), never a server's."""

    __tablename__ = "leader_lease"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    holder: Mapped[str | None] = mapped_column(String(255))
    """Who holds it: `host:pid:random`, unique to one run of one server; None before any did."""
    epoch: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[float] = mapped_column(Double)
    acquired_at: Mapped[float | None] = mapped_column(Double)
    renewed_at: Mapped[float | None] = mapped_column(Double)
    host: Mapped[str | None] = mapped_column(String(255))
    pid: Mapped[int | None] = mapped_column(Integer)
    pid_started: Mapped[int | None] = mapped_column(BigInteger)
    """The holder's process start time (clock ticks since boot, /proc/PID/stat): a pid reused
    by another process is not mistaken for the holder."""
    url: Mapped[str | None] = mapped_column(String(1024))
    """The holder's API, for `GET /v1/health` and the CLI to name the leader."""


class ServerRow(Base):
    """The servers of one database (docs/control-plane.md, "Several servers"): each server's
    row, keyed by its API's URL, is written at its start and refreshed every second while it
    runs (`warden.store.servers`), and deleted when it stops. The servers seen lately are what
    a job is given to report to (`WARDEN_URL`)."""

    __tablename__ = "servers"

    url: Mapped[str] = mapped_column(String(1024), primary_key=True)
    holder: Mapped[str] = mapped_column(String(255))
    """The run of the server, as the lease names it (`host:pid:random`)."""
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    seen_at: Mapped[float] = mapped_column(Double)
    """When the server last refreshed its row, by the database's clock."""
    ca: Mapped[str | None] = mapped_column(Text, nullable=True)
    """The PEM certificate of the CA that signed the server's own TLS certificate (None: an
    admin's certificate, or plain HTTP): jobs given its URL trust it (`WARDEN_CA`)."""


class UserStorageRow(Base):
    """What each user's jobs keep of what they wrote: the UTF-8 bytes of the command, env and
    workdir of every job of theirs, finished ones included (`warden.store.jobs.stored_bytes`),
    less what was dropped to make room. Kept by `Store.submit` in the transaction that inserts
    the job, so that the policy's `limits.max_stored_bytes_per_user` is one row's read, however
    many jobs the user has."""

    __tablename__ = "user_storage"

    user: Mapped[str] = mapped_column(String(255), primary_key=True)
    stored_bytes: Mapped[int] = mapped_column(BigInteger)
