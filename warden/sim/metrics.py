"""The simulator's metrics (DESIGN §7), computed from a `SimRun` alone.

Everything is a function of the run's job and attempt records, so any engine or policy preset
can be compared on the same footing. `summarize` returns one JSON-ready dict (plain floats, ints,
strings and None; None wherever a value is undefined, never NaN); `timeseries` returns the
per-bin series the report plots; `format_table` renders summaries for a terminal.

Definitions (times in seconds, GPU amounts in whole GPUs, `makespan = ended_at - started_at`):

- *admitted GPU-seconds* of an attempt: `gpus * (ended_at - admitted_at)`; it splits exactly into
  startup, checkpoint, useful, lost and idle time (see `SimAttempt`).
- *utilization*: Σ admitted GPU-seconds / (`run.gpus` * makespan). An engine that never
  over-commits keeps it ≤ 1; it is not clipped, so a value above 1 exposes an engine bug.
- *goodput*: Σ useful GPU-seconds / Σ admitted GPU-seconds (None when nothing was admitted).
- *lost GPU-hours*: Σ gpus * (lost_s + idle_s) over all attempts / 3600: progress thrown away by
  preemptions plus time held without progress (stranded gang members).
- *lost work per preemption*: the same sum over preempted attempts only, divided by the number
  of preemptions, in GPU-seconds (None without preemptions).
- *wait*: `SimJob.wait_s` (pending or requeued, over all attempts), over all jobs, finished
  or not. *JCT*: `finished_at - submit` over finished jobs.
- *percentiles*: `numpy.percentile` with its default linear interpolation (p95 of
  [0, 10, 20, 30, 40] is 38).
- *max wait of the least-served queue*: for each queue the maximum wait of its jobs, then the
  maximum over queues. The queue it comes from is the least-served one (`least_served_queue`).
  Numerically it is the worst wait in the cluster, but it is reported as a property of a queue
  because that is the fairness question: how badly is the worst-off team served?
- *starvation breach*: a job whose wait is at least `run.max_wait[queue]`; queues absent from
  `max_wait` never breach.
- *breach length*: a breaching job's wait over its maximum wait (`breach_wait_over_max_p50`,
  `_max`, and `breaches_over_twice_max_wait` counting those at 2 or more); per queue and per
  tier, `breaches` counts them.
- *restart startup GPU-hours*: Σ gpus * startup_s over attempts after a job's first: what
  preemptions cost in startups beyond the work they threw away.
- *preemptions by cause*: preempted attempts grouped by the preemptor's tier, the victim's
  tier, the engine's kind (downward or reclaim) and whether the preemptor held a reservation
  in the pass before (it waited for the victim's protection to lift), each with the lost
  GPU-hours and the victims' restart startup GPU-hours.
- *preemption cycles*: jobs in a preemption cycle (`warden.engine.cycles`: preempted more than a
  thrash budget allows within its window, or alternating with one other job), by kind, with
  the number of distinct jobs in either. Every policy is measured against the same budget,
  DESIGN §4.3's 3 per 24 h (`CYCLE_BUDGET`), whatever its own guard says: the presets that
  reproduce peers have none, and a count against their own budget would always be zero.
- *η* of a finished job: useful GPU-seconds / admitted GPU-seconds over all its attempts (jobs
  that were never admitted for a positive time have none); `eta_p5`, `eta_p50` over finished jobs.
- *delivered GPU-hours* of a queue: Σ admitted GPU-seconds of the attempts of its jobs of a
  charged tier (`run.charged_tiers`: those whose usage counts against quota and fair share;
  tier 4, `charged: false`, runs on idle capacity and is owed nothing) / 3600.
- *owed GPU-hours* of a queue: ∫ owed_q(t) dt / 3600 over [started_at, ended_at]. At each instant
  the cluster's `run.gpus` are divided among queues by weighted water-filling (weighted max-min
  fairness): a level λ rises and each queue gets `min(demand_q, λ * weight_q)` until the GPUs
  run out or every queue is at its demand, so a queue that wants less than its share gets its
  demand and the rest goes to the queues still below theirs, in proportion to their weights.
  `weight_q = run.entitlement[q]`; a queue absent from it (or with weight 0) is owed nothing,
  except that when none of the run's queues has a positive weight all queues weigh the same.
  `demand_q(t)` is Σ num_gpus of q's jobs of a charged tier with `submit <= t < finished_at` (a job that never
  finished counts until `ended_at`). The demand is piecewise constant between submits and
  finishes, so the integral is exact. Owed GPU-hours never exceed `gpus * makespan / 3600` in
  total, nor a queue's own demand integral; delivered may exceed owed (borrowed idle capacity).
  Both are computed by `warden.engine.accounting`, as the server's `/v1/queues` computes them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np
from numpy.typing import NDArray
from rich.table import Table

from warden.engine import accounting
from warden.engine.accounting import waterfill  # noqa: F401  (re-exported: its tests import it from here)
from warden.engine.cycles import CYCLE_KINDS, Preempted, preemption_cycles
from warden.engine.durations import span
from warden.engine.policy import MaxPreemptions
from warden.sim.records import SimAttempt, SimRun

HOUR = 3600.0

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.intp]


# ---------------------------------------------------------------------------- flat arrays


@dataclass(frozen=True)
class _Flat:
    """The run's records as column arrays, built once so every metric is a numpy reduction."""

    queues: list[str]
    """Queue names in natural order (q2 before q10); `job_queue` indexes it."""
    submit: FloatArray
    finished: FloatArray
    """finished_at, NaN for jobs that did not finish."""
    num_gpus: FloatArray
    wait: FloatArray
    tier: IntArray
    job_queue: IntArray
    att_job: IntArray
    """Index of each attempt's job."""
    gpus: FloatArray
    admitted: FloatArray
    ended: FloatArray
    startup: FloatArray
    checkpoint: FloatArray
    useful: FloatArray
    lost: FloatArray
    idle: FloatArray
    preempted: NDArray[np.bool_]
    number: IntArray
    """Each attempt's number (1 for a job's first)."""

    @property
    def held(self) -> FloatArray:
        """Admitted (delivered) GPU-seconds of each attempt."""
        return accounting.held_gpu_seconds(self.gpus, self.admitted, self.ended)

    @property
    def wasted(self) -> FloatArray:
        """Lost plus idle GPU-seconds of each attempt."""
        return self.gpus * (self.lost + self.idle)


