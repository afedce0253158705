"""The control plane's repository (warden.store.repo) on SQLite and on a real PostgreSQL.

Every test that takes `store` runs on both databases; the PostgreSQL ones skip (or fail under
WARDEN_REQUIRE_POSTGRES=1) where Debian's postgresql package is not installed.
"""

from __future__ import annotations

import os
import select as select_module
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pg import fresh_postgres_url, postgres_server  # noqa: F401  (fixtures)
from sqlalchemy import Engine, event, select, text
from sqlalchemy.exc import DBAPIError, IntegrityError
from support import move

from warden import paths
from warden.engine.lifecycle import Event, IllegalTransition
from warden.engine.model import Attempt, Job, JobState, Node, ReplicaPlacement
from warden.store import JobNotFound, NodeRecord, Store, connect, default_url, hash_token, migrate
from warden.store.db import normalize_url, state_dir
from warden.store.jobs import TooManyWaiting, WaitingLimits
from warden.store.schema import Base

REPO_ROOT = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000.0


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'warden.db'}"
    return str(request.getfixturevalue("fresh_postgres_url"))


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    opened = Store.open(db_url)
    try:
        yield opened
    finally:
        opened.close()


def submit(store: Store, now: float = T0, **overrides: Any) -> int:
    fields: dict[str, Any] = dict(
        name="train", user="ana", queue="vision", tier=3, command=["python", "train.py"], actor="ana", now=now
    )
    fields.update(overrides)
    return store.submit(**fields)


def count(store: Store, table: str) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


# --- submit ------------------------------------------------------------------------------------


def test_submit_stores_the_request_and_its_first_event(store: Store) -> None:
    job_id = submit(
        store,
        replicas=2,
        gpus=4,
        cpu=8000,
        memory=65536,
        flavor="h100",
        placement="pack",
        lease_s=600.0,
        grace_s=180.0,
        time_limit_s=3600.0,
        workdir="/w",
        env={"A": "1"},
        state=JobState.AWAITING_APPROVAL,
        tier=2,
    )
    job = store.get(job_id)
    assert job is not None
    assert (job.id, job.job_id, job.state, job.tier, job.replicas, job.gpus, job.cpu, job.memory) == (
        job_id,
        str(job_id),
        JobState.AWAITING_APPROVAL,
        2,
        2,
        4,
        8000,
        65536,
    )
    assert (job.flavor, job.placement, job.lease_s, job.grace_s, job.time_limit_s) == (
        "h100",
        "pack",
        600.0,
        180.0,
        3600.0,
    )
    assert job.command == ("python", "train.py") and job.env == {"A": "1"} and job.workdir == "/w"
    assert (job.submit_at, job.pending_since, job.waited_s, job.preempted_at, job.attempt) == (T0, None, 0.0, (), 0)
    assert (job.explanation, job.cancel_requested, job.version, job.finished_at) == (None, False, 1, None)
    [event] = store.events(job_id)
    assert (event.from_state, event.to_state, event.reason, event.actor, event.at) == (
        None,
        "AWAITING_APPROVAL",
        "submitted",
        "ana",
        T0,
    )


def test_submit_ids_increase_and_submit_times_strictly_increase(store: Store) -> None:
    ids = [submit(store, now=T0), submit(store, now=T0), submit(store, now=T0 - 50), submit(store, now=T0 + 10)]
    assert ids == sorted(ids) and len(set(ids)) == 4
    times = [store.get(i).submit_at for i in ids]  # type: ignore[union-attr]
    assert times[0] == T0
    assert all(b > a for a, b in zip(times, times[1:]))
    assert times[1] == pytest.approx(T0 + 1e-6, abs=1e-7)
    assert times[3] == T0 + 10


