"""What happens outside warden on the cluster it governs, as the reconcile loop sees it through
its executor: GPUs held by work that is not warden's are never offered to a job, and are shown
(`GET /v1/nodes`, `warden_gpus_foreign`); an attempt that something else ended (an external
`scancel`, a removed placement group) is evicted and its job requeued with what happened, never
failed. The executors' side is tested on real Slurm and Ray clusters (tests/executors); here a
real local executor runs the job and the cluster's report is the input."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from serverproc import end_everything, wait_for

from warden.engine.model import JobState, Node
from warden.engine.policy import parse_policy
from warden.executors.base import Exit, Inventory
from warden.executors.local import LocalExecutor
from warden.server.app import create_app
from warden.server.auth import Principal
from warden.server.nodes import unavailable_gpus
from warden.server.service import Service
from warden.store import Store

POLICY = {
    "min_grace": "120s",
    "thrash": {"min_efficiency": 0},
    "preemption": {"restart_overhead": "0s", "checkpoint_overhead": "0s"},
    "queues": {"name": "cluster", "children": [{"name": "vision"}]},
}
NODE = Node("node-0", 4, 16_000, 64_000)


class EndedOutside(LocalExecutor):
    """The local executor, whose exits say an attempt was ended by something else once the
    test has said so: what the Slurm executor reports after another user's `scancel`."""

    def __init__(self) -> None:
        super().__init__()
        self.outside: dict[tuple[str, int], str] = {}

    def exits(self) -> list[Exit]:
        return [
            dataclasses.replace(ex, ended_by=self.outside[(ex.job_id, ex.attempt)])
            if (ex.job_id, ex.attempt) in self.outside
            else ex
            for ex in super().exits()
        ]


class BindsElsewhere(LocalExecutor):
    """The local executor, reporting that each replica was bound to other GPUs than planned
    (`bound`, per attempt), as Slurm and Ray report the indices they chose."""

    def __init__(self) -> None:
        super().__init__()
        self.bound: dict[tuple[str, int], tuple[tuple[int, ...] | None, ...]] = {}

    def devices(self, job_id: str, attempt: int) -> tuple[tuple[int, ...] | None, ...] | None:
        return self.bound.get((job_id, attempt), (None,))


@asynccontextmanager
async def no_lifespan(_: Any) -> AsyncIterator[None]:
    yield


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store.open(f"sqlite:///{tmp_path / 'warden.db'}")
    yield opened
    opened.close()


def submit(store: Store, gpus: int, command: list[str]) -> int:
    return store.submit(
        name="", user="ana", queue="vision", tier=3, command=command, workdir="/", actor="ana",
        now=time.time(), gpus=gpus,
    )  # fmt: skip


def test_gpus_held_outside_warden_are_never_offered_and_are_shown(store: Store, tmp_path: Path) -> None:
    seen = [Inventory((NODE,), foreign={"node-0": (0, 2, 3)})]
    (tmp_path / "state").mkdir()
    svc = Service(store, LocalExecutor(), (NODE,), parse_policy(POLICY), tmp_path / "state", inventory=lambda: seen[0])
    token = store.create_token("admin", "admin", ["*"], "test", time.time())
    app = create_app(svc)
    app.router.lifespan_context = no_lifespan
    try:
        two = submit(store, 2, ["sleep", "600"])
        one = submit(store, 1, ["sleep", "600"])
        with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as c:

            def states() -> tuple[JobState, JobState]:
                svc.reconciler.reconcile()
                a, b = store.get(two), store.get(one)
                assert a is not None and b is not None
                return a.state, b.state

            # 1 GPU left to warden: the 1-GPU job runs, the 2-GPU job waits.
            wait_for(lambda: states() == (JobState.PENDING, JobState.RUNNING), what="only the 1-GPU job running")
            for _ in range(3):
                assert states()[0] is JobState.PENDING
            node = c.get("/v1/nodes").json()[0]
            assert (node["gpus"], node["gpus_used"], node["gpus_foreign"], node["gpus_free"]) == (4, 1, 3, 0)
            assert (node["gpu_indices_foreign"], node["gpu_indices_used"]) == ([0, 2, 3], [1])  # where they are
            assert 'warden_gpus_foreign{node="node-0"} 3.0' in c.get("/metrics").text
            # The outside work ends: its GPUs are warden's again.
            seen[0] = Inventory((NODE,))
            wait_for(lambda: states() == (JobState.RUNNING, JobState.RUNNING), what="both jobs running")
            assert c.get("/v1/nodes").json()[0]["gpus_foreign"] == 0
    finally:
        end_everything(svc)


