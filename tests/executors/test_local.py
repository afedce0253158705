"""The local executor with real processes and real signals.

Every job is a small Python program (PROGRAM below) in one of a few modes; the tests wait on
files and process states with timeouts, never on a fixed sleep. Each test's leftovers are
killed by process group in the fixture's teardown.

The SIGKILL lateness recorded in docs/executors.md comes from `test_kill_lateness_and_sigterm_skew`:
    WARDEN_KILL_LATENESS_RUNS=20 python3 -m pytest -q -s tests/executors/test_local.py -k lateness
"""

from __future__ import annotations

import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import warden
from warden.executors import cgroups
from warden.executors.base import (
    OPEN_FILES_HARD,
    Bounds,
    Executor,
    Exit,
    Fenced,
    Handle,
    LaunchError,
    LaunchSpec,
    ReplicaLaunch,
    UnknownAttempt,
)
from warden.executors.local import LocalExecutor, cgroup_name, log_paths
from warden.executors.shim import KEEPER_SLACK_S, DeadlineKeeper, group_alive, process_alive

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the local executor needs Linux")

REPO_ROOT = Path(warden.__file__).resolve().parents[1]
LAYOUT = cgroups.find_layout("warden/local")
contained = pytest.mark.skipif(not isinstance(LAYOUT, cgroups.Layout), reason=f"no cgroups here: {LAYOUT}")

PROGRAM = textwrap.dedent("""
    import json, os, signal, sys, time

    mode, where = sys.argv[1], sys.argv[2]
    rank = os.environ.get("RANK", "0")

    def mark(name, text=""):
        tmp = os.path.join(where, f".{name}.tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(where, name))

    def wait_for(name):
        while not os.path.exists(os.path.join(where, name)):
            time.sleep(0.01)

    def on_term_then_exit(signum, frame):
        mark(f"term-{rank}", repr(time.time()))
        time.sleep(0.2)
        sys.exit(0)

    def on_term_and_stay(signum, frame):
        mark(f"term-{rank}", repr(time.time()))

    if mode == "env":
        print(json.dumps({"env": dict(os.environ), "cwd": os.getcwd()}), flush=True)
        print(f"stderr of rank {rank}", file=sys.stderr, flush=True)
    elif mode == "exit":
        sys.exit(int(sys.argv[3]))
    elif mode in ("trap", "stubborn", "ignore"):
        handler = {"trap": on_term_then_exit, "stubborn": on_term_and_stay, "ignore": signal.SIG_IGN}[mode]
        signal.signal(signal.SIGTERM, handler)
        mark(f"ready-{rank}")
        while True:
            time.sleep(1)
    elif mode == "wait":
        mark(f"ready-{rank}")
        wait_for("release")
        sys.exit(int(sys.argv[3]))
    elif mode == "grandchild":
        if os.fork() == 0:  # stays in the job's process group
            mark("grandchild", str(os.getpid()))
            wait_for("release")
            os._exit(0)
        wait_for("grandchild")
    elif mode == "daemon":
        if os.fork() == 0:
            os.setsid()  # leaves the job's process group
            mark("daemon", str(os.getpid()))
            while True:
                time.sleep(1)
        wait_for("daemon")
    elif mode == "escape":  # a double fork into a session of its own, deaf to SIGTERM, as the main process is
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                mark("daemon", str(os.getpid()))
                while True:
                    time.sleep(1)
            os._exit(0)
        wait_for("daemon")
        mark(f"ready-{rank}")
        while True:
            time.sleep(1)
    elif mode == "forks":  # as many processes as it may, up to argv[3]
        made = 0
        for _ in range(int(sys.argv[3])):
            try:
                if os.fork() == 0:
                    time.sleep(60)
                    os._exit(0)
            except OSError:
                break
            made += 1
        mark("forks", str(made))
        while True:
            time.sleep(1)
    elif mode == "hog":  # argv[3] times 8 MiB, each written
        held = []
        for _ in range(int(sys.argv[3])):
            held.append(b"x" * (8 << 20))
            mark("hogged", str(len(held)))
    elif mode == "open":  # which of the paths in argv[3:] it may open: "ok" or the errno
        opened = {}
        for path in sys.argv[3:]:
            try:
                with open(path, "rb"):
                    opened[path] = "ok"
            except OSError as e:
                opened[path] = e.errno
        import resource
        opened["nofile"] = list(resource.getrlimit(resource.RLIMIT_NOFILE))
        mark("opened", json.dumps(opened))
""")


