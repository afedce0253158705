"""What every executor keeps of the attempts it runs: a table under one lock, and the methods
of the contract that only read it."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import Generic, Protocol, Self, TypeVar

from warden.executors.base import Handle, LaunchError, LaunchSpec, UnknownAttempt, validate_spec

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
        self._starting: set[Key] = set()
        self._closed = False

    def _begin_start(self, spec: LaunchSpec) -> Key:
        """Check a spec `start` was given and mark its attempt as starting (`_end_start` when
        done): ValueError when malformed or already here, RuntimeError once closed, and
        `LaunchError` when its workdir is missing."""
        validate_spec(spec)
        if not spec.workdir.is_dir():
            raise LaunchError(f"job {spec.job_id!r}: workdir {str(spec.workdir)!r} is not a directory")
        key = (spec.job_id, spec.attempt)
        with self._lock:
            if self._closed:
                raise RuntimeError("executor is closed")
            if key in self._tracked or key in self._starting:
                raise ValueError(f"attempt {spec.attempt} of job {spec.job_id!r} is already running here")
            self._starting.add(key)
        return key

    def _end_start(self, key: Key) -> None:
        with self._lock:
            self._starting.discard(key)

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
