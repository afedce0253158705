"""Times a person reads are local and relative, never epoch seconds: an event's SIGKILL deadline
is kept as a number in its details and written into its sentence when it is read ("SIGKILL at
14:05 (in 2m)"), in `GET /v1/jobs/{id}` (what `warden describe` and the dashboard show) and
`GET /v1/preemptions`.

The preemption runs on a real store, reconciler, service and local executor (job processes)."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from serverproc import end_everything

from warden.engine.durations import relative
from warden.engine.model import JobState, Node
from warden.engine.policy import parse_policy
from warden.executors.local import LocalExecutor
from warden.server.app import create_app
from warden.server.auth import Principal
from warden.server.explanations import event_message, wall_times
from warden.server.service import Service
from warden.store.repo import Store

EPOCH = re.compile(r"\d{9,}")
"""Epoch seconds in a text (this century's are ten digits, perhaps with decimals)."""
LOCAL = r"(\w{3} \d{1,2} )?(\d{4} )?\d\d:\d\d \((in [^)]+|now|[^)]+ ago)\)"
"""A time as `wall_times` writes it: "14:05 (in 2m)", "Dec 4 14:05 (1d2h ago)"."""

POLICY = """\
min_grace: 1s
thrash: {min_efficiency: 0}
preemption: {restart_overhead: 0s, checkpoint_overhead: 0s}
tiers:
  3: {name: experimentation, lease: 0s, grace: 1s}
  4: {name: opportunistic, lease: 0s, grace: 5m, charged: false}
queues:
  name: cluster
  children:
    - {name: team}
"""
ROOT = Principal("root", "admin", ("*",))


def test_a_deadline_in_the_details_is_written_local_and_relative_when_read() -> None:
    now = time.time()
    text = event_message("preempted for job 7 (downward); grace 300s", {"kill_at": now + 300.4}, now)
    assert text is not None and not EPOCH.search(text), text
    assert re.fullmatch(rf"preempted for job 7 \(downward\); grace 300s, SIGKILL at {LOCAL}", text), text
    assert text.endswith("(in 5m)") and wall_times(now)(now + 300.4) in text
    later = event_message("preempted for job 7 (downward); grace 300s", {"kill_at": now + 300.4}, now + 420)
    assert later is not None and later.endswith("(2m ago)")


def test_an_event_without_a_deadline_reads_as_stored() -> None:
    assert event_message("requeued", None, 1_796_386_000.0) == "requeued"
    assert event_message(None, None, 1_796_386_000.0) is None


@asynccontextmanager
async def no_lifespan(_: Any) -> AsyncIterator[None]:
    yield


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    store = Store.open(f"sqlite:///{tmp_path / 'warden.db'}")
    (tmp_path / "state").mkdir()
    svc = Service(
        store, LocalExecutor(), (Node("node-0", 1, 16_000, 64_000),), parse_policy(POLICY), tmp_path / "state"
    )
    try:
        yield svc
    finally:
        end_everything(svc)
        svc.stop()
        store.close()


def submit(svc: Service, tier: int, command: list[str]) -> int:
    return svc.store.submit(
        name="t", user="root", queue="team", tier=tier, command=command, workdir="/", actor="root", now=svc.now()
    )


def passes_until(svc: Service, job_id: int, state: JobState, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while (job := svc.store.get(job_id)) is None or job.state is not state:
        assert time.monotonic() < deadline, f"job {job_id} never {state}"
        svc.reconciler.reconcile()
        time.sleep(0.005)


def test_a_preemption_event_says_when_sigkill_comes_in_local_and_relative_time(service: Service) -> None:
    # The victim ignores SIGTERM, so it stays in its grace (5 min) while the test reads it.
    victim = submit(
        service, 4, ["python3", "-c", "import signal, time; signal.signal(15, signal.SIG_IGN); time.sleep(60)"]
    )
    passes_until(service, victim, JobState.RUNNING)
    submit(service, 3, ["true"])
    passes_until(service, victim, JobState.PREEMPTING)
    attempt = service.store.attempt(victim, 1)
    assert attempt is not None and attempt.kill_at is not None

    (stored,) = [e for e in service.store.events(victim) if e.to_state == "PREEMPTING"]
    assert not EPOCH.search(stored.reason), stored.reason  # the text as stored
    assert stored.details["kill_at"] == attempt.kill_at  # the number, for machines

    app = create_app(service)
    app.router.lifespan_context = no_lifespan
    token = service.store.create_token("root", "admin", ["*"], "root", service.now())
    with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as client:
        asked = service.now()
        detail = client.get(f"/v1/jobs/{victim}").json()
        answered = service.now()
        (event,) = [e for e in detail["events"] if e["to"] == "PREEMPTING"]
        assert event["details"]["kill_at"] == attempt.kill_at
        assert re.search(rf"grace 5m, SIGKILL at {LOCAL}$", event["reason"]), event["reason"]
        # Relative to when the server answered: "(in 5m)" at once, "(in 4m58s)" two seconds on.
        when = {f"({relative(attempt.kill_at, asked + s)})" for s in range(int(answered - asked) + 2)}
        assert any(event["reason"].endswith(w) for w in when), (event["reason"], when)
        for e in detail["events"]:
            assert not EPOCH.search(e["reason"]), e["reason"]
        (listed,) = client.get("/v1/preemptions").json()
        assert listed["kill_at"] == attempt.kill_at
        assert not EPOCH.search(listed["reason"]) and re.search(rf"SIGKILL at {LOCAL}$", listed["reason"]), listed
        refused = client.get("/v1/history", params={"since": service.now(), "until": service.now() - 60})
        assert refused.status_code == 422 and not EPOCH.search(refused.json()["error"]["message"])

    service.actions.cancel(str(victim), ROOT)  # already terminating: the audit entry says so without a number
    (entry,) = [a for a in service.store.audit_log() if a.action == "cancel" and a.target == f"job/{victim}"]
    assert "already terminating" in entry.details["done"] and not EPOCH.search(entry.details["done"])


def test_a_cancel_of_a_running_job_audits_its_sigterm_without_epoch_seconds(service: Service) -> None:
    job = submit(service, 3, ["sleep", "30"])
    passes_until(service, job, JobState.RUNNING)
    service.actions.cancel(str(job), ROOT)
    (entry,) = [a for a in service.store.audit_log() if a.action == "cancel" and a.target == f"job/{job}"]
    assert entry.details["done"].startswith("SIGTERM sent while RUNNING"), entry.details
    assert not EPOCH.search(entry.details["done"]), entry.details
