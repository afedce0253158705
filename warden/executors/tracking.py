"""What every executor keeps of the attempts it runs: a table under one lock, and the methods
of the contract that only read it; and, for the executors whose replicas run on other
machines (Slurm, Ray), what warden did to each attempt (SIGTERM, the SIGKILL deadline,
SIGKILL), kept on time by one timer and recorded in the attempt's `control.json`."""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Generic, Protocol, Self, TypeVar

from warden.executors.base import (
    Devices,
    Fenced,
    Handle,
    LaunchError,
    LaunchSpec,
    Stopped,
    UnknownAttempt,
    validate_spec,
)
from warden.executors.deadlines import KillTimer, adopted_deadline, deadline_pair, due
from warden.executors.outside import HEARTBEAT_S, TERMINATING, Beats, stopped_of
from warden.executors.records import CONTROL_MODE, launched, read_job_json, write_json_atomic

Key = tuple[str, int]
log = logging.getLogger("warden.executors")

FENCED_RETRY_S = 0.1
"""How soon a SIGKILL deadline that came while the executor was fenced is tried again: the
lease may be renewed a moment later (a slow renewal), and then the SIGKILL goes out."""


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
        self._wake: Callable[[], None] | None = None
        self._may_act: Callable[[], bool] | None = None

    def fence(self, may_act: Callable[[], bool]) -> None:
        """Act on the cluster only while `may_act()` holds (`Executor.fence`)."""
        self._may_act = may_act

    def _acting(self, what: str) -> None:
        """Before an action on the cluster: `Fenced` unless this server may act now."""
        if self._may_act is not None and not self._may_act():
            raise Fenced(f"{what}: refused, this server does not lead now (or its lease ran out)")

    def _fenced_deadlines(self, timer: KillTimer, keys: list[Key]) -> bool:
        """At a SIGKILL deadline: True (and each key armed again shortly) when this server may
        not act now; the SIGKILL is then sent once its lease is renewed, or by the next leader."""
        if self._may_act is None or self._may_act():
            return False
        log.warning(
            "SIGKILL of %s held back: this server may not act now (its lease is not renewed); retrying in %g s",
            ", ".join(f"job {j} attempt {a}" for j, a in keys),
            FENCED_RETRY_S,
        )
        for key in keys:
            timer.arm(time.monotonic() + FENCED_RETRY_S, key)
        return True

    def watch(self, wake: Callable[[], None]) -> None:
        """`wake` is called when the executor's pollers see something new (`_woken`)."""
        self._wake = wake

    def _woken(self) -> None:
        if self._wake is not None:
            self._wake()

    def _begin_start(self, spec: LaunchSpec) -> Key:
        """Check a spec `start` was given and mark its attempt as starting (`_end_start` when
        done): ValueError when malformed or already here, RuntimeError once closed, and
        `LaunchError` when its workdir is missing."""
        validate_spec(spec)
        self._acting(f"start attempt {spec.attempt} of job {spec.job_id}")
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

    def devices(self, job_id: str, attempt: int) -> Devices | None:
        """None: the replicas run on exactly the GPUs of their launch (`Executor.devices`);
        executors whose substrate picks the indices itself read them back instead."""
        return None

    def stopped(self) -> dict[Key, Stopped]:
        """The tracked attempts some of whose processes are stopped now (`Executor.stopped`), as
        their replicas' supervisors saw them (each one's `seen` file), with the earliest time one
        was seen stopped."""
        with self._lock:
            handles = [(key, tracked.handle) for key, tracked in self._tracked.items()]
        return {key: stop for key, handle in handles if (stop := stopped_of(handle)) is not None}

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


class Signalled(HasHandle, Protocol):
    """An attempt as a remote executor tracks it: when warden sent SIGTERM, the SIGKILL
    deadline (wall clock and monotonic), when SIGKILL was sent, and when its exit was
    reported."""

    signalled_at: float | None
    kill_at: float | None
    kill_mono: float | None
    killed_at: float | None
    terminating_at: float | None  # when warden decided to SIGTERM it (`_announce`)
    ended_mono: float | None
    started: bool  # reported by `started()`


S = TypeVar("S", bound=Signalled)