def test_waiting_limits_hold_for_concurrent_submissions_from_two_servers(db_url: str) -> None:
    """Two servers' stores on one database, 16 threads submitting at once: the waiting-jobs
    limits are counted in the inserting transaction, so exactly the limit is stored, per user
    and per queue, and every other submission is refused with what it met."""
    stores = [Store.open(db_url), Store.open(db_url, upgrade=False)]
    limits = WaitingLimits(per_user=5, per_queue=7)
    refused: list[TooManyWaiting] = []
    stored: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(16)

    def work(i: int) -> None:
        start.wait()
        try:
            job_id = submit(stores[i % 2], user=f"u{i % 2}", queue="vision", waiting_limits=limits)
        except TooManyWaiting as err:
            with lock:
                refused.append(err)
            return
        with lock:
            stored.append(job_id)

    try:
        workers = [threading.Thread(target=work, args=(i,)) for i in range(16)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        jobs = stores[0].list(queue="vision")
        assert len(jobs) == len(stored) == 7 and len(refused) == 9
        per_user = {u: sum(j.user == u for j in jobs) for u in ("u0", "u1")}
        assert max(per_user.values()) <= 5 and sum(per_user.values()) == 7
        assert {(e.field, e.limit) for e in refused} <= {("user", 5), ("queue", 7)}
        # A job that starts frees its place; an admin's submission (no per-user limit) still counts for the queue.
        stores[0].transition(stored[0], JobState.CANCELLED, event=Event.CANCELLED, reason="x", actor="x", now=T0)
        submit(stores[1], user="admin", waiting_limits=WaitingLimits(None, 7))
        with pytest.raises(TooManyWaiting, match="queue 'vision' has 7 jobs waiting, the limit of 7"):
            submit(stores[1], user="admin", waiting_limits=WaitingLimits(None, 7))
    finally:
        for one in stores:
            one.close()


def test_concurrent_submissions_keep_submit_order_equal_to_id_order(store: Store) -> None:
    threads, per_thread = 4, 15
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads)

    def work() -> None:
        try:
            barrier.wait()
            for _ in range(per_thread):
                submit(store, now=T0)  # the same clock reading everywhere: the worst case
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors
    jobs = store.list()
    assert len(jobs) == threads * per_thread
    times = [j.submit_at for j in jobs]  # list() is in id order
    assert all(b > a for a, b in zip(times, times[1:]))
    assert count(store, "events") == threads * per_thread


@pytest.mark.parametrize(
    "bad",
    [
        {"tier": 5},
        {"placement": "spread"},
        {"replicas": 0},
        {"gpus": -1},
        {"state": JobState.RUNNING},
        {"command": "python train.py"},
        {"env": {"A": 1}},
    ],
)
def test_submit_refuses_bad_input_and_changes_nothing(store: Store, bad: dict[str, Any]) -> None:
    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        submit(store, **bad)
    assert count(store, "jobs") == 0 and count(store, "events") == 0


def test_get_unknown_ids(store: Store) -> None:
    assert store.get(12345) is None
    assert store.get("nope") is None
    job_id = submit(store)
    assert store.get(str(job_id)) == store.get(job_id)


# --- listing -----------------------------------------------------------------------------------


def test_list_filters(store: Store) -> None:
    a = submit(store, queue="vision", user="ana")
    b = submit(store, queue="vision", user="bo", state="AWAITING_APPROVAL", tier=1)
    c = submit(store, queue="language", user="ana")
    move(store, c, JobState.RUNNING, reason="start", actor="warden", now=T0 + 1)

    def ids(**kw: Any) -> list[int]:
        return [j.id for j in store.list(**kw)]

    assert ids() == [a, b, c]
    assert ids(queue="vision") == [a, b]
    assert ids(user="ana") == [a, c]
    assert ids(state="PENDING") == [a]
    assert ids(state=JobState.RUNNING) == [c]
    assert ids(state={"PENDING", JobState.AWAITING_APPROVAL}) == [a, b]
    assert ids(queue="vision", user="ana", state={"PENDING"}) == [a]
    assert ids(limit=2) == [a, b]
    assert ids(queue="nowhere") == []
    with pytest.raises(ValueError):
        store.list(state="SLEEPING")


# --- transitions -------------------------------------------------------------------------------


def test_transition_is_a_compare_and_set_with_an_event(store: Store) -> None:
    job_id = submit(store)
    store.set_explanations({job_id: {"reason": "Position", "message": "2 ahead"}})
    before = store.get(job_id)
    assert before is not None and before.version == 2

    assert store.transition(
        job_id,
        JobState.ADMITTED,
        event=Event.ADMITTED,
        reason="admitted",
        actor="warden",
        now=T0 + 5,
        expect_state=JobState.PENDING,
        details={"nodes": ["n0"]},
        waited_s=5.0,
    )
    after = store.get(job_id)
    assert after is not None
    assert (after.state, after.version, after.waited_s, after.explanation) == (JobState.ADMITTED, 3, 5.0, None)

    # Lost race: the job is no longer PENDING, nothing changes.
    assert not store.transition(
        job_id,
        JobState.CANCELLED,
        event=Event.CANCELLED,
        reason="cancel",
        actor="bo",
        now=T0 + 6,
        expect_state={"PENDING", "AWAITING_APPROVAL"},
        exit_code=1,
    )
    assert store.get(job_id) == after
    events = store.events(job_id)
    assert [(e.from_state, e.to_state, e.reason, e.actor) for e in events] == [
        (None, "PENDING", "submitted", "ana"),
        ("PENDING", "ADMITTED", "admitted", "warden"),
    ]
    assert events[1].details == {"nodes": ["n0"]} and events[1].at == T0 + 5

    # Terminal: finished_at defaults to now.
    assert store.transition(
        str(job_id), "SUCCEEDED", event=Event.EXITED, reason="exited", actor="warden", now=T0 + 9, exit_code=0
    )
    done = store.get(job_id)
    assert done is not None and (done.state, done.finished_at, done.exit_code, done.version) == (
        JobState.SUCCEEDED,
        T0 + 9,
        0,
        4,
    )


