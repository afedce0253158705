"""What a listing and an export cost the server, and what a user may keep: `GET /v1/jobs` pages
finished jobs in SQL and reads none of their commands and envs, in the order and with the total
it always had; `GET /v1/history/export` streams every row, a batch of jobs at a time; a user's
stored bytes are bounded by `limits.max_stored_bytes_per_user`. A real service on SQLite."""

from __future__ import annotations

import csv
import io
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import astuple
from pathlib import Path
from typing import Any

import pytest
from apiclient import Clock, api_service
from fastapi.testclient import TestClient
from sqlalchemy import event
from support import move

from warden.engine.model import JobState, Node
from warden.engine.policy import PolicyError, parse_policy
from warden.server import export as export_module
from warden.server.api import _releasing
from warden.server.errors import ApiError
from warden.server.expensive_request_limits import PerUserLimit
from warden.server.export import csv_chunks, export, exported_job
from warden.server.service import Service
from warden.server.views import listing_order
from warden.store.jobs import stored_bytes
from warden.traces import native_cell

T0 = 1_000_000.0
POLICY: dict[str, Any] = {
    "queues": {"name": "cluster", "children": [{"name": "team"}, {"name": "other"}]},
    "limits": {"max_stored_bytes_per_user": 1000},
}
BULK = 256 << 10
"""Bytes of command and env of each large job: the API's own limits allow 512 KiB."""


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Service, TestClient, Clock]]:
    clock = Clock(T0)
    with api_service(tmp_path, POLICY, (Node("node-0", 2, 16_000, 64_000),), clock) as (svc, client):
        yield svc, client, clock


