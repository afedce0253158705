"""Reservation-safe backfill (DESIGN §4.2): a lower job starts in reserved capacity only if it
ends before the reservation is due, or if the holder may preempt it at due − its grace; the
holder then does, exempt from `scope`, so that it starts on time."""

from __future__ import annotations

from dataclasses import replace

from support import admitted, nodes, pending, plan_for, policy, preempted, reason, running

from warden.engine import lifecycle
from warden.engine.model import Attempt, Job, JobState
from warden.engine.plan import Plan
from warden.engine.policy import Policy

NO_QUOTA = {"name": "cluster", "children": [{"name": "a"}, {"name": "b"}]}
DUE = 10_000.0
"""When the job holding the reservation fits: `a1` ends then."""


def _started(plan: Plan, job: Job, now: float) -> Job:
    """The job as the shell starts it from the plan's admission (its `lent` mark included)."""
    a = next(a for a in plan.admissions if a.job_id == job.id)
    return lifecycle.admitted(job, now, Attempt(1, now, a.placement, a.borrowing, lent=a.lent), starts=True)


def _take_back(pol: Policy, holder: Job, lower: Job, grace: float) -> None:
    """`lower` starts in `holder`'s reservation at 100 s; `holder` preempts it at due − grace,
    not earlier and not at due, and starts at due."""
    cluster = nodes(2)
    a1 = running("a1", holder.queue, holder.tier, ("n0", 8), started=0.0, time_limit=DUE)
    first = plan_for(pol, cluster, [a1, holder, lower], now=100.0)
    assert admitted(first) == {lower.id}
    assert [a.lent for a in first.admissions] == [True]
    assert [(r.job_id, r.due) for r in first.reservations] == [(holder.id, DUE)]
    lower = _started(first, lower, 100.0)

    before = plan_for(pol, cluster, [a1, holder, lower], now=5_000.0)
    assert preempted(before) == set() and admitted(before) == set()
    assert [(r.job_id, r.due, r.signal_at) for r in before.reservations] == [(holder.id, DUE, DUE - grace)]

    at = plan_for(pol, cluster, [a1, holder, lower], now=DUE - grace)
    assert [(p.job_id, p.for_job, p.kind, p.grace) for p in at.preemptions] == [
        (lower.id, holder.id, "downward", grace)
    ]
    assert reason(at, holder.id) != "WaitingForGrace"  # it still waits for a1

    gone = lifecycle.exited(lifecycle.signalled(lower, DUE - grace, DUE), JobState.REQUEUED, preempted_at=DUE - grace)
    last = plan_for(pol, cluster, [holder, lifecycle.requeued(gone, DUE, backoff=0.0)], now=DUE)  # a1 ended
    assert holder.id in admitted(last)


def test_a_tier4_backfill_is_preempted_at_due_minus_its_grace_and_the_holder_starts_at_due() -> None:
    big = pending("big", "a", 3, gpus=8, replicas=2, submit=0.0)
    scav = pending("scav", "b", 4, gpus=8, submit=50.0)  # no runtime estimate: never ends in time
    _take_back(policy(queues=NO_QUOTA), big, scav, grace=120.0)


def test_a_tier3_job_backfills_a_tier2_reservation_when_its_stretched_lease_ends_before_due_minus_grace() -> None:
    pol = policy(queues=NO_QUOTA, tiers={3: {"lease": "0s", "grace": "10m"}})
    # Lease 0 s, stretched by the efficiency floor to (60 + 30) / (1 − 0.9) = 900 s: over at
    # 1,000 s, long before 10,000 − 600 s.
    big = pending("big", "a", 2, gpus=8, replicas=2, submit=0.0)
    t3 = pending("t3", "b", 3, gpus=8, submit=50.0, time_limit=50_000.0)
    _take_back(pol, big, t3, grace=600.0)


def _backfills(pol: Policy, holder_tier: int, job: Job) -> bool:
    cluster = nodes(2)
    a1 = running("a1", "a", holder_tier, ("n0", 8), started=0.0, time_limit=DUE)
    big = pending("big", "a", holder_tier, gpus=8, replicas=2, submit=0.0)
    plan = plan_for(pol, cluster, [a1, big, job], now=100.0)
    assert [r.job_id for r in plan.reservations] == ["big"]
    if job.id in admitted(plan):
        return True
    assert reason(plan, job.id) == "Reserved"
    return False


def test_a_job_the_holder_could_not_take_back_at_due_minus_grace_backfills_only_if_it_ends_before_due() -> None:
    pol = policy(queues=NO_QUOTA)
    ends_in_time = {"time_limit": 5_000.0}
    # Inside its lease at due − grace: 100 + 45 min ≤ 9,880, but a 3 h lease is not.
    long_lease = pending("t3", "b", 3, submit=50.0, lease=3 * 3600.0)
    assert _backfills(pol, 2, pending("t3", "b", 3, submit=50.0))
    assert not _backfills(pol, 2, long_lease)
    assert _backfills(pol, 2, replace(long_lease, **ends_in_time))
    # Its lease stretched by the efficiency floor: (1,000 + 30) / 0.1 s from its start.
    slow = policy(queues=NO_QUOTA, preemption={"restart_overhead": "1000s"})
    assert not _backfills(slow, 3, pending("t4", "b", 4, submit=50.0))
    assert _backfills(slow, 3, pending("t4", "b", 4, submit=50.0, **ends_in_time))
    # The same tier as the holder.
    assert not _backfills(pol, 3, pending("t3", "b", 3, submit=50.0))
    assert _backfills(pol, 3, pending("t3", "b", 3, submit=50.0, **ends_in_time))
    # No preemption budget left at due − grace (3 per 24 h).
    spent = pending("t4", "b", 4, submit=50.0, preempted_at=(60.0, 70.0, 80.0))
    assert not _backfills(pol, 3, spent)
    assert _backfills(pol, 3, replace(spent, **ends_in_time))
    assert _backfills(pol, 3, replace(spent, preempted_at=(60.0, 70.0)))


def test_a_borrowing_scope_quota_holder_takes_back_a_backfilled_job_of_another_queue() -> None:
    pol = policy()  # a and b: 8 GPUs of nominal each; tier 3 is `scope: quota`
    big = pending("big", "a", 3, gpus=8, replicas=2, submit=0.0)  # 16 GPUs: borrows 8 of b's
    scav = pending("scav", "b", 4, gpus=8, submit=50.0)
    _take_back(pol, big, scav, grace=120.0)


def test_scope_still_protects_a_lower_job_of_another_queue_that_did_not_start_in_reserved_capacity() -> None:
    pol = policy()
    cluster = nodes(2)
    a1 = running("a1", "a", 3, ("n0", 8), started=0.0, time_limit=DUE)
    big = pending("big", "a", 3, gpus=8, replicas=2, submit=0.0)
    scav = running("scav", "b", 4, ("n1", 8), started=100.0)  # started on free capacity
    plan = plan_for(pol, cluster, [a1, big, scav], now=DUE - 120.0)
    assert preempted(plan) == set()
    assert all(r.signal_at is None for r in plan.reservations)