def test_transition_refuses_unknown_jobs_and_fields(store: Store) -> None:
    job_id = submit(store)
    with pytest.raises(JobNotFound):
        store.transition(999, "RUNNING", event=Event.ADMITTED, reason="x", actor="warden", now=T0)
    with pytest.raises(JobNotFound):
        store.transition("abc", "RUNNING", event=Event.ADMITTED, reason="x", actor="warden", now=T0)
    for field in ({"tier": 1}, {"version": 9}, {"nonsense": 1}, {"submit_at": 0.0}):
        with pytest.raises(ValueError):
            store.transition(job_id, "RUNNING", event=Event.ADMITTED, reason="x", actor="warden", now=T0, **field)
    with pytest.raises(ValueError):
        store.transition(job_id, "SLEEPING", event=Event.ADMITTED, reason="x", actor="warden", now=T0)
    assert store.get(job_id).version == 1  # type: ignore[union-attr]
    assert len(store.events(job_id)) == 1


def test_transition_refuses_a_change_the_lifecycle_lacks(store: Store) -> None:
    """The lifecycle's table is the only way a state changes: an edge it lacks is a bug in the
    caller, refused before anything is written."""
    job_id = submit(store)
    with pytest.raises(IllegalTransition, match="no exited edge from PENDING to SUCCEEDED"):
        store.transition(job_id, "SUCCEEDED", event=Event.EXITED, reason="x", actor="warden", now=T0)
    with pytest.raises(IllegalTransition, match="no approved edge from PENDING"):
        store.transition(job_id, "PENDING", event=Event.APPROVED, reason="x", actor="warden", now=T0)
    assert store.transition(job_id, "PENDING", event=Event.NOTED, reason="a note", actor="warden", now=T0)
    with pytest.raises(ValueError, match="a job is submitted PENDING or AWAITING_APPROVAL"):
        store.submit(name="", user="u", queue="q", tier=3, command=["true"], actor="u", now=T0, state="RUNNING")
    job = store.get(job_id)
    assert job is not None and job.state is JobState.PENDING and job.version == 2
    assert [e.reason for e in store.events(job_id)] == ["submitted", "a note"]


def test_requeue_fields_round_trip(store: Store) -> None:
    job_id = submit(store)
    assert move(
        store,
        job_id,
        "REQUEUED",
        reason="preempted",
        actor="warden",
        now=T0 + 100,
        preempted_at=[T0 + 50.0, T0 + 90.0],
        not_before=T0 + 160,
        pending_since=T0 + 100,
        waited_s=12.5,
    )
    job = store.get(job_id)
    assert job is not None
    assert job.preempted_at == (T0 + 50.0, T0 + 90.0)
    assert (job.not_before, job.pending_since, job.waited_s) == (T0 + 160, T0 + 100, 12.5)


def test_update_is_optimistic_on_version(store: Store) -> None:
    job_id = submit(store)
    assert store.update(job_id, cancel_requested=True)
    assert store.get(job_id).cancel_requested  # type: ignore[union-attr]
    assert not store.update(job_id, expect_version=1, approved_by="root")
    assert store.update(job_id, expect_version=2, approved_by="root", approved_at=T0 + 1)
    job = store.get(job_id)
    assert job is not None and (job.approved_by, job.approved_at, job.version) == ("root", T0 + 1, 3)
    assert len(store.events(job_id)) == 1
    with pytest.raises(JobNotFound):
        store.update(999, cancel_requested=True)


# --- attempts ----------------------------------------------------------------------------------


