"""A leader whose lease runs out by its own clock says so at once and acts on nothing its term
decided (docs/control-plane.md, "Fencing"): an in-process server on a real database with a
real local executor, its lease's clock the test's to move (what a stalled renewal or a paused
process sees when it looks again)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from serverproc import end_everything, wait_for

from warden.engine.model import Node
from warden.engine.policy import parse_policy
from warden.executors.base import Fenced, LaunchSpec, ReplicaLaunch
from warden.executors.local import LocalExecutor
from warden.server.app import create_app
from warden.server.service import Service
from warden.store import Store
from warden.store.leadership import Holder, Lease, boottime

POLICY = {"min_grace": "120s", "queues": {"name": "cluster", "children": [{"name": "vision"}]}}
NODE = Node("node-0", 4, 16_000, 64_000)


class Clock:
    """CLOCK_BOOTTIME plus a skip the test adds."""

    def __init__(self) -> None:
        self.skip = 0.0

    def __call__(self) -> float:
        return boottime() + self.skip


@asynccontextmanager
async def no_lifespan(_: Any) -> AsyncIterator[None]:
    yield


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[tuple[Service, Clock, str]]:
    store = Store.open(f"sqlite:///{tmp_path / 'warden.db'}")
    clock = Clock()
    svc = Service(
        store,
        LocalExecutor(),
        (NODE,),
        parse_policy(POLICY),
        tmp_path,
        url="http://a.invalid",
        lease=Lease(store.engine, Holder.this_process("http://a.invalid"), clock=clock),
        make_executor=LocalExecutor,
    )
    token = store.create_token("admin", "admin", ["*"], "test", time.time())
    try:
        yield svc, clock, token
    finally:
        if svc.leading:
            end_everything(svc)
        svc.stop()
        store.close()


def test_a_lapsed_term_says_standby_at_once_and_its_executor_acts_on_nothing(
    leader: tuple[Service, Clock, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    svc, clock, token = leader
    svc.start()
    wait_for(lambda: svc.leading and svc.reconciler.stats.passes >= 1, 10, "the server to lead and pass")
    app = create_app(svc)
    app.router.lifespan_context = no_lifespan
    with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as c:
        health = c.get("/v1/health")
        assert health.json()["role"] == "leader" and health.json()["epoch"] == 1
        term1 = svc.ctx.term
        assert term1 is not None
        spec = LaunchSpec(
            job_id="x",
            attempt=1,
            command=("true",),
            replicas=(ReplicaLaunch(0, "node-0", ()),),
            grace_s=1.0,
            workdir=tmp_path,
            log_dir=tmp_path / "x",
            checkpoint_dir=tmp_path / "x-ckpt",
        )

        clock.skip = 10.0  # the lease's local validity is behind it now, its renewal never came in time
        health = c.get("/v1/health")  # at once: no renewal, step-down or takeover needed first
        assert health.json()["role"] == "standby" and health.json()["epoch"] is None, health.json()
        assert health.headers["x-warden-role"] == "standby"
        metrics = c.get("/metrics").text
        assert "\nwarden_leader 0.0\n" in metrics and "\nwarden_leader_epoch " not in metrics
        with pytest.raises(Fenced):
            term1.executor.start(spec)  # what term 1 decided is never done
        assert not (tmp_path / "x").exists()

        # The term ends, the lease is given back, and the server leads again in a new term,
        # whose fence is its own: term 1's executor stays refused.
        wait_for(lambda: svc.leading and svc.epoch == 2, 10, "the server to lead again, in epoch 2")
        assert "epoch 1 ended: the lease of epoch 1 ran out by this server's clock" in caplog.text
        with pytest.raises(Fenced):
            term1.executor.start(spec)
        assert c.get("/v1/health").json()["epoch"] == 2
