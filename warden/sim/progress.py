"""How far a simulation run has come, and how long the runs of one command have left.

A run's wall time goes to events (an arrival, a completion, the pass each one brings), not to
simulated time: a quiet night of a trace costs nothing, and a contended trace's drain after
its last submit can take longer than everything before it. So the share of a run done counts
events: each job arrives once and finishes once, and a completion weighs twice an arrival (it
frees capacity, and the pass after it admits and places; an arrival into a full cluster mostly
queues). On Philly slices from idle to heavily contended, that share stayed within 0.02–0.17
of the share of wall time spent; on the contended ones simulated time, arrivals alone or
completions alone ran 0.3–0.7 off.
"""

from __future__ import annotations

from dataclasses import dataclass

from warden.engine.durations import span


@dataclass(frozen=True, slots=True)
class SimProgress:
    """Where one simulation run stands: what `Simulation.on_progress` is told now and then."""

    jobs: int
    """Trace jobs the run replays (those the cluster cannot run are not counted)."""
    arrived: int
    finished: int
    clock: float
    """The simulated moment reached, in the trace's seconds."""
    first_submit: float
    last_submit: float
    ended: bool = False
    """The run is over: its fraction is exactly 1."""

    @property
    def fraction(self) -> float:
        """The share of the run done, 0 to 1, never going back: arrivals plus twice the
        completions, over three times the jobs."""
        if self.ended:
            return 1.0
        if self.jobs <= 0:
            return 0.0
        return min(1.0, (self.arrived + 2 * self.finished) / (3 * self.jobs))


def time_left(elapsed_s: float, run_elapsed_s: float, fraction: float, runs_done: int, runs_total: int) -> float | None:
    """Seconds of wall time left for `runs_total` runs made one after the other, `runs_done`
    of them over and the current one `fraction` done after `run_elapsed_s` of the
    `elapsed_s` all of them took so far; None while nothing tells the rate.

    The current run's rest is extrapolated from its own pace (policies differ a lot in
    cost); each run still to come is taken to last as long as the runs done did on average,
    or, before any is done, as long as the current one is heading for."""
    if runs_done >= runs_total:
        return 0.0
    fraction = min(max(fraction, 0.0), 1.0)
    per_run = (elapsed_s - run_elapsed_s) / runs_done if runs_done else None
    if fraction > 0.0:
        current_left = run_elapsed_s * (1.0 - fraction) / fraction
        if per_run is None:
            per_run = run_elapsed_s / fraction
    elif per_run is None:
        return None
    else:
        current_left = max(0.0, per_run - run_elapsed_s)
    return max(0.0, current_left + (runs_total - runs_done - 1) * per_run)


def describe_left(seconds: float | None) -> str:
    """`~12m left` and the like: rounded, as an estimate deserves (to 5 seconds, then to the
    minute), in the short form of every duration (`durations.span`)."""
    if seconds is None:
        return "estimating time left"
    if seconds <= 0.0:
        return "done"
    if seconds < 10.0:
        return "<10s left"
    if round(seconds / 5) * 5 < 60:
        return f"~{span(round(seconds / 5) * 5)} left"
    return f"~{span(round(seconds / 60) * 60)} left"
