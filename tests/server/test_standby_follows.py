"""A standby answers from the database as the leader keeps it: the cluster as the leader's
executor reports it (nodes added, a node down and why, GPUs held by work that is not warden's)
and the fair-share ledger the leader saves each pass. Two in-process servers on one real
PostgreSQL, each with its lease; the leader's executor is a real local executor whose cluster
report is the test's input (the Slurm and Ray reports are tested on real clusters in
tests/executors)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pg import fresh_postgres_url, postgres_server  # noqa: F401  (fixtures)
from serverproc import end_everything, wait_for

from warden.engine.model import Node
from warden.engine.policy import parse_policy
from warden.executors.base import Inventory
from warden.executors.local import LocalExecutor
from warden.server.app import create_app
from warden.server.service import Service
from warden.store import Store
from warden.store.leadership import Holder, Lease

POLICY = {
    "min_grace": "120s",
    "thrash": {"min_efficiency": 0},
    "queues": {"name": "cluster", "children": [{"name": "vision"}]},
}
NODE = Node("node-0", 4, 16_000, 64_000)
OTHER = Node("node-1", 8, 16_000, 64_000, block="rack-2")


@asynccontextmanager
async def no_lifespan(_: Any) -> AsyncIterator[None]:
    yield


class Pair:
    """Two services with leases on one database; `seen[0]` is what the cluster reports."""

    def __init__(self, root: Path, url: str) -> None:
        self.seen = [Inventory((NODE,))]
        self.stores: list[Store] = []
        self.services: list[Service] = []
        for name in ("a", "b"):
            store = Store.open(url)
            state = root / name
            state.mkdir()
            svc = Service(
                store,
                LocalExecutor(),
                (NODE,),
                parse_policy(POLICY),
                state,
                url=f"http://{name}.invalid",
                inventory=lambda: self.seen[0],
                forecast_interval_s=0.5,
                lease=Lease(store.engine, Holder.this_process(f"http://{name}.invalid")),
                make_executor=LocalExecutor,
            )
            self.stores.append(store)
            self.services.append(svc)
        self.token = self.stores[0].create_token("admin", "admin", ["*"], "test", time.time())

    def client(self, svc: Service) -> TestClient:
        app = create_app(svc)
        app.router.lifespan_context = no_lifespan
        return TestClient(app, headers={"Authorization": f"Bearer {self.token}"})

    def close(self) -> None:
        for svc in self.services:
            if svc.leading:
                end_everything(svc)
            svc.stop()
        for store in self.stores:
            store.close()


@pytest.fixture
def pair(tmp_path: Path, fresh_postgres_url: str) -> Iterator[Pair]:
    made = Pair(tmp_path, fresh_postgres_url)
    try:
        yield made
    finally:
        made.close()


def test_a_standby_shows_the_cluster_and_the_ledger_the_leader_records(pair: Pair) -> None:
    a, b = pair.services
    a.start()
    wait_for(lambda: a.leading, 10, "a to lead")
    b.start()
    assert not b.leading
    with pair.client(a) as ca, pair.client(b) as cb:
        r = ca.post(
            "/v1/jobs",
            json={"queue": "vision", "tier": 3, "gpus": 1, "command": ["sleep", "600"], "workdir": "/"},
        )
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        wait_for(lambda: ca.get(f"/v1/jobs/{job_id}").json()["state"] == "RUNNING", 15, "the job to run")

        # The cluster changes under the leader: a node joins and drains, outside work holds GPUs.
        pair.seen[0] = Inventory(
            (NODE, OTHER),
            down={"node-1": "DRAIN (maintenance)"},
            foreign={"node-0": (3,)},
            foreign_unknown={"node-0": 1},
        )

        def standby_nodes() -> dict[str, Any]:
            return {n["name"]: n for n in cb.get("/v1/nodes").json()}

        wait_for(lambda: "node-1" in standby_nodes(), 10, "the standby to show the new node")
        nodes = standby_nodes()
        assert nodes["node-1"]["down"] == "DRAIN (maintenance)" and nodes["node-1"]["gpus"] == 8
        assert (nodes["node-0"]["gpus_foreign"], nodes["node-0"]["gpus_used"]) == (2, 1)
        assert nodes["node-0"]["gpu_indices_foreign"] == [3]  # the one known by index, kept by the database
        assert nodes == {n["name"]: n for n in ca.get("/v1/nodes").json()}
        # A submission the standby checks against the cluster as it is now: 8 GPUs fit only on node-1.
        r = cb.post(
            "/v1/jobs", json={"queue": "vision", "tier": 3, "gpus": 8, "command": ["sleep", "600"], "workdir": "/"}
        )
        assert r.status_code == 201, r.text
        big = r.json()["id"]

        # The node comes back, the outside work ends: the standby follows that too.
        pair.seen[0] = Inventory((NODE, OTHER))
        wait_for(lambda: standby_nodes()["node-1"]["down"] is None, 10, "the standby to see node-1 back")
        assert standby_nodes()["node-0"]["gpus_foreign"] == 0

        # The fair-share ledger the leader charges is the standby's within its follow interval.
        def usage(c: TestClient) -> float:
            return float(next(q for q in c.get("/v1/queues").json() if q["name"] == "vision")["fair_share_usage"])

        wait_for(lambda: usage(cb) > 0, 10, "the standby to show the leader's fair-share usage")
        assert usage(cb) <= usage(ca)

        # A job that waits (node-1 taken whole, node-0 has 3 GPUs left) gets an expected start
        # from the standby too, forecast from the database's snapshot.
        wait_for(lambda: ca.get(f"/v1/jobs/{big}").json()["state"] == "RUNNING", 15, "the 8-GPU job to run")
        r = cb.post("/v1/jobs", json={"queue": "vision", "tier": 3, "gpus": 4, "command": ["true"], "workdir": "/"})
        assert r.status_code == 201, r.text
        waiting = r.json()["id"]

        def expected(c: TestClient) -> dict[str, Any] | None:
            job = c.get(f"/v1/jobs/{waiting}").json()
            start: dict[str, Any] | None = job["expected_start"]
            return start if job["state"] == "PENDING" and start is not None and start["as_of"] else None

        wait_for(lambda: expected(cb), 15, "the standby to forecast the waiting job's start")