_ATTEMPT_FIELDS = attrgetter(
    "gpus",
    "admitted_at",
    "ended_at",
    "startup_s",
    "checkpoint_s",
    "useful_s",
    "lost_s",
    "idle_s",
    "preempted",
    "number",
)
_JOB_FIELDS = attrgetter("submit", "num_gpus", "wait_s", "tier")


def _table(getter: attrgetter[Any], records: Sequence[Any], width: int) -> FloatArray:
    """Records as a float matrix, one row each: one pass of C-level attribute access (fast)."""
    if not records:
        return np.zeros((0, width))
    return np.array(list(map(getter, records)), dtype=np.float64)


def _flatten(run: SimRun) -> _Flat:
    jobs = run.jobs
    n = len(jobs)
    queues = sorted({j.queue for j in jobs}, key=natural_key)
    index = {q: i for i, q in enumerate(queues)}
    attempts: list[SimAttempt] = [a for j in jobs for a in j.attempts]
    counts = np.fromiter((len(j.attempts) for j in jobs), dtype=np.intp, count=n)
    jt = _table(_JOB_FIELDS, jobs, 4)
    at = _table(_ATTEMPT_FIELDS, attempts, 10)
    return _Flat(
        queues=queues,
        submit=jt[:, 0],
        finished=np.fromiter(
            (math.nan if j.finished_at is None else j.finished_at for j in jobs), dtype=np.float64, count=n
        ),
        num_gpus=jt[:, 1],
        wait=jt[:, 2],
        tier=jt[:, 3].astype(np.intp),
        job_queue=np.fromiter((index[j.queue] for j in jobs), dtype=np.intp, count=n),
        att_job=np.repeat(np.arange(n, dtype=np.intp), counts),
        gpus=at[:, 0],
        admitted=at[:, 1],
        ended=at[:, 2],
        startup=at[:, 3],
        checkpoint=at[:, 4],
        useful=at[:, 5],
        lost=at[:, 6],
        idle=at[:, 7],
        preempted=at[:, 8] != 0,
        number=at[:, 9].astype(np.intp),
    )


