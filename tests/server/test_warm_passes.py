"""The reconcile loop tells the engine only what changed between passes, and its plan is the
plan a fresh engine makes of the same whole snapshot.

The store (SQLite), the reconciler, the service and the local executor with its job processes
are real. A seeded history submits jobs of tiers 2–4 to two queues (gangs, placements, time
limits, approvals), cancels some, lets others complete, fail or be preempted, holds a job that
makes the engine fail and releases it, and changes the policy; after every pass the plan the
server's engine made (told `changed=`) must equal `schedule(snapshot, now)` on the snapshot it
was given, and that snapshot must be every unfinished job read afresh from the database.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from serverproc import end_everything

from warden.engine import schedule
from warden.engine.model import Job, JobState, Node, Snapshot
from warden.engine.plan import Plan
from warden.engine.policy import parse_policy
from warden.engine.scheduler import Engine
from warden.executors.local import LocalExecutor
from warden.server.auth import Principal
from warden.server.engineguard import EngineJobs
from warden.server.errors import ApiError
from warden.server.service import Service
from warden.store.jobs import ActiveJob
from warden.store.repo import Store

POLICY = """\
min_grace: 1s
thrash: {{min_efficiency: 0, max_preemptions: {{per: 1h, count: 50}}}}
preemption: {{restart_overhead: 0s, checkpoint_overhead: 0s}}
scheduling: {{reservations: 2}}
tiers:
  2: {{name: pretraining, lease: 0s, grace: 1s, requires_approval: true}}
  3: {{name: experimentation, lease: {lease}, grace: 1s}}
  4: {{name: opportunistic, lease: 0s, grace: 1s, charged: false}}
queues:
  name: cluster
  children:
    - {{name: a, nominal: {{gpu: {nominal}}}, borrowing_limit: {{gpu: 4}}}}
    - {{name: b, nominal: {{gpu: {nominal}}}, lending_limit: {{gpu: 4}}}}
"""
POLICIES = (POLICY.format(lease="0s", nominal=6), POLICY.format(lease="1s", nominal=4))
NODES = (
    Node("n0", 4, 16_000, 64_000, block="b0"),
    Node("n1", 4, 16_000, 64_000, block="b0"),
    Node("n2", 4, 16_000, 64_000, block="b1"),
)
SAVES_ON_SIGTERM = ("sh", "-c", "trap 'sleep 0.8; exit 0' TERM; sleep 30 & wait")
"""Runs until SIGTERM, then takes 0.8 s of its 1 s grace to exit: the pass after the one that
preempted it sees it PREEMPTING even when a loaded machine makes a pass slow."""
ROOT = Principal("root", "admin", ("*",))
TRIGGER_CPU = 777
"""A waiting job that asks for this many millicores makes the engine raise (while `broken`)."""


@dataclass
class Call:
    """One call of the reconciler's engine."""

    pass_no: int
    snapshot: Snapshot
    now: float
    changed: list[Job] | None
    """What it was told changed (None: a full pass)."""
    fresh: tuple[Job, ...]
    """The snapshot's jobs as they should be: every row in the database converted anew."""
    plan: Plan | None = None
    """None: it raised."""


@dataclass
class Recorder:
    svc: Service | None = None
    broken: bool = False
    pass_no: int = 0
    calls: list[Call] = field(default_factory=list)


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    rec = Recorder()
    original = Engine.plan

    def plan(engine: Engine, snapshot: Snapshot, now: float, changed: Any = None) -> Plan:
        svc = rec.svc
        told = None if changed is None else list(changed)
        call = None
        if svc is not None and engine is svc.reconciler.guard.engine:  # not a trial pass, not `schedule`
            call = Call(rec.pass_no, snapshot, now, told, _fresh_jobs(svc.store.fresh_active()))
            rec.calls.append(call)
        if rec.broken and any(j.state.waiting and j.cpu == TRIGGER_CPU for j in snapshot.jobs):
            raise ValueError("no replica layout for 777 millicores")
        out = original(engine, snapshot, now, told)
        if call is not None:
            call.plan = out
        return out

    monkeypatch.setattr(Engine, "plan", plan)
    return rec


def _fresh_jobs(active: tuple[ActiveJob, ...]) -> tuple[Job, ...]:
    """The engine form of every unfinished row but the held ones, converted anew (the culprit
    retry plans a snapshot without the job it has just held: the database holds it then)."""
    return tuple(a.to_engine() for a in active if not a.job.held)


