"""Which uid a job runs as: the pool of job uids (one per running attempt, never reused while
held or while a process runs under it, known again after a restart) and the ownership of an
attempt's directories. The tests that start jobs as other uids need root (CI runs as root)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from warden.executors.base import Exit, Handle, LaunchSpec, ReplicaHandle, ReplicaLaunch
from warden.executors.identity import Identities, NoIdentity, UidPool, parse_uid_range, parse_user_map
from warden.executors.local import LocalExecutor

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(
    sys.platform != "linux" or not ROOT, reason="switching a job's uid needs root (CI runs the tests as root)"
)
UIDS = range(61900, 61904)  # a corner of the default range of its own, so a running server is not in the way


def wait_until(predicate: Callable[[], object], timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


# -- the pool, without processes -----------------------------------------------------------------


def test_each_attempt_gets_its_own_uid_until_it_is_released() -> None:
    pool = UidPool(range(61990, 61993))
    a, b, c = pool.acquire(("a", 1)), pool.acquire(("b", 1)), pool.acquire(("c", 1))
    assert len({a, b, c}) == 3 and {a, b, c} <= set(pool.uids)
    assert pool.acquire(("a", 1)) == a  # the same attempt asks again: the same uid
    with pytest.raises(NoIdentity, match="no free job uid"):
        pool.acquire(("d", 1))
    assert pool.release(("b", 1)) == b
    assert pool.acquire(("d", 1)) == b  # the only free one; never one still held
    assert pool.held() == {("a", 1): a, ("c", 1): c, ("d", 1): b}


def test_uids_are_handed_out_round_robin() -> None:
    pool = UidPool(range(61990, 61994))
    first = pool.acquire(("a", 1))
    pool.release(("a", 1))
    second = pool.acquire(("a", 2))
    assert second != first  # a uid just given back is the last to come again


def test_a_uid_that_is_an_account_is_never_given() -> None:
    nobody = 65534
    pool = UidPool(range(nobody, nobody + 2))
    assert pool.acquire(("a", 1)) == nobody + 1
    with pytest.raises(NoIdentity):
        pool.acquire(("b", 1))


def test_claimed_uids_are_not_given_again() -> None:
    pool = UidPool(range(61990, 61992))
    pool.claim(("adopted", 3), 61990)
    assert pool.acquire(("new", 1)) == 61991


def test_ranges_and_maps_parse() -> None:
    assert parse_uid_range("61000-61999") == range(61000, 62000)
    assert parse_uid_range("70000") == range(70000, 70001)
    for bad in ("0-10", "5-4", "x-y", "-"):
        with pytest.raises(ValueError):
            parse_uid_range(bad)
    assert parse_user_map(["alice=al", "*=nobody"]) == {"alice": "al", "*": "nobody"}
    with pytest.raises(ValueError):
        parse_user_map(["alice"])


@needs_root
def test_accounts_several_users_share_are_named_and_the_server_warns_of_them() -> None:
    from warden.server.app import Settings, job_identities

    assert Identities("user", UIDS, {"ana": "nobody", "bob": "daemon"}).shared_accounts() == {}
    assert Identities("dynamic", UIDS, {"*": "nobody"}).shared_accounts() == {}
    shared = Identities("user", UIDS, {"ana": "daemon", "bob": "daemon", "*": "nobody", "eve": "nobody"})
    assert shared.shared_accounts() == {"daemon": ["ana", "bob"], "nobody": ["eve", "*"]}
    said: list[str] = []
    job_identities(Settings(run_as="user", user_map=(("*", "nobody"),)), said.append)
    warning = [line for line in said if line.startswith("WARNING")]
    assert len(warning) == 1 and "every user not mapped all run as the account nobody" in warning[0], said
    assert "report tokens" in warning[0] and "docs/security.md" in warning[0]
    said.clear()
    job_identities(Settings(run_as="user", user_map=(("ana", "nobody"),)), said.append)
    assert not [line for line in said if line.startswith("WARNING")], said


def test_a_handle_remembers_the_uid() -> None:
    replica = ReplicaHandle(0, 10, 11, Path("s"), Path("e"), Path("l"), uid=61001)
    handle = Handle("j", 1, (replica,), control_path=Path("c"))
    assert Handle.from_dict(json.loads(json.dumps(handle.to_dict()))) == handle
    old = {k: v for k, v in replica.to_dict().items() if k != "uid"}  # stored by an older server
    assert ReplicaHandle.from_dict(old).uid is None


@pytest.mark.skipif(ROOT, reason="as root, jobs do switch")
def test_a_server_that_is_not_root_cannot_switch() -> None:
    with pytest.raises(PermissionError, match="root"):
        Identities("dynamic")
    assert not Identities.default().switching


# -- real jobs under root -------------------------------------------------------------------------


@needs_root
def test_a_uid_owned_by_a_live_process_is_skipped() -> None:
    squatter = subprocess.Popen(["sleep", "60"], user=UIDS[0], group=UIDS[0], extra_groups=[])
    try:
        wait_until(lambda: Path(f"/proc/{squatter.pid}/status").exists(), what="the squatter")
        assert UidPool(UIDS).acquire(("a", 1)) != UIDS[0]
    finally:
        squatter.kill()
        squatter.wait()


class Jobs:
    """LaunchSpecs for one-line Python jobs under `root`, and their exits."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.work = root / "work"
        self.work.mkdir()
        self.seen: dict[tuple[str, int], Exit] = {}

    def spec(self, job: str, attempt: int, code: str) -> LaunchSpec:
        return LaunchSpec(
            job,
            attempt,
            (sys.executable, "-c", code),
            (ReplicaLaunch(0, "local", ()),),
            5.0,
            self.work,
            self.root / "state" / "jobs" / job / f"attempt-{attempt}",
            self.root / "state" / "jobs" / job / "checkpoints",
        )

    def wait_exit(self, executor: LocalExecutor, job: str, attempt: int) -> Exit:
        def reported() -> bool:
            self.seen.update({(e.job_id, e.attempt): e for e in executor.exits()})
            return (job, attempt) in self.seen

        wait_until(reported, what=f"the exit of {job}/{attempt}")
        return self.seen.pop((job, attempt))


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    (tmp_path / "state").mkdir()
    os.chmod(tmp_path / "state", 0o711)
    yield Jobs(tmp_path)


