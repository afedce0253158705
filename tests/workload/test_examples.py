"""The examples, run as real processes in their own process groups with the environment warden's
executor gives a job (tmp checkpoint dir, WARDEN_* variables, WARDEN_URL pointing at a recording
HTTP server): each makes progress, gets SIGTERM the way the executor sends it (`killpg`), must
exit 0 within its grace with a checkpoint saved and the reports received, and a second attempt
must resume from exactly the saved step and end where an uninterrupted run ends."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from reportsink import TOKEN, ReportSink

from warden.workload import CheckpointStore, Reporter

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
GRACE = 15.0
_SCRUB = ("CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


class Proc:
    """A job process in its own process group (as the executor starts it) whose merged output
    is collected line by line by a thread, so the test can wait for a line instead of sleeping."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self.popen = subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self.lines.append("<EOF>")
            self._cond.notify_all()

    def wait_line(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        """The first output line matching `pattern` (waits for it; fails on exit or timeout)."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    if m := rx.search(line):
                        return m
                left = deadline - time.monotonic()
                if "<EOF>" in self.lines or left <= 0:
                    raise AssertionError(f"no line matches {pattern!r}; output:\n{self.output()}")
                self._cond.wait(left)

    def output(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def signal(self, signum: int) -> None:
        os.killpg(self.popen.pid, signum)

    def wait(self, timeout: float) -> int:
        """The exit status; fails with the output so far if the process outlives `timeout`."""
        try:
            rc = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout} s; output:\n{self.output()}") from None
        self._reader.join(10)
        return rc

    def kill(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(10)


@pytest.fixture
def sink() -> Iterator[ReportSink]:
    s = ReportSink()
    yield s
    s.close()


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for p in started:
        p.kill()


def job_env(sink: ReportSink | None, ckpt: Path, attempt: int, **extra: str) -> dict[str, str]:
    """The environment docs/executors.md describes, with the report variables of the SDK."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARDEN_") and k not in _SCRUB}
    env.update(
        {
            "WARDEN_JOB_ID": "j7",
            "WARDEN_ATTEMPT": str(attempt),
            "WARDEN_GRACE_SECONDS": str(GRACE),
            "WARDEN_CHECKPOINT_DIR": str(ckpt),
            "CUDA_VISIBLE_DEVICES": "",
            "PYTHONUNBUFFERED": "1",
        }
    )
    if sink is not None:
        env.update({"WARDEN_URL": sink.url, "WARDEN_REPORT_TOKEN": TOKEN})
    env.update(extra)
    return env


def start(procs: list[Proc], script: str, args: list[str], env: dict[str, str], cwd: Path) -> Proc:
    p = Proc([sys.executable, str(EXAMPLES / script), *args], env, cwd)
    procs.append(p)
    return p


def steps_printed(p: Proc, prefix: str = "") -> list[int]:
    return [int(m[1]) for m in re.finditer(rf"^{prefix}step (\d+) ", p.output(), re.MULTILINE)]


def assert_reports(sink: ReportSink, attempt: int, saved_step: int, size: int) -> None:
    """startup, progress, then the SIGTERM save: started and finished with on_sigterm."""
    assert all(r.authorization == f"Bearer {TOKEN}" for r in sink.reports)
    assert all(r.path == "/v1/jobs/j7/reports" for r in sink.reports)
    mine = [r.body for r in sink.reports if r.body["attempt"] == attempt]
    kinds = [b["kind"] for b in mine]
    assert kinds[0] == "startup" and "progress" in kinds, kinds
    assert kinds[-2:] == ["checkpoint_started", "checkpoint_finished"], kinds
    startup = mine[0]["startup_s"]
    assert 0 < startup < 60
    finished = mine[-1]
    assert finished["on_sigterm"] is True and finished["size_bytes"] == size
    assert finished["step"] == saved_step
    assert 0 < finished["duration_s"] < GRACE
    assert all(0 < b["step"] <= saved_step for b in mine if b["kind"] == "progress")