def test_attempt_lifecycle(store: Store) -> None:
    job_id = submit(store, replicas=2, gpus=2)
    assignment: list[ReplicaPlacement | dict[str, Any]] = [
        ReplicaPlacement("n0", (0, 1)),
        {"node": "n1", "gpus": [2, 3]},
    ]
    started = store.start_attempt(
        job_id,
        1,
        T0 + 10,
        assignment,
        flavor="h100",
        borrowing=True,
        handle={"pgid": 4242},
        log_dir="/logs/1/1",
        startup_s=None,
    )
    assert started.assignment == (ReplicaPlacement("n0", (0, 1)), ReplicaPlacement("n1", (2, 3)))
    assert (started.state, started.borrowing, started.handle, started.log_dir, started.checkpoint_s) == (
        "running",
        True,
        {"pgid": 4242},
        "/logs/1/1",
        0.0,
    )
    assert store.get(job_id).attempt == 1  # type: ignore[union-attr]
    assert store.attempt(job_id, 1) == started
    assert store.running_attempts() == (started,)

    assert store.update_attempt(
        job_id, 1, startup_s=20.0, checkpoint_s=4.0, last_checkpoint_at=T0 + 60, sigterm_save_s=3.0
    )
    assert store.update_attempt(job_id, 1, state="terminating", sigterm_at=T0 + 100, kill_at=T0 + 220)
    live = store.attempt(job_id, 1)
    assert live is not None
    assert (live.state, live.startup_s, live.checkpoint_s, live.last_checkpoint_at, live.sigterm_at, live.kill_at) == (
        "terminating",
        20.0,
        4.0,
        T0 + 60,
        T0 + 100,
        T0 + 220,
    )
    assert store.running_attempts() == (live,)

    assert store.end_attempt(job_id, 1, T0 + 110, [0, 0], "preempted", preempted_for="77")
    ended = store.attempt(job_id, 1)
    assert ended is not None
    assert (ended.state, ended.ended_at, ended.exit_codes, ended.reason, ended.preempted_for) == (
        "exited",
        T0 + 110,
        (0, 0),
        "preempted",
        "77",
    )
    assert store.running_attempts() == ()

    second = store.start_attempt(job_id, 2, T0 + 300, [ReplicaPlacement("n2", (0,))])
    assert store.attempts(job_id) == (ended, second)
    assert store.get(job_id).attempt == 2  # type: ignore[union-attr]


def test_progress_counters_hold_64_bits(store: Store) -> None:
    """A long run reports more steps and samples than 32 bits hold (int8 on PostgreSQL)."""
    job_id = submit(store)
    store.start_attempt(job_id, 1, T0, [ReplicaPlacement("n0", (0,))])
    big = 2**62 + 7
    assert store.update_attempt(job_id, 1, progress_step=2**40, progress_samples=big, progress_at=T0 + 5)
    live = store.attempt(job_id, 1)
    assert live is not None
    assert (live.progress_step, live.progress_samples) == (2**40, big)


def test_attempt_errors(store: Store) -> None:
    job_id = submit(store)
    store.start_attempt(job_id, 1, T0, [ReplicaPlacement("n0", (0,))])
    with pytest.raises(IntegrityError):
        store.start_attempt(job_id, 1, T0, [ReplicaPlacement("n0", (0,))])
    with pytest.raises(JobNotFound):
        store.start_attempt(999, 1, T0, [])
    assert not store.update_attempt(job_id, 7, startup_s=1.0)
    assert not store.end_attempt(job_id, 7, T0, [1], "failed")
    with pytest.raises(ValueError):
        store.end_attempt(job_id, 1, T0, [1], "exploded")
    with pytest.raises(ValueError):
        store.update_attempt(job_id, 1, state="sleeping")
    with pytest.raises(ValueError):
        store.update_attempt(job_id, 1, number=3)
    with pytest.raises(ValueError):
        store.update_attempt(job_id, 1, job_id=3)
    assert store.attempt(job_id, 7) is None and store.attempt("abc", 1) is None