# ---------------------------------------------------------------------------- small helpers


def natural_key(name: str) -> tuple[Any, ...]:
    """Sort key that puts q2 before q10 (queue names often end in numbers)."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _num(x: float | None, digits: int) -> float | None:
    """A plain, rounded float, or None for None, NaN and infinities (JSON has no NaN)."""
    if x is None:
        return None
    f = float(x)
    return round(f, digits) if math.isfinite(f) else None


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _pct(values: FloatArray, q: float) -> float | None:
    """numpy's default (linear) percentile, None for no values."""
    return float(np.percentile(values, q)) if values.size else None


def _mean(values: FloatArray) -> float | None:
    return float(values.mean()) if values.size else None


def _max(values: FloatArray) -> float | None:
    return float(values.max()) if values.size else None


def _secs(x: float | None) -> float | None:
    return _num(x, 3)


def _hours(gpu_seconds: float | None) -> float | None:
    return None if gpu_seconds is None else _num(gpu_seconds / HOUR, 6)


def _frac(x: float | None) -> float | None:
    return _num(x, 6)


# ---------------------------------------------------------------------------- owed GPU-hours


def owed_gpu_seconds(run: SimRun, flat: _Flat | None = None) -> dict[str, float]:
    """∫ owed_q(t) dt per queue, in GPU-seconds: `warden.engine.accounting.owed_gpu_seconds`
    over the run's jobs, the definition the server's owed hours use too."""
    f = _flatten(run) if flat is None else flat
    charged = _charged(run, f)
    return accounting.owed_gpu_seconds(
        f.queues,
        f.job_queue[charged],
        f.num_gpus[charged],
        f.submit[charged],
        f.finished[charged],
        run.entitlement,
        run.gpus,
        run.started_at,
        run.ended_at,
    )


def _charged(run: SimRun, f: _Flat) -> NDArray[np.bool_]:
    """Which jobs are of a charged tier (`SimRun.charged_tiers`): the only ones owed anything."""
    return np.isin(f.tier, np.fromiter(run.charged_tiers, dtype=np.intp))


# ---------------------------------------------------------------------------- summary


def summarize(run: SimRun) -> dict[str, Any]:
    """All §7 metrics of one run as a JSON-ready dict (definitions in the module docstring)."""
    f = _flatten(run)
    makespan = run.ended_at - run.started_at
    done = ~np.isnan(f.finished)
    held = f.held
    preemptions = int(f.preempted.sum())
    admitted_total = float(held.sum())
    available = run.gpus * makespan
    summary: dict[str, Any] = {
        "policy": run.policy,
        "trace": run.trace,
        "seed": int(run.seed),
        "gpus": int(run.gpus),
        "jobs": len(run.jobs),
        "finished": int(done.sum()),
        "unfinished": int((~done).sum()),
        "avg_jct_s": _secs(_mean(f.finished[done] - f.submit[done])),
        "avg_wait_s": _secs(_mean(f.wait)),
        "p50_wait_s": _secs(_pct(f.wait, 50)),
        "p95_wait_s": _secs(_pct(f.wait, 95)),
        "makespan_s": _secs(makespan),
        "utilization": _frac(_ratio(admitted_total, available)),
        "goodput": _frac(_ratio(float((f.gpus * f.useful).sum()), admitted_total)),
        "preemptions": preemptions,
        "preemptions_per_hour": _num(_ratio(preemptions * HOUR, makespan), 4),
        "lost_gpu_hours": _hours(float(f.wasted.sum())),
        "lost_work_per_preemption_s": _secs(_ratio(float(f.wasted[f.preempted].sum()), preemptions)),
        "startup_gpu_hours": _hours(float((f.gpus * f.startup).sum())),
        "checkpoint_gpu_hours": _hours(float((f.gpus * f.checkpoint).sum())),
        "admitted_gpu_hours": _hours(admitted_total),
        "available_gpu_hours": _hours(max(available, 0.0)),
    }
    per_queue = _per_queue(run, f)
    summary["least_served_queue"], summary["max_wait_least_served_queue_s"] = _least_served(per_queue)
    summary["starvation_breaches"] = _breaches(run, f)
    summary.update(_breach_lengths(run, f))
    summary["restart_startup_gpu_hours"] = _hours(float((f.gpus * f.startup)[f.number > 1].sum()))
    eta = _eta(f, done)
    summary["eta_p5"] = _frac(_pct(eta, 5))
    summary["eta_p50"] = _frac(_pct(eta, 50))
    summary["per_queue"] = per_queue
    summary["per_tier"] = _per_tier(run, f)
    summary["preemptions_by_cause"] = preemption_causes(run)
    summary["preemption_cycles"] = cycle_counts(run)
    summary["wall_s"] = _secs(run.wall_s)
    summary["passes"] = int(run.passes)
    summary["engine_s"] = _secs(run.engine_s)
    summary["jobs_per_wall_s"] = _num(_ratio(len(run.jobs), run.wall_s), 1)
    return summary


