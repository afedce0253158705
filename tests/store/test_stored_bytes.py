"""What a listing and an export read, and what a user keeps, on SQLite and on a real PostgreSQL:
finished jobs are counted and paged by the database and read without their command, env and
workdir; each user's stored bytes are counted in the submission's transaction and bounded."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from pg import fresh_postgres_url, postgres_server  # noqa: F401  (fixtures)
from sqlalchemy import event
from support import move

from warden.engine.model import JobState
from warden.store import Store
from warden.store import jobs as jobs_module
from warden.store.jobs import EXPORT_FINISHED, TERMINAL_STATES, TooMuchStored, stored_bytes

T0 = 1_700_000_000.0
BULKY = re.compile(r"\bjobs\.(command|env|workdir)\b")
"""A read of what a job's submitter wrote."""


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'warden.db'}"
    else:
        url = str(request.getfixturevalue("fresh_postgres_url"))
    opened = Store.open(url)
    try:
        yield opened
    finally:
        opened.close()


def submit(store: Store, **overrides: Any) -> int:
    fields: dict[str, Any] = dict(
        name="train", user="ana", queue="vision", tier=3, command=["python", "train.py"], actor="ana", now=T0
    )
    fields.update(overrides)
    return store.submit(**fields)


@contextmanager
def statements(store: Store) -> Iterator[list[str]]:
    """Every SQL statement the store's engine runs inside the block."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, sql: str, params: Any, context: Any, many: bool) -> None:
        seen.append(sql)

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(store.engine, "before_cursor_execute", record)


def reads_bulky(sql: str) -> bool:
    return sql.lstrip().upper().startswith("SELECT") and BULKY.search(sql) is not None


# --- the per-user bound ------------------------------------------------------------------------


def test_stored_bytes_count_command_env_and_workdir_in_utf8() -> None:
    assert stored_bytes(["python", "é"], {"K": "vé"}, "/w") == 6 + 2 + 1 + 3 + 2


def test_a_submission_past_the_bound_is_refused_and_stores_nothing(store: Store) -> None:
    command = ["x" * 100]
    for _ in range(3):
        submit(store, command=command, workdir="/", stored_bytes_limit=400)
    assert store.stored_bytes_of("ana") == 303
    with pytest.raises(TooMuchStored) as info:
        submit(store, command=command, env={"A": "b" * 10}, workdir="/", stored_bytes_limit=400)
    assert (info.value.user, info.value.kept, info.value.adding, info.value.limit) == ("ana", 303, 112, 400)
    assert "303 bytes in unfinished jobs; 112 more would pass the limit of 400" in str(info.value)
    assert len(store.list(user="ana")) == 3 and store.stored_bytes_of("ana") == 303
    submit(store, command=["y" * 96], stored_bytes_limit=400)  # exactly to the bound
    assert store.stored_bytes_of("ana") == 399
    submit(store, user="bo", command=command, stored_bytes_limit=400)  # every user has a bound of their own
    assert store.stored_bytes_of("bo") == 100


def kept(store: Store, user: str = "ana") -> int:
    """What `user`'s stored jobs keep, counted from every whole row."""
    return sum(stored_bytes(j.command, j.env, j.workdir) for j in store.list(user=user))


def test_the_oldest_finished_jobs_are_dropped_to_make_room_and_no_more(store: Store) -> None:
    ids = [submit(store, command=["z" * 50], stored_bytes_limit=None) for _ in range(4)]
    submit(store, user="bo", command=["z" * 50])
    move(store, ids[2], JobState.CANCELLED, reason="cancel", actor="ana", now=T0 + 1)
    move(store, ids[0], JobState.SUCCEEDED, reason="done", actor="warden", now=T0 + 2)
    move(store, ids[1], JobState.FAILED, reason="done", actor="warden", now=T0 + 3)
    assert store.stored_bytes_of("ana") == 200 == kept(store)  # a finished job keeps its command until then
    before = store.get(ids[0])
    assert before is not None and before.command_expired_at is None

    fifth = submit(store, command=["z" * 50], stored_bytes_limit=249, now=T0 + 10)
    after = store.get(ids[0])
    assert after is not None and (after.command, after.env, after.workdir) == ((), {}, "")
    assert after.command_expired_at == T0 + 10 and after.version > before.version
    assert after.state is JobState.SUCCEEDED and after.name == before.name  # the rest of it stays
    assert [j.command_expired_at is None for j in store.list(user="ana")] == [False, True, True, True, True]
    assert store.stored_bytes_of("ana") == 200 == kept(store)

    submit(store, command=["z" * 120], stored_bytes_limit=249, now=T0 + 11)  # takes both others
    assert [j.id for j in store.list(user="ana") if j.command_expired_at is not None] == ids[:3]
    assert store.stored_bytes_of("ana") == 50 + 50 + 120 == kept(store)
    with pytest.raises(TooMuchStored) as info:  # only unfinished jobs left
        submit(store, command=["z" * 50], stored_bytes_limit=249, now=T0 + 12)
    assert info.value.kept == 220
    assert store.stored_bytes_of("bo") == 50 == kept(store, "bo")  # another user's jobs are theirs
    assert fifth in {j.id for j in store.list(user="ana")}


