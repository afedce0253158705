"""A stand-in for a warden server, for clients' tests: a real HTTP server in a thread that
answers every request with the status and JSON body it is set to, and records each request's
method and path."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class FakeApi:
    def __init__(self, status: int = 200, body: Any = None) -> None:
        self.status = status
        self.body: Any = {} if body is None else body
        self.requests: list[tuple[str, str]] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                fake.requests.append((self.command, self.path))
                payload = json.dumps(fake.body).encode()
                self.send_response(fake.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def fake_apis(*answers: tuple[int, Any]) -> Iterator[list[FakeApi]]:
    """One `FakeApi` per (status, body), closed afterwards."""
    made = [FakeApi(status, body) for status, body in answers]
    try:
        yield made
    finally:
        for fake in made:
            fake.close()
