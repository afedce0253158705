"""`PreemptionGuard`: SIGTERM raises a flag (with its time and deadline) instead of killing;
cheap to poll, visible from any thread, installable only where Python runs handlers."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from reportsink import ReportSink, env_for

from warden.workload import PreemptionGuard, Reporter, active_guard, install

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def restore_sigterm() -> Iterator[None]:
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def sigterm_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    # The handler runs in the main thread at the next bytecode boundary; give it one.
    for _ in range(100):
        time.sleep(0)


def test_sigterm_raises_the_flag_and_sets_the_deadline(restore_sigterm: None) -> None:
    with PreemptionGuard(env={"WARDEN_GRACE_SECONDS": "30"}) as guard:
        assert not guard.should_stop()
        assert guard.signalled_at is None and guard.deadline is None
        assert guard.remaining() == math.inf
        before = time.time()
        sigterm_self()
        assert guard.should_stop()
        assert guard.signum == signal.SIGTERM
        assert guard.signalled_at is not None and before <= guard.signalled_at <= time.time()
        assert guard.deadline == pytest.approx(guard.signalled_at + 30.0)
        assert 29.0 < guard.remaining() <= 30.0
        first = guard.signalled_at
        sigterm_self()  # a second SIGTERM keeps the first time (the deadline counts from it)
        assert guard.signalled_at == first


def test_without_a_grace_there_is_no_deadline(restore_sigterm: None) -> None:
    with PreemptionGuard(env={}) as guard:
        sigterm_self()
        assert guard.should_stop() and guard.deadline is None
        assert guard.remaining() == math.inf


def test_remaining_reaches_zero_not_below(restore_sigterm: None) -> None:
    with PreemptionGuard(grace_s=0.05, env={"WARDEN_GRACE_SECONDS": "999"}) as guard:
        sigterm_self()
        assert guard.grace_s == 0.05
        time.sleep(0.1)
        assert guard.remaining() == 0.0


def test_the_previous_handler_is_chained_and_restored(restore_sigterm: None) -> None:
    calls: list[int] = []

    def previous(signum: int, frame: object) -> None:
        calls.append(signum)

    signal.signal(signal.SIGTERM, previous)
    guard = install(env={})
    assert active_guard() is guard
    sigterm_self()
    assert guard.should_stop() and calls == [signal.SIGTERM]
    guard.uninstall()
    assert signal.getsignal(signal.SIGTERM) is previous
    assert active_guard() is None

    with PreemptionGuard(chain=False, env={}) as quiet:
        sigterm_self()
        assert quiet.should_stop() and calls == [signal.SIGTERM]


def test_install_outside_the_main_thread_is_a_clear_error() -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            PreemptionGuard(env={}).install()
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert len(errors) == 1 and isinstance(errors[0], RuntimeError)
    assert "main thread" in str(errors[0])


def test_other_threads_see_the_flag_and_can_wait_for_it(restore_sigterm: None) -> None:
    with PreemptionGuard(env={}) as guard:
        assert guard.wait(0.01) is False
        woke: list[float] = []
        polled: list[int] = []

        def waiter() -> None:
            if guard.wait(10):
                woke.append(time.monotonic())

        def poller() -> None:
            n = 0
            while not guard.should_stop():
                n += 1
                time.sleep(0.001)
            polled.append(n)

        threads = [threading.Thread(target=waiter) for _ in range(3)]
        threads.append(threading.Thread(target=poller))
        for t in threads:
            t.start()
        time.sleep(0.05)
        sent = time.monotonic()
        sigterm_self()
        for t in threads:
            t.join(5)
        assert len(woke) == 3 and all(w - sent < 1.0 for w in woke)
        assert len(polled) == 1
        assert guard.wait() is True  # after the stop it never blocks


def test_request_stop_without_a_signal(restore_sigterm: None) -> None:
    with PreemptionGuard(env={"WARDEN_GRACE_SECONDS": "5"}) as guard:
        guard.request_stop()
        guard.request_stop()
        assert guard.should_stop() and guard.wait(0) and guard.deadline is None


@pytest.mark.parametrize(
    ("env", "rank", "writer"),
    [
        ({}, 0, True),
        ({"RANK": "0", "WORLD_SIZE": "2"}, 0, True),
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, 1, False),
    ],
)
def test_only_rank_zero_is_the_writer(env: dict[str, str], rank: int, writer: bool) -> None:
    guard = PreemptionGuard(env=env)
    assert (guard.rank, guard.is_writer) == (rank, writer)
    assert guard.world_size == int(env.get("WORLD_SIZE", 1))


def test_should_stop_without_a_process_group_is_local(restore_sigterm: None) -> None:
    with PreemptionGuard(env={"WORLD_SIZE": "2", "RANK": "1"}) as guard:
        assert guard.should_stop_all() is False
        sigterm_self()
        assert guard.should_stop_all() is True


AGREE = """\
import datetime, sys
import torch.distributed as dist
from warden.workload import install
guard = install()
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
reduce = dist.all_reduce
def late_sigterm(*args, **kwargs):
    # A stop request landing on rank 0 just after the collective returned, before its result is read.
    work = reduce(*args, **kwargs)
    if dist.get_rank() == 0 and not guard.should_stop():
        guard.request_stop()
    return work
