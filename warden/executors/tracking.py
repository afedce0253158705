"""What every executor keeps of the attempts it runs: a table under one lock, and the methods
of the contract that only read it."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import Generic, Protocol, Self, TypeVar

from warden.executors.base import Handle, UnknownAttempt

Key = tuple[str, int]


class HasHandle(Protocol):
    @property
    def handle(self) -> Handle: ...


T = TypeVar("T", bound=HasHandle)


class AttemptTable(ABC, Generic[T]):
    """The attempts an executor tracks, by (job_id, attempt), each with what it knows of it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tracked: dict[Key, T] = {}

    def running(self) -> list[Key]:
        """Every tracked attempt whose exit `exits()` has not reported yet."""
        with self._lock:
            return sorted(self._tracked)

    def handle(self, job_id: str, attempt: int) -> Handle:
        with self._lock:
            return self._get((job_id, attempt)).handle

    @abstractmethod
    def close(self) -> None:
        """Stop the executor's threads; never its jobs."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _get(self, key: Key) -> T:
        """The attempt's record (under the lock); UnknownAttempt when it is not tracked."""
        tracked = self._tracked.get(key)
        if tracked is None:
            raise UnknownAttempt(key)
        return tracked
