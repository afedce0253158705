"""SIGKILL on time: the one timer every executor arms at a terminate's deadline, and how a
deadline read back after a restart is trusted."""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("warden.executors")

Key = tuple[str, int]


class KillTimer:
    """One thread and a heap of monotonic deadlines: SIGKILL comes when the deadline is due,
    not at the next tick of some polling loop (Slurm's 30 s poll is what warden improves on).
    The thread waits on a condition variable with the exact remaining time and re-checks the
    clock, so it never fires early.

    No deadline and no failed SIGKILL stops it: a wait is cut to `threading.TIMEOUT_MAX` (a
    longer one raises) and taken again, a deadline that is not a number fires at once, and an
    error of one firing is logged and the thread goes on with the next deadline."""

    def __init__(self, fire: Callable[[list[Key]], None]) -> None:
        self._fire = fire
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Key]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False

    def arm(self, deadline_mono: float, key: Key) -> None:
        if isinstance(deadline_mono, bool) or not isinstance(deadline_mono, int | float) or math.isnan(deadline_mono):
            log.warning(
                "SIGKILL deadline %r of attempt %s of job %s is no time: due now", deadline_mono, key[1], key[0]
            )
            deadline_mono = time.monotonic()
        with self._cond:
            if self._closed:
                return
            heapq.heappush(self._heap, (float(deadline_mono), next(self._order), key))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="warden-kill-timer", daemon=True)
                self._thread.start()
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    def alive(self) -> bool:
        """Whether the thread runs (it starts with the first deadline)."""
        return self._thread is not None and self._thread.is_alive()

    def _next_due(self) -> list[Key]:
        """Block until at least one deadline is due; return every due key (empty when closed)."""
        with self._cond:
            while not self._closed:
                if not self._heap:
                    self._cond.wait()
                    continue
                now = time.monotonic()
                if self._heap[0][0] <= now:
                    due = []
                    while self._heap and self._heap[0][0] <= now:
                        due.append(heapq.heappop(self._heap)[2])
                    return due
                self._cond.wait(min(self._heap[0][0] - now, threading.TIMEOUT_MAX))
            return []

    def _run(self) -> None:
        while due := self._next_due():
            try:
                self._fire(due)
            except Exception:
                log.exception("SIGKILL of %d attempt(s) failed; trying each on its own", len(due))
                self._fire_each(due)

    def _fire_each(self, due: list[Key]) -> None:
        for key in due:
            try:
                self._fire([key])
            except Exception:
                log.exception("SIGKILL of attempt %s of job %s failed", key[1], key[0])


WALL_SLACK_S = 1.0
"""How far SIGKILL waits for the wall clock to reach the deadline it reported once the
monotonic deadline has passed: a pause between the two clock reads or NTP slewing. A larger
step of the wall clock is not followed (the grace is timed by the monotonic clock)."""


def deadline_pair(grace_s: float) -> tuple[float, float]:
    """The SIGKILL deadline `grace_s` from now on the wall clock (what terminate returns and the
    database keeps) and on the monotonic clock (what the timer waits on). The wall clock is read
    first, so a pause between the reads moves the monotonic deadline later, never earlier."""
    now = time.time()
    return now + grace_s, time.monotonic() + grace_s


def due(timer: KillTimer, key: Key, kill_at: float | None, kill_mono: float | None) -> bool:
    """Whether the SIGKILL deadline armed for `key` has come: the monotonic one has passed and
    so has the wall-clock one terminate reported (when that is at most `WALL_SLACK_S` further,
    `key` is armed again for the rest). False too for no deadline, or one re-armed later."""
    if kill_at is None or kill_mono is None or time.monotonic() < kill_mono:
        return False
    lag = kill_at - time.time()
    if 0 < lag <= WALL_SLACK_S:
        timer.arm(time.monotonic() + lag, key)
        return False
    return True


def adopted_deadline(given: Any) -> float | None:
    """A SIGKILL deadline read back at adoption (the database or control.json): a finite
    time, or now when the record is damaged (an attempt in its grace is never left unkilled)."""
    if given is None:
        return None
    if isinstance(given, int | float) and not isinstance(given, bool) and math.isfinite(given):
        return float(given)
    log.warning("recorded SIGKILL deadline %r is no time: SIGKILL now", given)
    return time.time()