@pytest.fixture
def service(tmp_path: Path, recorder: Recorder) -> Iterator[Service]:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    store = Store.open(f"sqlite:///{tmp_path / 'warden.db'}")
    svc = Service(store, LocalExecutor(), NODES, parse_policy(POLICIES[0]), state_dir)
    recorder.svc = svc
    yield svc
    end_everything(svc)
    svc.stop()
    store.close()


def same_plan(ours: Plan, fresh: Plan) -> None:
    assert ours.now == fresh.now
    assert ours.admissions == fresh.admissions
    assert ours.preemptions == fresh.preemptions
    assert ours.reservations == fresh.reservations
    assert ours.claims == fresh.claims
    assert ours.released_claims == fresh.released_claims
    # Only the Mapping interface: the explanations may be computed lazily.
    assert len(ours.explanations) == len(fresh.explanations)
    assert dict(ours.explanations.items()) == dict(fresh.explanations.items())
    for job_id, e in fresh.explanations.items():
        assert job_id in ours.explanations and ours.explanations[job_id] == e


def check_calls(calls: list[Call]) -> None:
    """Each call planned what a fresh engine plans of its snapshot, and that snapshot held
    every unfinished job as the database has it."""
    for call in calls:
        assert call.snapshot.jobs == call.fresh
        if call.plan is not None:
            same_plan(call.plan, schedule(call.snapshot, call.now))


def check_full_passes(calls: list[Call]) -> None:
    """The engine was given the whole snapshot only where it must be: the first call, a call
    after one that failed, the retry without a held job and the call after it, and a call on
    another policy."""
    for i, call in enumerate(calls):
        if call.changed is not None:
            continue
        before = calls[i - 1] if i else None
        must = (
            before is None
            or before.plan is None
            or before.pass_no == call.pass_no
            or (i >= 2 and calls[i - 2].pass_no == before.pass_no)
            or before.snapshot.policy != call.snapshot.policy
        )
        assert must, f"call {i} (pass {call.pass_no}) was a full one for no reason"


def submit(svc: Service, rng: random.Random, **overrides: Any) -> int:
    tier = rng.choice((2, 3, 3, 3, 4, 4))
    replicas = rng.choice((1, 1, 1, 2))
    gpus = rng.choice((1, 1, 2, 2, 3, 4))
    command = rng.choice(
        (("sleep", f"{rng.uniform(0.05, 1.5):.2f}"), ("sleep", "30"), SAVES_ON_SIGTERM, ("true",), ("false",))
    )
    fields: dict[str, Any] = dict(
        name="warm",
        user="ana",
        queue=rng.choice(("a", "b")),
        tier=tier,
        state=JobState.AWAITING_APPROVAL if tier == 2 else JobState.PENDING,
        replicas=replicas,
        gpus=gpus,
        cpu=rng.choice((0, 0, 1000, 4000)),
        memory=rng.choice((0, 0, 8000)),
        placement=rng.choice(("any", "pack", "block")) if replicas > 1 else "any",
        time_limit_s=rng.choice((None, 2.0, 30.0)),
        command=list(command),
        workdir="/",
        actor="ana",
        now=svc.now(),
    )
    fields.update(overrides)
    return svc.store.submit(**fields)


