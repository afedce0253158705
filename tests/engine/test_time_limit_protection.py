"""A protection that starts later: no preemption in the last `preemption.protect_before_time_limit`
of a job's time limit (`rules.TIME_LIMIT`). A job may be taken until then, never after; the
reach is the thrash guard's (tiers 2–4 and reclaims wait, tier 1 does not); a warm engine that
priced the job before the protection started plans what a fresh pass plans after it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from engine_driver import check_warm_engine
from support import admitted, nodes, pending, plan_for, policy, preempted, running

from warden.engine.model import Snapshot
from warden.engine.policy import PolicyError, parse_policy
from warden.engine.reasons import InsufficientCapacity
from warden.engine.rules import RuleContext, closes_at, protection
from warden.engine.scheduler import Engine

NOW = 10_000.0
WINDOW = {"protect_before_time_limit": "10m"}
QUIET = {3: {"lease": "0s"}, 4: {"lease": "0s"}}


def _pol(window: bool = True, **extra: object) -> object:
    return policy(
        tiers=QUIET,
        preemption={"only_if_it_pays": False, **(WINDOW if window else {})},
        queues={"name": "cluster", "children": [{"name": "a"}]},
        **extra,
    )


def _near(job_id: str = "near", node: str = "n0") -> object:
    """A tier-4 job 5 minutes from its time limit, cheap to preempt (it saved a second ago)."""
    return running(
        job_id, "a", 4, (node, 8), started=NOW - 3_300.0, time_limit=3_600.0,
        checkpoint_s=1.0, last_checkpoint_at=NOW - 1.0, startup_s=1.0,
    )  # fmt: skip


def _far(job_id: str = "far", node: str = "n1") -> object:
    """A tier-4 job with hours left, dearer to preempt (nothing saved for an hour)."""
    return running(job_id, "a", 4, (node, 8), started=NOW - 3_600.0, time_limit=36_000.0, startup_s=1.0)


def test_the_window_is_the_last_stretch_of_the_time_limit() -> None:
    pol = _pol()
    v = _near()
    ctx = RuleContext(pol, None, NOW)  # type: ignore[arg-type]
    assert closes_at(ctx, v) == NOW - 3_300.0 + 3_600.0 - 600.0
    assert protection(ctx, v) == float("inf")  # within its last 10 minutes
    assert protection(ctx, v, guard=False) == 0.0  # a tier-1 preemptor is not held back
    early = RuleContext(pol, None, NOW - 1_000.0)  # type: ignore[arg-type]
    assert protection(early, v) == 0.0 and closes_at(early, v) == closes_at(ctx, v)
    # A lease that would lift only after the window starts never lets it go.
    leased = replace(v, lease=3_200.0)
    assert protection(early, leased) == float("inf")
    # Without a time limit, or with the setting off, nothing starts.
    assert closes_at(ctx, replace(v, time_limit=None)) == float("inf")
    assert closes_at(RuleContext(_pol(window=False), None, NOW), v) == float("inf")  # type: ignore[arg-type]


@pytest.mark.parametrize("tier", [2, 3])
def test_tiers_2_to_4_take_the_dearer_job_rather_than_one_near_its_limit(tier: int) -> None:
    jobs = [_near(), _far(), pending("p", "a", tier, gpus=8, submit=NOW - 1)]
    assert preempted(plan_for(_pol(window=False), nodes(2), jobs, now=NOW)) == {"near"}  # the cheaper one
    plan = plan_for(_pol(), nodes(2), jobs, now=NOW)
    assert preempted(plan) == {"far"}
    assert plan.explanations["p"].reason.victims == ("far",)  # type: ignore[attr-defined]


def test_a_tier_1_job_is_not_held_back_by_it() -> None:
    plan = plan_for(_pol(), nodes(2), [_near(), _far(), pending("p", "a", 1, gpus=8, submit=NOW - 1)], now=NOW)
    assert preempted(plan) == {"near"}


def test_a_job_whose_only_victim_is_near_its_limit_waits_for_its_end() -> None:
    near = _near()
    plan = plan_for(_pol(), nodes(1), [near, pending("p", "a", 3, gpus=8, submit=NOW - 1)], now=NOW)
    assert preempted(plan) == set() and admitted(plan) == set()
    why = plan.explanations["p"].reason
    assert isinstance(why, InsufficientCapacity) and why.reserved_at == NOW + 300.0
    # Before the window it is taken.
    early = plan_for(_pol(), nodes(1), [near, pending("p", "a", 3, gpus=8, submit=NOW - 1_500)], now=NOW - 1_000)
    assert preempted(early) == {"near"}


def test_a_warm_engine_stops_taking_a_job_once_its_window_starts() -> None:
    """The engine prices `near` while it may still be taken (its window starts at NOW − 300);
    a pass after that start plans what a fresh pass plans: nothing is taken from it."""
    pol = _pol()
    near = _near()
    p = pending("p", "a", 3, gpus=8, submit=NOW - 400)
    engine = Engine()
    before = NOW - 400.0
    assert engine.plan(Snapshot(nodes(1), (near,), pol), before).preemptions == ()
    snapshot = Snapshot(nodes(1), (near, p), pol)
    for at in (NOW - 310.0, NOW - 300.0, NOW):
        warm = engine.plan(snapshot, at)
        check_warm_engine(engine, snapshot, warm, at)  # the plan a fresh pass gives, and the indexes
        assert preempted(warm) == ({"near"} if at < NOW - 300.0 else set())


def test_a_job_started_now_near_a_reservation_is_not_lent_its_capacity() -> None:
    """A reservation's holder takes a backfilled job back at due − grace; a job whose time limit
    puts that moment in its last stretch could not be taken back, so it does not start there."""
    pol = _pol(scheduling={"reservations": 1})
    blocker = running("r", "a", 2, [("n0", 8)], started=NOW - 100.0, time_limit=2_100.0, lease=0.0)
    big = pending("big", "a", 2, gpus=8, replicas=2, submit=NOW - 50)
    jobs = [blocker, big]
    # 40 minutes: taken back at due (NOW + 2000) − its 120 s grace, 1880 s in: in its last 10 minutes.
    short = pending("x", "a", 4, gpus=8, submit=NOW - 10, time_limit=2_400.0)
    # 2 hours: 1880 s in is far from its limit, so it may be taken back and starts.
    long = pending("y", "a", 4, gpus=8, submit=NOW - 10, time_limit=7_200.0)
    off = plan_for(_pol(window=False, scheduling={"reservations": 1}), nodes(2), [*jobs, short], now=NOW)
    assert admitted(off) == {"x"}
    assert admitted(plan_for(pol, nodes(2), [*jobs, short], now=NOW)) == set()
    assert admitted(plan_for(pol, nodes(2), [*jobs, long], now=NOW)) == {"y"}
    both = plan_for(pol, nodes(2), [*jobs, short, long], now=NOW)
    assert admitted(both) == {"y"}
    engine = Engine()
    snapshot = Snapshot(nodes(2), (*jobs, short, long), pol)
    assert engine.plan(snapshot, NOW) == both == engine.plan(snapshot, NOW, ())


@pytest.mark.parametrize(("value", "seconds"), [("10m", 600.0), (0, 0.0), ("1h30m", 5_400.0)])
def test_the_policy_field_takes_a_duration(value: object, seconds: float) -> None:
    pol = parse_policy({"queues": {"name": "c"}, "preemption": {"protect_before_time_limit": value}})
    assert pol.preemption.protect_before_time_limit == seconds


@pytest.mark.parametrize("value", ["-5m", "soon", -1])
def test_a_bad_window_is_refused_naming_the_field(value: object) -> None:
    with pytest.raises(PolicyError, match=r"preemption\.protect_before_time_limit"):
        parse_policy({"queues": {"name": "c"}, "preemption": {"protect_before_time_limit": value}})


def test_a_waiting_jobs_reclaim_time_counts_a_borrower_near_its_limit_as_protected() -> None:
    """A full cluster: team b borrows team a's nominal with two jobs; a's job waits for the
    cluster (`QuotaExceeded` at the root) and says from when it may take b's borrowing back.
    Job x's lease ends at 850 and its window at 900: after 900 it is protected for good, so the
    time is y's lease end, 3000 — on a warm engine that priced x before 900 as on a fresh pass."""
    pol = policy(
        tiers=QUIET,
        preemption={"only_if_it_pays": False, **WINDOW},
        queues={
            "name": "cluster",
            "children": [{"name": "a", "nominal": {"gpu": 8}}, {"name": "b", "nominal": {"gpu": 8}}],
        },
    )
    x = running("x", "b", 3, ("n0", 8), started=0.0, lease=850.0, time_limit=1_500.0, startup_s=1.0)
    y = running("y", "b", 3, ("n1", 8), started=0.0, lease=3_000.0, startup_s=1.0)
    p = pending("p", "a", 3, gpus=8, submit=700.0)
    snapshot = Snapshot(nodes(2), (x, y, p), pol)
    engine = Engine()
    for at, reclaim_at in ((800.0, 850.0), (950.0, 3_000.0)):
        plan = engine.plan(snapshot, at)
        check_warm_engine(engine, snapshot, plan, at)
        why = plan.explanations["p"].reason
        assert getattr(why, "reclaim_at", None) == reclaim_at, why
