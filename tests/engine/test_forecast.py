"""Expected starts (`warden.engine.forecast`): exact when their assumptions hold, none where
nothing bounds a start, and planned by the warm engine exactly as a fresh one plans."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from support import nodes, pending, policy, running

from warden.engine.forecast import AWAITS_APPROVAL, NO_END, expected_starts
from warden.engine.model import Job, JobState, Snapshot
from warden.engine.plan import Plan
from warden.engine.policy import parse_policy
from warden.engine.scheduler import Engine, schedule
from warden.sim.presets import SimPolicy, build_preset, entitlements
from warden.sim.records import Trace, TraceJob
from warden.sim.simulator import Simulation


def test_a_queue_drains_in_the_order_and_at_the_times_its_ends_free_capacity() -> None:
    r = replace(running("r", "a", 3, ("n0", 8), 0.0), time_limit=100.0)
    jobs = (
        r,
        pending("p1", "a", 3, gpus=8, submit=1, time_limit=50.0),
        pending("p2", "a", 3, gpus=4, submit=2, time_limit=30.0),
        pending("p3", "a", 3, gpus=4, submit=3, time_limit=10.0),
    )
    found = expected_starts(Snapshot(nodes(1), jobs, policy()), 10.0)
    assert {i: e.at for i, e in found.starts.items()} == {"p1": 100.0, "p2": 150.0, "p3": 150.0}
    assert found.passes == 3


def test_a_start_that_waits_on_a_job_with_no_known_end_has_no_estimate() -> None:
    jobs = (running("r", "a", 3, ("n0", 8), 0.0), pending("p", "a", 3, gpus=8, submit=1))
    found = expected_starts(Snapshot(nodes(1), jobs, policy()), 10.0)
    assert found.starts["p"].at is None and found.starts["p"].why == NO_END


def test_a_job_awaiting_approval_has_no_estimate_and_says_why() -> None:
    job = pending("p", "a", 2, gpus=1, state=JobState.AWAITING_APPROVAL)
    found = expected_starts(Snapshot(nodes(1), (job,), policy()), 10.0)
    assert found.starts["p"].at is None and found.starts["p"].why == AWAITS_APPROVAL


def test_jobs_beyond_the_forecasts_reach_have_no_estimate() -> None:
    ends = [replace(running(f"r{i}", "a", 3, (f"n{i}", 8), 0.0), time_limit=10.0 * (i + 1)) for i in range(4)]
    waiting = [pending(f"p{i}", "a", 3, gpus=8, submit=i, time_limit=1000.0) for i in range(4)]
    one_queue = policy(queues={"name": "cluster", "children": [{"name": "a", "nominal": {"gpu": 32}}]})
    found = expected_starts(Snapshot(nodes(4), (*ends, *waiting), one_queue), 0.0, max_passes=2)
    assert found.passes == 2
    assert [found.starts[f"p{i}"].at for i in range(4)] == [10.0, None, None, None]
    assert "reach" in (found.starts["p3"].why or "")


def test_a_preemptor_starts_when_its_victims_grace_ends_and_the_victim_is_requeued() -> None:
    pol = policy(tiers={3: {"name": "exp", "lease": "0s", "grace": "120s"}}, thrash={"min_efficiency": 0})
    victim = replace(running("v", "a", 3, ("n0", 8), 0.0), time_limit=10_000.0)
    p = pending("p", "a", 1, gpus=8, submit=5, time_limit=600.0)
    found = expected_starts(Snapshot(nodes(1), (victim, p), pol), 100.0, ("p",))
    assert found.starts["p"].at == 220.0  # SIGTERM at 100, no save reported: gone at SIGKILL


def test_the_estimate_is_now_exactly_when_this_pass_admits_the_job() -> None:
    jobs = (running("r", "a", 3, ("n0", 4), 0.0), pending("p", "a", 3, gpus=4), pending("q", "b", 3, gpus=8))
    snap = Snapshot(nodes(1), jobs, policy())
    plan = schedule(snap, 5.0)
    found = expected_starts(snap, 5.0)
    assert {a.job_id for a in plan.admissions} == {i for i, e in found.starts.items() if e.at == 5.0} == {"p"}


# -- exact when its assumptions hold: the simulator, with nothing arriving after the snapshot ----


def _trace(shapes: list[tuple[int, int, float]]) -> Trace:
    jobs = tuple(
        TraceJob(str(k), 0.0, replicas * gpus, duration, replicas=replicas, gpus_per_replica=gpus, seq=k)
        for k, (replicas, gpus, duration) in enumerate(shapes)
    )
    return Trace(jobs, "test", "native")


shapes = st.lists(
    st.tuples(st.sampled_from([1, 1, 2]), st.sampled_from([1, 2, 4, 8]), st.integers(1, 50).map(lambda m: m * 60.0)),
    min_size=2,
    max_size=14,
)


@settings(max_examples=60, deadline=None)
@given(shapes=shapes, count=st.integers(1, 3))
def test_with_no_arrivals_and_exact_runtimes_every_estimate_is_the_simulated_start(
    shapes: list[tuple[int, int, float]], count: int
) -> None:
    """Everything arrives at once; durations are exact and nothing preempts: the forecast from
    the simulator's first pass gives every job's simulated start.

    No protection to lift (lease 0, no efficiency floor): the simulator runs a pass only when
    something ends, the forecast also when a protection lifts (as a server's passes would see
    it), and a pass at another moment may place a reservation elsewhere."""
    gpus = 8 * count
    assume(all(replicas * per <= gpus for replicas, per, _ in shapes))  # else the simulator skips it
    trace = _trace(shapes)
    governed = build_preset("governed", entitlements({}, ["default"], gpus), gpus)
    sp = SimPolicy(
        "governed",
        parse_policy(
            {
                "tiers": {3: {"name": "experimentation", "lease": "0s", "grace": "120s"}},
                "thrash": {"min_efficiency": 0},
                "preemption": {"restart_overhead": "0s", "checkpoint_overhead": "0s"},
                "queues": {"name": "cluster", "children": [{"name": "default", "nominal": {"gpu": gpus}}]},
            }
        ),
        governed.behaviour,
    )
    first: list[tuple[Snapshot, float]] = []

    def note(snapshot: Snapshot, plan: Plan, now: float) -> None:
        if not first:
            first.append((snapshot, now))

    run = Simulation(trace, nodes(count, 8), sp, on_pass=note).run()
    snapshot, now = first[0]
    found = expected_starts(snapshot, now).starts
    started = {j.job_id: j.attempts[0].admitted_at for j in run.jobs if j.attempts}
    assert {trace.jobs[int(eid)].job_id: e.at for eid, e in found.items()} == started


# -- the warm engine of a forecast plans what a fresh engine plans -------------------------------


@pytest.fixture
def fresh_checked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every `Engine.plan` call checked against `schedule` on the same snapshot and `now`."""
    calls: list[int] = []
    original = Engine.plan

    def plan(engine: Engine, snapshot: Snapshot, now: float, changed: Any = None) -> Plan:
        out = original(engine, snapshot, now, changed)
        fresh = original(Engine(), snapshot, now)
        assert (out.admissions, out.preemptions, out.reservations, out.claims) == (
            fresh.admissions,
            fresh.preemptions,
            fresh.reservations,
            fresh.claims,
        )
        assert dict(out.explanations.items()) == dict(fresh.explanations.items())
        calls.append(1)
        return out

    monkeypatch.setattr(Engine, "plan", plan)
    return calls


