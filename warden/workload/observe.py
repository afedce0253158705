"""What `check-workload` sees of a run from outside: its status, its output (timed as it
arrives) and the reports it sends, as warden's server would receive them."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class Reports:
    """A tiny HTTP endpoint that records what the workload reports, as warden's server would."""

    def __init__(self, token: str) -> None:
        self.items: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        reports = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = min(int(self.headers.get("Content-Length") or 0), 1 << 20)
                body = self.rfile.read(length)
                if self.headers.get("Authorization") != f"Bearer {token}":
                    self.send_response(401)
                    self.end_headers()
                    return
                try:
                    item = json.loads(body)
                except ValueError:
                    item = None
                if not isinstance(item, dict):
                    self.send_response(400)
                    self.end_headers()
                    return
                item["_received"] = time.time()
                with reports.lock:
                    reports.items.append(item)
                self.send_response(202)
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="warden-check-reports", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def of(self, attempt: int, kind: str, since: float = 0.0) -> list[dict[str, Any]]:
        with self.lock:
            return [
                r
                for r in self.items
                if r.get("attempt") == attempt and r.get("kind") == kind and r.get("_received", 0) >= since
            ]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Run:
    """One run of the command in its own session, its output (stdout and stderr) read from a
    pseudo-terminal, so that programs line-buffer it as they would for a person, and passed on
    to our stderr; each arrival is timed."""

    def __init__(self, command: Sequence[str], env: dict[str, str], workdir: Path | None) -> None:
        master, slave = pty.openpty()
        try:
            self.proc = subprocess.Popen(
                list(command),
                env=env,
                cwd=workdir,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=slave,
                stderr=slave,
            )
        except OSError:
            os.close(master)
            raise
        finally:
            os.close(slave)
        self.started = time.time()
        self.arrivals: list[float] = []
        self.tail = b""
        self._master = master
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="warden-check-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._master, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                break
            if not chunk:
                break
            with self._lock:
                self.arrivals.append(time.time())
                self.tail = (self.tail + chunk)[-2000:]
            try:
                sys.stderr.buffer.write(chunk.replace(b"\r\n", b"\n"))
                sys.stderr.buffer.flush()
            except (AttributeError, OSError, ValueError):
                pass
        os.close(self._master)

    def output_since(self, since: float) -> list[float]:
        """The moments (0.1 s apart or more) at which output arrived after `since`."""
        with self._lock:
            times = [t for t in self.arrivals if t >= since]
        moments: list[float] = []
        for t in times:
            if not moments or t - moments[-1] >= 0.1:
                moments.append(t)
        return moments

    def last_line(self) -> str:
        with self._lock:
            lines = [ln.strip() for ln in self.tail.decode(errors="replace").splitlines() if ln.strip()]
        return lines[-1][:120] if lines else ""

    def poll(self) -> int | None:
        return self.proc.poll()

    def signal(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def reap(self) -> None:
        """SIGKILL whatever is left of its process group and collect it."""
        self.signal(signal.SIGKILL)
        self.proc.wait()
        self._reader.join(timeout=5)

    def ended(self) -> str:
        code = self.proc.poll()
        last = self.last_line()
        return f"exited {status(code)}" + (f"; last output: {last!r}" if last else "; no output")


def status(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"by signal {-code}"
    return f"with status {code}"
