"""Process-wide settings for a process that runs scheduling passes (server, simulator, bench).

A pass allocates many short-lived tuples per waiting job (sort keys, outcomes, explanations).
With CPython's default thresholds the cyclic collector runs every 700 allocations and, as the
young objects survive the pass, keeps walking them again: on a 100,000-job queue that triples
a pass. The engine itself never touches the collector (it may run beside other threads, such
as the server's API); each process that runs passes calls `tune_collector` once at start.
"""

from __future__ import annotations

import gc

FIRST_GENERATION = 100_000
"""Allocations between collections of the youngest generation (CPython's default: 700)."""


def tune_collector() -> None:
    """Collect the youngest generation every `FIRST_GENERATION` allocations, the older ones
    more rarely; the collector stays on, so reference cycles are still freed."""
    gc.set_threshold(FIRST_GENERATION, 50, 100)
