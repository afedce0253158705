"""What a user may read of other users' jobs (the server's `--private-data`, like Slurm's
`PrivateData=jobs`): by default not their command, workdir or logs, which their owner and
admins read; with "none", everything. A user's dry run does not tell whether a workdir exists."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from serverproc import end_everything

from warden.engine.model import Node
from warden.engine.policy import parse_policy
from warden.executors.local import LocalExecutor
from warden.server.app import create_app
from warden.server.service import Service
from warden.store import Store

T0 = 1_000_000.0
POLICY = {
    "tiers": {3: {"name": "experimentation", "lease": "1h"}},
    "queues": {"name": "cluster", "children": [{"name": "team"}, {"name": "other"}]},
}
SECRET = "--api-key=hunter2"


@asynccontextmanager
async def no_lifespan(_: Any) -> AsyncIterator[None]:
    yield


Clients = tuple[Service, TestClient, dict[str, dict[str, str]], Path]


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Clients]:
    store = Store.open(f"sqlite:///{tmp_path / 'warden.db'}")
    (tmp_path / "state").mkdir()
    svc = Service(
        store,
        LocalExecutor(),
        (Node("node-0", 2, 16_000, 64_000),),
        parse_policy(POLICY),
        tmp_path / "state",
        lambda: T0,
    )
    tokens = {
        "admin": store.create_token("admin", "admin", ["*"], "test", T0),
        "ana": store.create_token("ana", "user", ["team"], "test", T0),
        "bo": store.create_token("bo", "user", ["other"], "test", T0),
    }
    app = create_app(svc)
    app.router.lifespan_context = no_lifespan  # nothing runs: the jobs wait
    client = TestClient(app, raise_server_exceptions=False)
    as_ = {user: {"Authorization": f"Bearer {token}"} for user, token in tokens.items()}
    workdir = tmp_path / "bo-work"
    workdir.mkdir()
    try:
        yield svc, client, as_, workdir
    finally:
        client.close()
        end_everything(svc)
        svc.stop()
        store.close()


def bo_job(c: TestClient, as_: dict[str, dict[str, str]], workdir: Path) -> str:
    body = {"queue": "other", "tier": 3, "command": ["train", SECRET], "workdir": str(workdir), "env": {"K": "v"}}
    r = c.post("/v1/jobs", json=body, headers=as_["bo"])
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def test_a_user_sees_another_users_job_but_not_its_command_workdir_or_logs(setup: Clients) -> None:
    _, c, as_, workdir = setup
    job = bo_job(c, as_, workdir)
    seen = c.get(f"/v1/jobs/{job}", headers=as_["ana"])
    assert seen.status_code == 200
    detail = seen.json()
    assert (detail["user"], detail["queue"], detail["tier"], detail["state"]) == ("bo", "other", 3, "PENDING")
    assert detail["private"] is True and "command" not in detail and "workdir" not in detail
    assert SECRET not in seen.text and str(workdir) not in seen.text and '"K"' not in seen.text
    listed = c.get("/v1/jobs", headers=as_["ana"])
    assert [j["id"] for j in listed.json()] == [job] and SECRET not in listed.text and str(workdir) not in listed.text
    logs = c.get(f"/v1/jobs/{job}/logs", headers=as_["ana"])
    assert logs.status_code == 403 and "--private-data" in logs.text and "bo" in logs.text, logs.text

    for reader in ("bo", "admin"):  # the owner and admins read everything
        own = c.get(f"/v1/jobs/{job}", headers=as_[reader]).json()
        assert own["private"] is False and own["command"] == ["train", SECRET] and own["workdir"] == str(workdir)
        assert c.get(f"/v1/jobs/{job}/logs", headers=as_[reader]).status_code == 200


def test_with_private_data_none_every_user_reads_every_job(setup: Clients) -> None:
    svc, c, as_, workdir = setup
    svc.logs.private_data = "none"
    job = bo_job(c, as_, workdir)
    detail = c.get(f"/v1/jobs/{job}", headers=as_["ana"]).json()
    assert detail["private"] is False and detail["command"] == ["train", SECRET]
    assert c.get(f"/v1/jobs/{job}/logs", headers=as_["ana"]).status_code == 200


def test_a_users_dry_run_does_not_tell_whether_a_workdir_exists(setup: Clients, tmp_path: Path) -> None:
    _, c, as_, workdir = setup
    answers = {}
    for path in (workdir, tmp_path / "no-such-dir"):
        body = {"queue": "team", "tier": 3, "command": ["true"], "workdir": str(path)}
        r = c.post("/v1/jobs?dry_run=true", json=body, headers=as_["ana"])
        assert r.status_code == 200, r.text
        answers[path] = {k: v for k, v in r.json().items() if k != "workdir"}
    assert answers[workdir] == answers[tmp_path / "no-such-dir"]
    # An admin's dry run checks, as the submission itself does.
    body = {"queue": "team", "tier": 3, "command": ["true"], "workdir": str(tmp_path / "no-such-dir")}
    refused = c.post("/v1/jobs?dry_run=true", json=body, headers=as_["admin"])
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "workdir"
    assert c.post("/v1/jobs?dry_run=true", json={**body, "workdir": str(workdir)}, headers=as_["admin"]).is_success
