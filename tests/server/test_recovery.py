"""A server stopped between two steps of a pass: the next start finishes or undoes each
half-done step, never starting a job twice and never giving its GPUs to another job."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from serverproc import wait_for
from support import move

from warden.engine.model import JobState, ReplicaPlacement
from warden.executors.base import LaunchSpec, ReplicaLaunch
from warden.executors.local import LocalExecutor
from warden.server.app import Settings, build_service
from warden.server.service import Service

POLICY = "queues:\n  name: cluster\n  children:\n    - {name: team}\n"


def service(tmp_path: Path) -> Service:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    return build_service(
        Settings(policy=policy, fake_gpus=2, state_dir=tmp_path / "state", bootstrap_token="t"), say=lambda _: None
    )


def submit(svc: Service, command: list[str]) -> int:
    return svc.store.submit(
        name="",
        user="admin",
        queue="team",
        tier=3,
        command=command,
        actor="admin",
        now=svc.now(),
        gpus=2,
        workdir=str(Path.cwd()),
    )


def finished(svc: Service, job_id: int) -> JobState:
    return wait_for(
        lambda: (svc.reconciler.reconcile(), svc.store.get(job_id).state)[1].terminal and svc.store.get(job_id).state,
        20,
        f"job {job_id} to finish",
    )


def test_admitted_without_an_attempt_is_requeued_and_runs(tmp_path: Path) -> None:
    svc = service(tmp_path)
    job = submit(svc, [sys.executable, "-c", "pass"])
    move(svc.store, job, JobState.ADMITTED, reason="admitted", actor="warden", now=svc.now(), attempt=1)
    svc.executor.close()
    again = service(tmp_path)
    again.reconciler.recover()
    assert again.store.get(job).state in (JobState.PENDING, JobState.RUNNING)
    assert finished(again, job) is JobState.SUCCEEDED
    assert [a.number for a in again.store.attempts(job)] == [1]
    again.executor.close()


def test_processes_started_but_the_handle_was_never_stored_are_adopted(tmp_path: Path) -> None:
    svc = service(tmp_path)
    marker = tmp_path / "ran"
    # Long enough to outlast two service start-ups and a recovery on a loaded machine: the
    # check below needs it still running.
    code = f"import time; open({str(marker)!r}, 'a').write('x'); time.sleep(3)"
    job = submit(svc, [sys.executable, "-c", code])
    now = svc.now()
    log_dir = tmp_path / "state" / "jobs" / str(job) / "attempt-1"
    move(svc.store, job, JobState.ADMITTED, reason="admitted", actor="warden", now=now, attempt=1)
    svc.store.start_attempt(
        job, 1, started_at=now, assignment=[ReplicaPlacement(svc.nodes[0].name, (0, 1))], log_dir=str(log_dir)
    )
    # The processes start, then the server dies before it records the handle.
    launcher = LocalExecutor()
    launcher.start(
        LaunchSpec(
            str(job),
            1,
            (sys.executable, "-c", code),
            (ReplicaLaunch(0, svc.nodes[0].name, (0, 1)),),
            120.0,
            Path.cwd(),
            log_dir,
            tmp_path / "ckpt",
        )
    )
    launcher.close()
    svc.executor.close()
    again = service(tmp_path)
    again.reconciler.recover()
    assert again.store.get(job).state is JobState.RUNNING
    assert again.store.attempt(job, 1).handle is not None
    # Its GPUs stay held: a second job waits for them.
    other = submit(again, [sys.executable, "-c", "pass"])
    again.reconciler.reconcile()
    assert again.store.get(other).state is JobState.PENDING
    assert finished(again, job) is JobState.SUCCEEDED
    assert marker.read_text() == "x"  # started once
    assert finished(again, other) is JobState.SUCCEEDED
    again.executor.close()


@pytest.mark.parametrize(
    "reason, expected",
    [
        ("completed", JobState.SUCCEEDED),
        ("failed", JobState.FAILED),
        ("preempted", JobState.PENDING),
        ("evicted", JobState.PENDING),
    ],
)
def test_an_ended_attempt_whose_job_was_not_moved_on(tmp_path: Path, reason: str, expected: JobState) -> None:
    svc = service(tmp_path)
    job = submit(svc, ["true"])
    now = svc.now()
    for state in (JobState.ADMITTED, JobState.STARTING, JobState.RUNNING):
        move(svc.store, job, state, reason="x", actor="warden", now=now, attempt=1)
    svc.store.start_attempt(
        job, 1, started_at=now, assignment=[ReplicaPlacement(svc.nodes[0].name, (0, 1))], log_dir=str(tmp_path)
    )
    if reason == "preempted":
        svc.store.update_attempt(job, 1, sigterm_at=now, kill_at=now + 120, preempted_for="9")
    if reason == "evicted":  # its node went down: no preemption
        svc.store.update_attempt(job, 1, sigterm_at=now, kill_at=now + 120, preemption_kind="eviction")
    svc.store.end_attempt(job, 1, ended_at=now, exit_codes=[0 if reason != "failed" else 4], reason=reason)
    svc.executor.close()
    again = service(tmp_path)
    again.reconciler.recover()
    after = again.store.get(job)
    assert after.state is expected
    if expected is JobState.FAILED:
        assert after.exit_code == 4
    if expected is JobState.PENDING:
        # as when the exit is collected live: only a preemption counts for the thrash guard
        assert after.preempted_at == ((now,) if reason == "preempted" else ())
    again.executor.close()