def test_active_jobs_carry_their_live_attempt_and_convert_to_engine_jobs(store: Store) -> None:
    pending = submit(store, lease_s=60.0, grace_s=120.0, time_limit_s=900.0)
    running = submit(store, gpus=2, placement="pack", flavor="h100")
    requeued = submit(store)
    done = submit(store)
    store.start_attempt(running, 1, T0 + 5, [ReplicaPlacement("n0", (0, 1))], borrowing=True, startup_s=3.0)
    move(store, running, "RUNNING", reason="started", actor="warden", now=T0 + 5)
    store.start_attempt(requeued, 1, T0 + 5, [ReplicaPlacement("n1", (0,))])
    store.end_attempt(requeued, 1, T0 + 8, [0], "preempted")
    move(store, requeued, "PENDING", reason="requeued", actor="warden", now=T0 + 8, preempted_at=[T0 + 6])
    move(store, done, "CANCELLED", reason="cancelled", actor="ana", now=T0 + 9)

    active = store.active()
    assert [a.job.id for a in active] == [pending, running, requeued]
    by_id = {a.job.id: a for a in active}
    assert by_id[pending].attempt is None
    assert by_id[requeued].attempt is None  # its only attempt has exited
    assert by_id[running].attempt == store.attempt(running, 1)

    engine_job = by_id[running].to_engine()
    assert isinstance(engine_job, Job)
    assert engine_job == Job(
        id=str(running),
        queue="vision",
        tier=3,
        submit=store.get(running).submit_at,  # type: ignore[union-attr]
        state=JobState.RUNNING,
        replicas=1,
        gpus=2,
        flavor="h100",
        placement="pack",
        user="ana",
        attempt=Attempt(
            number=1, started_at=T0 + 5, assignment=(ReplicaPlacement("n0", (0, 1)),), borrowing=True, startup_s=3.0
        ),
    )
    pending_job = by_id[pending].to_engine()
    assert (pending_job.lease, pending_job.grace, pending_job.time_limit, pending_job.attempt) == (
        60.0,
        120.0,
        900.0,
        None,
    )
    assert by_id[requeued].to_engine().preempted_at == (T0 + 6,)


# --- explanations ------------------------------------------------------------------------------


def test_set_explanations_updates_many_jobs_in_one_executemany(store: Store) -> None:
    ids = [submit(store) for _ in range(5)]
    explanation = {
        "reason": "QuotaExceeded",
        "message": "queue vision is at its quota",
        "details": {"queue": "vision", "resource": "gpu", "requested": 4, "available": 0},
        "sort_key": [3, False, 0.25, 0.0, T0, 1],
        "position": 1,
    }
    statements: list[tuple[str, bool]] = []

    def record(conn: Any, cursor: Any, statement: str, params: Any, context: Any, executemany: bool) -> None:
        statements.append((statement, executemany))

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        store.set_explanations(
            {
                **{i: {**explanation, "position": n} for n, i in enumerate(ids[:4])},
                str(ids[4]): None,
                999_999: {"reason": "ghost"},
            }
        )
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    updates = [(s, many) for s, many in statements if s.lstrip().upper().startswith("UPDATE")]
    assert len(updates) == 1 and updates[0][1], updates

    for n, job_id in enumerate(ids[:4]):
        job = store.get(job_id)
        assert job is not None and job.explanation == {**explanation, "position": n} and job.version == 2
    last = store.get(ids[4])
    assert last is not None and last.explanation is None and last.version == 2
    store.set_explanations({})  # nothing to do, no transaction needed
    with store.engine.connect() as conn:  # None is stored as SQL NULL, not JSON 'null'
        assert conn.execute(text("SELECT count(*) FROM jobs WHERE explanation IS NULL")).scalar_one() == 1


def test_set_explanations_leaves_a_job_that_stopped_waiting_alone(store: Store) -> None:
    """A pass explains the jobs it saw waiting; one cancelled meanwhile (by a user, on another
    server) keeps no stale "why pending"."""
    waiting, cancelled = submit(store), submit(store)
    assert store.transition(
        cancelled, JobState.CANCELLED, event=Event.CANCELLED, reason="x", actor="ana", now=T0, expect_state="PENDING"
    )
    store.set_explanations({waiting: {"reason": {"code": "Position"}}, cancelled: {"reason": {"code": "Position"}}})
    assert store.get(waiting).explanation == {"reason": {"code": "Position"}}  # type: ignore[union-attr]
    after = store.get(cancelled)
    assert after is not None and after.explanation is None and after.version == 2


# --- tokens ------------------------------------------------------------------------------------


def _database_text(store: Store, db_url: str) -> str:
    """Every value of every table (and, for SQLite, every byte of its files), as text."""
    parts: list[str] = []
    with store.engine.connect() as conn:
        for table in Base.metadata.sorted_tables:
            parts.extend(repr(tuple(row)) for row in conn.execute(select(table)))
    if db_url.startswith("sqlite"):
        path = Path(db_url.removeprefix("sqlite:///"))
        for file in path.parent.glob(path.name + "*"):
            parts.append(file.read_bytes().decode("latin-1"))
    return "\n".join(parts)