def stored(svc: Service, *, user: str = "ana", queue: str = "team", size: int = 10, end: JobState | None = None) -> int:
    """A job stored as `POST /v1/jobs` stores it (no bound: the store's own), ended in `end`."""
    job = svc.store.submit(
        name="big" if size > 1000 else "",
        user=user,
        queue=queue,
        tier=3,
        command=["c" * (size // 2)],
        env={"E": "e" * (size // 2)},
        workdir="/",
        actor=user,
        now=svc.now(),
    )
    if end is not None:
        move(svc.store, job, end, reason="end", actor="warden", now=svc.now())
    return job


@contextmanager
def peak_bytes() -> Iterator[list[int]]:
    """The most memory Python held above what it held at the start of the block, every thread."""
    out: list[int] = []
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        yield out
        out.append(tracemalloc.get_traced_memory()[1] - start)
    finally:
        tracemalloc.stop()


# --- listings ------------------------------------------------------------------------------------


def test_a_page_over_many_large_finished_jobs_reads_none_of_their_bulk(
    setup: tuple[Service, TestClient, Clock],
) -> None:
    svc, c, _ = setup
    jobs = [stored(svc, size=BULK, end=JobState.SUCCEEDED) for _ in range(40)]  # 10 MiB of commands and envs
    waiting = stored(svc)
    c.get("/v1/jobs", params={"all": "true", "limit": 1})  # the first request's one-time costs
    with peak_bytes() as peak:
        started = time.perf_counter()
        page = c.get("/v1/jobs", params={"all": "true", "limit": 1, "offset": 1})
        took = time.perf_counter() - started
    assert page.status_code == 200 and page.headers["X-Total-Count"] == "41"
    assert [j["id"] for j in page.json()] == [str(jobs[0])]  # the waiting one first, then by id
    assert peak[0] < 2 << 20, f"a page of one job held {peak[0] / 2**20:.1f} MiB"  # not the 10 MiB
    assert took < 2.0
    assert c.get("/v1/jobs", params={"limit": 1}).json()[0]["id"] == str(waiting)
    whole = c.get(f"/v1/jobs/{jobs[0]}").json()
    assert len(whole["command"][0]) == BULK // 2  # the job itself still shows its command


def reference(svc: Service, queue: str | None, states: set[str] | None, user: str | None) -> list[str]:
    """`GET /v1/jobs`'s order, from every whole row: what a listing was before it paged in SQL."""
    rows = [
        j
        for j in svc.store.list()
        if (queue is None or j.queue == queue)
        and (user is None or j.user == user)
        and (states is None or j.state.value in states)
    ]
    return [str(j.id) for j in sorted(rows, key=listing_order)]


UNFINISHED = {s.value for s in JobState if not s.terminal}


@pytest.mark.parametrize(
    "params, queue, states, user",
    [
        ({}, None, UNFINISHED, None),
        ({"all": "true"}, None, None, None),
        ({"all": "true", "queue": "other"}, "other", None, None),
        ({"all": "true", "user": "bo"}, None, None, "bo"),
        ({"state": "CANCELLED,PENDING"}, None, {"CANCELLED", "PENDING"}, None),
        ({"state": "RUNNING,SUCCEEDED", "user": "ana"}, None, {"RUNNING", "SUCCEEDED"}, "ana"),
        ({"state": "FAILED", "queue": "team", "user": "bo"}, "team", {"FAILED"}, "bo"),
    ],
)
def test_pages_in_sql_list_what_the_whole_table_listed(
    setup: tuple[Service, TestClient, Clock],
    params: dict[str, str],
    queue: str | None,
    states: set[str] | None,
    user: str | None,
) -> None:
    svc, c, clock = setup
    ends = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT, None)
    for i in range(25):
        clock.t = T0 + i
        stored(svc, user=("ana", "bo")[i % 2], queue=("team", "other")[i % 3 % 2], end=ends[i % 5])
    svc.reconciler.reconcile()  # two of them start: running ones are listed first
    assert len(svc.store.list(state="RUNNING")) == 2
    expected = reference(svc, queue, states, user)
    assert len(expected) >= 2
    for offset, limit in [(0, None), (0, 1), (1, 2), (2, 5), (len(expected) - 1, 10), (len(expected), 3)]:
        query = dict(params, offset=str(offset)) | ({} if limit is None else {"limit": str(limit)})
        r = c.get("/v1/jobs", params=query)
        assert r.status_code == 200, r.text
        assert r.headers["X-Total-Count"] == str(len(expected))
        assert [j["id"] for j in r.json()] == expected[offset : None if limit is None else offset + limit], query


# --- the export ----------------------------------------------------------------------------------


def ran(svc: Service, clock: Clock, n: int, size: int = 10) -> list[int]:
    """`n` jobs that ran once: most succeeded, every third one failed after an assumed loss,
    every seventh still runs."""
    ids = []
    for i in range(n):
        clock.t = T0 + i
        job = stored(svc, user=("ana", "bo")[i % 2], size=size)
        move(svc.store, job, JobState.RUNNING, reason="start", actor="warden", now=clock.t)
        svc.store.start_attempt(job, 1, clock.t, [], log_dir="")
        if i % 7 == 6:
            ids.append(job)
            continue
        svc.store.end_attempt(job, 1, clock.t + 50, [0], "completed")
        if i % 3 == 2:
            svc.store.update_attempt(job, 1, lost_work_gpu_s=5.0, lost_work_basis="assumed")
        move(
            svc.store, job, JobState.FAILED if i % 3 == 2 else JobState.SUCCEEDED, reason="end", actor="w", now=clock.t
        )
        ids.append(job)
    stored(svc)  # never ran: not exported
    return ids


def test_the_export_streams_every_row_as_the_whole_table_gave_it(setup: tuple[Service, TestClient, Clock]) -> None:
    svc, c, clock = setup
    ids = ran(svc, clock, export_module.BATCH * 2 + 37)
    clock.t = T0 + 5000
    answer = c.get("/v1/history/export", params={"since": T0 - 1})
    assert answer.status_code == 200, answer.text
    rows = list(csv.reader(io.StringIO(answer.text)))
    expected = [
        [native_cell(v) for v in astuple(exported_job(j, svc.store.attempts(j.id), svc.policy, clock.t))]
        for j in (svc.store.get(i) for i in ids)
        if j is not None
    ]
    assert rows[1:] == expected and answer.headers["X-Total-Count"] == str(len(ids))
    running = sum(1 for i in range(len(ids)) if i % 7 == 6)
    assumed = sum(1 for i in range(len(ids)) if i % 7 != 6 and i % 3 == 2)
    assert answer.headers["Warning"].startswith(f'299 - "{running + assumed} of {len(ids)} durations')
    assert f"{running} never finished" in answer.headers["Warning"]
    assert f"{assumed} had their lost work assumed" in answer.headers["Warning"]

    pq = pytest.importorskip("pyarrow.parquet")
    parquet = c.get("/v1/history/export", params={"since": T0 - 1, "format": "parquet"})  # the hold was let go
    assert parquet.status_code == 200, parquet.text
    table = pq.read_table(io.BytesIO(parquet.content))
    assert table.column("job_id").to_pylist() == [str(i) for i in ids]
    assert pq.ParquetFile(io.BytesIO(parquet.content)).num_row_groups == 3  # one a batch
    empty = c.get("/v1/history/export", params={"since": T0 + 4000, "format": "parquet"})
    assert pq.read_table(io.BytesIO(empty.content)).num_rows == 0 and empty.headers["X-Total-Count"] == "0"


def test_the_export_reads_its_jobs_a_batch_at_a_time_as_it_writes_them(
    setup: tuple[Service, TestClient, Clock],
) -> None:
    svc, _, clock = setup
    ran(svc, clock, export_module.BATCH * 2 + 1)
    reads: list[str] = []

    def record(conn: Any, cursor: Any, sql: str, *_: Any) -> None:
        if "FROM attempts" in sql:
            reads.append(sql)

    event.listen(svc.store.engine, "before_cursor_execute", record)
    try:
        out = export(svc.store, T0 - 1, svc.policy, clock.t)
        assert out.total == export_module.BATCH * 2 + 1
        after_headers = len(reads)  # the window's counts
        chunks = csv_chunks(out.rows)
        first = next(chunks)
        assert len(reads) == after_headers + 1  # the first batch only
        assert first.count("\n") == 1 + export_module.BATCH  # the header and that batch's rows
        rest = list(chunks)
        assert len(reads) == after_headers + 3
        assert sum(chunk.count("\n") for chunk in rest) == export_module.BATCH + 1
    finally:
        event.remove(svc.store.engine, "before_cursor_execute", record)


def test_an_export_of_large_jobs_holds_a_batch_not_their_commands(setup: tuple[Service, TestClient, Clock]) -> None:
    svc, c, clock = setup
    ran(svc, clock, 40, size=BULK)  # 10 MiB of commands and envs
    c.get("/v1/history/export", params={"since": T0 - 1})  # the first request's one-time costs
    with peak_bytes() as peak:
        answer = c.get("/v1/history/export", params={"since": T0 - 1})
    assert answer.status_code == 200 and answer.headers["X-Total-Count"] == "40"
    assert peak[0] < 2 << 20, f"an export of 40 jobs held {peak[0] / 2**20:.1f} MiB"


# --- what a user keeps ---------------------------------------------------------------------------


def user_client(c: TestClient, user: str) -> TestClient:
    r = c.post("/v1/tokens", json={"user": user, "role": "user"})
    assert r.status_code == 201, r.text
    return TestClient(c.app, headers={"Authorization": f"Bearer {r.json()['token']}"}, raise_server_exceptions=False)


def test_a_user_past_the_stored_bound_is_refused_naming_it_until_a_finished_job_makes_room(
    setup: tuple[Service, TestClient, Clock], tmp_path: Path
) -> None:
    svc, c, _ = setup
    workdir = str(tmp_path)
    job = {"queue": "team", "tier": 3, "command": ["echo", "x" * 296], "workdir": workdir}
    each = stored_bytes(job["command"], {}, workdir)
    with user_client(c, "ana") as ana:
        ids = []
        while (len(ids) + 1) * each <= 1000:
            r = ana.post("/v1/jobs", json=job)
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
        refused = ana.post("/v1/jobs", json=job)
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["field"] == "user" and error["value"] == "ana"
        kept = len(ids) * each
        assert f"keeps {kept} bytes of commands, envs and workdirs in unfinished jobs" in error["message"]
        assert f"this job's {each} more would pass the limit of 1000 bytes" in error["message"]
        assert "limits.max_stored_bytes_per_user" in error["message"]
        assert len(svc.store.list(user="ana")) == len(ids) and svc.store.stored_bytes_of("ana") == kept

        assert ana.post(f"/v1/jobs/{ids[0]}/cancel").status_code in (200, 202)
        assert svc.store.get(int(ids[0])).state is JobState.CANCELLED  # type: ignore[union-attr]
        shown = ana.get(f"/v1/jobs/{ids[0]}").json()
        assert shown["command"] == job["command"] and shown["command_expired_at"] is None  # kept while room is
        again = ana.post("/v1/jobs", json=job)
        assert again.status_code == 201, again.text  # the cancelled job's command made room
        dropped = ana.get(f"/v1/jobs/{ids[0]}").json()
        assert dropped["command"] == [] and dropped["workdir"] == "" and dropped["command_expired_at"] == svc.now()
        assert dropped["state"] == "CANCELLED" and svc.store.stored_bytes_of("ana") == kept
        assert ana.post("/v1/jobs", json=job).status_code == 422  # no finished job left to drop
    with user_client(c, "bo") as bo:
        assert bo.post("/v1/jobs", json=job).status_code == 201  # a bound per user
    assert c.post("/v1/jobs", json=job).status_code == 201  # admins are exempt
    assert c.post("/v1/jobs", json=job).status_code == 201


@pytest.mark.parametrize("value", [0, -1, 1.5, "1GB"])
def test_a_stored_bound_out_of_range_is_refused_naming_it(value: object) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy({"limits": {"max_stored_bytes_per_user": value}})
    assert [i.path for i in info.value.issues] == ["limits.max_stored_bytes_per_user"]
    assert repr(value) in str(info.value) or str(value) in str(info.value)


def test_the_stored_bound_has_a_default() -> None:
    assert parse_policy({}).limits.max_stored_bytes_per_user == 1 << 30


def test_an_export_that_fails_while_it_is_sent_lets_its_slot_go() -> None:
    """The slot of `GET /v1/history/export` (one per user) is held while the rows are sent and
    let go however the sending ends: here a read that fails after the first chunk."""
    limit = PerUserLimit("history exports")

    def failing() -> Iterator[str]:
        yield "header\n"
        raise OSError("the database went away")

    with ExitStack() as held:
        held.enter_context(limit.hold("ana"))
        sent = held.pop_all()
    chunks = _releasing(failing(), sent)
    assert next(chunks) == "header\n"
    with pytest.raises(ApiError):
        limit.hold("ana").__enter__()  # held while it is sent
    with pytest.raises(OSError):
        next(chunks)
    with limit.hold("ana"):  # let go
        pass
