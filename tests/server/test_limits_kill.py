"""The timers behind preemption and cancel, end to end: a job that ignores SIGTERM is
SIGKILLed at SIGTERM + the policy's max_grace, and a server thread that dies stops scheduling
loudly (health 503, a metric, a log line). The real app, store and local executor."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from serverproc import wait_for

from warden.server.app import Settings, build_service, create_app

TOKEN = "kill-admin-token"
GRACE = 2.0
POLICY = f"""
min_grace: 1s
max_grace: {GRACE:g}s
tiers: {{1: {{grace: 1s}}, 2: {{grace: 1s}}, 3: {{grace: 1s}}, 4: {{grace: 1s}}}}
queues:
  name: cluster
  children:
    - {{name: team}}
"""
DEAF = "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); pathlib.Path(sys.argv[1]).touch(); time.sleep(600)"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    service = build_service(
        Settings(policy=policy, fake_gpus=2, state_dir=tmp_path / "state", bootstrap_token=TOKEN), say=lambda _: None
    )
    with TestClient(create_app(service), headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        yield c


def job(c: TestClient, job_id: str) -> dict[str, Any]:
    return c.get(f"/v1/jobs/{job_id}").json()


def test_a_job_that_ignores_sigterm_is_killed_at_the_max_grace(client: TestClient, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    body = {"queue": "team", "tier": 3, "command": [sys.executable, "-c", DEAF, str(ready)], "grace": f"{GRACE:g}s"}
    r = client.post("/v1/jobs", json={**body, "workdir": str(tmp_path)})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    wait_for(lambda: job(client, job_id)["state"] == "RUNNING" and ready.exists(), what="the job to run")
    assert client.post(f"/v1/jobs/{job_id}/cancel").status_code == 202
    done = wait_for(lambda: (j := job(client, job_id))["state"] == "CANCELLED" and j, 30, "the cancel to end")
    [attempt] = done["attempts"]
    assert attempt["kill_at"] - attempt["sigterm_at"] == pytest.approx(GRACE, abs=0.5)
    assert attempt["exit_codes"] == [-9]
    assert attempt["kill_at"] <= attempt["ended_at"] < attempt["kill_at"] + 1.0  # SIGKILL on time, never early


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_server_thread_stops_scheduling_loudly(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="warden.server")
    assert client.get("/v1/health").status_code == 200

    def die() -> None:
        raise RuntimeError("probe")

    thread = threading.Thread(target=die, name="warden-probe")
    thread.start()
    thread.join(10)
    health = wait_for(lambda: (r := client.get("/v1/health")).status_code == 503 and r.json(), what="health to say so")
    assert health["ok"] is False and health["scheduling"] == "stopped"
    assert health["dead_threads"] == ["warden-probe: RuntimeError: probe"]
    assert "warden_server_thread_deaths_total 1.0" in client.get("/metrics").text
    assert any("warden-probe died" in r.getMessage() for r in caplog.records)
    passes = health["passes"]
    # The loop has stopped: a submission is stored but no longer scheduled.
    r = client.post("/v1/jobs", json={"queue": "team", "tier": 3, "command": ["true"], "workdir": str(Path.cwd())})
    assert r.status_code == 201
    assert client.get("/v1/health").json()["passes"] <= passes + 1
