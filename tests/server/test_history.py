"""The dashboard's history (`GET /v1/history`): samples taken by the reconcile loop every
interval, read back after a restart, thinned and pruned; preemptions and lost work counted
from the attempts; the preemption kinds a database migrated from 0006 gets. A real service
(the local executor, real processes) on a clock the test moves, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from fastapi.testclient import TestClient
from pg import fresh_postgres_url, postgres_server  # noqa: F401  (fixtures)
from serverproc import end_everything, wait_for
from sqlalchemy import insert, text
from support import move

from warden.engine.model import JobState, Node, ReplicaPlacement
from warden.engine.policy import parse_policy
from warden.executors.base import Inventory
from warden.executors.local import LocalExecutor
from warden.server.app import create_app
from warden.server.history import KEEP_S, take_sample
from warden.server.service import Service
from warden.store import Store, connect, migrate
from warden.store.db import alembic_config
from warden.store.history import SAMPLES, HistorySample
from warden.store.leadership import NotLeader

T0 = 1_000_000.0
POLICY = {
    "min_grace": "120s",
    "thrash": {"min_efficiency": 0},
    "preemption": {"restart_overhead": "0s", "checkpoint_overhead": "0s"},
    "tiers": {3: {"name": "experimentation", "lease": "0s"}},
    "queues": {
        "name": "cluster",
        "children": [
            {"name": "research", "children": [{"name": "vision", "nominal": {"gpu": 2}}]},
            {"name": "language", "nominal": {"gpu": 2}},
        ],
    },
}
NODE = Node("node-0", 4, 16_000, 64_000)


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'warden.db'}"
    return str(request.getfixturevalue("fresh_postgres_url"))


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    opened = Store.open(db_url)
    yield opened
    opened.close()


def service(store: Store, state: Path, clock: Clock, interval_s: float = 60.0) -> Service:
    state.mkdir(exist_ok=True)
    return Service(store, LocalExecutor(), (NODE,), parse_policy(POLICY), state, clock, history_interval_s=interval_s)


def submit(store: Store, now: float, queue: str = "vision", tier: int = 3, gpus: int = 1) -> int:
    return store.submit(
        name="",
        user="ana",
        queue=queue,
        tier=tier,
        command=["sleep", "600"],
        workdir="/",
        actor="ana",
        now=now,
        gpus=gpus,
    )


@asynccontextmanager
async def no_lifespan(_: Any) -> AsyncIterator[None]:
    yield


def api(svc: Service) -> TestClient:
    """The real app on `svc`, without its reconcile loop (the test runs the passes)."""
    token = svc.store.create_token("admin", "admin", ["*"], "test", svc.now())
    app = create_app(svc)
    app.router.lifespan_context = no_lifespan
    return TestClient(app, headers={"Authorization": f"Bearer {token}"}, raise_server_exceptions=False)


def test_samples_are_taken_every_interval_and_read_back_after_a_restart(
    store: Store, db_url: str, tmp_path: Path
) -> None:
    clock = Clock(T0)
    svc = service(store, tmp_path / "state", clock)
    try:
        big = submit(store, T0, gpus=3)  # vision's nominal is 2: it borrows one GPU
        submit(store, T0, tier=4, gpus=2)  # 1 GPU is left: it waits
        svc.reconciler.reconcile()
        assert store.get(big).state.holds_resources  # type: ignore[union-attr]
        clock.t = T0 + 30
        svc.reconciler.reconcile()  # not an interval since the first sample: none
        assert [s.at for s in store.samples(0, 2 * T0, 2000)] == [T0]
        clock.t = T0 + 60
        svc.reconciler.reconcile()
        before = store.samples(0, 2 * T0, 2000)
        assert [s.at for s in before] == [T0, T0 + 60]
    finally:
        end_everything(svc)  # a cancel's SIGTERM is no preemption
        svc.stop()
        store.close()

    last = before[-1]
    assert last.cluster == {"gpus": 4, "gpus_used": 3, "gpus_down": 0, "pending_jobs": 1, "running_jobs": 1}
    vision = last.queues["vision"]
    assert vision == {
        "gpus_in_use": 3,
        "borrowed_gpus": 1,
        "pending_jobs": 1,
        "delivered_gpu_hours": pytest.approx(3 * 60 / 3600),
        "owed_gpu_hours": vision["owed_gpu_hours"],
        "max_wait_s": 60.0,
        "p50_wait_s": 60.0,
        "p95_wait_s": 60.0,
        "starving_jobs": 0,
        "preemptions": 0,
        "lost_gpu_hours": 0.0,
    }
    assert last.queues["research"]["gpus_in_use"] == 3 and last.queues["research"]["borrowed_gpus"] == 1
    assert last.queues["cluster"]["borrowed_gpus"] == 0  # the root's nominal is every leaf's: 4
    assert last.queues["language"]["gpus_in_use"] == 0 and last.queues["language"]["max_wait_s"] == 0.0
    assert set(last.queues) == {"cluster", "research", "vision", "language"}

    clock.t = T0 + 90
    reopened = Store.open(db_url)
    again = service(reopened, tmp_path / "state", clock)
    try:
        with api(again) as c:
            r = c.get("/v1/history")  # the last 24 h by default
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["interval_s"] == 60.0
            assert body["samples"] == [{"at": s.at, "cluster": s.cluster, "queues": s.queues} for s in before]
            only = c.get("/v1/history", params={"since": T0 + 1, "until": T0 + 60}).json()["samples"]
            assert [s["at"] for s in only] == [T0 + 60]
        again.reconciler.reconcile()  # 30 s after the last sample, taken before the restart: none
        assert len(reopened.samples(0, 2 * T0, 2000)) == 2
        clock.t = T0 + 120
        again.reconciler.reconcile()
        third = reopened.samples(0, 2 * T0, 2000)[-1]
        assert third.at == T0 + 120 and third.cluster["running_jobs"] == 0
        assert all(q["preemptions"] == 0 for q in third.queues.values())
    finally:
        end_everything(again)
        again.stop()
        reopened.close()


def preempted_attempt(
    store: Store, *, queue: str, kind: str | None, sigterm_at: float, lost: float | None, for_job: str | None = None
) -> int:
    """A 2-GPU job whose first attempt got SIGTERM at `sigterm_at` and, when `lost` is given,
    exited with that much lost work."""
    job = submit(store, sigterm_at - 100, queue=queue, gpus=2)
    store.start_attempt(job, 1, started_at=sigterm_at - 50, assignment=[ReplicaPlacement("node-0", (0, 1))])
    move(store, job, JobState.RUNNING, reason="running", actor="warden", now=sigterm_at - 50)
    store.update_attempt(
        job,
        1,
        state="terminating",
        sigterm_at=sigterm_at,
        kill_at=sigterm_at + 120,
        preempted_for=for_job,
        preemption_kind=kind,
    )
    if lost is not None:
        store.update_attempt(job, 1, lost_work_gpu_s=lost)
        store.end_attempt(job, 1, ended_at=sigterm_at + 10, exit_codes=[0], reason="preempted")
    return job


def test_a_sample_counts_the_preemptions_since_the_last_and_the_lost_work_recorded_since(store: Store) -> None:
    policy = parse_policy(POLICY)
    cluster = Inventory((NODE, Node("node-1", 8)), {"node-1": "DOWN"})
    ledger = store.load_ledger().to_engine()
    preempted_attempt(store, queue="vision", kind="preemption", sigterm_at=T0 - 10, lost=3600.0)  # before
    first = take_sample(store, policy, ledger, cluster, T0, None, 60.0)
    assert first.cluster["gpus"] == 12 and first.cluster["gpus_down"] == 8
    assert first.queues["vision"]["preemptions"] == 1  # in the last interval: no sample before
    assert first.queues["vision"]["lost_gpu_hours"] == 0.0  # no baseline: none
    store.record_sample(first, keep_after=0)

    in_grace = preempted_attempt(store, queue="vision", kind="reclaim", sigterm_at=T0 + 20, lost=None)
    preempted_attempt(store, queue="language", kind="eviction", sigterm_at=T0 + 30, lost=7200.0)
    preempted_attempt(store, queue="language", kind=None, sigterm_at=T0 + 40, lost=7200.0)  # a cancel's
    second = take_sample(store, policy, ledger, cluster, T0 + 60, store.last_sample(), 60.0)
    assert second.queues["vision"]["preemptions"] == 1 and second.queues["vision"]["lost_gpu_hours"] == 0.0
    assert second.queues["language"]["preemptions"] == 1 and second.queues["language"]["lost_gpu_hours"] == 2.0
    assert second.queues["research"]["preemptions"] == 1 and second.queues["cluster"]["preemptions"] == 2
    assert second.queues["cluster"]["lost_gpu_hours"] == 2.0
    store.record_sample(second, keep_after=0)

    # The victim that was in its grace exits: its lost work counts in the next sample.
    store.update_attempt(in_grace, 1, lost_work_gpu_s=1800.0)
    store.end_attempt(in_grace, 1, ended_at=T0 + 70, exit_codes=[0], reason="preempted")
    third = take_sample(store, policy, ledger, cluster, T0 + 120, store.last_sample(), 60.0)
    assert third.queues["vision"]["preemptions"] == 0 and third.queues["vision"]["lost_gpu_hours"] == 0.5
    assert third.queues["language"]["lost_gpu_hours"] == 0.0


def test_a_long_span_is_thinned_evenly_and_old_samples_are_pruned(store: Store) -> None:
    rows = [{"at": T0 + i, "cluster": {"i": i}, "queues": {}, "lost_totals": {}} for i in range(2500)]
    with store.engine.begin() as conn:
        conn.execute(insert(SAMPLES), rows)
    thinned = store.samples(T0, T0 + 2499, 2000)
    ats = [s.at - T0 for s in thinned]
    assert len(ats) == 2000 and ats[0] == 0 and ats[-1] == 2499
    assert {b - a for a, b in zip(ats, ats[1:])} == {1, 2}  # evenly: no gap wider than the others
    assert [s.cluster["i"] for s in thinned] == ats
    assert len(store.samples(T0 + 10, T0 + 19, 2000)) == 10

    late = T0 + 2499 + KEEP_S
    store.record_sample(HistorySample(late, {}, {}, {}), keep_after=late - KEEP_S)
    kept = store.samples(0, late, 5000)
    assert [s.at for s in kept] == [T0 + 2499, late]


def test_preemptions_before_the_migration_get_their_kind_from_their_event(db_url: str) -> None:
    engine = connect(db_url)
    try:
        config = alembic_config()
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, "0006")
        kinds = ("preemption", "reclaim", "eviction", "cancel", "unsignalled")
        made = dict(zip(kinds, range(1, len(kinds) + 1)))
        with engine.begin() as conn:  # as a server of revision 0006 wrote them
            for job in made.values():
                conn.execute(
                    text(
                        'INSERT INTO jobs (id, name, "user", queue, tier, state, replicas, gpus, cpu, memory, '
                        "placement, command, workdir, env, submit_at, preempted_at) VALUES (:job, '', 'ana', "
                        "'vision', 3, 'RUNNING', 1, 1, 0, 0, 'any', '[\"sleep\", \"600\"]', '/', '{}', :t, '[]')"
                    ),
                    {"job": job, "t": T0 + job},
                )
        reasons = {
            "preemption": f"preempted for job {made['cancel']} (downward); grace 120s",
            "reclaim": f"preempted for job {made['cancel']} (reclaim); grace 120s",
            "eviction": "evicted: node node-0 is DOWN; the whole gang stops and is requeued",
        }
        with engine.begin() as conn:
            for kind, job in made.items():
                signalled = kind != "unsignalled"
                conn.execute(
                    text(
                        "INSERT INTO attempts (job_id, number, state, started_at, assignment, borrowing, "
                        "checkpoint_s, log_dir, checkpoints, sigterm_at, preempted_for) VALUES "
                        "(:job, 1, 'terminating', :t, '[]', false, 0, '', 0, :s, :for)"
                    ),
                    {
                        "job": job,
                        "t": T0,
                        "s": T0 + 5 if signalled else None,
                        "for": str(made["cancel"]) if kind in ("preemption", "reclaim") else None,
                    },
                )
                if kind in reasons:
                    conn.execute(
                        text(
                            "INSERT INTO events (job_id, at, from_state, to_state, reason, actor, details) "
                            "VALUES (:job, :at, 'RUNNING', 'PREEMPTING', :reason, 'warden', '{}')"
                        ),
                        {"job": job, "at": T0 + 5, "reason": reasons[kind]},
                    )
        migrate(engine)
        kinds = {kind: Store(engine).attempt(job, 1).preemption_kind for kind, job in made.items()}  # type: ignore[union-attr]
        assert kinds == {
            "preemption": "preemption",
            "reclaim": "reclaim",
            "eviction": "eviction",
            "cancel": None,
            "unsignalled": None,
        }
    finally:
        engine.dispose()


def test_the_preemptions_query_walks_the_sigterm_index(tmp_path: Path) -> None:
    """With 100k attempts, the newest preemptions are read from `ix_attempts_sigterm_at`, not by
    scanning every attempt (SQLite's plan; PostgreSQL plans by its statistics)."""
    store = Store.open(f"sqlite:///{tmp_path / 'warden.db'}")
    try:
        with store.engine.connect() as conn:
            plan = conn.execute(
                text(
                    "EXPLAIN QUERY PLAN SELECT * FROM attempts JOIN jobs ON jobs.id = attempts.job_id "
                    "WHERE attempts.preemption_kind IS NOT NULL AND attempts.sigterm_at >= 0 "
                    "ORDER BY attempts.sigterm_at DESC LIMIT 200"
                )
            ).all()
        assert any("ix_attempts_sigterm_at" in str(row) for row in plan), plan
    finally:
        store.close()


def test_a_gang_on_a_node_that_goes_down_is_listed_as_an_eviction(store: Store, tmp_path: Path) -> None:
    nodes = (Node("node-0", 4, 16_000, 64_000), Node("node-1", 4, 16_000, 64_000))
    seen = [Inventory(nodes)]
    (tmp_path / "state").mkdir()
    policy = parse_policy({"min_grace": "120s", "queues": {"name": "cluster", "children": [{"name": "team"}]}})
    svc = Service(
        store, LocalExecutor(), nodes, policy, tmp_path / "state", inventory=lambda: seen[0], history_interval_s=1e-3
    )
    try:
        gang = store.submit(
            name="", user="ana", queue="team", tier=3, command=["sleep", "600"], workdir="/", actor="ana",
            now=time.time(), gpus=4, replicas=2,
        )  # fmt: skip
        svc.reconciler.reconcile()
        attempt = store.attempt(gang, 1)
        assert attempt is not None and {p.node for p in attempt.assignment} == {"node-0", "node-1"}
        seen[0] = Inventory(nodes, {"node-1": "DOWN"})
        svc.reconciler.reconcile()
        assert store.get(gang).state is JobState.PREEMPTING  # type: ignore[union-attr]
        sample = store.last_sample()
        assert sample is not None and sample.cluster["gpus"] == 8 and sample.cluster["gpus_down"] == 4
        assert sample.queues["team"]["preemptions"] == 1
        with api(svc) as c:
            [evicted] = c.get("/v1/preemptions").json()
            assert evicted["victim"] == str(gang) and evicted["kind"] == "eviction"
            assert (evicted["preemptor"], evicted["preemptor_queue"], evicted["preemptor_tier"]) == (None, None, None)
            assert evicted["reason"].startswith("evicted: node node-1 is DOWN")
            assert evicted["grace_s"] == pytest.approx(120.0, abs=1.0) and evicted["ended_at"] is None

            def requeued() -> bool:
                svc.reconciler.reconcile()  # collects the exit of the SIGTERMed gang
                return store.get(gang).state is JobState.PENDING  # type: ignore[union-attr]

            wait_for(requeued, what="the evicted gang requeued")
            [gone] = c.get("/v1/preemptions").json()
            assert gone["ended_at"] is not None and 0 <= gone["grace_used_s"] < gone["grace_s"]
            assert gone["lost_work_gpu_hours"] is not None
    finally:
        end_everything(svc)
        svc.stop()


def test_a_sample_refused_because_the_term_ended_ends_the_loop_without_a_traceback(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The sample is written after the pass, outside its lock: where the fence refuses that
    write (this server's term ended meanwhile), the loop stops as for a refused pass, and no
    traceback is logged for what is a step down, not a failure."""
    clock = Clock(T0)
    svc = service(store, tmp_path / "state", clock)

    def refused(*args: Any, **kwargs: Any) -> None:
        raise NotLeader("write refused: decided in epoch 1, and this server's term is epoch 2")

    monkeypatch.setattr(store, "record_sample", refused)
    try:
        stop = threading.Event()
        loop = threading.Thread(target=svc.reconciler.run, args=(stop, 0.05))
        loop.start()
        loop.join(30)
        stopped = not loop.is_alive()
        stop.set()
        loop.join(10)
    finally:
        end_everything(svc)
        svc.stop()
        store.close()
    assert stopped, "the loop went on after its sample's write was refused"
    assert svc.reconciler.lost is not None and "epoch 2" in svc.reconciler.lost
    assert "recording the history sample failed" not in caplog.text
    assert "Traceback" not in caplog.text