def test_every_pass_plans_what_a_fresh_engine_plans_of_the_whole_snapshot(service: Service, recorder: Recorder) -> None:
    svc, rng, rec = service, random.Random(20250301), recorder
    held: list[int] = []
    culprit: int | None = None
    policies = [parse_policy(p) for p in POLICIES]
    policy_at = 0
    for step in range(140):
        for _ in range(rng.choice((0, 0, 1, 1, 2, 4))):
            submit(svc, rng)
        unfinished = [a.job for a in svc.store.active()]
        cancellable = [j for j in unfinished if j.held_reason is None]  # the held one is released
        if cancellable and rng.random() < 0.25:  # a cancel, waiting or running
            victim = rng.choice(cancellable)
            try:
                svc.actions.cancel(victim.job_id, ROOT)
            except ApiError:
                pass
        awaiting = [j for j in unfinished if j.state is JobState.AWAITING_APPROVAL]
        if awaiting and rng.random() < 0.3:
            try:
                svc.actions.approve(rng.choice(awaiting).job_id, ROOT)
            except ApiError:  # the cancel just now ended it
                pass
        if step == 40:  # a job that makes every pass fail: it is held, the others go on
            rec.broken = True
            culprit = submit(svc, rng, tier=3, cpu=TRIGGER_CPU, command=["true"], state=JobState.PENDING)
        if culprit is not None and (job := svc.store.get(culprit)) is not None and job.held_reason:
            held.append(culprit)
            rec.broken, culprit = False, None
        if step == 70 and held:
            svc.actions.release(str(held[0]), ROOT)
        if step in (55, 100):  # another policy: the engine starts over whole
            policy_at = 1 - policy_at
            svc.reconciler.set_policy(policies[policy_at])
        rec.pass_no, start = step, len(rec.calls)
        svc.reconciler.reconcile()
        check_calls(rec.calls[start:])
        time.sleep(rng.choice((0.0, 0.02, 0.05, 0.1)))

    # The history went where it should: the engine was told what changed but where it must
    # start over, and what changed held jobs that left (finished, cancelled, held) and jobs
    # that hold GPUs.
    check_full_passes(rec.calls)
    told = [call.changed for call in rec.calls if call.changed is not None]
    assert held, "no job was held"
    assert svc.reconciler.stats.failures >= 2
    left = [j for changed in told for j in changed if j.state.terminal]
    assert len(left) >= 20, f"only {len(left)} jobs left the snapshot"
    states = {j.state for changed in told for j in changed}
    assert {JobState.PENDING, JobState.RUNNING, JobState.PREEMPTING} <= states, states
    assert svc.reconciler.stats.admitted >= 30 and svc.reconciler.stats.preempted >= 3, svc.reconciler.stats
    assert any(call.plan is not None and call.plan.reservations for call in rec.calls), "no pass reserved capacity"


def test_a_quiet_pass_converts_nothing_and_tells_the_engine_nothing(service: Service, recorder: Recorder) -> None:
    svc = service
    # One queue, one tier, one GPU each: 10 run (its nominal 6 and 4 borrowed), 20 wait, and
    # nothing preempts anything.
    for _ in range(30):
        svc.store.submit(
            name="quiet",
            user="ana",
            queue="a",
            tier=3,
            command=["sleep", "30"],
            workdir="/",
            actor="ana",
            now=svc.now(),
        )
    for _ in range(3):  # the admissions, and the explanations they move, settle
        svc.reconciler.reconcile()
    assert sum(j.state is JobState.RUNNING for j in recorder.calls[-1].snapshot.jobs) == 10
    before = dict(svc.reconciler.guard.engine_jobs.jobs)
    svc.reconciler.reconcile()
    last = recorder.calls[-1]
    assert last.changed == [], [(j.id, j.state) for j in last.changed or ()]
    assert all(before[int(j.id)][1] is j for j in last.snapshot.jobs), "a job was converted again"


def _active(job: Job, version: int, state: JobState | None = None) -> ActiveJob:
    """A stand-in for a store row: `to_engine` gives `job` (in `state`)."""

    class Row:
        def __init__(self) -> None:
            self.id, self.version = int(job.id), version

    class Active:
        def __init__(self) -> None:
            self.job = Row()

        def to_engine(self) -> Job:
            return job if state is None else Job(job.id, job.queue, job.tier, job.submit, state=state)

    return Active()  # type: ignore[return-value]


def test_changed_names_new_moved_and_gone_jobs() -> None:
    a, b, c = (Job(str(i), "a", 3, float(i)) for i in (1, 2, 3))
    jobs = EngineJobs()
    assert jobs.update([_active(a, 1), _active(b, 1)]) == (a, b)
    assert jobs.changed == [a, b]
    # Same versions: the same objects, nothing changed.
    out = jobs.update([_active(a, 1), _active(b, 1)])
    assert out[0] is a and out[1] is b and jobs.changed == []
    # A moved version that converts to an equal job is no change (the old object is kept).
    same_b = Job("2", "a", 3, 2.0)
    out = jobs.update([_active(a, 1), _active(same_b, 2)])
    assert out[1] is b and jobs.changed == []
    # b moves, c arrives, a leaves: a is told in a terminal state.
    out = jobs.update([_active(b, 3, JobState.REQUEUED), _active(c, 1)])
    assert [j.state for j in out] == [JobState.REQUEUED, JobState.PENDING]
    assert [(j.id, j.state) for j in jobs.changed] == [
        ("2", JobState.REQUEUED),
        ("3", JobState.PENDING),
        ("1", JobState.CANCELLED),
    ]
    # Only leaving (nothing new, nothing moved) is still told.
    jobs.update([_active(c, 1)])
    assert [(j.id, j.state) for j in jobs.changed] == [("2", JobState.CANCELLED)]
