"""A service and its HTTP API on a clock the test sets, with no background pass: the test runs
the passes it wants (or none, and the rows are the test's own)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from serverproc import end_everything, wait_for

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


def submit_until(
    svc: Service,
    done: Path,
    queue: str,
    tier: int,
    gpus: int,
    seconds: float | None = None,
    *,
    traps_sigterm: bool = False,
    saves_on_sigterm: bool = False,
) -> str:
    """A job of user ana that runs until the test creates the file `done`, with its tier's lease
    fixed at submission (as `POST /v1/jobs` fixes it) and, given `seconds`, that runtime
    estimate (the simulator knows every job's). With `traps_sigterm` it exits 0 on SIGTERM, as
    a job that saves then does (without the SDK: warden sees no save unless it is submitted
    `saves_on_sigterm`); else SIGTERM ends it at once."""
    loop = 'while [ ! -e "$0" ]; do sleep 0.02; done'
    command = ["sh", "-c", ('trap "exit 0" TERM; ' if traps_sigterm else "") + loop, str(done)]
    job = svc.store.submit(
        name="",
        user="ana",
        queue=queue,
        tier=tier,
        command=command,
        workdir="/",
        actor="ana",
        now=svc.now(),
        gpus=gpus,
        lease_s=svc.policy.tier(tier).lease,
        time_limit_s=seconds,
        saves_on_sigterm=saves_on_sigterm,
    )
    return str(job)


def exited(svc: Service, *jobs: str) -> None:
    """Wait until each job's current attempt has no process left."""
    current = {j: svc.store.get(j).attempt for j in jobs}  # type: ignore[union-attr]
    wait_for(
        lambda: all(None not in svc.executor.replica_exit_codes(j, n) for j, n in current.items()),
        what=f"job {', '.join(jobs)} to exit",
    )
