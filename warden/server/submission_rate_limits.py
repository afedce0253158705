"""How fast each user may submit: a token bucket per user, in the server's memory.

A user's bucket holds up to `burst` tokens and refills at `rate` per second; each submission
takes one, and a submission that finds the bucket empty is refused (429) with the time until
the next token. The buckets live in the server process only: a restarted server starts every
user with a full bucket. Every method is thread-safe (the API serves requests on many threads).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

MAX_USERS = 10_000
"""Buckets kept before the full ones (users idle long enough to refill) are dropped."""


class SubmissionRate:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}
        """user → (tokens, when counted)."""

    def take(self, user: str, rate: float, burst: int) -> float | None:
        """Take one token of `user`'s bucket: None when there was one, else the seconds until
        there is (and nothing is taken)."""
        with self._lock:
            now = self._clock()
            tokens, at = self._buckets.get(user, (float(burst), now))
            tokens = min(float(burst), tokens + max(0.0, now - at) * rate)
            if tokens < 1.0:
                self._buckets[user] = (tokens, now)
                return (1.0 - tokens) / rate
            if user not in self._buckets and len(self._buckets) >= MAX_USERS:
                self._forget_full(rate, burst, now)
            self._buckets[user] = (tokens - 1.0, now)
            return None

    def give_back(self, user: str, burst: int) -> None:
        """Return a token taken for a submission that created nothing after all."""
        with self._lock:
            if user in self._buckets:
                tokens, at = self._buckets[user]
                self._buckets[user] = (min(float(burst), tokens + 1.0), at)

    def _forget_full(self, rate: float, burst: int, now: float) -> None:
        self._buckets = {u: (t, at) for u, (t, at) in self._buckets.items() if t + (now - at) * rate < burst}
