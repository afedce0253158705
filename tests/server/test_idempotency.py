"""Idempotent submissions: a POST /v1/jobs retried with the same Idempotency-Key by the same
user returns the first job; another request with the key is refused; concurrent retries
create one job. On SQLite and PostgreSQL, through the real app and store."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pg import fresh_postgres_url, postgres_server  # noqa: F401  (fixtures)
from serverproc import started

from warden.client import Client
from warden.server.app import Settings, build_service, create_app
from warden.server.service import Service

TOKEN = "idem-admin-token"
POLICY = "queues:\n  name: cluster\n  children:\n    - {name: team}\n"


@asynccontextmanager
async def no_lifespan(_: Any) -> AsyncIterator[None]:
    yield


@pytest.fixture(params=["sqlite", "postgresql"])
def api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Service, TestClient]]:
    db = None if request.param == "sqlite" else str(request.getfixturevalue("fresh_postgres_url"))
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    service = build_service(
        Settings(db=db, policy=policy, fake_gpus=2, state_dir=tmp_path / "state", bootstrap_token=TOKEN),
        say=lambda _: None,
    )
    app = create_app(service)
    app.router.lifespan_context = no_lifespan  # nothing submitted here runs
    client = TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        yield service, client
    finally:
        client.close()
        service.executor.close()
        service.store.close()


def job(**fields: Any) -> dict[str, Any]:
    return {"queue": "team", "tier": 3, "command": ["true"], "workdir": str(Path.cwd()), **fields}


def test_a_retry_returns_the_first_job_and_creates_none(api: tuple[Service, TestClient]) -> None:
    service, c = api
    first = c.post("/v1/jobs", json=job(), headers={"Idempotency-Key": "retry-1"})
    assert first.status_code == 201
    again = c.post("/v1/jobs", json=job(), headers={"Idempotency-Key": "retry-1"})
    assert again.status_code == 200 and again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert len(service.store.list()) == 1
    # Without a key, or with another one, it is a new job.
    assert c.post("/v1/jobs", json=job()).json()["id"] != first.json()["id"]
    assert c.post("/v1/jobs", json=job(), headers={"Idempotency-Key": "retry-2"}).status_code == 201
    assert len(service.store.list()) == 3


def test_the_same_key_for_another_request_is_refused(api: tuple[Service, TestClient]) -> None:
    service, c = api
    assert c.post("/v1/jobs", json=job(), headers={"Idempotency-Key": "k"}).status_code == 201
    refused = c.post("/v1/jobs", json=job(name="other"), headers={"Idempotency-Key": "k"})
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["field"] == "Idempotency-Key" and error["value"] == "k" and "different request" in error["message"]
    assert len(service.store.list()) == 1


def test_keys_are_per_user(api: tuple[Service, TestClient]) -> None:
    service, c = api
    other = service.store.create_token("bob", "user", ["*"], "admin", 0.0)
    mine = c.post("/v1/jobs", json=job(), headers={"Idempotency-Key": "shared"}).json()["id"]
    theirs = c.post("/v1/jobs", json=job(), headers={"Idempotency-Key": "shared", "Authorization": f"Bearer {other}"})
    assert theirs.status_code == 201 and theirs.json()["id"] != mine
    assert {j.user for j in service.store.list()} == {"admin", "bob"}


def test_concurrent_retries_create_one_job(api: tuple[Service, TestClient]) -> None:
    service, c = api
    answers: list[Any] = []
    barrier = threading.Barrier(8)

    def post() -> None:
        barrier.wait()
        answers.append(c.post("/v1/jobs", json=job(), headers={"Idempotency-Key": "storm"}))

    threads = [threading.Thread(target=post) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(a.status_code for a in answers) == [200] * 7 + [201]
    assert len({a.json()["id"] for a in answers}) == 1
    assert len(service.store.list()) == 1


def test_the_cli_client_sends_its_key_again_on_a_retry(tmp_path: Path) -> None:
    server = started(tmp_path, POLICY)
    try:
        client = Client(server.url, "admin-secret-token", ca=str(server.ca))
        body = job(command=["true"])
        first = client.submit(idempotency_key="cli-key", retries=2, **body)
        second = client.submit(idempotency_key="cli-key", retries=2, **body)
        assert first == second
        assert len(client.jobs(all=True)) == 1
        client.close()
    finally:
        server.stop()