class RemoteAttemptTable(AttemptTable[S]):
    """The attempts of an executor that signals its replicas through another system (Slurm's
    `scancel`, Ray's launcher actors): its SIGKILL timer, the deadline a terminate arms, and
    the control file an adopter reads back. Subclasses say how SIGKILL is sent (`_kill`)."""

    def __init__(self, heartbeat_s: float = HEARTBEAT_S) -> None:
        super().__init__()
        self._timer = KillTimer(self._deadlines_reached)
        self.heartbeat_s = heartbeat_s
        """How often each replica's supervisor writes when nothing changed (its launch's `heartbeat_s`)."""
        self._beats = Beats(heartbeat_s)

    def stopped(self) -> dict[Key, Stopped]:
        """`AttemptTable.stopped`, and the attempts a replica of which has a silent supervisor:
        it runs as the job's account, which can stop or freeze it with the job (`Beats`)."""
        with self._lock:
            handles = [(key, tracked.handle) for key, tracked in self._tracked.items()]
        self._beats.keep(key for key, _ in handles)
        return {key: stop for key, handle in handles if (stop := stopped_of(handle, self._beats)) is not None}

    def start(self, spec: LaunchSpec) -> Handle:
        """Hand the attempt to the other system (`_hand_over`) and return at once: `started()`
        reports it once every replica runs, `exits()` once every one is gone."""
        key = self._begin_start(spec)
        try:
            return self._hand_over(spec, key)
        finally:
            self._end_start(key)

    @abstractmethod
    def _hand_over(self, spec: LaunchSpec, key: Key) -> Handle:
        """Submit the attempt, pinned where warden placed it, and track it; LaunchError when
        the other system refuses it."""

    def _announce(self, tracked: S) -> None:
        """Record in control.json that warden is about to SIGTERM the attempt, before it does:
        a job that catches SIGTERM reads it to tell warden's from another's (`outside`)."""
        with self._lock:
            if tracked.terminating_at is not None:
                return
            tracked.terminating_at = time.time()
        self._persist(tracked, durable=False)  # read by the job after the SIGTERM: no disk wait before it

    def _arm(self, key: Key, tracked: S, signalled_at: float, grace_s: float) -> float:
        """Record a SIGTERM that just went out and arm SIGKILL `grace_s` from now (after the
        last signal left, so no replica gets less). The first terminate's deadline stands."""
        kill_at, kill_mono = deadline_pair(grace_s)
        with self._lock:
            if tracked.signalled_at is None:
                tracked.signalled_at = signalled_at
            if tracked.kill_at is None:
                tracked.kill_at, tracked.kill_mono = kill_at, kill_mono
                self._timer.arm(tracked.kill_mono, key)
            deadline = tracked.kill_at
        self._persist(tracked)
        return deadline

    def kill(self, job_id: str, attempt: int) -> None:
        self._acting(f"SIGKILL attempt {attempt} of job {job_id}")
        with self._lock:
            tracked = self._get((job_id, attempt))
        self._kill(tracked)

    def started(self) -> list[Key]:
        """The attempts each of whose replicas has written its status file since the last
        call (a launch's, not a revocation): their job processes run. Each is reported once."""
        with self._lock:
            waiting = [(key, t) for key, t in self._tracked.items() if not t.started]
        begun = [
            (key, t) for key, t in waiting if all(launched(read_job_json(r.status_path)) for r in t.handle.replicas)
        ]
        out = []
        with self._lock:
            for key, tracked in begun:
                if not tracked.started:
                    tracked.started = True
                    out.append(key)
        return out

    @abstractmethod
    def _kill(self, tracked: S) -> None:
        """Send SIGKILL to every replica now (`_killing` records it)."""

    def _killing(self, tracked: S) -> bool:
        """Record a SIGKILL about to be sent (under the lock); False when the attempt's exit
        was already reported."""
        if tracked.ended_mono is not None:
            return False
        if tracked.killed_at is None:
            tracked.killed_at = time.time()
            if tracked.kill_at is None:
                tracked.kill_at = tracked.killed_at
        return True

    def _deadlines_reached(self, keys: list[Key]) -> None:
        if self._fenced_deadlines(self._timer, keys):
            return
        for key in keys:
            with self._lock:
                tracked = self._tracked.get(key)
                if tracked is None or not due(self._timer, key, tracked.kill_at, tracked.kill_mono):
                    continue  # reported, re-armed later at adoption, or the wall clock not there yet
            self._kill(tracked)

    def _persist(self, tracked: S, durable: bool = True) -> None:
        """control.json: what a server that restarts mid-grace needs to kill on time."""
        if tracked.handle.control_path is None:
            return
        with self._lock:
            record = {
                "signalled_at": tracked.signalled_at,
                "kill_at": tracked.kill_at,
                "killed_at": tracked.killed_at,
                TERMINATING: tracked.terminating_at,
            }
        write_json_atomic(tracked.handle.control_path, record, mode=CONTROL_MODE, durable=durable)  # no planted link

    @staticmethod
    def _control(handle: Handle) -> dict[str, Any]:
        """The control.json an earlier server wrote for this attempt (empty if none)."""
        return (read_job_json(handle.control_path) if handle.control_path is not None else None) or {}

    def _rearm(self, key: Key, tracked: S, kill_at: float | None) -> float | None:
        """At adoption (under the lock): re-arm SIGKILL at the recorded deadline, `kill_at`
        from the database else control.json's; returns it (None: not terminating)."""
        deadline = adopted_deadline(kill_at if kill_at is not None else tracked.kill_at)
        if deadline is not None and tracked.killed_at is None:
            tracked.kill_at = deadline
            tracked.kill_mono = time.monotonic() + (deadline - time.time())
            self._timer.arm(tracked.kill_mono, key)
        return deadline
