"""A server that survives a failing scheduling pass: the failures are counted and logged, jobs
that run keep running, and the waiting job that makes every pass fail is held with its reason
until an admin releases it.

The server, its SQLite store, the local executor and the job processes are real; the only
stand-in is the engine's `plan`, made to raise whenever a waiting job asks for 777 millicores
(the job that trips an engine bug).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from serverproc import ADMIN, wait_for

from warden.engine.model import Job, Snapshot
from warden.engine.plan import Plan
from warden.engine.scheduler import Engine
from warden.server.app import Settings, build_service, create_app

POLICY = """\
min_grace: 2s
queues:
  name: cluster
  children:
    - {name: team}
"""
TRIGGER_CPU = 777


class FaultyEngine:
    """`Engine.plan` as it is, except that it raises while a waiting job has the trigger's CPU."""

    def __init__(self) -> None:
        self.broken = True
        self.calls = 0
        self._plan = Engine.plan

    def plan(self, engine: Engine, snapshot: Snapshot, now: float, changed: Any = None) -> Plan:
        self.calls += 1
        if self.broken and any(j.state.waiting and j.cpu == TRIGGER_CPU for j in snapshot.jobs):
            raise ValueError("no replica layout for 777 millicores")
        return self._plan(engine, snapshot, now, changed)


@pytest.fixture
def faulty(monkeypatch: pytest.MonkeyPatch) -> FaultyEngine:
    fault = FaultyEngine()

    def plan(engine: Engine, snapshot: Snapshot, now: float, changed: Any = None) -> Plan:
        return fault.plan(engine, snapshot, now, changed)

    monkeypatch.setattr(Engine, "plan", plan)
    return fault