def test_tokens_store_only_a_hash(store: Store, db_url: str) -> None:
    token = store.create_token("ana", "user", ["vision", "language"], created_by="root", now=T0)
    assert len(token) >= 40
    info = store.token_for(token)
    assert info is not None
    assert (info.user, info.role, info.queues, info.created_by, info.created_at, info.revoked_at) == (
        "ana",
        "user",
        ("vision", "language"),
        "root",
        T0,
        None,
    )
    assert info.may_submit_to("vision") and not info.may_submit_to("platform") and not info.is_admin
    assert store.token_for(token + "x") is None and store.token_for("") is None

    text_of_db = _database_text(store, db_url)
    assert token not in text_of_db
    assert hash_token(token) in text_of_db
    assert not any(token in repr(t) for t in store.list_tokens())

    assert store.revoke_token(info.id, now=T0 + 1)
    assert not store.revoke_token(info.id, now=T0 + 2)
    assert store.token_for(token) is None
    [listed] = store.list_tokens()
    assert listed.revoked_at == T0 + 1
    with pytest.raises(ValueError):
        store.create_token("ana", "superuser", ["*"], created_by="root", now=T0)


def test_a_token_keeps_its_expiry_and_a_revoked_one_is_still_found(store: Store) -> None:
    lasting = store.create_token("ana", "user", ["*"], created_by="root", now=T0)
    brief = store.create_token("bo", "user", ["*"], created_by="root", now=T0, expires_at=T0 + 60)
    assert [t.expires_at for t in store.list_tokens()] == [None, T0 + 60]
    info = store.token_for(brief)
    assert info is not None and info.expires_at == T0 + 60 and store.token_by_id(info.id) == info
    assert store.revoke_token(info.id, now=T0 + 1)
    assert store.token_for(brief) is None
    found = store.lookup_token(brief)
    assert found is not None and (found.revoked_at, found.expires_at) == (T0 + 1, T0 + 60)
    assert store.lookup_token(lasting + "x") is None and store.token_by_id(999) is None
    with pytest.raises(ValueError):
        store.create_token("cy", "user", ["*"], created_by="root", now=T0, expires_at=T0)


def test_ensure_token_is_idempotent_and_never_revives(store: Store) -> None:
    bootstrap = "operator-given-bootstrap-token-0123456789"
    first = store.ensure_token(bootstrap, "root", "admin", ["*"], now=T0)
    again = store.ensure_token(bootstrap, "root", "admin", ["*"], now=T0 + 5)
    assert first == again and first.is_admin and first.may_submit_to("anything")
    assert len(store.list_tokens()) == 1
    changed = store.ensure_token(bootstrap, "ops", "admin", ["platform"], now=T0 + 6)
    assert (changed.id, changed.user, changed.queues) == (first.id, "ops", ("platform",))
    assert store.revoke_token(first.id, now=T0 + 7)
    revived = store.ensure_token(bootstrap, "ops", "admin", ["platform"], now=T0 + 8)
    assert revived.revoked_at == T0 + 7 and store.token_for(bootstrap) is None
    with pytest.raises(ValueError):
        store.ensure_token("", "root", "admin", ["*"], now=T0)


# --- audit -------------------------------------------------------------------------------------


def test_audit_log_is_append_only_in_the_database(store: Store, db_url: str) -> None:
    first = store.audit("root", "approve", "job/1", {"tier": 1}, now=T0)
    second = store.audit("root", "token.create", "user/ana", None, now=T0 + 1)
    entries = store.audit_log()
    assert [e.id for e in entries] == [second, first]  # newest first
    assert (entries[1].actor, entries[1].action, entries[1].target, entries[1].details, entries[1].at) == (
        "root",
        "approve",
        "job/1",
        {"tier": 1},
        T0,
    )
    assert store.audit_log(limit=1) == entries[:1]

    refusals = ["UPDATE audit SET actor = 'mallory'", "DELETE FROM audit"]
    if db_url.startswith("postgresql"):
        refusals.append("TRUNCATE audit")
    for statement in refusals:
        with pytest.raises(DBAPIError, match="append-only"), store.engine.begin() as conn:
            conn.execute(text(statement))
    assert store.audit_log() == entries


# --- policies, ledger, nodes -------------------------------------------------------------------


