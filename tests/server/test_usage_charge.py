"""The server charges fair-share usage (and delivered GPU-seconds) for the time since the last
pass to the jobs that held resources as that pass left them: a job whose exit the pass collects
was holding its GPUs until then, and is charged for it. A real service (SQLite, the local
executor, real processes) on a clock the test moves."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from serverproc import end_everything

from warden.engine.model import JobState, Node
from warden.engine.policy import parse_policy
from warden.executors.local import LocalExecutor
from warden.server.service import Service
from warden.store.repo import Store

POLICY = {
    "queues": {"name": "cluster", "children": [{"name": "team"}, {"name": "other"}]},
    "tiers": {3: {"name": "experimentation", "lease": "0s"}},
}


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[Service, Clock]]:
    state = tmp_path / "state"
    state.mkdir()
    clock = Clock(1_000_000.0)
    store = Store.open(f"sqlite:///{tmp_path / 'warden.db'}")
    svc = Service(store, LocalExecutor(), (Node("node-0", 4, 16_000, 64_000),), parse_policy(POLICY), state, clock)
    yield svc, clock
    end_everything(svc)
    svc.stop()
    store.close()


def test_a_job_that_exits_between_passes_is_charged_until_the_pass_that_collects_it(
    service: tuple[Service, Clock],
) -> None:
    svc, clock = service
    job_id = svc.store.submit(
        name="short", user="ana", queue="team", tier=3, command=["true"], workdir="/", actor="ana", now=clock.t, gpus=4
    )
    svc.reconciler.reconcile()  # admits it: it holds the whole node from now on
    job = svc.store.get(job_id)
    assert job is not None and job.state.holds_resources
    deadline = time.monotonic() + 30
    while svc.executor.replica_exit_codes(str(job_id), 1) != (0,):  # its process is gone
        assert time.monotonic() < deadline, "the job's process did not exit"
        time.sleep(0.05)
    before = svc.reconciler.charging.ledger.usage.get("team", 0.0)
    clock.t += 600.0
    svc.reconciler.reconcile()  # collects the exit ten minutes later
    job = svc.store.get(job_id)
    assert job is not None and job.state is JobState.SUCCEEDED
    h = svc.policy.fair_share.half_life
    # the whole node (dominant share 1) for 600 s, decayed as the ledger decays
    gain = h / math.log(2) * (1 - 0.5 ** (600.0 / h))
    assert svc.reconciler.charging.ledger.usage.get("team", 0.0) == pytest.approx(before * 0.5 ** (600.0 / h) + gain)
    assert "other" not in svc.reconciler.charging.ledger.usage


def test_an_idle_cluster_saves_no_ledger_and_what_was_saved_decays_to_the_running_one(
    service: tuple[Service, Clock], tmp_path: Path
) -> None:
    """While nothing holds resources the ledger only decays: the passes save nothing, and the
    ledger saved last, brought up to now as a restarted server brings it, is the running one.
    A job admitted again is saved by the pass that admits it."""
    from warden.engine.fairshare import accrue

    svc, clock = service
    job_id = svc.store.submit(
        name="short", user="ana", queue="team", tier=3, command=["true"], workdir="/", actor="ana", now=clock.t, gpus=4
    )
    svc.reconciler.reconcile()
    deadline = time.monotonic() + 30
    while svc.executor.replica_exit_codes(str(job_id), 1) != (0,):
        assert time.monotonic() < deadline, "the job's process did not exit"
        time.sleep(0.05)
    clock.t += 600.0
    svc.reconciler.reconcile()  # collects the exit: charged up to now, saved
    svc.reconciler.reconcile()  # nothing held before or after: nothing to save from now on
    saved = svc.store.load_ledger()
    assert saved.at == clock.t and saved.usage["team"] > 0
    for _ in range(5):
        clock.t += 3600.0
        svc.reconciler.reconcile()
    assert svc.store.load_ledger() == saved  # five idle passes wrote nothing
    running = svc.reconciler.charging.ledger
    assert running.at == clock.t and running.usage["team"] < saved.usage["team"]
    restarted = accrue(saved.to_engine(), (), (4, 16_000, 64_000), svc.policy, clock.t)
    assert restarted.usage["team"] == pytest.approx(running.usage["team"], rel=1e-12)

    svc.store.submit(
        name="again", user="ana", queue="other", tier=3, command=["true"], workdir="/", actor="ana", now=clock.t, gpus=1
    )
    svc.reconciler.reconcile()  # admits it: it holds from now on, so the ledger is saved as of now
    assert svc.store.load_ledger().at == clock.t