def wait_until(predicate: Callable[[], object], timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


class Harness:
    """Builds specs for PROGRAM, remembers every handle, collects exits across calls."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.program = root / "program.py"
        self.program.write_text(PROGRAM)
        self.workdir = root / "work"
        self.workdir.mkdir()
        self.executors: list[LocalExecutor] = []
        self.handles: list[Handle] = []
        self.seen: dict[tuple[str, int], Exit] = {}
        self.executor = self.new_executor()

    def new_executor(self, **kwargs: object) -> LocalExecutor:
        executor = LocalExecutor(**kwargs)  # type: ignore[arg-type]
        self.executors.append(executor)
        return executor

    def spec(
        self,
        job_id: str,
        mode: str,
        *args: str,
        replicas: int = 1,
        attempt: int = 1,
        grace_s: float = 5.0,
        gpus: list[tuple[int, ...]] | None = None,
        env: dict[str, str] | None = None,
    ) -> LaunchSpec:
        gpus = gpus or [()] * replicas
        return LaunchSpec(
            job_id=job_id,
            attempt=attempt,
            command=(sys.executable, str(self.program), mode, str(self.marks(job_id)), *args),
            replicas=tuple(ReplicaLaunch(rank=i, node="local", gpus=gpus[i], local_rank=i) for i in range(replicas)),
            grace_s=grace_s,
            workdir=self.workdir,
            log_dir=self.root / "logs" / job_id / str(attempt),
            checkpoint_dir=self.root / "ckpt" / job_id,
            env=env or {},
        )

    def marks(self, job_id: str) -> Path:
        path = self.root / "marks" / job_id
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o777)  # written by the job, which runs as a uid of its own under root
        return path

    def start(self, spec: LaunchSpec, executor: LocalExecutor | None = None) -> Handle:
        handle = (executor or self.executor).start(spec)
        self.handles.append(handle)
        return handle

    def wait_ready(self, job_id: str, replicas: int = 1) -> None:
        marks = self.marks(job_id)
        wait_until(lambda: all((marks / f"ready-{r}").exists() for r in range(replicas)), what=f"{job_id} to be ready")

    def wait_exit(
        self, job_id: str, attempt: int = 1, executor: LocalExecutor | None = None, timeout: float = 15.0
    ) -> Exit:
        executor = executor or self.executor

        def reported() -> bool:
            for exit_ in executor.exits():
                self.seen[(exit_.job_id, exit_.attempt)] = exit_
            return (job_id, attempt) in self.seen

        wait_until(reported, timeout, f"the exit of {job_id}/{attempt}")
        return self.seen.pop((job_id, attempt))

    def cleanup(self) -> None:
        for executor in self.executors:
            executor.close()
        for handle in self.handles:
            for replica in handle.replicas:
                if replica.pgid is not None and not replica.exit_path.exists():
                    try:
                        os.killpg(replica.pgid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        for daemon in self.root.glob("marks/*/daemon"):
            try:
                os.kill(int(daemon.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        for handle in self.handles:
            for replica in handle.replicas:
                wait_until(
                    lambda replica=replica: replica.exit_path.exists() or not process_alive(replica.shim_pid),
                    what="the shims to finish",
                )


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    try:
        yield harness
    finally:
        harness.cleanup()


def read_env_dump(path: Path) -> Any:
    return json.loads(path.read_text().splitlines()[0])


# -- environment and logs ----------------------------------------------------------------------


def test_gang_environment_gpus_and_logs_per_replica(h: Harness) -> None:
    base = {"PATH": os.environ["PATH"], "KEEP": "yes", "CUDA_VISIBLE_DEVICES": "5", "WARDEN_STALE": "1", "RANK": "9"}
    executor = h.new_executor(base_env=base)
    spec = h.spec(
        "gang",
        "env",
        replicas=2,
        gpus=[(0, 3), (1,)],
        grace_s=90,
        env={"FOO": "bar", "CUDA_VISIBLE_DEVICES": "7", "WARDEN_JOB_ID": "spoofed", "WARDEN_SERVER": "http://x"},
    )
    handle = h.start(spec, executor)
    exit_ = h.wait_exit("gang", executor=executor)
    assert exit_.exit_codes == (0, 0) and exit_.signalled_at is None and not exit_.killed

    dumps = [read_env_dump(path) for path in log_paths(handle)]
    envs = [dump["env"] for dump in dumps]
    assert [env["CUDA_VISIBLE_DEVICES"] for env in envs] == ["0,3", "1"]
    assert [env["RANK"] for env in envs] == ["0", "1"]
    assert [env["LOCAL_RANK"] for env in envs] == ["0", "1"]
    assert {env["WORLD_SIZE"] for env in envs} == {"2"}
    assert {env["MASTER_ADDR"] for env in envs} == {"127.0.0.1"}
    assert len({env["MASTER_PORT"] for env in envs}) == 1 and int(envs[0]["MASTER_PORT"]) > 0
    for rank, (dump, env, log) in enumerate(zip(dumps, envs, log_paths(handle))):
        assert env["WARDEN_JOB_ID"] == "gang" and env["WARDEN_ATTEMPT"] == "1"
        assert env["WARDEN_GRACE_SECONDS"] == "90"
        assert env["WARDEN_CHECKPOINT_DIR"] == str(spec.checkpoint_dir)
        assert env["WARDEN_LOG_FILE"] == str(log) and log.name == f"rank-{rank}.log"
        assert env["WARDEN_SERVER"] == "http://x" and env["FOO"] == "bar" and env["KEEP"] == "yes"
        assert "WARDEN_STALE" not in env
        assert dump["cwd"] == str(h.workdir)
        assert f"stderr of rank {rank}" in log.read_text()
    assert spec.checkpoint_dir.is_dir()


def test_single_replica_has_no_gang_variables_and_sees_no_gpu(h: Harness) -> None:
    executor = h.new_executor(
        base_env={"PATH": os.environ["PATH"], "RANK": "3", "MASTER_PORT": "1", "CUDA_VISIBLE_DEVICES": "0,1"}
    )
    handle = h.start(h.spec("solo", "env", grace_s=0.5, env={"WORLD_SIZE": "8"}), executor)
    assert h.wait_exit("solo", executor=executor).exit_codes == (0,)
    env = read_env_dump(log_paths(handle)[0])["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["WARDEN_GRACE_SECONDS"] == "0.5"
    assert not {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"} & set(env)


def test_bad_specs_are_refused(h: Harness) -> None:
    spec = h.spec("bad", "env")
    with pytest.raises(LaunchError, match="workdir"):
        h.executor.start(replace(spec, workdir=h.root / "missing"))
    with pytest.raises(ValueError, match="ranks"):
        h.executor.start(replace(spec, replicas=(ReplicaLaunch(1, "local", ()),)))
    with pytest.raises(ValueError, match="command"):
        h.executor.start(replace(spec, command=()))
    with pytest.raises(UnknownAttempt):
        h.executor.terminate("bad", 1, 1.0)


# -- exit codes ---------------------------------------------------------------------------------


def test_exit_codes_error_and_sigkill(h: Harness) -> None:
    h.start(h.spec("three", "exit", "3"))
    missing = h.spec("missing", "env")
    h.start(replace(missing, command=("/no/such/binary", "x")))
    h.start(h.spec("victim", "wait", "0"))
    h.wait_ready("victim")
    h.executor.kill("victim", 1)

    assert h.wait_exit("three").exit_codes == (3,)
    not_found = h.wait_exit("missing")
    assert not_found.exit_codes == (127,) and "no/such/binary" in (not_found.error or "")
    victim = h.wait_exit("victim")
    assert victim.exit_codes == (-9,) and victim.killed and victim.killed_at is not None
    assert victim.signalled_at is None and not victim.succeeded
    assert h.executor.running() == []


def test_start_twice_is_refused_and_running_lists_attempts(h: Harness) -> None:
    assert isinstance(h.executor, Executor)
    spec = h.spec("twice", "wait", "0")
    h.start(spec)
    with pytest.raises(ValueError, match="already running"):
        h.executor.start(spec)
    assert h.executor.running() == [("twice", 1)]
    (h.marks("twice") / "release").touch()
    assert h.wait_exit("twice").exit_codes == (0,)
    assert h.executor.running() == []


def test_a_failing_shim_is_a_launch_error(h: Harness, tmp_path: Path) -> None:
    broken = tmp_path / "broken-python"
    broken.write_text("#!/bin/sh\nexit 5\n")
    broken.chmod(0o755)
    executor = h.new_executor(python=str(broken))
    with pytest.raises(LaunchError, match="exit 5"):
        executor.start(h.spec("broken", "env"))
    hanging = tmp_path / "hanging-python"
    hanging.write_text("#!/bin/sh\nexec sleep 60\n")
    hanging.chmod(0o755)
    slow = h.new_executor(python=str(hanging), start_timeout_s=0.3)
    with pytest.raises(LaunchError, match="timed out"):
        slow.start(h.spec("hanging", "env"))
    assert executor.running() == [] and slow.running() == []


# -- SIGTERM, grace, SIGKILL --------------------------------------------------------------------


def test_terminate_sigterm_then_clean_exit(h: Harness) -> None:
    h.start(h.spec("polite", "trap"))
    h.wait_ready("polite")
    deadline = h.executor.terminate("polite", 1, 10.0)
    assert h.executor.terminate("polite", 1, 1.0) == deadline  # idempotent
    exit_ = h.wait_exit("polite")
    seen = float((h.marks("polite") / "term-0").read_text())
    assert exit_.exit_codes == (0,) and not exit_.killed and exit_.killed_at is None
    assert exit_.signalled_at is not None
    assert exit_.signalled_at - 0.05 <= seen <= exit_.ended_at < deadline
    assert deadline == pytest.approx(exit_.signalled_at + 10.0)


def test_sigterm_ignored_means_sigkill_at_the_deadline(h: Harness) -> None:
    h.start(h.spec("deaf", "ignore"))
    h.wait_ready("deaf")
    deadline = h.executor.terminate("deaf", 1, 0.5)
    exit_ = h.wait_exit("deaf")
    assert exit_.exit_codes == (-9,) and exit_.killed
    assert exit_.killed_at is not None and exit_.signalled_at is not None
    assert deadline <= exit_.killed_at < deadline + 1.0  # never early, barely late
    assert exit_.killed_at - exit_.signalled_at >= 0.5  # the whole grace (invariant 5)
    assert exit_.ended_at - deadline < 1.0


def test_gang_gets_sigterm_at_the_same_instant(h: Harness) -> None:
    h.start(h.spec("pair", "trap", replicas=2))
    h.wait_ready("pair", replicas=2)
    h.executor.terminate("pair", 1, 10.0)
    exit_ = h.wait_exit("pair")
    assert exit_.exit_codes == (0, 0) and not exit_.killed
    seen = [float((h.marks("pair") / f"term-{rank}").read_text()) for rank in (0, 1)]
    assert abs(seen[0] - seen[1]) < 0.1


def test_kill_lateness_and_sigterm_skew(h: Harness) -> None:
    """Measures what docs/executors.md records: per run a 2-replica gang that notes SIGTERM and
    keeps running is terminated with 0.5 s of grace; lateness is SIGKILL sent minus deadline,
    skew is the difference between the times the two ranks' SIGTERM handlers ran."""
    runs = int(os.environ.get("WARDEN_KILL_LATENESS_RUNS", "3"))
    late, gone, skew = [], [], []
    for run in range(runs):
        job = f"late{run}"
        h.start(h.spec(job, "stubborn", replicas=2))
        h.wait_ready(job, replicas=2)
        deadline = h.executor.terminate(job, 1, 0.5)
        exit_ = h.wait_exit(job)
        assert exit_.exit_codes == (-9, -9) and exit_.killed and exit_.killed_at is not None
        late.append(exit_.killed_at - deadline)
        gone.append(exit_.ended_at - deadline)
        marks = [h.marks(job) / f"term-{rank}" for rank in (0, 1)]
        if all(mark.exists() for mark in marks):  # a starved CPU may not run a handler in the grace
            seen = [float(mark.read_text()) for mark in marks]
            skew.append(abs(seen[0] - seen[1]))
    summary = (
        f"runs={runs} SIGKILL lateness median={statistics.median(late) * 1e3:.2f} ms "
        f"max={max(late) * 1e3:.2f} ms; last process gone after deadline "
        f"median={statistics.median(gone) * 1e3:.2f} ms max={max(gone) * 1e3:.2f} ms; "
        f"SIGTERM skew between ranks ({len(skew)} runs) median={statistics.median(skew or [0]) * 1e3:.2f} ms "
        f"max={max(skew or [0]) * 1e3:.2f} ms"
    )
    print(summary)
    assert min(late) >= 0 and max(late) < 1.0 and max(gone) < 1.0 and max(skew or [0]) < 0.1


# -- process groups -----------------------------------------------------------------------------


def test_attempt_lives_while_a_grandchild_in_its_group_lives(h: Harness) -> None:
    handle = h.start(h.spec("family", "grandchild"))
    marks = h.marks("family")
    leader = handle.replicas[0].pgid
    assert leader is not None
    wait_until(lambda: (marks / "grandchild").exists(), what="the grandchild")
    wait_until(lambda: not process_alive(leader), what="the main process to exit")
    grandchild = int((marks / "grandchild").read_text())
    assert process_alive(grandchild) and group_alive(leader)
    assert h.executor.exits() == []
    time.sleep(0.5)  # more than the shim's poll interval: it had every chance to finish early
    assert h.executor.exits() == [] and h.executor.running() == [("family", 1)]

    released = time.time()
    (marks / "release").touch()
    exit_ = h.wait_exit("family")
    assert exit_.exit_codes == (0,) and exit_.ended_at >= released
    assert not process_alive(grandchild)


def test_escaped_daemon_is_killed_when_the_group_ends(h: Harness) -> None:
    handle = h.start(h.spec("escape", "daemon"))
    exit_ = h.wait_exit("escape")
    daemon = int((h.marks("escape") / "daemon").read_text())
    assert exit_.exit_codes == (0,)
    assert not process_alive(daemon)
    assert json.loads(handle.replicas[0].exit_path.read_text())["escaped_killed"] >= 1


# -- restart and adoption -----------------------------------------------------------------------


def test_adopt_after_close_reports_the_exit_code(h: Harness) -> None:
    first = h.executor
    handle = h.start(h.spec("survivor", "wait", "5"))
    h.wait_ready("survivor")
    first.close()  # the server goes away; the job does not
    stored = Handle.from_dict(json.loads(json.dumps(handle.to_dict())))
    assert stored == handle

    second = h.new_executor()
    second.adopt(stored)
    assert second.running() == [("survivor", 1)] and second.exits() == []
    (h.marks("survivor") / "release").touch()
    exit_ = h.wait_exit("survivor", executor=second)
    assert exit_.exit_codes == (5,) and exit_.signalled_at is None and not exit_.killed


def test_adopt_rearms_a_pending_sigkill(h: Harness) -> None:
    h.start(h.spec("doomed", "ignore"))
    h.wait_ready("doomed")
    handle = h.executor.handle("doomed", 1)
    deadline = h.executor.terminate("doomed", 1, 1.0)
    h.executor.close()  # its timer dies with it

    second = h.new_executor()
    second.adopt(handle, kill_at=deadline)
    exit_ = h.wait_exit("doomed", executor=second)
    assert exit_.exit_codes == (-9,) and exit_.killed and exit_.signalled_at is not None
    assert exit_.killed_at is not None and deadline <= exit_.killed_at < deadline + 1.0


def test_adopt_an_attempt_that_ended_while_nobody_watched(h: Harness) -> None:
    handle = h.start(h.spec("gone", "exit", "3"))
    h.executor.close()
    wait_until(handle.replicas[0].exit_path.exists, what="the exit file")
    second = h.new_executor()
    second.adopt(handle)
    [exit_] = second.exits()
    assert exit_.exit_codes == (3,) and second.exits() == [] and second.running() == []


DRIVER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from warden.executors.base import LaunchSpec, ReplicaLaunch
    from warden.executors.local import LocalExecutor

    program, root, workdir = sys.argv[1], Path(sys.argv[2]), sys.argv[3]

    def spec(job_id, mode, *args):
        marks = root / "marks" / job_id
        marks.mkdir(parents=True, exist_ok=True)
        marks.chmod(0o777)
        return LaunchSpec(job_id, 1, (sys.executable, program, mode, str(marks), *args),
                          (ReplicaLaunch(0, "local", (0,)),), 30.0, Path(workdir),
                          root / "logs" / job_id, root / "ckpt" / job_id)

    def ready(job_id):
        while not (root / "marks" / job_id / "ready-0").exists():
            time.sleep(0.01)

    executor = LocalExecutor()
    waiting = executor.start(spec("waiting", "wait", "4"))
    stubborn = executor.start(spec("stubborn", "ignore"))
    ready("waiting"); ready("stubborn")
    deadline = executor.terminate("stubborn", 1, 2.0)
    print(json.dumps({"waiting": waiting.to_dict(), "stubborn": stubborn.to_dict(),
                      "deadline": deadline}), flush=True)
    time.sleep(600)
""")


def test_adopt_after_the_server_is_killed_with_sigkill(h: Harness) -> None:
    driver = h.root / "driver.py"
    driver.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    server = subprocess.Popen(
        [sys.executable, str(driver), str(h.program), str(h.root), str(h.workdir)],
        stdout=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        os.kill(server.pid, signal.SIGKILL)
        killed_server_at = time.time()
        server.wait(timeout=10)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    state = json.loads(line)
    waiting, stubborn = Handle.from_dict(state["waiting"]), Handle.from_dict(state["stubborn"])
    h.handles += [waiting, stubborn]
    deadline = state["deadline"]
    assert killed_server_at < deadline, "the server must die inside the grace period for this test"

    survivor = h.new_executor()
    survivor.adopt(waiting)
    survivor.adopt(stubborn)  # no kill_at: the terminate recorded by the dead server is re-armed
    assert sorted(survivor.running()) == [("stubborn", 1), ("waiting", 1)]
    stubborn_exit = h.wait_exit("stubborn", executor=survivor)
    assert stubborn_exit.exit_codes == (-9,) and stubborn_exit.killed
    assert stubborn_exit.signalled_at == pytest.approx(deadline - 2.0)
    assert stubborn_exit.killed_at is not None and deadline <= stubborn_exit.killed_at < deadline + 1.0

    (h.root / "marks" / "waiting" / "release").touch()
    assert h.wait_exit("waiting", executor=survivor).exit_codes == (4,)


def test_a_lost_supervisor_is_survived(h: Harness) -> None:
    handle = h.start(h.spec("orphan", "wait", "0"))
    h.wait_ready("orphan")
    os.kill(handle.replicas[0].shim_pid, signal.SIGKILL)
    wait_until(lambda: not process_alive(handle.replicas[0].shim_pid), what="the shim to die")
    assert h.executor.exits() == []  # the job itself still runs
    (h.marks("orphan") / "release").touch()
    exit_ = h.wait_exit("orphan", timeout=30)  # the orphan is reaped by init, whenever it does
    assert exit_.exit_codes == (None,) and "supervisor" in (exit_.error or "")


REAPER = textwrap.dedent("""
    import ctypes, os, sys, time
    from pathlib import Path
    from warden.executors.base import LaunchSpec, ReplicaLaunch
    from warden.executors.local import LocalExecutor

    # What a server running as PID 1 of a container sees: orphans are re-parented to it.
    assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    root = Path(sys.argv[1])
    executor = LocalExecutor()
    handle = executor.start(LaunchSpec("short", 1, (sys.executable, "-c", "pass"), (ReplicaLaunch(0, "local", ()),),
                                       1.0, root, root / "logs", root / "ckpt"))
    shim = handle.replicas[0].shim_pid
    deadline = time.monotonic() + 15
    reported = []
    while time.monotonic() < deadline and not (reported and not os.path.exists(f"/proc/{shim}")):
        reported += executor.exits()
        time.sleep(0.01)
    print("reaped" if not os.path.exists(f"/proc/{shim}") else "zombie", [e.exit_codes for e in reported])
""")


def test_shims_reparented_to_the_server_are_reaped(h: Harness) -> None:
    driver = h.root / "reaper.py"
    driver.write_text(REAPER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, str(driver), str(h.root)], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert result.stdout.strip() == "reaped [(0,)]", result.stderr


def test_a_fenced_executor_starts_signals_and_kills_nothing(h: Harness) -> None:
    """While `may_act` says no (the server lost the lead, or its lease ran out by its own
    clock) every action is refused with `Fenced` and nothing is signalled; reads go on."""
    leading = [True]
    h.executor.fence(lambda: leading[0])
    h.start(h.spec("1", "stubborn"))
    h.wait_ready("1")
    leading[0] = False
    with pytest.raises(Fenced, match="SIGTERM attempt 1 of job 1"):
        h.executor.terminate("1", 1, 0.5)
    with pytest.raises(Fenced, match="SIGKILL attempt 1 of job 1"):
        h.executor.kill("1", 1)
    with pytest.raises(Fenced, match="start attempt 1 of job 2"):
        h.executor.start(h.spec("2", "stubborn"))
    assert not (h.marks("1") / "term-0").exists()
    assert h.executor.running() == [("1", 1)] and h.executor.exits() == []
    assert not (h.root / "logs" / "2").exists()
    leading[0] = True
    h.executor.kill("1", 1)
    assert h.wait_exit("1").exit_codes == (-9,)


def test_a_sigkill_due_while_fenced_is_kept_by_the_supervisor(h: Harness) -> None:
    """A SIGKILL deadline that comes while the executor is fenced (its server lost the lead) is
    not the server's to keep: it was set while the server led, and the job's supervisor keeps
    it, `KEEPER_SLACK_S` after it, whoever leads."""
    leading = [True]
    h.executor.fence(lambda: leading[0])
    h.start(h.spec("1", "stubborn"))
    h.wait_ready("1")
    deadline = h.executor.terminate("1", 1, 0.3)
    wait_until(lambda: (h.marks("1") / "term-0").exists(), what="the SIGTERM")
    leading[0] = False
    ended = h.wait_exit("1", timeout=5)
    assert ended.killed and ended.exit_codes == (-9,)
    assert ended.killed_at is not None and deadline + KEEPER_SLACK_S <= ended.killed_at < deadline + 0.5


def test_with_no_server_the_supervisor_keeps_the_sigkill_deadline(h: Harness) -> None:
    """The server is gone (its executor closed: no timer) while a job that ignores SIGTERM is in
    its grace: the shim SIGKILLs the group at the deadline recorded in control.json, never
    before it, and the server that adopts the attempt later learns it was killed, and when."""
    handle = h.start(h.spec("deaf", "ignore", replicas=2))
    h.wait_ready("deaf", replicas=2)
    deadline = h.executor.terminate("deaf", 1, 0.5)
    h.executor.close()
    wait_until(lambda: all(r.exit_path.exists() for r in handle.replicas), what="the supervisors' exit records")
    records = [json.loads(r.exit_path.read_text()) for r in handle.replicas]
    assert [r["exit_code"] for r in records] == [-9, -9]
    for record in records:
        assert deadline + KEEPER_SLACK_S <= record["killed_at"] < deadline + 0.5
        assert record["ended_at"] >= record["killed_at"]
    adopter = h.new_executor()
    adopter.adopt(handle)
    ended = h.wait_exit("deaf", executor=adopter)
    assert ended.killed and ended.killed_at == min(r["killed_at"] for r in records)


def test_the_supervisor_rereads_a_changed_deadline_and_ignores_a_damaged_one(tmp_path: Path) -> None:
    control = tmp_path / "control.json"
    keeper = DeadlineKeeper(control)
    assert keeper.until_due(0) is None  # no file yet: no deadline
    control.write_text(json.dumps({"kill_at": "soon"}))
    assert keeper.until_due(0) is None
    control.write_text(json.dumps({"kill_at": time.time() + 60, "pad": 1}))
    left = keeper.until_due(0)
    assert left is not None and 59 < left <= 60 + KEEPER_SLACK_S
    os.utime(control, ns=(0, 0))  # unchanged content, changed stamp: read again, same answer
    again = keeper.until_due(0)
    assert again is not None and again <= left
    assert keeper.killed_at is None


# -- containment: cgroups, limits, ends as they happened --------------------------------------------


def cgroup_dirs(handle: Handle) -> list[Path]:
    status = json.loads(handle.replicas[0].status_path.read_text())
    return [Path(d) for d in status["cgroup"]["dirs"].values()]


@contained
def test_nothing_of_an_attempt_outlives_it_however_it_escapes(h: Harness) -> None:
    """A double fork into a session of its own, deaf to SIGTERM like its main process, stays in
    the replica's cgroup; SIGKILL at the deadline ends the whole cgroup, which is then removed."""
    handle = h.start(h.spec("escape", "escape"))
    h.wait_ready("escape")
    escaped, leader = int((h.marks("escape") / "daemon").read_text()), handle.replicas[0].pgid
    assert os.getsid(escaped) != leader
    dirs = cgroup_dirs(handle)
    assert dirs and all(str(escaped) in (d / "cgroup.procs").read_text().split() for d in dirs)
    h.executor.terminate("escape", 1, 0.3)
    exit_ = h.wait_exit("escape")
    assert exit_.killed and exit_.exit_codes == (-9,) and exit_.ended_by is None
    assert not process_alive(escaped)
    assert json.loads(handle.replicas[0].exit_path.read_text())["escaped_killed"] >= 1
    assert not any(d.exists() for d in dirs)


@contained
def test_a_fork_bomb_stays_inside_its_cgroup(h: Harness) -> None:
    executor = h.new_executor()
    handle = h.start(replace(h.spec("bomb", "forks", "200"), bounds=Bounds(max_processes=12)), executor)
    marks = h.marks("bomb")
    wait_until(lambda: (marks / "forks").exists(), what="the forks")
    assert 1 <= int((marks / "forks").read_text()) < 12  # the main process counts too
    executor.kill("bomb", 1)
    assert h.wait_exit("bomb", executor=executor).exit_codes == (-9,)
    assert not any(d.exists() for d in cgroup_dirs(handle))


@contained
def test_a_memory_hog_is_killed_inside_its_cgroup(h: Harness) -> None:
    if "memory" not in LAYOUT.controllers:  # type: ignore[union-attr]
        pytest.skip("no memory controller")
    h.start(replace(h.spec("hog", "hog", "40"), bounds=Bounds(memory_mib=48)))
    exit_ = h.wait_exit("hog")
    assert exit_.exit_codes == (-9,) and exit_.ended_by is None  # its own doing: a failure, never an eviction
    assert "OOM killer" in (exit_.error or "")
    assert int((h.marks("hog") / "hogged").read_text()) < 40


@contained
def test_a_replica_opens_only_the_gpu_device_nodes_it_was_given(h: Harness, tmp_path: Path) -> None:
    """Two fake GPU device nodes (aliases of /dev/full and /dev/zero, char devices 1:7 and 1:5):
    the replica given GPU 1 opens its node, not GPU 0's. Its open files limit is its own."""
    if "devices" not in LAYOUT.controllers:  # type: ignore[union-attr]
        pytest.skip("no devices controller")
    dev = tmp_path / "dev"
    dev.mkdir(mode=0o755)
    nodes = {0: ("c", 1, 7), 1: ("c", 1, 5)}
    for index, (_, major, minor) in nodes.items():
        os.mknod(dev / f"nvidia{index}", 0o666 | 0o020000, os.makedev(major, minor))
        (dev / f"nvidia{index}").chmod(0o666)
    assert cgroups.gpu_device_nodes(str(dev)) == nodes
    executor = h.new_executor(gpu_nodes=lambda: nodes)
    paths = [str(dev / "nvidia0"), str(dev / "nvidia1")]
    h.start(h.spec("gpus", "open", *paths, gpus=[(1,)]), executor)
    assert h.wait_exit("gpus", executor=executor).exit_codes == (0,)
    opened = json.loads((h.marks("gpus") / "opened").read_text())
    assert opened[paths[0]] == 1 and opened[paths[1]] == "ok"  # EPERM for the GPU it was not given
    # its own soft limit, not this process's; its hard one as high as the shim may set it
    assert opened["nofile"][0] == Bounds().open_files != resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert opened["nofile"][1] in (OPEN_FILES_HARD, resource.getrlimit(resource.RLIMIT_NOFILE)[1])


def test_cgroup_names_and_records_name_only_this_executor_s_cgroups(tmp_path: Path) -> None:
    name = cgroup_name("a/b", 2, 1, tmp_path)
    assert name.startswith("a_b-2-1-") and name == cgroup_name("a/b", 2, 1, tmp_path)
    assert cgroup_name(".x", 1, 0, tmp_path).startswith("_x-")
    assert name != cgroup_name("a/b", 2, 1, tmp_path / "other")
    layout = cgroups.Layout(1, (("pids", "/sys/fs/cgroup/pids"),))
    good = {"version": 1, "dirs": {"pids": f"/sys/fs/cgroup/pids/warden/x/{name}"}}
    assert cgroups.Group.from_record(good, layout, "warden/x") is not None
    for bad in (
        {"version": 1, "dirs": {"pids": "/sys/fs/cgroup/pids/warden/y/other"}},  # another server's
        {"version": 1, "dirs": {"pids": "/sys/fs/cgroup/pids/warden/x/../../system.slice"}},
        {"version": 1, "dirs": {"memory": f"/sys/fs/cgroup/memory/warden/x/{name}"}},
        {"version": 2, "dirs": {"": f"/sys/fs/cgroup/warden/x/{name}"}},
        "nonsense",
    ):
        assert cgroups.Group.from_record(bad, layout, "warden/x") is None, bad


def test_an_end_by_a_signal_warden_did_not_send_is_an_eviction(h: Harness) -> None:
    """SIGTERM from another process (of the job's account, say) ends the attempt: an eviction,
    with what happened; the same signal from warden, or a job's own failure, is none."""
    handle = h.start(h.spec("outside", "wait", "0"))
    h.wait_ready("outside")
    assert handle.replicas[0].pgid is not None
    os.killpg(handle.replicas[0].pgid, signal.SIGTERM)
    exit_ = h.wait_exit("outside")
    assert exit_.exit_codes == (-15,) and not exit_.killed and exit_.signalled_at is None
    assert exit_.ended_by == "rank 0 was killed by SIGTERM, which warden did not send"

    h.start(h.spec("inside", "wait", "0"))
    h.wait_ready("inside")
    h.executor.terminate("inside", 1, 5.0)
    exit_ = h.wait_exit("inside")
    assert exit_.exit_codes == (-15,) and exit_.ended_by is None


def test_a_stopped_job_is_seen_and_warden_s_sigterm_reaches_it(h: Harness) -> None:
    handle = h.start(h.spec("frozen", "wait", "0"))
    h.wait_ready("frozen")
    leader = handle.replicas[0].pgid
    assert leader is not None
    before = time.time()
    os.killpg(leader, signal.SIGSTOP)
    wait_until(lambda: ("frozen", 1) in h.executor.stopped(), what="the stop seen")
    seen = h.executor.stopped()[("frozen", 1)]
    assert before - 0.01 <= seen.since <= time.time() and seen.what == f"rank 0: pid {leader}"
    os.killpg(leader, signal.SIGCONT)
    wait_until(lambda: not h.executor.stopped(), what="the resumption seen")
    os.killpg(leader, signal.SIGSTOP)
    wait_until(lambda: h.executor.stopped(), what="the second stop seen")
    h.executor.terminate("frozen", 1, 10.0)  # SIGTERM and SIGCONT: it ends now, not at its SIGKILL
    exit_ = h.wait_exit("frozen", timeout=5)
    assert exit_.exit_codes == (-15,) and not exit_.killed


def test_with_no_server_the_supervisor_keeps_the_time_limit(h: Harness) -> None:
    """No server runs (its executor closed) when an attempt reaches its time limit: its shim
    sends SIGTERM (slack after it), SIGKILL after its grace; a server that adopts it meanwhile
    keeps that deadline, and its exit says the time limit ended it."""
    executor = h.new_executor(time_limit_slack_s=0.1)
    spec = replace(h.spec("late", "ignore", grace_s=1.0), time_limit_s=0.4)
    handle = h.start(spec, executor)
    h.wait_ready("late")
    started = json.loads(handle.replicas[0].status_path.read_text())["started_at"]
    executor.close()
    seen_path = handle.replicas[0].status_path.parent / "rank-0.seen.json"
    wait_until(lambda: seen_path.exists() and json.loads(seen_path.read_text())["limit_sigterm_at"], what="its SIGTERM")
    seen = json.loads(seen_path.read_text())
    assert seen["limit_sigterm_at"] - started >= 0.5
    assert seen["limit_kill_at"] == pytest.approx(seen["limit_sigterm_at"] + 1.0)
    adopter = h.new_executor()
    adopter.adopt(handle)
    assert adopter.terminate("late", 1, 30.0) == seen["limit_kill_at"]  # nothing more sent: its deadline kept
    exit_ = h.wait_exit("late", executor=adopter)
    assert exit_.exit_codes == (-9,) and exit_.killed and exit_.ended_by is None
    assert exit_.timed_out_at == seen["limit_sigterm_at"]
    assert exit_.killed_at is not None and exit_.killed_at >= seen["limit_kill_at"]


@contained
def test_an_adopter_ends_the_cgroup_of_a_lost_supervisor(h: Harness) -> None:
    """The shim is killed (an admin; a job cannot, it runs as another uid) and the server
    restarts: the adopter finds the replica's cgroup in the status file and, once the job's
    group is gone, kills what is left in it (the escaped process) before it records the exit."""
    handle = h.start(h.spec("lost", "escape"))
    h.wait_ready("lost")
    escaped = int((h.marks("lost") / "daemon").read_text())
    dirs = cgroup_dirs(handle)
    os.kill(handle.replicas[0].shim_pid, signal.SIGKILL)
    wait_until(lambda: not process_alive(handle.replicas[0].shim_pid), what="the shim to die")
    h.executor.close()
    adopter = h.new_executor()
    adopter.adopt(Handle.from_dict(handle.to_dict()))
    adopter.kill("lost", 1)
    exit_ = h.wait_exit("lost", executor=adopter)
    assert exit_.exit_codes == (None,) and "supervisor" in (exit_.error or "")
    assert not process_alive(escaped)
    assert not any(d.exists() for d in dirs)


DEVICE_PROBE = textwrap.dedent("""
    import json, os, sys
    with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    opened = {}
    for path in ("/dev/full", "/dev/zero"):
        try:
            open(path, "rb").close()
            opened[path] = "ok"
        except OSError as e:
            opened[path] = e.errno
    print(json.dumps(opened))
""")


def test_the_cgroup_v2_device_filter_refuses_exactly_its_nodes() -> None:
    """cgroup v2 has no devices files: an eBPF program attached to the cgroup refuses the nodes
    (here /dev/full, 1:7, in a cgroup of the unified hierarchy, which a "hybrid" machine
    mounts beside v1's)."""
    unified = cgroups.parse_mounts(Path("/proc/self/mounts").read_text())[1]
    if unified is None or os.geteuid() != 0:
        pytest.skip("no cgroup v2 hierarchy this test may write")
    directory = Path(unified) / f"warden-test-{os.getpid()}-{time.monotonic_ns()}"
    directory.mkdir()
    try:
        cgroups.attach_device_filter(str(directory), (("c", 1, 7),))
        done = subprocess.run(
            [sys.executable, "-c", DEVICE_PROBE, str(directory)], capture_output=True, text=True, timeout=30
        )
        assert json.loads(done.stdout) == {"/dev/full": 1, "/dev/zero": "ok"}, done.stderr
    finally:
        wait_until(lambda: not (directory / "cgroup.procs").read_text().split(), what="the probe gone")
        directory.rmdir()


def test_the_hierarchies_are_read_from_mounts_and_own_cgroups() -> None:
    mounts = (
        "cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0\n"
        "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n"
        "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0\n"
        "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n"
    )
    assert cgroups.parse_mounts(mounts) == (
        {"pids": "/sys/fs/cgroup/pids", "memory": "/sys/fs/cgroup/memory"},
        "/sys/fs/cgroup/unified",
    )
    own = "9:name=systemd:/\n8:pids:/\n4:memory:/system.slice/warden.service\n0::/system.slice/warden.service\n"
    assert cgroups.parse_own(own) == (
        {"pids": "/", "memory": "/system.slice/warden.service"},
        "/system.slice/warden.service",
    )
    program = cgroups.device_filter((("c", 195, 0), ("c", 195, 1)))
    assert len(program) == 8 * (4 + 2 * 5 + 2)  # the loads, five instructions a node, the final allow


def test_the_containment_is_said_in_one_line(h: Harness) -> None:
    off = h.new_executor(cgroup_parent=None)
    assert off.layout is None
    assert off.containment().startswith(
        "no cgroups (no cgroup parent was given): a job's processes, memory and GPU device nodes are not bounded"
    )
    if isinstance(LAYOUT, cgroups.Layout):
        assert h.executor.containment().startswith("each replica in a cgroup of its own, in warden/local/ under: ")


def test_a_late_terminate_keeps_the_sigterm_the_supervisor_sent_at_the_time_limit(h: Harness) -> None:
    """The server's pass that would stop an attempt at its time limit comes late (it stalled):
    its shim has sent SIGTERM already, and the server's `terminate` keeps that SIGTERM's
    deadline rather than give the job a second SIGTERM and a new grace."""
    executor = h.new_executor(time_limit_slack_s=0.1)
    handle = h.start(replace(h.spec("slow", "ignore", grace_s=1.0), time_limit_s=0.3), executor)
    seen_path = handle.replicas[0].status_path.parent / "rank-0.seen.json"
    wait_until(lambda: seen_path.exists() and json.loads(seen_path.read_text())["limit_sigterm_at"], what="its SIGTERM")
    seen = json.loads(seen_path.read_text())
    assert executor.terminate("slow", 1, 30.0) == seen["limit_kill_at"]
    exit_ = h.wait_exit("slow", executor=executor)
    assert exit_.killed and exit_.exit_codes == (-9,) and exit_.timed_out_at == seen["limit_sigterm_at"]
    assert exit_.ended_at < seen["limit_kill_at"] + 1.0