def test_gpus_held_outside_warden_are_unavailable_where_they_are_and_leave_room_for_warden_s() -> None:
    assert unavailable_gpus(NODE, (1, 2, 3), 0, set()) == (1, 2, 3)
    assert unavailable_gpus(NODE, (), 3, set()) == (0, 1, 2)  # which, Ray cannot say: the lowest stand for them
    assert unavailable_gpus(NODE, (), 3, {0}) == (1, 2, 3)  # never one warden holds
    assert unavailable_gpus(NODE, (3,), 1, {0}) == (1, 3)
    assert unavailable_gpus(NODE, (), 3, {2, 3}) == (0, 1)  # no more than leave room for warden's
    # Warden's record of an attempt not corrected yet names a foreign GPU: still one GPU fewer.
    assert unavailable_gpus(NODE, (0, 1), 0, {1}) == (0, 1)
    assert unavailable_gpus(NODE, (0, 1, 2, 3), 0, {2, 3}) == (0, 1)
    assert unavailable_gpus(NODE, (0, 1, 2, 3), 0, {0, 1}, holding=4) == ()  # an exit not collected yet
    assert unavailable_gpus(NODE, (7,), 9, set()) == (0, 1, 2, 3)  # nothing outside the node
    assert unavailable_gpus(NODE, (), 0, {3}) == ()


def test_an_attempt_ended_outside_warden_is_evicted_and_requeued_not_failed(store: Store, tmp_path: Path) -> None:
    executor = EndedOutside()
    (tmp_path / "state").mkdir()
    svc = Service(store, executor, (NODE,), parse_policy(POLICY), tmp_path / "state")
    try:
        job = submit(store, 2, ["sleep", "600"])

        def state() -> JobState:
            svc.reconciler.reconcile()
            got = store.get(job)
            assert got is not None
            return got.state

        wait_for(lambda: state() is JobState.RUNNING, what="the job running")
        executor.outside[(str(job), 1)] = "Slurm job 123 cancelled by uid 65534"
        statuses = list((tmp_path / "state" / "jobs" / str(job) / "attempt-1").glob("rank-*.status.json"))
        assert statuses
        for status in statuses:  # what an outside scancel does to the job's processes
            os.killpg(int(json.loads(status.read_text())["pgid"]), signal.SIGKILL)
        wait_for(lambda: state() and store.attempts(job)[0].ended_at is not None, what="the exit recorded")
        first = store.attempts(job)[0]
        assert first.reason == "evicted" and list(first.exit_codes or ()) == [-9]
        assert first.lost_work_gpu_s is not None and first.lost_work_gpu_s >= 0
        reasons = [e.reason for e in store.events(job)]
        assert "evicted: Slurm job 123 cancelled by uid 65534 (exit -9); the job is requeued" in reasons, reasons
        got = store.get(job)
        assert got is not None and not got.preempted_at  # no preemption: the thrash guard does not count it
        wait_for(lambda: state() is JobState.RUNNING and len(store.attempts(job)) == 2, what="the second attempt")
    finally:
        end_everything(svc)


class ForgedEnd(LocalExecutor):
    """The local executor, whose exits carry an end time a job could have written in a record:
    long before the attempt began, or in the future."""

    def __init__(self, ended_at: float) -> None:
        super().__init__()
        self.ended_at = ended_at

    def exits(self) -> list[Exit]:
        return [dataclasses.replace(ex, ended_at=self.ended_at) for ex in super().exits()]