dist.all_reduce = late_sigterm
print(dist.get_rank(), guard.should_stop_all(), guard.should_stop_all(), flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def test_should_stop_all_returns_what_the_ranks_agreed(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    ranks = []
    for rank in (0, 1):
        env = {k: v for k, v in os.environ.items() if not k.startswith("WARDEN_")}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE="2", PYTHONPATH=str(REPO))
        ranks.append(
            subprocess.Popen([sys.executable, "-c", AGREE], env=env, cwd=tmp_path, stdout=subprocess.PIPE, text=True)
        )
    outputs = sorted(p.communicate(timeout=120)[0].strip() for p in ranks)
    # The first call agreed on "go on" on both ranks; rank 0's late request is agreed on at the next.
    assert outputs == ["0 False True", "1 False True"]
    assert [p.returncode for p in ranks] == [0, 0]


# -- in a real process ---------------------------------------------------------------------------

LOOP = """\
import sys, time
from warden.workload import default_reporter, install
guard = install()
reporter = default_reporter()
step = 0
while True:
    time.sleep(0.2)            # a step; SIGTERM arrives in the middle of it
    step += 1
    reporter.progress(step)
    print(f"finished step {step}", flush=True)
    if guard.should_stop():
        print(f"stopping after step {step}, {guard.remaining():.1f}s left", flush=True)
        guard.exit()
"""


def test_a_loop_finishes_its_step_flushes_and_exits_zero(tmp_path: Path) -> None:
    sink = ReportSink()
    try:
        script = tmp_path / "loop.py"
        script.write_text(textwrap.dedent(LOOP))
        env = {**os.environ, **env_for(sink), "WARDEN_GRACE_SECONDS": "20", "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("finished step 1")
        sink.wait_kind("progress")
        proc.send_signal(signal.SIGTERM)  # may land before step 1's check: then step 1 is the last
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0, out
        lines = [first.rstrip("\n"), *out.splitlines()]
        assert lines[-1].startswith("stopping after step") and "s left" in lines[-1]
        assert lines[-2] == f"finished step {lines[-1].split()[3].rstrip(',')}"
        assert float(lines[-1].split()[4].rstrip("s")) > 15.0
    finally:
        sink.close()


def test_exit_flushes_pending_reports(tmp_path: Path) -> None:
    sink = ReportSink()
    sink.delay = 0.5  # slower than the process needs to reach exit()
    try:
        code = (
            "from warden.workload import install, default_reporter\n"
            "g = install(); default_reporter().progress(7); g.exit(0)\n"
        )
        env = {**os.environ, **env_for(sink), "PYTHONPATH": str(REPO)}
        proc = subprocess.run([sys.executable, "-c", code], env=env, timeout=20)
        assert proc.returncode == 0
        assert [b["step"] for b in sink.of("progress")] == [7]
    finally:
        sink.close()


def test_exit_with_an_explicit_reporter_and_code(restore_sigterm: None) -> None:
    guard = PreemptionGuard(env={}, reporter=Reporter.from_env({}))
    with pytest.raises(SystemExit) as exited:
        guard.exit(3)
    assert exited.value.code == 3


SAVES_AND_EXITS = """\
import pathlib, sys, time
from warden.workload import install
guard = install()
out = pathlib.Path(sys.argv[1])
(out / "up").write_text("")
while not guard.should_stop():
    time.sleep(0.01)
(out / "saved").write_text("")
guard.exit()
"""


@pytest.mark.parametrize(
    ("records", "code"),
    [
        (None, 0),  # outside warden: exit 0 as asked
        ({}, -signal.SIGTERM),  # under warden, no stop of warden's marked: it ends by the SIGTERM it got
        ({"control": {"terminating_at": 1.0, "signalled_at": None}}, 0),  # warden's SIGTERM
        ({"seen": {"stopped_since": None, "limit_sigterm_at": 1.0}}, 0),  # its supervisor's, at the time limit
        ({"control": {"signalled_at": "soon"}, "seen": {"limit_sigterm_at": None}}, -signal.SIGTERM),
        ({"linked": {"terminating_at": 1.0}}, -signal.SIGTERM),  # a link a job planted is never followed
    ],
)
def test_exit_zero_after_a_sigterm_warden_did_not_mark_ends_by_that_signal_once_saved(
    tmp_path: Path, records: dict[str, dict[str, object]] | None, code: int
) -> None:
    control, seen = tmp_path / "control.json", tmp_path / "rank-0.seen.json"
    env = {k: v for k, v in os.environ.items() if k != "WARDEN_STOP_RECORDS"} | {"PYTHONPATH": str(REPO)}
    if records is not None:
        env["WARDEN_STOP_RECORDS"] = f"{control}{os.pathsep}{seen}"
        for name, path in (("control", control), ("seen", seen)):
            if name in records:
                path.write_text(json.dumps(records[name]))
        if "linked" in records:
            (tmp_path / "elsewhere.json").write_text(json.dumps(records["linked"]))
            control.symlink_to(tmp_path / "elsewhere.json")
    script = tmp_path / "job.py"
    script.write_text(SAVES_AND_EXITS)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env)
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "up").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the job never came up"
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == code
        assert (tmp_path / "saved").exists()  # it saved first either way
    finally:
        proc.kill()
        proc.wait()