def _least_served(per_queue: dict[str, dict[str, Any]]) -> tuple[str | None, float | None]:
    """The queue whose worst wait is the longest (first in natural order on ties), and that wait."""
    if not per_queue:
        return None, None
    queue = max(per_queue, key=lambda q: per_queue[q]["max_wait_s"])
    return queue, per_queue[queue]["max_wait_s"]


def _eta(f: _Flat, done: NDArray[np.bool_]) -> FloatArray:
    """η of each finished job that held GPUs for a positive time."""
    n = f.submit.size
    useful = np.bincount(f.att_job, weights=f.gpus * f.useful, minlength=n)
    held = np.bincount(f.att_job, weights=f.held, minlength=n)
    ok = done & (held > 0)
    return useful[ok] / held[ok]


def _limits(run: SimRun, f: _Flat) -> FloatArray:
    """Each job's maximum wait (its queue's; inf where the queue has none)."""
    limits = np.array([run.max_wait.get(q, math.inf) for q in f.queues], dtype=np.float64)
    return limits[f.job_queue] if limits.size else np.full(f.submit.size, math.inf)


def _breached(run: SimRun, f: _Flat) -> NDArray[np.bool_]:
    """Which jobs waited at least their queue's maximum wait."""
    return f.wait >= _limits(run, f)


def _breaches(run: SimRun, f: _Flat) -> int:
    return int(_breached(run, f).sum())


def _breach_lengths(run: SimRun, f: _Flat) -> dict[str, Any]:
    """How far past their maximum wait the breaching jobs waited, as multiples of it: median,
    worst, and how many waited twice their maximum or more."""
    limits = _limits(run, f)
    over = _breached(run, f) & (limits > 0)
    times = f.wait[over] / limits[over]
    return {
        "breach_wait_over_max_p50": _num(_pct(times, 50), 3),
        "breach_wait_over_max_max": _num(_max(times), 3),
        "breaches_over_twice_max_wait": int((times >= 2.0).sum()),
    }


def _wait_stats(waits: FloatArray, breached: NDArray[np.bool_]) -> dict[str, Any]:
    return {
        "jobs": int(waits.size),
        "p50_wait_s": _secs(_pct(waits, 50)),
        "p95_wait_s": _secs(_pct(waits, 95)),
        "max_wait_s": _secs(_max(waits)),
        "breaches": int(breached.sum()),
    }


def _per_queue(run: SimRun, f: _Flat) -> dict[str, dict[str, Any]]:
    owed = owed_gpu_seconds(run, f)
    charged = _charged(run, f)[f.att_job]
    delivered = np.bincount(f.job_queue[f.att_job][charged], weights=f.held[charged], minlength=len(f.queues))
    breached = _breached(run, f)
    out: dict[str, dict[str, Any]] = {}
    for i, q in enumerate(f.queues):
        mine = f.job_queue == i
        out[q] = {
            **_wait_stats(f.wait[mine], breached[mine]),
            "owed_gpu_hours": _hours(owed[q]),
            "delivered_gpu_hours": _hours(float(delivered[i])),
            "delivered_over_owed": _num(_ratio(float(delivered[i]), owed[q]), 4),
        }
    return out


