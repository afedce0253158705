"""Per-user bounds on the endpoints whose work grows with the whole system rather than the
request: `POST /v1/policy/diff` (two scheduling plans over every job) and
`GET /v1/history/export` (every job that ran in the window). One user may have at most
`PER_USER` of each in progress at once; one more is refused with 429 and `Retry-After`, at once,
instead of queueing behind the first. The count lives in the server process (one process
serves the API), so a restart forgets it, which loses nothing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from warden.server.errors import ApiError

__all__ = ["PER_USER", "PerUserLimit"]

PER_USER = 1
"""Requests of one kind one user may have in progress at once."""


class PerUserLimit:
    """At most `limit` requests of one kind (`what`, as the refusal names it) per user."""

    def __init__(self, what: str, limit: int = PER_USER) -> None:
        self.what = what
        self.limit = limit
        self._lock = threading.Lock()
        self._running: dict[str, int] = {}

    @contextmanager
    def hold(self, user: str) -> Iterator[None]:
        """One slot of `user` for the body of the `with`; 429 when none is free."""
        with self._lock:
            running = self._running.get(user, 0)
            if running >= self.limit:
                raise ApiError(
                    429,
                    "user",
                    user,
                    f"already has {running} {self.what} in progress; at most {self.limit} at once per user",
                    headers={"Retry-After": "1"},
                )
            self._running[user] = running + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._running[user] - 1
                if left:
                    self._running[user] = left
                else:
                    del self._running[user]