@pytest.fixture
def client(tmp_path: Path, faulty: FaultyEngine) -> Iterator[TestClient]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    svc = build_service(
        Settings(policy=policy, fake_gpus=2, state_dir=tmp_path / "state", bootstrap_token=ADMIN), say=lambda _: None
    )
    with TestClient(create_app(svc), headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        yield c


def submit(c: TestClient, seconds: float, **body: Any) -> str:
    code = f"import time; time.sleep({seconds})"
    r = c.post(
        "/v1/jobs",
        json={
            "queue": "team",
            "tier": 3,
            "gpus": 1,
            "command": [sys.executable, "-c", code],
            "workdir": str(Path.cwd()),
            **body,
        },
    )
    assert r.status_code == 201, r.text
    return r.json()["id"]


def job(c: TestClient, job_id: str) -> dict[str, Any]:
    return c.get(f"/v1/jobs/{job_id}").json()


def state(c: TestClient, job_id: str, *states: str) -> dict[str, Any] | None:
    j = job(c, job_id)
    return j if j["state"] in states else None


def metric(c: TestClient, name: str) -> float:
    for line in c.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not exported")


def test_the_job_that_makes_passes_fail_is_held_and_the_others_are_scheduled(
    client: TestClient, faulty: FaultyEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="warden.reconcile")
    c = client
    first = submit(c, 1.0)
    wait_for(lambda: state(c, first, "RUNNING", "SUCCEEDED"), what=f"job {first} to start")
    culprit = submit(c, 0.1, cpu=TRIGGER_CPU)
    second = submit(c, 0.1)

    held = wait_for(lambda: (j := job(c, culprit))["held_reason"] and j, what=f"job {culprit} to be held")
    # The job that ran meanwhile finished, and the one submitted with the culprit was scheduled.
    wait_for(lambda: state(c, first, "SUCCEEDED"), what=f"job {first} to finish")
    wait_for(lambda: state(c, second, "SUCCEEDED"), what=f"job {second} to run despite the failing passes")

    assert held["state"] == "PENDING" and held["position"] is None
    expected = "quarantined: scheduling passes failed with ValueError: no replica layout for 777 millicores"
    assert held["held_reason"].startswith(expected)
    assert held["reason"]["code"] == "Held" and expected in held["reason"]["message"]
    assert held["events"][-1]["reason"] == held["held_reason"] and held["events"][-1]["actor"] == "warden"
    [listed] = [j for j in c.get("/v1/jobs").json() if j["id"] == culprit]
    assert listed["reason"]["code"] == "Held"

    assert metric(c, "warden_scheduling_pass_failures_total") >= 2
    assert metric(c, "warden_jobs_held") == 1
    failures = [r.getMessage() for r in caplog.records if "scheduling pass failed with ValueError" in r.getMessage()]
    assert len(failures) >= 2 and all(culprit in m.split("waiting job(s): ")[1].split(", ") for m in failures)

    # It stays held while passes go on; once the cause is fixed, an admin releases it and it runs.
    passes = c.get("/v1/health").json()["passes"]
    wait_for(lambda: c.get("/v1/health").json()["passes"] >= passes + 2, what="two more passes")
    assert job(c, culprit)["state"] == "PENDING"
    faulty.broken = False
    r = c.post(f"/v1/jobs/{culprit}/release")
    assert r.status_code == 200, r.text
    done = wait_for(lambda: state(c, culprit, "SUCCEEDED"), what=f"job {culprit} to run once released")
    assert done["held_reason"] is None
    assert any(e["reason"] == "released by admin" for e in done["events"])
    assert c.get("/v1/audit").json()[0]["action"] == "release"
    assert metric(c, "warden_jobs_held") == 0


def test_release_is_for_admins_and_only_for_held_jobs(client: TestClient) -> None:
    c = client
    running = submit(c, 30.0)
    wait_for(lambda: state(c, running, "RUNNING"), what=f"job {running} to start")
    r = c.post(f"/v1/jobs/{running}/release")
    assert r.status_code == 409 and r.json()["error"]["field"] == "id"
    token = c.post("/v1/tokens", json={"user": "alice", "role": "user"}).json()["token"]
    r = c.post(f"/v1/jobs/{running}/release", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 403
    c.post(f"/v1/jobs/{running}/cancel")
    wait_for(lambda: state(c, running, "CANCELLED"), what=f"job {running} to be cancelled")


def test_a_held_job_can_be_cancelled(client: TestClient) -> None:
    c = client
    culprit = submit(c, 0.1, cpu=TRIGGER_CPU)
    wait_for(lambda: job(c, culprit)["held_reason"], what=f"job {culprit} to be held")
    r = c.post(f"/v1/jobs/{culprit}/cancel")
    assert r.status_code == 202 and r.json()["state"] == "CANCELLED"
    assert job(c, culprit)["held_reason"] is None
    assert metric(c, "warden_jobs_held") == 0


def test_a_failure_that_no_single_waiting_job_causes_holds_nobody(
    client: TestClient, faulty: FaultyEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two jobs that fail the pass only together: the pass keeps failing (and says so), but no
    job is held for it; the failures stop the moment one of them is cancelled."""
    c = client
    original = faulty._plan

    def both(engine: Engine, snapshot: Snapshot, now: float, changed: Any = None) -> Plan:
        waiting: list[Job] = [j for j in snapshot.jobs if j.state.waiting and j.cpu in (TRIGGER_CPU, 778)]
        if {j.cpu for j in waiting} == {TRIGGER_CPU, 778}:
            raise RuntimeError("the two of them")
        return original(engine, snapshot, now, changed)

    monkeypatch.setattr(Engine, "plan", both)
    blocker = submit(c, 1.0, gpus=2)  # so that the two wait together
    wait_for(lambda: state(c, blocker, "RUNNING", "SUCCEEDED"), what=f"job {blocker} to start")
    a = submit(c, 0.1, cpu=TRIGGER_CPU)
    b = submit(c, 0.1, cpu=778)
    wait_for(lambda: metric(c, "warden_scheduling_pass_failures_total") >= 4, what="repeated failures")
    assert job(c, a)["held_reason"] is None and job(c, b)["held_reason"] is None
    c.post(f"/v1/jobs/{a}/cancel")
    wait_for(lambda: state(c, b, "SUCCEEDED"), what=f"job {b} to run once {a} is gone")