def test_policies_are_versioned(store: Store) -> None:
    assert store.current_policy() is None
    v1 = store.apply_policy("queues: {name: cluster}\n", {"queues": {"name": "cluster"}}, "root", now=T0)
    v2 = store.apply_policy("min_grace: 60s\n", {"min_grace": 60.0}, "ops", now=T0 + 1)
    assert v2 > v1
    version, source, resolved = store.current_policy()  # type: ignore[misc]
    assert (version, source, resolved) == (v2, "min_grace: 60s\n", {"min_grace": 60.0})
    history = store.policy_history()
    assert [(p.version, p.applied_by, p.applied_at) for p in history] == [(v2, "ops", T0 + 1), (v1, "root", T0)]
    assert store.policy_history(limit=1) == history[:1]


def test_ledger_round_trip(store: Store) -> None:
    assert store.load_ledger() == (0.0, {})
    store.save_ledger(T0, {"vision": 1234.5, "language": 0.125})
    at, usage = store.load_ledger()
    assert (at, usage) == (T0, {"vision": 1234.5, "language": 0.125})
    store.save_ledger(T0 + 60, {"vision": 1000.0})
    ledger = store.load_ledger()
    assert ledger == (T0 + 60, {"vision": 1000.0})
    assert dict(ledger.to_engine().usage) == {"vision": 1000.0} and ledger.to_engine().at == T0 + 60


def test_nodes_are_replaced_whole(store: Store) -> None:
    assert store.nodes() == ()
    first = [
        NodeRecord("n1", 8, 64000, 512000, "h100", "rack1", ("NVIDIA H100",) * 8, T0),
        NodeRecord.from_engine(Node("n0", 4, flavor="a100"), updated_at=T0),
    ]
    store.replace_nodes(first)
    assert store.nodes() == (first[1], first[0])  # by name
    assert store.nodes()[1].to_engine() == Node("n1", 8, cpu=64000, memory=512000, flavor="h100", block="rack1")
    store.replace_nodes(
        [NodeRecord("n9", 4, updated_at=T0 + 1, down="DRAIN (disk)", foreign_gpus=3, foreign_indices=(0, 2))]
    )
    [n9] = store.nodes()
    assert (n9.name, n9.down, n9.foreign_gpus, n9.foreign_indices) == ("n9", "DRAIN (disk)", 3, (0, 2))
    assert (store.nodes()[0].down, first[0].foreign_gpus) == ("DRAIN (disk)", 0)
    store.replace_nodes([])
    assert store.nodes() == ()


# --- SQLite specifics --------------------------------------------------------------------------


def test_sqlite_connection_settings(tmp_path: Path) -> None:
    engine = connect(f"sqlite:///{tmp_path / 'w.db'}")
    try:
        with engine.connect() as conn:

            def pragma(name: str) -> Any:
                return conn.exec_driver_sql(f"PRAGMA {name}").scalar()

            assert (pragma("journal_mode"), pragma("synchronous"), pragma("foreign_keys"), pragma("busy_timeout")) == (
                "wal",
                2,
                1,
                5000,
            )  # synchronous 2 = FULL
    finally:
        engine.dispose()


def test_sqlite_enforces_foreign_keys(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'w.db'}")
    try:
        with pytest.raises(IntegrityError), store.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO events (job_id, at, to_state, reason, actor, details) "
                    "VALUES (42, 0, 'PENDING', 'x', 'y', '{}')"
                )
            )
    finally:
        store.close()


CHILD = """
import os, sys, time
from warden.store import Store
store = Store.open(sys.argv[1])
job_id = store.submit(name="durable", user="ana", queue="vision", tier=3, command=["true"], actor="ana", now=1.0)
os.write(int(sys.argv[2]), f"{job_id}\\n".encode())
time.sleep(60)
"""


def test_a_submission_survives_sigkill_the_instant_after_it_returned(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'warden.db'}"
    read_end, write_end = os.pipe()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, str(write_end)], pass_fds=(write_end,), env=env, stdin=subprocess.DEVNULL
    )
    os.close(write_end)
    try:
        ready, _, _ = select_module.select([read_end], [], [], 60)
        assert ready, "the child never reported its submission"
        line = os.read(read_end, 64)
        child.send_signal(signal.SIGKILL)
    finally:
        os.close(read_end)
        if child.poll() is None:
            child.kill()
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    job_id = int(line.decode().strip())
    store = Store.open(url)
    try:
        job = store.get(job_id)
        assert job is not None and job.name == "durable"
        assert [e.to_state for e in store.events(job_id)] == ["PENDING"]
    finally:
        store.close()


# --- URLs --------------------------------------------------------------------------------------


