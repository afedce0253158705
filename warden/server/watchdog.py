"""The leader's watchdog: a small process of its own that kills the server when the server's
lease ran out, by the server's own clock, while the server still led (docs/control-plane.md,
"What a stalled leader can and cannot do").

A leader checks its lease before it acts, but no check is one step with the act it guards: a
process stopped between the two (SIGSTOP, a VM pause, a swap storm, a long collection) acts
when it resumes, perhaps after another server took the lease over. The watchdog closes that
gap from outside the process. The lease tells it each deadline (`arm`: when the lease's local
validity ends, `Lease.may_act`) and when the server stops leading (`disarm`). Should the
deadline pass, `SLACK_S` later, without a renewal or a step-down, the server is stopped as a
whole (its own steward thread would have stepped it down otherwise), and the watchdog sends it
SIGKILL, which ends even a stopped process. That is before any other server may take the lease
over (`LEASE_S` after the last renewal was sent, by the database's clock): a leader is either
within its lease or dead, never acting on what it decided in a term that ended.

The watchdog runs in a session of its own (a stop of the server's process group, Ctrl-Z in a
terminal, does not stop it too), compares deadlines on CLOCK_BOOTTIME like the lease, kills
only the process it was started for (pid and start time), and exits when the server closes
its pipe or dies. This module is also the watchdog's program (`python -m
warden.server.watchdog PID TICKS SLACK`): it imports only the standard library at its top.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

log = logging.getLogger("warden.server")

SLACK_S = 0.25
"""How long after the lease's local validity ends the watchdog kills a server that did not
step down. Below the lease's margin (`MARGIN_S`, 0.5 s), so the kill lands before the lease
can run out in the database; above the steward's poll (`LAPSE_POLL_S`), so a server whose
process runs steps down by itself first."""
POLL_S = 0.05
"""How often the watchdog reads the clock while armed (a suspend stops every timer)."""
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def _boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _start_ticks(pid: int) -> str:
    """The process's start time in clock ticks since boot ('' when unknown)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return ""
    fields = text[text.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else ""


class Watchdog:
    """The server's side: starts the watchdog process for this process, and tells it each
    deadline (`arm`, by CLOCK_BOOTTIME) and each step-down (`disarm`). Thread-safe. A
    watchdog that died is started again at the next message (and told the deadline)."""

    def __init__(self, slack_s: float = SLACK_S, python: str = sys.executable) -> None:
        if not slack_s > 0:
            raise ValueError(f"slack_s: {slack_s!r} must be above 0")
        self.slack_s = slack_s
        self._python = python
        self._lock = threading.Lock()
        self._until: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._closed = False
        with self._lock:
            self._spawn()

    @property
    def pid(self) -> int | None:
        """The watchdog process's pid (None once closed)."""
        proc = self._proc
        return None if proc is None else proc.pid

    def _spawn(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("WARDEN_", "PGPASSWORD"))}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        me = os.getpid()
        self._proc = subprocess.Popen(
            [self._python, "-m", "warden.server.watchdog", str(me), _start_ticks(me), repr(self.slack_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            cwd="/",
            env=env,
            start_new_session=True,
            close_fds=True,
        )

    def arm(self, until: float) -> None:
        """Kill this process unless `disarm` or a later `arm` comes before `until` + slack."""
        with self._lock:
            self._until = until
            self._send(f"A {until!r}\n")

    def disarm(self) -> None:
        """This process does not lead (any more): nothing to kill it for."""
        with self._lock:
            self._until = None
            self._send("D\n")

    def _send(self, line: str) -> None:
        if self._closed:
            return
        for _ in range(2):
            proc = self._proc
            if proc is not None and proc.stdin is not None and proc.poll() is None:
                try:
                    os.write(proc.stdin.fileno(), line.encode())
                    return
                except (BrokenPipeError, OSError):
                    pass
            log.error("the leader's watchdog (pid %s) is gone; starting it again", None if proc is None else proc.pid)
            self._spawn()
            if self._until is not None and not line.startswith("A"):
                line = f"A {self._until!r}\n{line}"

    def close(self) -> None:
        """Disarm and end the watchdog (the server stops)."""
        with self._lock:
            self._closed = True
            proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                os.write(proc.stdin.fileno(), b"D\n")
                proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the watchdog process ---------------------------------------------------------------------


def watch(pid: int, ticks: str, slack_s: float, fd: int = 0) -> str:
    """Until `fd` closes: kill `pid` (if it is still the process that started at `ticks`) once
    the last armed deadline plus `slack_s` has passed by CLOCK_BOOTTIME. Returns what ended
    the watch."""
    deadline: float | None = None
    pending = b""
    while True:
        if deadline is None:
            timeout = None
        else:
            left = deadline + slack_s - _boottime()
            if left <= 0:
                if ticks and _start_ticks(pid) != ticks:
                    return f"the server (pid {pid}) is gone"
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    return f"the server (pid {pid}) is gone"
                return (
                    f"killed the server (pid {pid}): its lease ran out {slack_s:g}s ago by its clock and it "
                    "neither renewed it nor stood down (it was stopped or stalled), so it may not act again"
                )
            timeout = min(left, POLL_S)
        readable, _, _ = select.select([fd], [], [], timeout)
        if not readable:
            continue
        data = os.read(fd, 4096)
        if not data:
            return "the server closed the watch"
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            word, _, value = line.decode("ascii", "replace").partition(" ")
            if word == "A":
                deadline = float(value)
            elif word == "D":
                deadline = None


def main(argv: list[str]) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # it ends with the server's pipe, not with a signal
    ended = watch(int(argv[1]), argv[2], float(argv[3]))
    if ended.startswith("killed"):
        print(f"warden watchdog: {ended}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