def _per_tier(run: SimRun, f: _Flat) -> dict[str, dict[str, Any]]:
    breached = _breached(run, f)
    return {str(int(t)): _wait_stats(f.wait[f.tier == t], breached[f.tier == t]) for t in np.unique(f.tier)}


def preemption_causes(run: SimRun) -> list[dict[str, Any]]:
    """Preemptions grouped by (preemptor tier, victim tier, kind, after a reservation), with
    the GPU-hours of work they threw away and of startup their victims' next attempts spent,
    most frequent first."""
    rows: dict[tuple[int, int, str, bool], list[float]] = {}
    for job in run.jobs:
        attempts = job.attempts
        for i, a in enumerate(attempts):
            c = a.cause
            if c is None:
                continue
            row = rows.setdefault((c.by_tier, job.tier, c.kind, c.reserved), [0, 0.0, 0.0])
            row[0] += 1
            row[1] += a.gpus * (a.lost_s + a.idle_s)
            if i + 1 < len(attempts):
                row[2] += attempts[i + 1].gpus * attempts[i + 1].startup_s
    ordered = sorted(rows.items(), key=lambda kv: (-kv[1][0], kv[0]))
    return [
        {
            "preemptor_tier": by,
            "victim_tier": tier,
            "kind": kind,
            "after_reservation": reserved,
            "preemptions": int(n),
            "lost_gpu_hours": _hours(lost),
            "restart_startup_gpu_hours": _hours(startup),
        }
        for (by, tier, kind, reserved), (n, lost, startup) in ordered
    ]


# ---------------------------------------------------------------------------- preemption cycles

CYCLE_BUDGET = MaxPreemptions()
"""The thrash budget every run's preemption cycles are counted against (DESIGN §4.3's default)."""


def run_preemptions(run: SimRun) -> tuple[Preempted, ...]:
    """Every preempted attempt of the run as the cycle rule reads it: when its SIGTERM came,
    and for which job (None: for none, as a pod evicted without a preemptor)."""
    out = []
    for job in run.jobs:
        for a in job.attempts:
            if a.preempted:
                at = a.sigterm_at if a.sigterm_at is not None else a.ended_at
                c = a.cause
                out.append(Preempted(at, job.job_id, c.by if c else None, c.kind if c else "eviction"))
    return tuple(out)


def cycle_counts(run: SimRun, budget: MaxPreemptions = CYCLE_BUDGET) -> dict[str, Any]:
    """How many jobs were in a preemption cycle of each kind (a job in both counts under
    each; `jobs` counts each once), against `budget`."""
    involved: dict[str, list[Preempted]] = {}
    for p in run_preemptions(run):
        for side in {p.victim, p.by}:
            if side is not None:
                involved.setdefault(side, []).append(p)
    counts = dict.fromkeys(CYCLE_KINDS, 0)
    jobs = 0
    for job, links in involved.items():
        cycles = preemption_cycles(job, links, budget)
        jobs += bool(cycles)
        for c in cycles:
            counts[c.kind] += 1
    return {**counts, "jobs": jobs, "budget": {"count": budget.count, "per_s": budget.per}}


def format_cycles(cycles: dict[str, Any] | None) -> str:
    """`preemption_cycles` as "over budget / alternating"."""
    if not cycles:
        return "—"
    return f"{cycles['over_budget']} / {cycles['alternating']}"


# ---------------------------------------------------------------------------- preemption spread

DEFAULT_MAX_PREEMPTIONS_PER_JOB = 10
"""A job preempted more often than this is flagged: past it, evictions pile onto one job (it is
readmitted and evicted again and again) instead of spreading with contention."""


