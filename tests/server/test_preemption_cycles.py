"""A job's preemption history and its preemption cycle as the API and `/metrics` show them: the
store's preemption links read for a pair of jobs that alternated (a real SQLite store), and a
job evicted more often than the thrash budget allows by a node that keeps going down (a real
service with the local executor and real processes; the test runs the passes)."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from serverproc import end_everything, wait_for

from warden.engine.model import JobState, Node, ReplicaPlacement
from warden.engine.policy import parse_policy
from warden.executors.base import Inventory
from warden.executors.local import LocalExecutor
from warden.server.app import create_app
from warden.server.service import Service
from warden.server.views import cycles_of, job_detail
from warden.store import Store

T0 = 1_000_000.0
POLICY = {
    "min_grace": "120s",
    "thrash": {"min_efficiency": 0, "max_preemptions": {"per": "24h", "count": 1}},
    "preemption": {"restart_overhead": "10s"},
    "queues": {"name": "cluster", "children": [{"name": "vision"}, {"name": "language"}]},
}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store.open(f"sqlite:///{tmp_path / 'warden.db'}")
    yield opened
    opened.close()


def submit(store: Store, queue: str, now: float) -> int:
    return store.submit(
        name="", user="ana", queue=queue, tier=3, command=["sleep", "600"], workdir="/", actor="ana", now=now
    )


def preempted(store: Store, job: int, number: int, at: float, by: int, lost: float = 3600.0) -> None:
    """Attempt `number` of `job` ran 100 s, checkpointing 5 s, and was preempted for `by` at `at`."""
    store.start_attempt(job, number, started_at=at - 100, assignment=[ReplicaPlacement("node-0", (0,))])
    store.update_attempt(job, number, checkpoint_s=5.0, startup_s=15.0)
    store.update_attempt(
        job,
        number,
        state="terminating",
        sigterm_at=at,
        kill_at=at + 120,
        preempted_for=str(by),
        preemption_kind="reclaim",
    )
    store.end_attempt(
        job,
        number,
        ended_at=at + 3,
        exit_codes=[0],
        reason="preempted",
        lost_work_gpu_s=lost,
        lost_work_basis="assumed",
    )


def test_two_jobs_that_took_capacity_back_and_forth_are_both_in_an_alternating_cycle(store: Store) -> None:
    policy = parse_policy(POLICY | {"thrash": {"max_preemptions": {"per": "1h", "count": 3}}})
    a, b, c = submit(store, "vision", T0), submit(store, "language", T0), submit(store, "language", T0)
    preempted(store, a, 1, T0 + 1000, by=b)
    preempted(store, c, 1, T0 + 1500, by=a)  # a third party in between
    preempted(store, b, 1, T0 + 2000, by=a)
    job = store.get(a)
    assert job is not None
    before = job_detail(job, (), store.attempts(a), T0 + 2500, policy, links=store.preemption_links([a]))
    assert before["preemption_cycle"] is None  # one round trip: a for b, b for a
    assert cycles_of(store, [store.get(i) for i in (a, b, c)], policy) == {}  # type: ignore[misc]

    preempted(store, a, 2, T0 + 3000, by=b)
    store.start_attempt(a, 3, started_at=T0 + 3100, assignment=[ReplicaPlacement("node-0", (0,))])
    detail = job_detail(
        job,
        (),
        store.attempts(a),
        T0 + 3200,
        policy,
        links=store.preemption_links([a]),
        preemptors=store.queues_and_tiers([str(b)]),
    )
    assert detail["preemptions"] == [
        {
            "attempt": n,
            "at": at,
            "by": str(b),
            "by_queue": "language",
            "by_tier": 3,
            "kind": "reclaim",
            "lost_work_gpu_hours": 1.0,
            "lost_work_basis": "assumed",
            "lost_work_why": "assumed: no checkpoint was reported and the job did not declare --saves-on-sigterm; "
            "counted from its last start",
            "grace_used_s": 3.0,
            "efficiency": 0.8,  # (100 - (15 + 5)) / 100, up to the SIGTERM
        }
        for n, at in ((1, T0 + 1000), (2, T0 + 3000))
    ]
    assert [x["efficiency"] for x in detail["attempts"]] == [0.8, 0.8, None]  # the third still runs
    assert detail["preemption_cycle"] == {
        "kind": "alternating",
        "message": f"It and job {b} have preempted each other back and forth in 3 turns: it was preempted "
        f"for job {b} twice, and job {b} for it once.",
        "details": {
            "partner": str(b),
            "turns": 3,
            "preempted_by_partner": 2,
            "preempted_partner": 1,
            "first_at": T0 + 1000,
            "last_at": T0 + 3000,
        },
    }
    flagged = cycles_of(store, [store.get(i) for i in (a, b, c)], policy)  # type: ignore[misc]
    assert {i: [x.kind for x in cs] for i, cs in flagged.items()} == {a: ["alternating"], b: ["alternating"]}
    assert flagged[b][0].details()["partner"] == str(a)


# -- a node that keeps going down ----------------------------------------------------------------


@asynccontextmanager
async def no_lifespan(_: Any) -> AsyncIterator[None]:
    yield


def metric(text: str, name: str, kind: str) -> float | None:
    m = re.search(rf'^{name}\{{kind="{kind}"\}} (\S+)$', text, re.M)
    return None if m is None else float(m.group(1))


def test_a_job_evicted_past_its_thrash_budget_is_flagged_in_the_api_and_the_metrics(
    store: Store, tmp_path: Path
) -> None:
    node = Node("node-0", 4, 16_000, 64_000)
    seen = [Inventory((node,))]
    (tmp_path / "state").mkdir()
    svc = Service(store, LocalExecutor(), (node,), parse_policy(POLICY), tmp_path / "state", inventory=lambda: seen[0])
    token = store.create_token("admin", "admin", ["*"], "test", time.time())
    app = create_app(svc)
    app.router.lifespan_context = no_lifespan
    try:
        job = store.submit(
            name="", user="ana", queue="vision", tier=3, command=["sleep", "600"], workdir="/", actor="ana",
            now=time.time(), gpus=4,
        )  # fmt: skip

        def state_after_pass() -> JobState:
            svc.reconciler.reconcile()
            got = store.get(job)
            assert got is not None
            return got.state

        with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as c:
            for round_ in (1, 2):
                seen[0] = Inventory((node,))
                wait_for(lambda: state_after_pass() is JobState.RUNNING, what="the job running")
                if round_ == 2:  # one eviction: within the budget of 1 per 24 h
                    assert c.get(f"/v1/jobs/{job}").json()["preemption_cycle"] is None
                    assert metric(c.get("/metrics").text, "warden_jobs_in_preemption_cycle", "over_budget") == 0
                seen[0] = Inventory((node,), {"node-0": "DOWN"})
                wait_for(lambda: state_after_pass() is JobState.PENDING, what="the evicted job requeued")

            detail = c.get(f"/v1/jobs/{job}").json()
            assert [(p["attempt"], p["by"], p["by_queue"], p["kind"]) for p in detail["preemptions"]] == [
                (1, None, None, "eviction"),
                (2, None, None, "eviction"),
            ]
            assert all(
                p["grace_used_s"] is not None and p["lost_work_gpu_hours"] is not None for p in detail["preemptions"]
            )
            cycle = detail["preemption_cycle"]
            assert cycle["kind"] == "over_budget"
            assert (cycle["details"]["count"], cycle["details"]["limit"], cycle["details"]["per_s"]) == (2, 1, 86400.0)
            assert cycle["details"]["window_start"] == detail["preemptions"][0]["at"]
            assert cycle["message"].startswith("Preempted 2 times within ")
            [row] = [j for j in c.get("/v1/jobs").json() if j["id"] == str(job)]
            assert row["preemption_cycle"] is True
            text = c.get("/metrics").text
            assert metric(text, "warden_jobs_in_preemption_cycle", "over_budget") == 1
            assert metric(text, "warden_jobs_in_preemption_cycle", "alternating") == 0
            assert metric(text, "warden_preemption_cycles_total", "over_budget") == 1
    finally:
        end_everything(svc)
        svc.stop()
