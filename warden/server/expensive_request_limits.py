"""Bounds on the endpoints whose work grows with the whole system rather than the request:
`POST /v1/policy/diff` (two scheduling plans over every job), `GET /v1/history/export` (every
job that ran in the window) and dry runs (a plan over the live snapshot).

- One user may have at most `PER_USER` of each kind in progress at once (`PerUserLimit`);
  one more is refused with 429 and `Retry-After`.
- The server works on at most `limits.expensive_requests_at_once` of them, every user and
  kind together (`ServerBudget`); one more is refused with 503 and `Retry-After`. Their work
  is CPU-bound Python: in the server's threads (exports, dry runs) it holds the interpreter's
  lock, and in worker processes (diffs, `warden.server.offload`) it takes a core and memory
  each; so many users each within their own limit cannot stall the server.

Refusals come at once, instead of queueing behind the work. The counts live in the server
process (one process serves the API), so a restart forgets them, which loses nothing."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from warden.server.errors import ApiError

__all__ = ["PER_USER", "RETRY_AFTER_S", "PerUserLimit", "ServerBudget"]

PER_USER = 1
"""Requests of one kind one user may have in progress at once."""
RETRY_AFTER_S = 2
"""The `Retry-After` of a refusal by the server's budget: such work takes seconds."""


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


class ServerBudget:
    """At most `limit()` expensive requests in progress at once, every user and kind together
    (`limit` is read at each request: the policy in force may change it)."""

    def __init__(self, limit: Callable[[], int], setting: str = "limits.expensive_requests_at_once") -> None:
        self.limit = limit
        self.setting = setting
        self._lock = threading.Lock()
        self._running: dict[str, int] = {}

    @contextmanager
    def hold(self, what: str) -> Iterator[None]:
        """One slot for `what` (a kind, as the refusal names it) for the body of the `with`;
        503 when none is free."""
        limit = self.limit()
        with self._lock:
            running = sum(self._running.values())
            if running >= limit:
                doing = ", ".join(f"{n} {kind}" for kind, n in sorted(self._running.items()))
                raise ApiError(
                    503,
                    "server",
                    None,
                    f"is busy with {doing}; it works on at most {limit} policy diffs, history exports and dry "
                    f"runs at once, every user together ({self.setting}): retry in {RETRY_AFTER_S} s",
                    headers={"Retry-After": str(RETRY_AFTER_S)},
                )
            self._running[what] = self._running.get(what, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._running[what] - 1
                if left:
                    self._running[what] = left
                else:
                    del self._running[what]
