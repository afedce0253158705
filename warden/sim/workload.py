"""How a simulated job spends an attempt: startup, work, periodic checkpoints, and SIGTERM.

An attempt that starts with `saved` seconds of progress already durable runs like this:

    startup (S) | work I | save C | work I | save C | ... | work (the rest)   → finished

`I` is the checkpoint interval in seconds of progress and `C` the time one save takes; no
save follows the last piece of work. A job without an interval works without pause. A job
that is not resumable never saves, and every attempt starts again from zero.

On SIGTERM at `t` the job stops working. A resumable job then writes a checkpoint (C
seconds; a periodic save in progress is abandoned, its time spent is still checkpoint time)
and exits when it is written: if that is no later than the SIGKILL deadline nothing is lost,
else it is killed at the deadline and loses the progress since its last complete save. A job
that is not resumable does not handle SIGTERM and exits at once, losing all its progress.
Signalled during startup, a job has made no progress and exits at once. What an exit lost is
`warden.engine.accounting.measured_loss`, the definition the server measures with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from warden.engine.accounting import measured_loss
from warden.sim.records import TraceJob


@dataclass(frozen=True, slots=True)
class Progress:
    """Where an attempt stands at one moment (all in seconds)."""

    done: float
    """Total progress of the job, durable or not."""
    saved: float
    """Progress covered by the newest complete checkpoint (or the attempt's start)."""
    checkpoint_s: float
    """Time this attempt has spent writing checkpoints so far."""
    last_save_end: float | None
    """When the newest complete periodic save of this attempt ended (None: none yet)."""
    saving_since: float | None = None
    """When the periodic save under way at this moment began (None: the job is not saving)."""


@dataclass(frozen=True, slots=True)
class Exit:
    """The end of an attempt cut short by SIGTERM."""

    at: float
    """When the job exits and its GPUs are free."""
    saved: float
    """Progress that survives into the next attempt."""
    done: float
    """Progress the job had made when signalled."""
    checkpoint_s: float
    """All checkpoint time of the attempt, the SIGTERM save included."""
    killed: bool
    lost: float = 0.0
    """Seconds of progress the preemption threw away (`done - saved`)."""


def interval_of(job: TraceJob) -> float | None:
    """The job's periodic checkpoint interval, or None when it saves only on SIGTERM or never."""
    i = job.checkpoint_interval
    return i if job.resumable and i is not None and i > 0 else None


def finish_time(job: TraceJob, admitted_at: float, saved: float) -> float:
    """When an attempt admitted at `admitted_at` with `saved` progress finishes, if left alone."""
    rest = max(0.0, job.duration - saved)
    i = interval_of(job)
    saves = 0 if i is None or rest <= 0 else math.ceil(rest / i) - 1
    return admitted_at + job.startup_seconds + rest + saves * job.checkpoint_seconds


def checkpoint_times(job: TraceJob, admitted_at: float, saved: float) -> list[float]:
    """When each periodic save of an undisturbed attempt ends (none after the last work)."""
    i = interval_of(job)
    if i is None:
        return []
    rest = max(0.0, job.duration - saved)
    saves = 0 if rest <= 0 else math.ceil(rest / i) - 1
    t0 = admitted_at + job.startup_seconds
    return [t0 + k * (i + job.checkpoint_seconds) for k in range(1, saves + 1)]


def progress_at(job: TraceJob, admitted_at: float, saved: float, t: float) -> Progress:
    """The attempt's progress at time `t` (no later than its finish)."""
    t0 = admitted_at + job.startup_seconds
    if t <= t0:
        return Progress(saved, saved, 0.0, None)
    elapsed = t - t0
    rest = max(0.0, job.duration - saved)
    i = interval_of(job)
    if i is None:
        done = saved + min(elapsed, rest)
        return Progress(done, done if job.resumable and done >= job.duration else saved, 0.0, None)
    c = job.checkpoint_seconds
    cycle = i + c
    k = int(elapsed // cycle)
    within = elapsed - k * cycle
    # Saves happen only while work remains after them.
    max_saves = 0 if rest <= 0 else math.ceil(rest / i) - 1
    if k > max_saves:
        k, within = max_saves, elapsed - max_saves * cycle
    base = saved + k * i
    last = t0 + k * cycle if k > 0 else None
    if within < i or k == max_saves:
        done = min(base + within, job.duration)
        return Progress(done, done if done >= job.duration else base, k * c, last)
    # In the middle of save k+1: its work is done but not durable yet.
    return Progress(base + i, base, k * c + (within - i), last, t0 + k * cycle + i)


def sigterm_exit(job: TraceJob, admitted_at: float, saved: float, t: float, kill_at: float) -> Exit:
    """What a SIGTERM at `t` with SIGKILL at `kill_at` does to the attempt."""
    p = progress_at(job, admitted_at, saved, t)
    # The job stopped working when it was signalled, or when a save under way then began.
    stopped = t if p.saving_since is None else p.saving_since
    if t <= admitted_at + job.startup_seconds or not job.resumable:
        lost = measured_loss(1, stopped, admitted_at, job.startup_seconds, None, t).gpu_s
        return Exit(t, p.saved if job.resumable else 0.0, p.done, p.checkpoint_s, False, lost)
    written = t + job.checkpoint_seconds
    if written <= kill_at:
        return Exit(written, p.done, p.done, p.checkpoint_s + job.checkpoint_seconds, False, 0.0)
    lost = measured_loss(1, stopped, admitted_at, job.startup_seconds, p.last_save_end, kill_at).gpu_s
    return Exit(kill_at, p.saved, p.done, p.checkpoint_s + (kill_at - t), True, lost)