def _waiting(i: int, data: st.DataObject) -> Job:
    queue = data.draw(st.sampled_from(["a", "b"]))
    tier = data.draw(st.sampled_from([1, 3, 3, 4]))
    gpus = data.draw(st.sampled_from([1, 2, 4, 8]))
    estimate = data.draw(st.one_of(st.none(), st.integers(1, 40).map(lambda m: m * 60.0)))
    return pending(f"j{i:02d}", queue, tier, gpus=gpus, submit=float(i), time_limit=estimate)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_forecasts_warm_passes_equal_fresh_ones(data: st.DataObject, fresh_checked: list[int]) -> None:
    pol = policy(
        tiers={3: {"name": "exp", "lease": "5m", "grace": "120s"}, 4: {"name": "opp", "lease": "0s", "charged": False}},
        thrash={"min_efficiency": 0.5, "requeue_backoff": "60s"},
        scheduling={"reservations": 2},
    )
    cluster = nodes(data.draw(st.integers(1, 3)), 8)
    held: list[Job] = []
    for k, n in enumerate(cluster):
        if data.draw(st.booleans()):
            queue, tier = data.draw(st.sampled_from(["a", "b"])), data.draw(st.sampled_from([3, 4]))
            job = running(f"r{k}", queue, tier, (n.name, 8), 0.0)
            held.append(replace(job, time_limit=data.draw(st.sampled_from([None, 600.0, 1800.0]))))
    waiting = [_waiting(i, data) for i in range(data.draw(st.integers(1, 10)))]
    found = expected_starts(Snapshot(cluster, (*held, *waiting), pol), 100.0, max_passes=60)
    assert set(found.starts) == {j.id for j in waiting}
    assert all(e.at is None or e.at >= 100.0 for e in found.starts.values())
    assert fresh_checked
