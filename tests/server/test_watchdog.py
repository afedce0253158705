"""The leader's watchdog with real processes: a "server" (a small Python process holding a
`Watchdog`) arms it, renews, disarms or stops itself with SIGSTOP, and the watchdog kills it
exactly when its deadline plus the slack passed unrenewed, and never otherwise."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest

from warden.executors.shim import process_alive

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="CLOCK_BOOTTIME and /proc are Linux's")

SLACK_S = 0.2

SERVER = textwrap.dedent("""
    import os, signal, sys, time
    from warden.server.watchdog import Watchdog

    mode = sys.argv[1]
    now = lambda: time.clock_gettime(time.CLOCK_BOOTTIME)
    dog = Watchdog(slack_s=float(sys.argv[2]))
    print(dog.pid, flush=True)
    if mode == "stall":          # armed, then stopped as a whole
        dog.arm(now() + 0.5)
        print(repr(time.time()), flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    elif mode == "disarmed":     # stood down, then stopped
        dog.arm(now() + 0.3)
        dog.disarm()
        print(repr(time.time()), flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    elif mode == "renewing":     # renews for 1.5 s, then stops
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            dog.arm(now() + 0.3)
            time.sleep(0.1)
        print(repr(time.time()), flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    elif mode == "idle":         # never armed: waits to be killed by the test
        print(repr(time.time()), flush=True)
        time.sleep(60)
""")


@pytest.fixture
def servers() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def start(servers: list[subprocess.Popen[str]], mode: str) -> tuple[subprocess.Popen[str], int, float]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, mode, repr(SLACK_S)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    servers.append(proc)
    assert proc.stdout is not None
    dog = int(proc.stdout.readline())
    marked = float(proc.stdout.readline())
    return proc, dog, marked


def wait_stopped(proc: subprocess.Popen[str]) -> None:
    """Until the process stopped itself (state T in /proc)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{proc.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "T":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.005)
    raise AssertionError("the server never stopped itself")


def test_a_server_stopped_past_its_deadline_is_killed_on_time(servers: list[subprocess.Popen[str]]) -> None:
    proc, dog, armed_at = start(servers, "stall")
    code = proc.wait(10)
    killed_after = time.time() - armed_at
    assert code == -signal.SIGKILL
    assert 0.5 + SLACK_S - 0.05 <= killed_after < 0.5 + SLACK_S + 0.6, killed_after
    deadline = time.monotonic() + 5
    while process_alive(dog) and time.monotonic() < deadline:  # its work is done: it exits
        time.sleep(0.01)
    assert not process_alive(dog)


def test_a_server_that_stood_down_is_never_killed(servers: list[subprocess.Popen[str]]) -> None:
    proc, dog, _ = start(servers, "disarmed")
    wait_stopped(proc)
    time.sleep(0.3 + SLACK_S + 0.5)  # past the deadline it had before it disarmed
    assert proc.poll() is None and process_alive(dog)
    proc.send_signal(signal.SIGCONT)


def test_renewals_keep_a_server_alive_until_they_stop(servers: list[subprocess.Popen[str]]) -> None:
    proc, _, stopped_at = start(servers, "renewing")  # 1.5 s of renewals, each 0.3 s ahead
    code = proc.wait(10)
    assert code == -signal.SIGKILL
    assert time.time() - stopped_at < 0.3 + SLACK_S + 0.6


def test_the_watchdog_ends_with_its_server(servers: list[subprocess.Popen[str]]) -> None:
    proc, dog, _ = start(servers, "idle")
    assert process_alive(dog)
    with open(f"/proc/{dog}/stat") as f:  # a session of its own: a stop of the server's group misses it
        assert int(f.read().rsplit(")", 1)[1].split()[3]) == dog
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 5
    while process_alive(dog) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not process_alive(dog)
