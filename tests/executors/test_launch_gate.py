"""A launch and its revocation: the shim claims its replica's status file before it starts the
job, an adopter's `recover` revokes every replica no shim has claimed, and exactly one of the
two wins, whatever the timing (docs/executors.md, "A launch is claimed").

The launching executor is the real `LocalExecutor`, stalled at a chosen step by a subclass
that waits on an event there (what SIGSTOP does to a whole leader, done to one thread); the
adopter is a second `LocalExecutor`, as a new leader's. Jobs are real processes that leave a
mark when they run.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from warden.executors.base import Handle, LaunchError, LaunchSpec, ReplicaLaunch
from warden.executors.local import LocalExecutor
from warden.executors.records import REVOKED, claim_launch, launched, read_job_json, revoke_launch
from warden.executors.shim import group_alive

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the local executor needs Linux")

JOB = "import os, sys, time; open(os.path.join(sys.argv[1], os.environ['RANK'] if 'RANK' in os.environ else '0'), 'w').close(); time.sleep(60)"


class Stalling(LocalExecutor):
    """A LocalExecutor whose launch stops after it forked each shim and before it hands the
    shim its launch description, until `resume` (or for `delay_s`, when given)."""

    def __init__(self, delay_s: float | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.delay_s = delay_s
        self.forked = threading.Event()
        self.resume = threading.Event()

    def _await_shims(self, shims: Any, launches: Any) -> list[str]:
        self.forked.set()
        if self.delay_s is None:
            self.resume.wait(30)
        else:
            time.sleep(self.delay_s)
        return super()._await_shims(shims, launches)


def spec(root: Path, job_id: str, replicas: int = 1) -> LaunchSpec:
    marks = root / "marks" / job_id
    marks.mkdir(parents=True, exist_ok=True)
    marks.chmod(0o777)  # the job runs as a uid of its own under root
    work = root / "work"
    work.mkdir(exist_ok=True)
    return LaunchSpec(
        job_id=job_id,
        attempt=1,
        command=(sys.executable, "-c", JOB, str(marks)),
        replicas=tuple(ReplicaLaunch(rank=i, node="local", gpus=(), local_rank=i) for i in range(replicas)),
        grace_s=5.0,
        workdir=work,
        log_dir=root / "logs" / job_id / "1",
        checkpoint_dir=root / "ckpt" / job_id,
    )


def ran(root: Path, job_id: str) -> list[str]:
    """The ranks of the job whose process ran (each leaves a mark)."""
    return sorted(p.name for p in (root / "marks" / job_id).iterdir())


@pytest.fixture
def cleanup() -> Iterator[list[Handle]]:
    handles: list[Handle] = []
    yield handles
    for handle in handles:
        for replica in handle.replicas:
            if replica.pgid is not None and group_alive(replica.pgid):
                os.killpg(replica.pgid, 9)


def test_a_launch_revoked_while_it_was_on_its_way_starts_nothing(tmp_path: Path, cleanup: list[Handle]) -> None:
    """The leader forked the gang's shims and stalled; the adopter revokes every replica and
    finds nothing to adopt; the stalled launch, resumed, is refused and no job process runs."""
    leader, adopter = Stalling(), LocalExecutor()
    launch = spec(tmp_path, "j", replicas=2)
    failure: list[BaseException] = []

    def start() -> None:
        try:
            cleanup.append(leader.start(launch))
        except BaseException as err:
            failure.append(err)

    thread = threading.Thread(target=start)
    thread.start()
    assert leader.forked.wait(30)
    assert adopter.recover("j", 1, launch.log_dir, 2) is None
    for rank in range(2):
        record = read_job_json(launch.log_dir / f"rank-{rank}.status.json")
        assert record is not None and REVOKED in record and not launched(record)
    leader.resume.set()
    thread.join(60)
    assert len(failure) == 1 and isinstance(failure[0], LaunchError), failure
    assert "was refused: the launch was revoked (attempt 1 of job j was recovered unstarted)" in str(failure[0])
    # The shims refused before they forked a job (nothing to wait for): no mark, no exit record.
    assert ran(tmp_path, "j") == []
    assert not any(launch.log_dir.glob("rank-*.exit.json"))
    assert "warden-shim: not started: the launch was revoked" in (launch.log_dir / "rank-0.log").read_text()
    assert leader.running() == [] and adopter.running() == []
    leader.close()
    adopter.close()


def test_a_claimed_launch_is_adopted_not_revoked(tmp_path: Path, cleanup: list[Handle]) -> None:
    """The launch claimed its replicas before the adopter came: `recover` finds the job's
    process groups and revokes nothing."""
    leader, adopter = LocalExecutor(), LocalExecutor()
    launch = spec(tmp_path, "k", replicas=2)
    handle = leader.start(launch)
    cleanup.append(handle)
    recovered = adopter.recover("k", 1, launch.log_dir, 2)
    assert recovered is not None
    assert [r.pgid for r in recovered.replicas] == [r.pgid for r in handle.replicas]
    assert all(r.pgid is not None and group_alive(r.pgid) for r in recovered.replicas)
    leader.close()
    adopter.close()


def test_a_launch_and_a_revocation_at_random_moments_never_both_win(tmp_path: Path, cleanup: list[Handle]) -> None:
    """Property: the launch's description arrives after a random delay and the adopter comes
    after another; in every trial exactly one wins. Either the launch started and `recover`
    returned its process group (the adopter tracks what runs), or the launch was refused,
    `recover` returned None and no process of the job ever ran."""
    rng = random.Random(42)
    outcomes = {"adopted": 0, "revoked": 0}
    adopter = LocalExecutor()
    for trial in range(24):
        job = f"t{trial}"
        launch = spec(tmp_path, job)
        leader = Stalling(delay_s=rng.uniform(0.0, 0.15))
        result: list[Handle | BaseException] = []

        def start(leader: Stalling = leader, launch: LaunchSpec = launch, result: list[Any] = result) -> None:
            try:
                result.append(leader.start(launch))
            except BaseException as err:
                result.append(err)

        thread = threading.Thread(target=start)
        thread.start()
        assert leader.forked.wait(30)
        time.sleep(rng.uniform(0.0, 0.3))
        recovered = adopter.recover(job, 1, launch.log_dir, 1)
        thread.join(60)
        assert len(result) == 1
        if isinstance(result[0], Handle):
            cleanup.append(result[0])
            assert recovered is not None, f"trial {trial}: the launch ran but recovery found nothing"
            assert recovered.replicas[0].pgid == result[0].replicas[0].pgid
            deadline = time.monotonic() + 10
            while ran(tmp_path, job) != ["0"] and time.monotonic() < deadline:
                time.sleep(0.01)
            assert ran(tmp_path, job) == ["0"]
            outcomes["adopted"] += 1
        else:
            assert isinstance(result[0], LaunchError), result[0]
            assert recovered is None, f"trial {trial}: refused, yet recovery adopted {recovered}"
            assert ran(tmp_path, job) == [], f"trial {trial}: a revoked launch ran"
            assert not (launch.log_dir / "rank-0.exit.json").exists()
            outcomes["revoked"] += 1
        leader.close()
    adopter.close()
    assert outcomes["adopted"] and outcomes["revoked"], outcomes  # both sides of the race were exercised


def test_claim_and_revoke_exclude_each_other(tmp_path: Path) -> None:
    """The file-level contract: one exclusive creation each, whole at once; a revocation of a
    claimed replica returns the claim, a claim over a revocation is refused."""
    claimed, revoked = tmp_path / "a.status.json", tmp_path / "b.status.json"
    assert claim_launch(claimed, {"shim_pid": os.getpid()})
    assert not claim_launch(claimed, {"shim_pid": 1})  # a second launch of the same replica
    assert revoke_launch(claimed, "late") == {"shim_pid": os.getpid()}
    assert revoke_launch(revoked, "recovered") is None
    assert not claim_launch(revoked, {"shim_pid": os.getpid()})
    assert read_job_json(revoked) == {REVOKED: "recovered"}
    assert revoke_launch(revoked, "again") is None  # revoked stays revoked
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.status.json", "b.status.json"]  # no temporary left