def test_a_user_already_past_the_bound_is_brought_under_it_a_few_jobs_a_transaction(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs kept from before a limit (or a lower one): the next submission first drops the
    oldest finished jobs down to the limit in transactions of at most `_TRIM_BYTES` each, so no
    other write waits behind one huge drop; the submission itself then drops only its own size."""
    monkeypatch.setattr(jobs_module, "_TRIM_BYTES", 120)
    ids = [submit(store, command=["z" * 50]) for _ in range(10)]
    for i, job_id in enumerate(ids[:8]):
        move(store, job_id, JobState.SUCCEEDED, reason="done", actor="warden", now=T0 + 1 + i)
    assert store.stored_bytes_of("ana") == 500
    drops: list[int] = []  # jobs dropped by each transaction that dropped any
    pending: list[int] = [0]

    def executed(conn: Any, cursor: Any, sql: str, params: Any, context: Any, many: bool) -> None:
        if sql.lstrip().upper().startswith("UPDATE JOBS") and "command_expired_at" in sql:
            pending[0] += cursor.rowcount

    def committed(conn: Any) -> None:
        if pending[0]:
            drops.append(pending[0])
        pending[0] = 0

    event.listen(store.engine, "after_cursor_execute", executed)
    event.listen(store.engine, "commit", committed)
    try:
        submit(store, command=["n" * 50], stored_bytes_limit=260, now=T0 + 20)
    finally:
        event.remove(store.engine, "after_cursor_execute", executed)
        event.remove(store.engine, "commit", committed)
    # 500 bytes: 3 jobs (≥ 120 bytes), then 2 (≥ 90) bring it to 250; the submission takes 1 more.
    assert drops == [3, 2, 1], drops
    assert [j.id for j in store.list(user="ana") if j.command_expired_at is not None] == ids[:6]
    assert store.stored_bytes_of("ana") == 250 == kept(store)


def test_a_refusal_drops_nothing(store: Store) -> None:
    small = submit(store, command=["s" * 10])
    move(store, small, JobState.CANCELLED, reason="cancel", actor="ana", now=T0 + 1)
    submit(store, command=["u" * 80])
    with pytest.raises(TooMuchStored) as info:  # the finished 10 bytes would not make room for 30
        submit(store, command=["n" * 30], stored_bytes_limit=100)
    assert info.value.kept == 80
    job = store.get(small)
    assert job is not None and job.command == ("s" * 10,) and job.command_expired_at is None
    assert store.stored_bytes_of("ana") == 90 == kept(store)


def test_written_fields_are_fixed_once_stored(store: Store) -> None:
    job = submit(store)
    with pytest.raises(ValueError, match="command"):
        store.update(job, command=["much longer than before"])  # the count stays exact
    with pytest.raises(ValueError, match="env"):
        store.update(job, env={"A": "b"})


def test_concurrent_submissions_never_pass_the_bound(store: Store) -> None:
    errors: list[BaseException] = []
    refused = [0]
    lock = threading.Lock()

    def flood() -> None:
        for _ in range(6):
            try:
                submit(store, command=["w" * 100], stored_bytes_limit=1000)
            except TooMuchStored:
                with lock:
                    refused[0] += 1
            except BaseException as err:  # pragma: no cover - reported below
                errors.append(err)

    threads = [threading.Thread(target=flood) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(store.list(user="ana")) == 10 and refused[0] == 26
    assert store.stored_bytes_of("ana") == 1000


# --- listings ------------------------------------------------------------------------------------


def finished_jobs(store: Store, n: int, size: int) -> list[int]:
    """`n` jobs of users ana and bo in queues vision and language, each with `size` bytes of
    command and env, ended in turn SUCCEEDED, FAILED, CANCELLED and TIMEOUT."""
    ends = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT)
    ids = []
    for i in range(n):
        job = submit(
            store,
            user=("ana", "bo")[i % 2],
            queue=("vision", "language")[i % 3 % 2],
            command=["c" * (size // 2)],
            env={"E": "e" * (size // 2)},
        )
        move(store, job, ends[i % 4], reason="end", actor="warden", now=T0 + i)
        ids.append(job)
    return ids


def test_a_page_of_finished_jobs_is_counted_and_paged_by_the_database_without_their_bulk(store: Store) -> None:
    finished_jobs(store, 24, 64 << 10)
    whole = {j.id: j for j in store.list()}
    with statements(store) as seen:
        part = store.finished_part(states=TERMINAL_STATES, offset=0, limit=1)
    assert part.total == 24 and [j.id for j in part.page] == [min(whole)]
    assert not [s for s in seen if reads_bulky(s)], seen
    assert any("LIMIT" in s.upper() for s in seen)  # paged in SQL, not here
    head = part.page[0]
    assert not hasattr(head, "command") and head.name == whole[head.id].name and head.state is whole[head.id].state


@pytest.mark.parametrize(
    "states, queue, user",
    [
        (TERMINAL_STATES, None, None),
        ({"CANCELLED", "TIMEOUT"}, None, None),
        (TERMINAL_STATES, "vision", None),
        (TERMINAL_STATES, None, "bo"),
        ({"SUCCEEDED"}, "language", "ana"),
    ],
)
def test_finished_pages_are_the_filtered_jobs_by_id(
    store: Store, states: frozenset[str], queue: str | None, user: str | None
) -> None:
    finished_jobs(store, 30, 10)
    expected = [j.id for j in store.list(queue=queue, state=states, user=user)]
    for offset, limit in [(0, None), (0, 1), (3, 4), (7, 100), (len(expected), 5), (100, 1)]:
        part = store.finished_part(states=states, queue=queue, user=user, offset=offset, limit=limit)
        assert part.total == len(expected)
        assert [j.id for j in part.page] == expected[offset : None if limit is None else offset + limit]


def test_unfinished_jobs_before_a_page_shift_it_and_those_ended_since_are_listed_once(store: Store) -> None:
    done = finished_jobs(store, 5, 10)
    waiting = [submit(store) for _ in range(3)]
    move(store, waiting[1], JobState.CANCELLED, reason="cancel", actor="ana", now=T0 + 9)  # ended since read
    part = store.finished_part(states=TERMINAL_STATES, before=waiting, offset=1, limit=4)
    assert part.ended == {waiting[1]} and part.total == 6
    # The listing shows the two still unfinished first: its rows 1..4 are the first finished ones.
    assert [j.id for j in part.page] == done[:3]


# --- the export ----------------------------------------------------------------------------------


def test_the_export_window_counts_in_sql_and_its_batches_read_no_bulk(store: Store) -> None:
    ids = finished_jobs(store, 12, 32 << 10)
    for job in ids[:9]:
        store.start_attempt(job, 1, T0, [], log_dir="")
        if job == ids[4]:
            store.update_attempt(job, 1, lost_work_basis="assumed")
    never_ran = ids[9:]
    with statements(store) as seen:
        window = store.export_window(T0 - 1)
        batch = store.export_batch(window.ids[:5])
    assert list(window.ids) == ids[:9]  # (submit, id) order; the jobs that never ran left out
    states = {j.id: j.state.value for j in store.list()}
    assert window.unfinished == sum(states[i] not in EXPORT_FINISHED for i in ids[:9])
    assert states[ids[4]] == "SUCCEEDED" and window.assumed == 1
    assert [j.id for j, _ in batch] == ids[:5] and [len(a) for _, a in batch] == [1] * 5
    assert not [s for s in seen if reads_bulky(s)], seen
    assert not set(never_ran) & set(window.ids)