def owner_and_mode(path: Path) -> tuple[int, int]:
    st = path.lstat()
    return st.st_uid, stat.S_IMODE(st.st_mode)


WAIT = "import os, time\nwhile not os.path.exists(os.path.join(os.environ['WARDEN_CHECKPOINT_DIR'], 'go')): time.sleep(0.02)"


@needs_root
def test_running_attempts_have_distinct_uids_released_at_exit(jobs: Jobs) -> None:
    executor = LocalExecutor(identities=Identities("dynamic", UIDS))
    try:
        a = executor.start(jobs.spec("a", 1, WAIT))
        b = executor.start(jobs.spec("b", 1, WAIT))
        uid_a, uid_b = a.replicas[0].uid, b.replicas[0].uid
        assert uid_a in UIDS and uid_b in UIDS and uid_a != uid_b
        assert executor.identities.pool.held() == {("a", 1): uid_a, ("b", 1): uid_b}
        log_dir, checkpoints = jobs.root / "state/jobs/a/attempt-1", jobs.root / "state/jobs/a/checkpoints"
        assert owner_and_mode(log_dir) == (0, 0o711)
        assert owner_and_mode(checkpoints) == (uid_a, 0o700)
        assert owner_and_mode(log_dir / "home") == (uid_a, 0o700)
        assert owner_and_mode(log_dir / "rank-0.log") == (0, 0o600)
        (checkpoints / "go").touch()
        assert jobs.wait_exit(executor, "a", 1).exit_codes == (0,)
        assert executor.identities.pool.held() == {("b", 1): uid_b}
        assert owner_and_mode(checkpoints) == (0, 0o700)  # the server's again
        assert owner_and_mode(log_dir / "home")[0] == 0
        (jobs.root / "state/jobs/b/checkpoints/go").touch()
        assert jobs.wait_exit(executor, "b", 1).exit_codes == (0,)
        assert executor.identities.pool.held() == {}
    finally:
        executor.close()