@pytest.mark.parametrize("ended_at", [1000.0, float("nan"), 4e9])
def test_an_exit_time_outside_the_attempt_is_never_recorded(store: Store, tmp_path: Path, ended_at: float) -> None:
    (tmp_path / "state").mkdir()
    svc = Service(store, ForgedEnd(ended_at), (NODE,), parse_policy(POLICY), tmp_path / "state")
    try:
        job = submit(store, 2, ["true"])

        def ended() -> bool:
            svc.reconciler.reconcile()
            got = store.get(job)
            return got is not None and got.state.terminal

        wait_for(ended, what="the job finished")
        attempt = store.attempts(job)[0]
        assert attempt.ended_at is not None and attempt.started_at <= attempt.ended_at <= time.time()
    finally:
        end_everything(svc)


def test_an_attempt_bound_to_other_gpus_than_planned_is_recorded_where_it_runs(store: Store, tmp_path: Path) -> None:
    """The substrate chose GPUs 2,3 for a job planned on 0,1: its recorded assignment follows,
    with an event that says so, and the next job is planned on the GPUs really free; a replica
    bound to another number of GPUs than placed is requeued with the reason, never failed."""
    executor = BindsElsewhere()
    (tmp_path / "state").mkdir()
    svc = Service(store, executor, (NODE,), parse_policy(POLICY), tmp_path / "state")
    try:
        first = submit(store, 2, ["sleep", "600"])
        executor.bound[(str(first), 1)] = ((2, 3),)

        def placed(job: int) -> list[tuple[str, tuple[int, ...]]]:
            svc.reconciler.reconcile()
            got = store.get(job)
            assert got is not None
            attempt = store.attempt(job, got.attempt) if got.attempt else None
            return [] if attempt is None else [(p.node, p.gpus) for p in attempt.assignment]

        wait_for(lambda: placed(first) == [("node-0", (2, 3))], what="the first job recorded on GPUs 2,3")
        noted = [e for e in store.events(first) if "as the executor bound them" in e.reason]
        assert len(noted) == 1 and "node-0:2,3" in noted[0].reason and "not node-0:0,1" in noted[0].reason, noted
        assert noted[0].details["bound"] == [{"node": "node-0", "gpus": [2, 3]}]
        second = submit(store, 2, ["sleep", "600"])
        executor.bound[(str(second), 1)] = ((0, 1, 2),)  # more GPUs than placed: never happens, requeued if it did
        wait_for(lambda: placed(second) == [("node-0", (0, 1))], what="the second job planned on the free GPUs")

        def requeued() -> bool:
            svc.reconciler.reconcile()
            return any("not as many as placed" in e.reason and e.to_state == "PREEMPTING" for e in store.events(second))

        wait_for(requeued, what="the second job evicted for it")
        assert all(e.to_state != "FAILED" for e in store.events(second))
    finally:
        end_everything(svc)


def pgid_of(tmp_path: Path, job: int) -> int:
    statuses = list((tmp_path / "state" / "jobs" / str(job) / "attempt-1").glob("rank-*.status.json"))
    assert statuses
    return int(json.loads(statuses[0].read_text())["pgid"])


def test_a_sigterm_warden_did_not_send_evicts_and_requeues(store: Store, tmp_path: Path) -> None:
    """What another job of the same account can do (`--user-map '*=ACCOUNT'`): SIGTERM this one.
    The real local executor tells it from warden's own SIGTERM; the job is requeued."""
    (tmp_path / "state").mkdir()
    svc = Service(store, LocalExecutor(), (NODE,), parse_policy(POLICY), tmp_path / "state")
    try:
        job = submit(store, 1, ["sleep", "600"])

        def state() -> JobState:
            svc.reconciler.reconcile()
            got = store.get(job)
            assert got is not None
            return got.state

        wait_for(lambda: state() is JobState.RUNNING, what="the job running")
        os.killpg(pgid_of(tmp_path, job), signal.SIGTERM)
        wait_for(lambda: state() and store.attempts(job)[0].ended_at is not None, what="the exit recorded")
        first = store.attempts(job)[0]
        assert first.reason == "evicted" and list(first.exit_codes or ()) == [-15]
        reasons = [e.reason for e in store.events(job)]
        said = "evicted: rank 0 was killed by SIGTERM, which warden did not send (exit -15); the job is requeued"
        assert said in reasons, reasons
        wait_for(lambda: state() is JobState.RUNNING and len(store.attempts(job)) == 2, what="the second attempt")
    finally:
        end_everything(svc)


