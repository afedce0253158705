"""A warm Engine gives exactly the plan a fresh pass gives, whatever it saw before."""

from __future__ import annotations

import random
from dataclasses import replace

from warden.engine.model import Attempt, JobState
from warden.engine.scheduler import Engine, schedule
from warden.engine.synthetic import synthetic_snapshot


def test_warm_engine_matches_fresh_passes_over_changing_snapshots() -> None:
    rng = random.Random(7)
    engine = Engine()
    told = Engine()
    """Told only what changed between snapshots, never shown the rest."""
    snapshot, now = synthetic_snapshot(40, 8, 120, 60, 3)
    told.plan(snapshot, now)
    previous = {j.id: j for j in snapshot.jobs}
    busy = 0
    for step in range(12):
        fresh = schedule(snapshot, now)
        busy += bool(fresh.admissions or fresh.preemptions)
        assert engine.plan(snapshot, now) == fresh
        assert engine.plan(snapshot, now) == fresh  # a repeated pass, too
        current = {j.id: j for j in snapshot.jobs}
        changed = [j for i, j in current.items() if previous.get(i) is not j]
        changed += [replace(j, state=JobState.SUCCEEDED) for i, j in previous.items() if i not in current]
        assert told.plan(replace(snapshot, jobs=()), now, changed) == fresh
        assert told.plan(replace(snapshot, jobs=()), now, ()) == fresh  # nothing changed since
        previous = current
        # Some running jobs end, some change facts only, some pending ones start where others were.
        jobs = list(snapshot.jobs)
        holding = [i for i, j in enumerate(jobs) if j.state.holds_resources]
        for i in rng.sample(holding, k=min(5, len(holding))):
            jobs[i] = replace(jobs[i], state=JobState.SUCCEEDED)
        for i in rng.sample(holding, k=min(5, len(holding))):
            a = jobs[i].attempt
            if a is not None and jobs[i].state.holds_resources:
                jobs[i] = replace(
                    jobs[i], attempt=replace(a, checkpoint_s=a.checkpoint_s + 10.0, last_checkpoint_at=now)
                )
        plan = schedule(replace(snapshot, jobs=tuple(j for j in jobs if not j.state.terminal)), now)
        started = {a.job_id: a for a in plan.admissions}
        jobs = [
            replace(j, state=JobState.RUNNING, attempt=Attempt(1, now, started[j.id].placement))
            if j.id in started
            else j
            for j in jobs
            if not j.state.terminal
        ]
        now += 60.0 * (step + 1)
        snapshot = replace(snapshot, jobs=tuple(jobs))
    assert busy >= 9, busy  # the history keeps the engine busy
    assert engine.plan(snapshot, now) == schedule(snapshot, now)
    assert engine.plan(snapshot, now, changed=()) == schedule(snapshot, now)


def test_a_job_told_twice_counts_as_its_last_version() -> None:
    """A shell may name a job more than once in one change set (it started, then ended):
    the engine keeps only the last version, as a fresh pass over the snapshot would."""
    snapshot, now = synthetic_snapshot(20, 8, 60, 30, 2)
    engine = Engine()
    plan = engine.plan(snapshot, now)
    assert plan.admissions
    adm = plan.admissions[0]
    job = next(j for j in snapshot.jobs if j.id == adm.job_id)
    started = replace(job, state=JobState.RUNNING, pending_since=None, attempt=Attempt(1, now, adm.placement))
    ended = replace(started, state=JobState.SUCCEEDED)
    after = replace(snapshot, jobs=tuple(j for j in snapshot.jobs if j.id != job.id))
    told = engine.plan(replace(snapshot, jobs=()), now + 1.0, [started, ended])
    assert told == schedule(after, now + 1.0)


def test_a_stretched_lease_lifts_at_the_same_instant_warm_and_fresh() -> None:
    """The efficiency floor compares with a little slack; an engine that worked the protection
    out at an earlier `now` must let the job go at exactly the instant a fresh pass does (here
    30 + 15 / (1 − 0.9) is 180.00000000000003, not 180)."""
    from warden.engine.model import Job, Node, ReplicaPlacement, Snapshot, UsageLedger
    from warden.engine.policy import parse_policy

    policy = parse_policy(
        {
            "tiers": {4: {"lease": "0s", "preemptible": True}},
            "thrash": {"min_efficiency": 0.9},
            "queues": {"name": "root", "children": [{"name": "a", "nominal": {"gpu": 8}}]},
        }
    )
    running = Job(
        id="10",
        queue="a",
        tier=4,
        submit=30.0,
        state=JobState.RUNNING,
        gpus=1,
        lease=0.0,
        time_limit=151.0,
        attempt=Attempt(1, 30.0, (ReplicaPlacement("pool", (7,)),), startup_s=15.0),
    )
    waiting = Job(id="09", queue="a", tier=1, submit=0.0, state=JobState.PENDING, replicas=2, gpus=4, lease=0.0)
    snapshot = Snapshot((Node("pool", 8),), (waiting, running), policy, UsageLedger())
    engine = Engine()
    for now in (60.0, 179.0, 180.0, 180.00000000000003, 181.0, 60.0, 180.0):  # and back in time
        assert engine.plan(snapshot, now) == schedule(snapshot, now), now