def preemption_spread(run: SimRun, limit: int = DEFAULT_MAX_PREEMPTIONS_PER_JOB) -> dict[str, Any]:
    """Preemptions per admitted job, and a warning when one job took more than `limit`.

    A total count hides whether evictions are spread over many jobs or pile onto a few caught
    in a cycle. Over the jobs admitted at least once: `preemptions_per_job` holds the mean, p95
    and max of each job's preempted attempts (for a gang scheduled pod by pod, every evicted
    pod), the job with the most (first in trace order on a tie), the number of admitted jobs,
    `limit` and how many jobs exceed it; `preemption_warning` is one sentence naming the worst
    job when any job exceeds `limit`, else None."""
    counts = [(j.preemptions, j.job_id) for j in run.jobs if j.attempts]
    values = np.array([c for c, _ in counts], dtype=np.float64)
    worst_count, worst_job = max(counts, key=lambda c: c[0]) if counts else (0, None)
    over = int((values > limit).sum())
    spread = {
        "mean": _num(_mean(values), 4),
        "p95": _num(_pct(values, 95), 4),
        "max": int(worst_count) if counts else None,
        "worst_job": worst_job if worst_count > 0 else None,
        "admitted_jobs": len(counts),
        "limit": limit,
        "over_limit": over,
    }
    warning = None
    if over:
        others = f"; {over - 1} other job(s) also exceed it" if over > 1 else ""
        warning = (
            f"job {worst_job} was preempted {worst_count} times, more than the limit of "
            f"{limit} per job (--max-preemptions-per-job){others}: it is readmitted and "
            "evicted again and again"
        )
    return {"preemptions_per_job": spread, "preemption_warning": warning}


def format_preemption_spread(spread: dict[str, Any] | None) -> str:
    """`preemptions_per_job` as "mean / p95 / max", with a "!" when some job exceeds the limit."""
    if not spread or spread.get("max") is None:
        return "—"

    def short(x: float) -> str:
        return f"{float(x):.2f}".rstrip("0").rstrip(".")

    flag = "!" if spread.get("over_limit") else ""
    return f"{short(spread['mean'])} / {short(spread['p95'])} / {spread['max']}{flag}"


# ---------------------------------------------------------------------------- time series


def timeseries(run: SimRun, points: int = 500) -> dict[str, Any]:
    """Per-bin series over [started_at, ended_at] for plots, as plain lists.

    `points` equal bins; `edges_s` are their bounds (seconds since the trace's start, so runs of
    different policies share an axis). `utilization` is the exact time-weighted mean of busy
    GPUs / gpus in each bin. `preemptions` counts preempted attempts and `lost_gpu_hours` sums
    gpus × (lost + idle) / 3600 of all attempts, each in the bin where the attempt ended (when
    the work is actually thrown away and the GPUs handed back). `wait_cdf` is `wait_cdf(run)`.
    """
    f = _flatten(run)
    start, end = run.started_at, run.ended_at
    out: dict[str, Any] = {
        "edges_s": [],
        "bin_s": None,
        "utilization": [],
        "preemptions": [],
        "lost_gpu_hours": [],
        "wait_cdf": _wait_cdf(f),
    }
    if end <= start or points < 1:
        return out
    edges = np.linspace(start, end, points + 1)
    width = (end - start) / points
    busy = np.diff(_busy_integral(f, edges))
    util = busy / (width * run.gpus) if run.gpus > 0 else np.zeros(points)
    ended_in = np.clip(f.ended, start, end)
    pre, _ = np.histogram(ended_in[f.preempted], bins=edges)
    lost, _ = np.histogram(ended_in, bins=edges, weights=f.wasted / HOUR)
    out.update(
        edges_s=[round(float(e), 3) for e in edges],
        bin_s=round(width, 3),
        utilization=[round(float(u), 6) for u in util],
        preemptions=[int(p) for p in pre],
        lost_gpu_hours=[round(float(x), 6) for x in lost],
    )
    return out


def _busy_integral(f: _Flat, at: FloatArray) -> FloatArray:
    """∫ busy GPUs dt from -∞ to each of `at`: piecewise linear between attempt starts and ends."""
    if not f.gpus.size:
        return np.zeros_like(at)
    times = np.concatenate((f.admitted, f.ended))
    delta = np.concatenate((f.gpus, -f.gpus))
    order = np.argsort(times, kind="stable")
    t, d = times[order], delta[order]
    level = np.cumsum(d)
    area = np.concatenate(([0.0], np.cumsum(level[:-1] * np.diff(t))))
    return np.interp(at, t, area)