def test_a_stopped_attempt_is_noted_and_past_its_bound_evicted(store: Store, tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    policy = parse_policy({**POLICY, "containment": {"stopped_limit": "1s"}})
    svc = Service(store, LocalExecutor(), (NODE,), policy, tmp_path / "state")
    try:
        job = submit(store, 1, ["sleep", "600"])

        def state() -> JobState:
            svc.reconciler.reconcile()
            got = store.get(job)
            assert got is not None
            return got.state

        wait_for(lambda: state() is JobState.RUNNING, what="the job running")
        pgid = pgid_of(tmp_path, job)
        stopped_at = time.time()
        os.killpg(pgid, signal.SIGSTOP)
        wait_for(lambda: state() and store.attempts(job)[0].ended_at is not None, what="the eviction's exit")
        first = store.attempts(job)[0]
        assert list(first.exit_codes or ()) == [-15]  # SIGTERM reached it: SIGCONT came with it
        assert first.sigterm_at is not None and first.sigterm_at - stopped_at >= 1.0
        reasons = [e.reason for e in store.events(job)]
        noted = (
            f"its processes are stopped (rank 0: pid {pgid}), not by warden: it holds its resources and runs nothing"
        )
        assert any(r.startswith(noted) for r in reasons), reasons
        evicted = f"evicted: its processes were stopped for 1s (rank 0: pid {pgid}); the whole gang stops"
        assert any(r.startswith(evicted) for r in reasons), reasons
        wait_for(lambda: state() is JobState.RUNNING and len(store.attempts(job)) == 2, what="the second attempt")
    finally:
        end_everything(svc)


SAVES_AND_EXITS = """\
import time
from warden.workload import install
guard = install()
print("up", flush=True)
while not guard.should_stop():
    time.sleep(0.01)
print("saved", flush=True)
guard.exit()
"""


def test_a_job_whose_guard_saves_after_an_outside_sigterm_is_evicted_and_warden_s_own_still_exits_0(
    store: Store, tmp_path: Path
) -> None:
    """The SDK guard turns SIGTERM into "save, exit 0", which warden takes for a preempted
    job's when it sent SIGTERM: after another's SIGTERM the guard ends the job by it once it
    saved, and the job is requeued, not SUCCEEDED; after warden's (a cancel) it exits 0."""
    (tmp_path / "state").mkdir()
    svc = Service(store, LocalExecutor(), (NODE,), parse_policy(POLICY), tmp_path / "state")
    try:
        job = submit(store, 1, [sys.executable, "-c", SAVES_AND_EXITS])

        def state() -> JobState:
            svc.reconciler.reconcile()
            got = store.get(job)
            assert got is not None
            return got.state

        def log(attempt: int) -> str:
            path = tmp_path / "state" / "jobs" / str(job) / f"attempt-{attempt}" / "rank-0.log"
            return path.read_text() if path.exists() else ""

        wait_for(lambda: state() is JobState.RUNNING and "up" in log(1), what="the job's guard installed")
        os.killpg(pgid_of(tmp_path, job), signal.SIGTERM)
        wait_for(lambda: state() and store.attempts(job)[0].ended_at is not None, what="the exit recorded")
        first = store.attempts(job)[0]
        assert first.reason == "evicted" and list(first.exit_codes or ()) == [-15], first
        assert "saved" in log(1)
        reasons = [e.reason for e in store.events(job)]
        said = "evicted: rank 0 was killed by SIGTERM, which warden did not send (exit -15); the job is requeued"
        assert said in reasons, reasons
        wait_for(lambda: state() is JobState.RUNNING and "up" in log(2), what="the second attempt's guard")
        svc.actions.cancel(str(job), Principal("root", "admin", ("*",)))
        wait_for(lambda: state() is JobState.CANCELLED, what="the cancel")
        second = store.attempts(job)[1]
        assert list(second.exit_codes or ()) == [0] and "saved" in log(2)
    finally:
        end_everything(svc)