SAVE = (
    "import os, sys\nd = os.environ['WARDEN_CHECKPOINT_DIR']\n"
    "old = open(os.path.join(d, 'step')).read() if os.path.exists(os.path.join(d, 'step')) else '0'\n"
    "os.makedirs(os.path.join(d, 'sub'), exist_ok=True)\n"
    "fd = os.open(os.path.join(d, 'sub', 'step.tmp'), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)\n"
    "os.write(fd, str(int(old) + 1).encode()); os.close(fd)\n"
    "os.replace(os.path.join(d, 'sub', 'step.tmp'), os.path.join(d, 'step'))\n"
    "print(old, os.getuid())"
)


@needs_root
def test_the_next_attempt_owns_the_checkpoints_of_the_last(jobs: Jobs) -> None:
    executor = LocalExecutor(identities=Identities("dynamic", UIDS))
    foreign = jobs.root / "foreign"
    foreign.write_text("someone else's")
    try:
        first = executor.start(jobs.spec("j", 1, SAVE))
        assert jobs.wait_exit(executor, "j", 1).exit_codes == (0,)
        checkpoints = jobs.root / "state/jobs/j/checkpoints"
        os.symlink(foreign, checkpoints / "link")  # what a job could plant: never followed
        second = executor.start(jobs.spec("j", 2, SAVE))
        assert jobs.wait_exit(executor, "j", 2).exit_codes == (0,)
    finally:
        executor.close()
    assert first.replicas[0].uid != second.replicas[0].uid
    assert (checkpoints / "step").read_text() == "2"  # attempt 2 read and replaced attempt 1's 0600 file
    out = (jobs.root / "state/jobs/j/attempt-2/rank-0.log").read_text().split()
    assert out == ["1", str(second.replicas[0].uid)]
    assert foreign.stat().st_uid == 0 and (checkpoints / "link").lstat().st_uid == 0


@needs_root
def test_a_restarted_executor_knows_the_uids_running_attempts_hold(jobs: Jobs) -> None:
    first = LocalExecutor(identities=Identities("dynamic", UIDS))
    handle = first.start(jobs.spec("r", 1, WAIT))
    first.close()  # the server stops; the job keeps running
    uid = handle.replicas[0].uid
    again = LocalExecutor(identities=Identities("dynamic", UIDS))
    try:
        recovered = again.recover("r", 1, jobs.root / "state/jobs/r/attempt-1", 1)
        assert recovered is not None and recovered.replicas[0].uid == uid
        again.adopt(Handle.from_dict(handle.to_dict()))
        assert again.identities.pool.held() == {("r", 1): uid}
        other = again.start(jobs.spec("s", 1, "pass"))
        assert other.replicas[0].uid != uid  # not reused while the adopted attempt runs
        assert jobs.wait_exit(again, "s", 1).exit_codes == (0,)
        (jobs.root / "state/jobs/r/checkpoints/go").touch()
        assert jobs.wait_exit(again, "r", 1).exit_codes == (0,)
        assert again.identities.pool.held() == {}
        assert owner_and_mode(jobs.root / "state/jobs/r/checkpoints") == (0, 0o700)  # reclaimed after adoption
    finally:
        again.close()


@needs_root
def test_user_mode_runs_as_the_mapped_account_and_never_as_root(jobs: Jobs) -> None:
    executor = LocalExecutor(identities=Identities("user", UIDS, {"alice": "nobody", "eve": "root"}))
    code = "import os; print(os.getuid(), os.environ['USER'], os.environ['HOME'])"
    try:
        alice = executor.start(replace(jobs.spec("alice", 1, code), user="alice"))
        eve = executor.start(replace(jobs.spec("eve", 1, code), user="eve"))
        assert jobs.wait_exit(executor, "alice", 1).exit_codes == (0,)
        assert jobs.wait_exit(executor, "eve", 1).exit_codes == (0,)
    finally:
        executor.close()
    assert (jobs.root / "state/jobs/alice/attempt-1/rank-0.log").read_text().split() == [
        "65534",
        "nobody",
        "/nonexistent",
    ]
    assert alice.replicas[0].uid == 65534
    assert eve.replicas[0].uid in UIDS  # mapped to root: a dynamic uid instead
