"""`GET /v1/jobs` in pages, in rank order, with `X-Total-Count` and each running job's times and
η; and every bound of the dashboard's parameters refused with a 4xx naming the field. A real
service (SQLite, the local executor) on a clock the test moves, its passes run by the test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apiclient import Clock, api_service
from fastapi.testclient import TestClient

from warden.engine.model import JobState, Node
from warden.server.service import Service

T0 = 1_000_000.0
POLICY = {
    "thrash": {"min_efficiency": 0.5},
    "preemption": {"restart_overhead": "60s"},
    "tiers": {3: {"name": "experimentation", "lease": "1h"}},
    "queues": {"name": "cluster", "children": [{"name": "team"}, {"name": "other"}]},
}


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Service, TestClient, Clock]]:
    clock = Clock(T0)
    with api_service(tmp_path, POLICY, (Node("node-0", 2, 16_000, 64_000),), clock) as (svc, client):
        yield svc, client, clock  # the test runs the passes


def submit(svc: Service, tier: int, gpus: int = 1, queue: str = "team") -> str:
    job = svc.store.submit(
        name="",
        user="ana",
        queue=queue,
        tier=tier,
        command=["sleep", "600"],
        workdir="/",
        actor="ana",
        now=svc.now(),
        gpus=gpus,
    )
    return str(job)


def test_jobs_come_in_pages_running_first_then_in_rank_order_with_the_total(
    setup: tuple[Service, TestClient, Clock],
) -> None:
    svc, c, clock = setup
    running = submit(svc, tier=3, gpus=2)
    svc.reconciler.reconcile()
    pending = [submit(svc, tier) for tier in (4, 3, 4, 3, 3)]
    other = submit(svc, tier=3, queue="other")
    clock.t = T0 + 100
    svc.reconciler.reconcile()
    assert svc.store.get(int(running)).state is JobState.RUNNING  # type: ignore[union-attr]

    whole = c.get("/v1/jobs")
    assert whole.status_code == 200 and whole.headers["X-Total-Count"] == "7"
    listed = whole.json()
    ranked = [j["id"] for j in listed[1:]]
    assert listed[0]["id"] == running
    # Tier 3 before tier 4; the queue nobody used before `team` (fair share); then by submission.
    assert ranked == [other, pending[1], pending[3], pending[4], pending[0], pending[2]]
    assert [j["position"] for j in listed[1:]] == sorted(j["position"] for j in listed[1:])

    page = c.get("/v1/jobs", params={"limit": 2, "offset": 1})
    assert page.headers["X-Total-Count"] == "7" and [j["id"] for j in page.json()] == ranked[:2]
    waiting = c.get("/v1/jobs", params={"state": "PENDING", "queue": "team", "limit": 2, "offset": 4})
    assert waiting.headers["X-Total-Count"] == "5" and [j["id"] for j in waiting.json()] == [pending[2]]
    beyond = c.get("/v1/jobs", params={"offset": 1000})
    assert beyond.json() == [] and beyond.headers["X-Total-Count"] == "7"

    run = listed[0]
    assert run["started_at"] == T0 and run["kill_at"] is None and run["last_checkpoint_at"] is None
    assert run["lease_end_at"] == T0 + 3600  # the lease; the efficiency floor needs only (60 + 30) s / 0.5
    # η with the assumed 60 s startup and the assumed 30 s save (no save reported yet)
    assert run["efficiency"] == pytest.approx((100 - 60 - 30) / 100)
    assert all(j["started_at"] is None and j["efficiency"] is None for j in listed[1:])


def error_field(response: Any, status: int = 422) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body["error"]) == {"field", "value", "message"} and body["errors"][0] == body["error"]
    return str(body["error"]["field"])


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("/v1/jobs", {"limit": 0}, "limit"),
        ("/v1/jobs", {"limit": 1001}, "limit"),
        ("/v1/jobs", {"limit": "1.5"}, "limit"),
        ("/v1/jobs", {"offset": -1}, "offset"),
        ("/v1/jobs", {"offset": 10**9 + 1}, "offset"),
        ("/v1/history", {"since": "nan"}, "since"),
        ("/v1/history", {"since": "inf"}, "since"),
        ("/v1/history", {"since": -1}, "since"),
        ("/v1/history", {"until": "1e12"}, "until"),
        ("/v1/history", {"until": "-inf"}, "until"),
        ("/v1/history", {"since": T0 + 1, "until": T0}, "since"),
        ("/v1/history", {"since": T0 - 31 * 86400 - 1, "until": T0}, "since"),
        ("/v1/preemptions", {"limit": 0}, "limit"),
        ("/v1/preemptions", {"limit": 1001}, "limit"),
        ("/v1/preemptions", {"since": "NaN"}, "since"),
        ("/v1/preemptions", {"since": "1e300"}, "since"),
    ],
)
def test_every_bound_is_refused_naming_the_field(
    setup: tuple[Service, TestClient, Clock], path: str, params: dict[str, Any], field: str
) -> None:
    svc, c, _ = setup
    submit(svc, tier=3)
    svc.reconciler.reconcile()  # one sample, one running job
    before = (svc.store.list(), svc.store.samples(0, 2 * T0, 2000))
    assert error_field(c.get(path, params=params)) == field
    assert (svc.store.list(), svc.store.samples(0, 2 * T0, 2000)) == before


def test_the_new_routes_need_a_token(setup: tuple[Service, TestClient, Clock]) -> None:
    _, c, _ = setup
    for path in ("/v1/history", "/v1/preemptions", "/v1/whoami"):
        assert error_field(c.get(path, headers={"Authorization": ""}), 401) == "Authorization"
    ok = c.get("/v1/history", params={"since": T0, "until": T0 + 31 * 86400})  # exactly 31 days
    assert ok.status_code == 200 and ok.json() == {"interval_s": 60.0, "samples": []}
    assert c.get("/v1/preemptions", params={"limit": 1000}).json() == []


def test_whoami_names_the_tokens_user_role_and_queues(setup: tuple[Service, TestClient, Clock]) -> None:
    svc, c, _ = setup
    assert c.get("/v1/whoami").json() == {"user": "admin", "role": "admin", "queues": ["*"]}
    token = svc.store.create_token("ana", "user", ["team"], "test", T0)
    ana = c.get("/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    assert ana.status_code == 200 and ana.json() == {"user": "ana", "role": "user", "queues": ["team"]}