def preempt(p: Proc, sink: ReportSink, step_line: str) -> tuple[int, float]:
    """Waits for progress (a report and a step line), SIGTERMs the group, waits for exit 0.
    Returns (saved step, seconds from SIGTERM to exit)."""
    sink.wait_kind("progress")
    p.wait_line(step_line)
    sent = time.monotonic()
    p.signal(signal.SIGTERM)
    rc = p.wait(GRACE)
    took = time.monotonic() - sent
    assert rc == 0, p.output()
    assert took < GRACE
    saved = int(p.wait_line(r"SIGTERM: saved step (\d+)")[1])
    # Zero lost steps: the checkpoint holds the last step the job finished.
    assert steps_printed(p)[-1] == saved, p.output()
    return saved, took


# -- train_plain.py ------------------------------------------------------------------------------


def test_train_plain_preempted_saves_and_resumes_exactly(tmp_path: Path, sink: ReportSink, procs: list[Proc]) -> None:
    ckpt = tmp_path / "ckpt"
    args = ["--steps", "100000", "--step-seconds", "0.02", "--checkpoint-every", "0"]
    first = start(procs, "train_plain.py", args, job_env(sink, ckpt, 1), tmp_path)
    saved, _ = preempt(first, sink, r"^step [3-9]\d* ")

    store = CheckpointStore(ckpt, reporter=Reporter.from_env({}))
    latest = store.load_latest()
    assert latest is not None and latest[0] == saved and latest[1]["step"] == saved
    assert_reports(sink, 1, saved, store.checkpoints()[-1].path.stat().st_size)

    # Attempt 2: resumes at the saved step and ends where a never-interrupted run ends.
    total = str(saved + 5)
    args = ["--steps", total, "--step-seconds", "0"]
    second = start(procs, "train_plain.py", args, job_env(sink, ckpt, 2), tmp_path)
    assert second.wait(60) == 0, second.output()
    assert second.wait_line(r"^resumed from step (\d+)$")[1] == str(saved)
    assert steps_printed(second) == list(range(saved + 1, saved + 6))
    once = start(procs, "train_plain.py", args, job_env(None, tmp_path / "fresh", 1), tmp_path)
    assert once.wait(60) == 0
    final = r"^finished at step \d+ value .*$"
    assert second.wait_line(final)[0] == once.wait_line(final)[0]
    assert sink.of("startup")[-1]["attempt"] == 2


def test_train_plain_alone_without_warden(tmp_path: Path, procs: list[Proc]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARDEN_")}
    p = start(procs, "train_plain.py", ["--steps", "3", "--step-seconds", "0"], env, tmp_path)
    assert p.wait(60) == 0, p.output()
    assert (tmp_path / "checkpoints" / "ckpt-000000000003.json").exists()


# -- train_torch.py ------------------------------------------------------------------------------


def test_train_torch_preempted_saves_and_resumes_exactly(tmp_path: Path, sink: ReportSink, procs: list[Proc]) -> None:
    torch = pytest.importorskip("torch")
    ckpt = tmp_path / "ckpt"
    args = ["--steps", "100000", "--step-seconds", "0.01", "--checkpoint-every", "0"]
    first = start(procs, "train_torch.py", args, job_env(sink, ckpt, 1), tmp_path)
    saved, _ = preempt(first, sink, r"^step [3-9]\d* ")

    path = ckpt / f"ckpt-{saved:012d}.pt"
    state = torch.load(path, weights_only=True)  # a plain torch file
    assert state["step"] == saved and "model" in state and "optimizer" in state
    assert_reports(sink, 1, saved, path.stat().st_size)

    args = ["--steps", str(saved + 20), "--checkpoint-every", "0"]
    second = start(procs, "train_torch.py", args, job_env(sink, ckpt, 2), tmp_path)
    once = start(procs, "train_torch.py", args, job_env(None, tmp_path / "fresh", 1), tmp_path)
    assert second.wait(120) == 0, second.output()
    assert once.wait(120) == 0, once.output()
    assert second.wait_line(r"^resumed from step (\d+)$")[1] == str(saved)
    assert steps_printed(second) == list(range(saved + 1, saved + 21))
    final = r"^finished at step (\d+) digest (\w+)$"
    assert second.wait_line(final)[1] == str(saved + 20)
    # Bit-identical weights: model and optimizer state (momentum) were restored exactly.
    assert second.wait_line(final)[0] == once.wait_line(final)[0]


# -- gang_torchrun.py ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_gang(
    procs: list[Proc], args: list[str], sink: ReportSink | None, ckpt: Path, attempt: int, cwd: Path
) -> list[Proc]:
    port = str(free_port())
    return [
        start(
            procs,
            "gang_torchrun.py",
            args,
            job_env(
                sink,
                ckpt,
                attempt,
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                RANK=str(rank),
                WORLD_SIZE="2",
                LOCAL_RANK=str(rank),
            ),
            cwd,
        )
        for rank in (0, 1)
    ]