def wait_cdf(run: SimRun, points: int = 200) -> dict[str, dict[str, list[float]]]:
    """Empirical CDF of waits per tier ("1".."4"), downsampled to at most `points` quantiles.

    `fraction[i]` of the tier's jobs waited at most `wait_s[i]`; quantiles (linear
    interpolation) keep the curve's shape while a 100k-job trace stays a few hundred points.
    """
    return _wait_cdf(_flatten(run), points)


def _wait_cdf(f: _Flat, points: int = 200) -> dict[str, dict[str, list[float]]]:
    out: dict[str, dict[str, list[float]]] = {}
    for t in np.unique(f.tier):
        waits = np.sort(f.wait[f.tier == t])
        if waits.size <= points:
            x = waits
            y = np.arange(1, waits.size + 1) / waits.size
        else:
            y = np.linspace(0.0, 1.0, points)
            x = np.quantile(waits, y)
        out[str(int(t))] = {"wait_s": [round(float(v), 3) for v in x], "fraction": [round(float(v), 6) for v in y]}
    return out


# ---------------------------------------------------------------------------- human table


def format_span(seconds: float | None) -> str:
    """Seconds in the short form, to their two largest units (`durations.span`); "—" for none."""
    return "—" if seconds is None else span(seconds)


def format_percent(fraction: float | None) -> str:
    return "—" if fraction is None else f"{100 * float(fraction):.1f}%"


def _format_plain(x: Any) -> str:
    return "—" if x is None else str(x)


def format_gpu_hours(x: float | None) -> str:
    """GPU-hours: two decimals while small (a few lost GPU-minutes should not read as 0.0)."""
    if x is None:
        return "—"
    return f"{float(x):.2f}" if abs(float(x)) < 10 else f"{float(x):,.1f}"


TABLE_COLUMNS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("policy", "policy", _format_plain),
    ("jobs", "jobs", _format_plain),
    ("avg JCT", "avg_jct_s", format_span),
    ("avg wait", "avg_wait_s", format_span),
    ("p50 wait", "p50_wait_s", format_span),
    ("p95 wait", "p95_wait_s", format_span),
    ("makespan", "makespan_s", format_span),
    ("util", "utilization", format_percent),
    ("goodput", "goodput", format_percent),
    ("preempt", "preemptions", _format_plain),
    ("preempt/job mean/p95/max", "preemptions_per_job", format_preemption_spread),
    ("cycles over/alt", "preemption_cycles", format_cycles),
    ("lost GPU-h", "lost_gpu_hours", format_gpu_hours),
    ("worst queue max wait", "max_wait_least_served_queue_s", format_span),
    ("breaches", "starvation_breaches", _format_plain),
    ("η p5", "eta_p5", format_percent),
)
"""(header, summary key, formatter) of the human table; the HTML report uses the same."""

TABLE_NAMES: dict[str, str] = {
    "jobs": "jobs",
    "avg_jct_s": "average job completion time",
    "avg_wait_s": "average wait",
    "p50_wait_s": "median wait (p50)",
    "p95_wait_s": "95th percentile wait (p95)",
    "makespan_s": "makespan",
    "utilization": "GPU utilization",
    "goodput": "goodput",
    "preemptions": "preemptions",
    "preemptions_per_job": "preemptions per job, mean / p95 / max",
    "preemption_cycles": "cycles, over budget / alternating",
    "lost_gpu_hours": "work lost to preemption, GPU-hours",
    "max_wait_least_served_queue_s": "max wait of the least-served queue",
    "starvation_breaches": "starvation breaches",
    "eta_p5": "preemption efficiency η, p5",
}
"""Each `TABLE_COLUMNS` column named in full, by summary key: the row names of the table when
it is turned on its side to fit a narrow terminal."""


def table_cells(row: dict[str, Any]) -> list[str]:
    """One summary dict as the human table's cell texts, in `TABLE_COLUMNS` order."""
    return [fmt(row.get(key)) for _, key, fmt in TABLE_COLUMNS]


def format_table(rows: list[dict[str, Any]]) -> Table:
    """A rich table with one row per summary dict (from `summarize`), in human units."""
    table = Table(title=None, header_style="bold")
    for header, key, _ in TABLE_COLUMNS:
        table.add_column(header, justify="left" if key == "policy" else "right")
    for row in rows:
        table.add_row(*table_cells(row))
    return table
