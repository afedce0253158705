"""A service and its HTTP API on a clock the test sets, with no background pass: the test runs
the passes it wants (or none, and the rows are the test's own)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from serverproc import end_everything

from warden.engine.model import Node
from warden.engine.policy import parse_policy
from warden.executors.base import Executor, Exit
from warden.executors.local import LocalExecutor
from warden.server.app import create_app
from warden.server.service import Service
from warden.store import Store


class Clock:
    """The service's clock: it stands where the test puts it."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class ClockedExecutor(LocalExecutor):
    """The local executor, its exits dated by the test's clock (the pass that collects an exit
    is the moment the test chose for it), so that every time of the run is the clock's."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    def exits(self) -> list[Exit]:
        return [replace(e, ended_at=self.clock()) for e in super().exits()]


@asynccontextmanager
async def no_lifespan(_: Any) -> AsyncIterator[None]:
    yield


@contextmanager
def api_service(
    tmp_path: Path,
    policy: Mapping[str, Any],
    nodes: tuple[Node, ...],
    clock: Clock,
    executor: Executor | None = None,
    ledger: Mapping[str, float] | None = None,
) -> Iterator[tuple[Service, TestClient]]:
    """A service on a fresh SQLite database under `tmp_path` (its usage ledger `ledger`, where
    given) and a client holding an admin token; everything is stopped on exit."""
    store = Store.open(f"sqlite:///{tmp_path / 'warden.db'}")
    if ledger is not None:
        store.save_ledger(clock(), dict(ledger))
    (tmp_path / "state").mkdir()
    svc = Service(store, executor or LocalExecutor(), nodes, parse_policy(dict(policy)), tmp_path / "state", clock)
    token = store.create_token("admin", "admin", ["*"], "test", clock())
    app = create_app(svc)
    app.router.lifespan_context = no_lifespan
    client = TestClient(app, headers={"Authorization": f"Bearer {token}"}, raise_server_exceptions=False)
    try:
        yield svc, client
    finally:
        client.close()
        end_everything(svc)
        svc.stop()
        store.close()
