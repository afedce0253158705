"""A real HTTP endpoint that records what the workload SDK reports (`ReportSink`), and the
warden environment that points a reporter at it; shared by the SDK's tests."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

TOKEN = "report-token-123"


@dataclass
class Received:
    path: str
    authorization: str | None
    body: dict[str, Any]
    at: float


class ReportSink:
    """A real HTTP server in a thread that records every POST. `status` and `delay` set how it
    answers (to play a failing or slow control plane)."""

    def __init__(self) -> None:
        self.reports: list[Received] = []
        self.status = 200
        self.delay = 0.0
        self._cond = threading.Condition()
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if sink.delay:
                    time.sleep(sink.delay)
                with sink._cond:
                    sink.reports.append(Received(self.path, self.headers.get("Authorization"), body, time.time()))
                    sink._cond.notify_all()
                self.send_response(sink.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def kinds(self) -> list[str]:
        with self._cond:
            return [str(r.body.get("kind")) for r in self.reports]

    def of(self, kind: str) -> list[dict[str, Any]]:
        with self._cond:
            return [r.body for r in self.reports if r.body.get("kind") == kind]

    def wait_for(self, predicate: Callable[[list[Received]], bool], timeout: float = 30.0) -> list[Received]:
        """Blocks until `predicate(reports)` holds; fails the test after `timeout`."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self.reports):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"reports never matched; got {self.reports}")
                self._cond.wait(left)
            return list(self.reports)

    def wait_kind(self, kind: str, timeout: float = 30.0) -> dict[str, Any]:
        self.wait_for(lambda rs: any(r.body.get("kind") == kind for r in rs), timeout)
        return self.of(kind)[0]


@pytest.fixture
def sink() -> Iterator[ReportSink]:
    s = ReportSink()
    yield s
    s.close()


def env_for(sink: ReportSink, job: str = "j42", attempt: int = 3) -> dict[str, str]:
    return {"WARDEN_URL": sink.url, "WARDEN_JOB_ID": job, "WARDEN_ATTEMPT": str(attempt), "WARDEN_REPORT_TOKEN": TOKEN}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- disabled ------------------------------------------------------------------------------------