def test_gang_stops_at_one_step_and_resumes_from_rank_zero(tmp_path: Path, sink: ReportSink, procs: list[Proc]) -> None:
    pytest.importorskip("torch")
    ckpt = tmp_path / "ckpt"
    args = ["--steps", "100000", "--step-seconds", "0.01", "--checkpoint-every", "0"]
    gang = start_gang(procs, args, sink, ckpt, 1, tmp_path)
    sink.wait_kind("progress")
    for rank, p in enumerate(gang):
        p.wait_line(rf"^rank {rank} step [3-9]\d* ")
    for p in gang:  # the executor's way: every group in one loop, nothing in between
        p.signal(signal.SIGTERM)
    sent = time.monotonic()
    assert [p.wait(GRACE) for p in gang] == [0, 0], [p.output() for p in gang]
    assert time.monotonic() - sent < GRACE

    saved = int(gang[0].wait_line(r"^rank 0: SIGTERM: saved step (\d+)")[1])
    for rank, p in enumerate(gang):
        # Every rank stopped after the same step, the one rank 0 saved.
        assert p.wait_line(rf"^rank {rank}: stopping after step (\d+)$")[1] == str(saved)
        assert steps_printed(p, prefix=f"rank {rank} ")[-1] == saved
    assert "saved step" not in gang[1].output()  # rank 1 never writes
    assert sorted(os.listdir(ckpt)) == [f"ckpt-{saved:012d}.pt", f"ckpt-{saved:012d}.pt.meta"]
    assert_reports(sink, 1, saved, (ckpt / f"ckpt-{saved:012d}.pt").stat().st_size)
    # Only rank 0 reports: one startup for the attempt.
    assert [b["attempt"] for b in sink.of("startup")] == [1]

    args = ["--steps", str(saved + 10), "--checkpoint-every", "0"]
    resumed = start_gang(procs, args, sink, ckpt, 2, tmp_path)
    assert [p.wait(120) for p in resumed] == [0, 0], [p.output() for p in resumed]
    digests = set()
    for rank, p in enumerate(resumed):
        assert p.wait_line(rf"^rank {rank} resumed from step (\d+)$")[1] == str(saved)
        assert steps_printed(p, prefix=f"rank {rank} ")[0] == saved + 1
        m = p.wait_line(rf"^rank {rank} finished at step (\d+) digest (\w+)$")
        assert m[1] == str(saved + 10)
        digests.add(m[2])
    assert len(digests) == 1  # both ranks hold the same weights


# -- ignore_sigterm.py ---------------------------------------------------------------------------


def test_ignore_sigterm_keeps_running_until_sigkill(tmp_path: Path, sink: ReportSink, procs: list[Proc]) -> None:
    p = start(procs, "ignore_sigterm.py", ["--step-seconds", "0.02"], job_env(sink, tmp_path / "ckpt", 1), tmp_path)
    sink.wait_kind("progress")
    p.wait_line(r"^step 2$")
    p.signal(signal.SIGTERM)
    p.wait_line(r"ignoring it")
    steps_then = len(steps_printed_plain(p))
    # Still alive and still stepping after SIGTERM.
    p.wait_line(rf"^step {steps_then + 2}$", timeout=30)
    assert p.popen.poll() is None
    p.signal(signal.SIGKILL)
    assert p.wait(10) == -signal.SIGKILL
    kinds = sink.kinds()
    assert kinds[0] == "startup" and "checkpoint_finished" not in kinds


def steps_printed_plain(p: Proc) -> list[str]:
    return re.findall(r"^step \d+$", p.output(), re.MULTILINE)
