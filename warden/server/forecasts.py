"""Expected starts of the waiting jobs, worked out in the background from the last pass.

A forecast (`warden.engine.forecast`) runs the engine forward from the snapshot the last pass
planned, at that pass's `now`, so its first pass is the one the server ran. It costs a pass per
event it looks ahead to, so it runs in a thread of its own, outside the reconcile loop's lock,
at most every `interval_s`, and looks as far ahead as about `budget_s` of work allows: the
number of passes is set from what a pass cost in the previous forecast. Jobs it does not
reach get no estimate (`Estimate.at` None, with why), never a made-up one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from warden.engine.forecast import MAX_PASSES, Estimate, expected_starts
from warden.engine.model import Snapshot
from warden.server.views import estimate_view
from warden.store.jobs import JobHead

log = logging.getLogger("warden.server")

INTERVAL_S = 10.0
"""Seconds between two forecasts, at least."""
BUDGET_S = 2.0
"""About how long one forecast may take."""
MIN_PASSES = 50
NOT_YET = "not forecast yet: it was submitted or requeued after the last forecast"


class Forecasts:
    """The newest forecast: each waiting job's estimate, as of the pass it started from."""

    def __init__(
        self,
        source: Callable[[], tuple[Snapshot, float] | None],
        interval_s: float = INTERVAL_S,
        budget_s: float = BUDGET_S,
    ) -> None:
        self.source = source
        """The last pass's snapshot and `now` (None before the first pass)."""
        self.interval_s = interval_s
        self.budget_s = budget_s
        self.passes = MIN_PASSES
        """Passes the next forecast runs at most (and a dry run's): few for the first one, whose
        cost is not known yet, then as many as `budget_s` allows."""
        self.estimates: dict[str, Estimate] = {}
        self.as_of: float | None = None
        """The `now` of the pass the estimates start from."""
        self._basis: Snapshot | None = None
        self._wake = threading.Event()

    def refresh(self) -> bool:
        """Forecast from the last pass, unless that pass was forecast already; True if it ran."""
        got = self.source()
        if got is None or got[0] is self._basis:
            return False
        snapshot, now = got
        t0 = time.perf_counter()
        found = expected_starts(snapshot, now, max_passes=self.passes)
        per_pass = (time.perf_counter() - t0) / max(1, found.passes)
        self.passes = max(MIN_PASSES, min(MAX_PASSES, int(self.budget_s / max(per_pass, 1e-6))))
        self.estimates, self.as_of, self._basis = found.starts, now, snapshot
        return True

    def run(self, stop: threading.Event) -> None:
        """Forecast every `interval_s` until `stop`; a forecast that fails is logged, and the
        previous one stays until the next succeeds."""
        while not stop.is_set():
            try:
                self.refresh()
            except Exception:
                log.exception("the expected-start forecast failed; the next try is in %g s", self.interval_s)
            if stop.wait(self.interval_s):
                return

    def view(self, job: JobHead) -> dict[str, Any] | None:
        """A job's `expected_start` as the API shows it: None unless it waits."""
        if not job.state.waiting:
            return None
        if job.held_reason is not None:
            return estimate_view(None, self.as_of, f"it is held: {job.held_reason}")
        return estimate_view(self.estimates.get(job.job_id), self.as_of, NOT_YET)