def test_default_url_follows_the_state_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARDEN_STATE_DIR", str(tmp_path / "explicit"))
    assert default_url() == f"sqlite:///{tmp_path / 'explicit' / 'warden.db'}"
    assert (tmp_path / "explicit").is_dir()
    monkeypatch.delenv("WARDEN_STATE_DIR")
    monkeypatch.setattr(paths.os, "geteuid", lambda: 1000)  # an ordinary user
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert state_dir() == tmp_path / "xdg" / "warden"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_url() == f"sqlite:///{tmp_path / 'home' / '.local' / 'state' / 'warden' / 'warden.db'}"


def test_missing_directories_above_the_state_directory_are_passable_whatever_the_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(paths.os, "geteuid", lambda: 1000)
    monkeypatch.delenv("WARDEN_STATE_DIR", raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    old = os.umask(0o077)  # the server's
    try:
        made = state_dir()
    finally:
        os.umask(old)
    for directory in (tmp_path / "home", tmp_path / "home" / ".local", tmp_path / "home" / ".local" / "state", made):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o755, directory


def test_as_root_the_default_state_directory_is_var_lib_warden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WARDEN_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", "/root/.local/state")  # a root login's own: not for the server
    monkeypatch.setattr(paths.os, "geteuid", lambda: 0)
    assert paths.default_state_dir() == Path("/var/lib/warden")
    monkeypatch.setenv("WARDEN_STATE_DIR", "/srv/warden")
    assert paths.default_state_dir() == Path("/srv/warden")


def test_postgresql_urls_use_psycopg_3() -> None:
    for url in ("postgresql://u@h:5/db", "postgres://u@h:5/db", "postgresql+psycopg://u@h:5/db"):
        assert normalize_url(url).drivername == "postgresql+psycopg"
    engine: Engine = connect("postgresql://u@127.0.0.1:1/db")
    assert engine.dialect.driver == "psycopg"
    engine.dispose()
    with pytest.raises(ValueError, match="mysql"):
        connect("mysql://u@h/db")


def test_postgresql_store_reached_through_a_plain_postgresql_url(fresh_postgres_url: str) -> None:
    plain = fresh_postgres_url.replace("postgresql+psycopg://", "postgresql://")
    store = Store.open(plain)
    try:
        assert store.engine.dialect.name == "postgresql"
        assert store.get(submit(store)) is not None
    finally:
        store.close()


def test_migrate_then_store_share_one_engine(db_url: str) -> None:
    engine = connect(db_url)
    try:
        migrate(engine)
        store = Store(engine)
        assert store.get(submit(store)) is not None
    finally:
        engine.dispose()


def test_active_read_again_only_where_rows_changed_equals_a_whole_read(store: Store) -> None:
    """`active()` keeps the rows it read and re-reads a job only when its version moved: after
    any mix of writes it must equal `fresh_active()`, which reads every row."""
    import random

    rng = random.Random(11)
    jobs: list[int] = []
    attempts: dict[int, int] = {}
    for step in range(120):
        now = T0 + step
        op = rng.choice(["submit", "submit", "start", "progress", "end", "explain", "mark", "read"])
        running = [j for j in jobs if attempts.get(j)]
        waiting = [j for j in jobs if not attempts.get(j)]
        if op == "submit" or not jobs:
            jobs.append(submit(store, now=now, gpus=rng.randint(0, 2)))
        elif op == "start" and waiting:
            j = rng.choice(waiting)
            n = store.get(j).attempt + 1  # type: ignore[union-attr]
            store.start_attempt(j, n, now, [ReplicaPlacement("n0", (0,))])
            move(store, j, JobState.RUNNING, reason="start", actor="warden", now=now)
            attempts[j] = n
        elif op == "progress" and running:
            j = rng.choice(running)
            store.update_attempt(j, attempts[j], progress_step=step, progress_at=now)
        elif op == "end" and running:
            j = rng.choice(running)
            store.end_attempt(j, attempts.pop(j), now, [0], "completed")
            state = rng.choice([JobState.SUCCEEDED, JobState.PENDING])
            move(store, j, state, reason="exit", actor="warden", now=now)
            if state is JobState.SUCCEEDED:
                jobs.remove(j)
        elif op == "explain" and waiting:
            store.set_explanations({rng.choice(waiting): {"reason": {"code": "Queued", "step": step}}})
        elif op == "mark":
            store.update(rng.choice(jobs), cancel_requested=rng.random() < 0.5)
        assert store.active() == store.fresh_active(), f"step {step} ({op})"
    assert {a.job.id for a in store.active()} == set(jobs)
