"""Time scheduling passes over the seeded synthetic cluster (`warden.engine.synthetic`).

Building the snapshot is not part of the measurement.
"""

from __future__ import annotations

import gc
import platform
import statistics
import time
from random import Random
from typing import Any

from warden.engine import lifecycle
from warden.engine.model import Job, JobState
from warden.engine.synthetic import pending_jobs, synthetic_snapshot


def run_engine_bench(
    nodes: int, gpus_per_node: int, pending: int, running: int, seed: int = 0, repeat: int = 5
) -> dict[str, Any]:
    """Median (and min, all) wall time of one scheduling pass, after one warm-up pass.

    `pass_ms_*` time `Engine.plan` on an engine that already holds the running jobs'
    allocation, as a server or the simulator does pass after pass; `cold_pass_ms_median` times
    `schedule`, which builds that allocation first. A collection runs before each timed pass so
    garbage from the previous one is not billed to it.
    """
    from warden.engine.scheduler import Engine, schedule
    from warden.runtime import tune_collector

    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    tune_collector()  # as the server and the simulator run passes
    t0 = time.perf_counter()
    snapshot, now = synthetic_snapshot(nodes, gpus_per_node, pending, running, seed)
    build_s = time.perf_counter() - t0
    engine = Engine()
    first = engine.plan(snapshot, now)
    times: list[float] = []
    plan = first
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        plan = engine.plan(snapshot, now)
        times.append(time.perf_counter() - t)
    cold: list[float] = []
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        cold_plan = schedule(snapshot, now)
        cold.append(time.perf_counter() - t)
    median = statistics.median(times)
    holding = [j for j in snapshot.jobs if j.state.holds_resources]
    admissions = len(plan.admissions)
    return {
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "gpus": nodes * gpus_per_node,
        "pending": pending,
        "running": running,
        "running_placed": len(holding),
        "gpus_busy": sum(j.total_gpus for j in holding),
        "seed": seed,
        "repeat": repeat,
        "pass_ms_median": round(median * 1e3, 3),
        "pass_ms_min": round(min(times) * 1e3, 3),
        "pass_ms_all": [round(t * 1e3, 3) for t in times],
        "cold_pass_ms_median": round(statistics.median(cold) * 1e3, 3),
        "snapshot_build_ms": round(build_s * 1e3, 3),
        "admissions": admissions,
        "preemptions": len(plan.preemptions),
        "reservations": len(plan.reservations),
        "explanations": len(plan.explanations),
        "admissions_per_s": round(admissions / median, 1) if median > 0 else None,
        "deterministic": plan == first == cold_plan,
        "python": platform.python_version(),
    }


def run_churn_bench(
    nodes: int,
    gpus_per_node: int,
    pending: int,
    running: int,
    churn: int = 50,
    seed: int = 0,
    repeat: int = 5,
    step_s: float = 10.0,
) -> dict[str, Any]:
    """A deep queue that cannot all fit, pass after pass, the way a shell drives it.

    Between passes `churn` running jobs complete, `churn` new jobs arrive, and the previous
    plan's admissions start (and its preemptions begin their grace); the engine is told only
    those jobs (`changed=`). `warm_pass_ms_*` times those passes; `full_pass_ms_median` times a
    pass over the same final snapshot shown whole to a warm engine, and `cold_pass_ms_median`
    one by `schedule`, which builds everything first. Every warm plan is checked against a
    fresh pass of the same snapshot (untimed).
    """
    from dataclasses import replace

    from warden.engine.model import Attempt
    from warden.engine.scheduler import Engine, schedule
    from warden.runtime import tune_collector

    if repeat < 1 or churn < 0:
        raise ValueError(f"repeat must be at least 1 and churn at least 0, got {repeat} and {churn}")
    tune_collector()  # as the server and the simulator run passes
    rng = Random(seed + 1)
    snapshot, now = synthetic_snapshot(nodes, gpus_per_node, pending, running, seed)
    jobs = {j.id: j for j in snapshot.jobs}
    engine = Engine()
    plan = engine.plan(snapshot, now)
    leaves = sorted({j.queue for j in snapshot.jobs})
    flavors = sorted({n.flavor for n in snapshot.nodes})
    fresh_jobs = pending_jobs(rng, churn * (repeat + 1), gpus_per_node, flavors, leaves, [1.0] * len(leaves))
    warm: list[float] = []
    changed_counts: list[int] = []
    exact = True
    for step in range(repeat):
        now += step_s
        changed: list[Job] = []
        for adm in plan.admissions:
            attempt = Attempt(1, now, adm.placement, borrowing=adm.borrowing, lent=adm.lent)
            job = lifecycle.admitted(jobs[adm.job_id], now, attempt, starts=True)
            jobs[job.id] = job
            changed.append(job)
        for pre in plan.preemptions:
            v = jobs[pre.job_id]
            assert v.attempt is not None
            job = lifecycle.signalled(v, now, now + pre.grace)
            jobs[job.id] = job
            changed.append(job)
        done = rng.sample(
            sorted(
                i
                for i, j in jobs.items()
                if j.state is JobState.RUNNING and j.attempt is not None and j.attempt.sigterm_at is None
            ),
            k=churn,
        )
        for job_id in done:
            changed.append(lifecycle.finished(jobs.pop(job_id)))
        for j in fresh_jobs[step * churn : (step + 1) * churn]:
            job = replace(j, id=f"new-{step:03d}-{j.id}", submit=now, pending_since=now)
            jobs[job.id] = job
            changed.append(job)
        snap = replace(snapshot, jobs=tuple(jobs.values()))
        gc.collect()
        t = time.perf_counter()
        plan = engine.plan(replace(snapshot, jobs=()), now, changed)
        warm.append(time.perf_counter() - t)
        changed_counts.append(len(changed))
        exact = exact and plan == schedule(snap, now)
    final = replace(snapshot, jobs=tuple(jobs.values()))
    full: list[float] = []
    cold: list[float] = []
    for _ in range(max(1, repeat // 2)):
        shown = Engine()
        shown.plan(final, now)
        gc.collect()
        t = time.perf_counter()
        shown.plan(final, now)
        full.append(time.perf_counter() - t)
        gc.collect()
        t = time.perf_counter()
        schedule(final, now)
        cold.append(time.perf_counter() - t)
    waiting = sum(1 for j in final.jobs if j.state.waiting)
    return {
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "pending_start": pending,
        "waiting_end": waiting,
        "running": running,
        "churn": churn,
        "repeat": repeat,
        "changed_per_pass": changed_counts,
        "warm_pass_ms_median": round(statistics.median(warm) * 1e3, 3),
        "warm_pass_ms_all": [round(t * 1e3, 3) for t in warm],
        "full_pass_ms_median": round(statistics.median(full) * 1e3, 3),
        "cold_pass_ms_median": round(statistics.median(cold) * 1e3, 3),
        "admissions_last": len(plan.admissions),
        "explanations_last": len(plan.explanations),
        "exact": exact,
        "python": platform.python_version(),
    }
