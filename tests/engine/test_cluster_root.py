"""DESIGN §4.2: the root is the cluster, and a tier that is not preemptible never borrows.

The root's limit is the capacity the nodes report, so capacity no queue's nominal covers is idle
capacity any queue may borrow (within its borrowing limit, and the lenders' lending limits, also
at the root). A job of a tier with `preemptible: false` (tier 1) is admitted only in-quota:
directly, or after a preemption whose victims leave it within nominal on its whole path.
"""

from __future__ import annotations

from typing import Any

from support import admitted, nodes, pending, plan_for, policy, preempted, running

from warden.engine.reasons import BorrowingLimit, QuotaExceeded

ONE_TEAM = {"queues": {"name": "cluster", "children": [{"name": "a", "nominal": {"gpu": 8}}]}}


def one_team(**a: Any) -> Any:
    return policy(queues={"name": "cluster", "children": [{"name": "a", "nominal": {"gpu": 8}, **a}]})


def test_capacity_no_nominal_covers_is_borrowed() -> None:
    """32 GPUs, one queue of nominal 8: a tier-3 job of 16 GPUs starts, borrowing."""
    plan = plan_for(one_team(), nodes(4), [pending("big", "a", 3, gpus=8, replicas=2)], now=0.0)
    assert admitted(plan) == {"big"}
    assert plan.admissions[0].borrowing
    whole = plan_for(one_team(), nodes(4), [pending("all", "a", 3, gpus=8, replicas=4)], now=0.0)
    assert admitted(whole) == {"all"}


def test_the_borrowing_limit_still_caps_the_uncovered_capacity() -> None:
    pol = one_team(borrowing_limit={"gpu": 8})
    plan = plan_for(pol, nodes(4), [pending("big", "a", 3, gpus=8, replicas=3)], now=0.0)
    assert admitted(plan) == set()
    why = plan.explanations["big"].reason
    assert isinstance(why, BorrowingLimit) and (why.queue, why.available, why.limit) == ("a", 16, 16)


def test_lending_limits_hold_at_the_root() -> None:
    """32 GPUs; b keeps all of its 8 (lending limit 0): a may have 32 − 8 = 24, and b its 8."""
    pol = policy(
        queues={
            "name": "cluster",
            "children": [
                {"name": "a", "nominal": {"gpu": 8}},
                {"name": "b", "nominal": {"gpu": 8}, "lending_limit": {"gpu": 0}},
            ],
        }
    )
    jobs = [
        pending("a32", "a", 3, gpus=8, replicas=4, submit=0.0),
        pending("a24", "a", 3, gpus=8, replicas=3, submit=1.0),
        pending("b8", "b", 3, gpus=8, submit=2.0),
    ]
    plan = plan_for(pol, nodes(4), jobs, now=10.0)
    assert admitted(plan) == {"a24", "b8"}
    why = plan.explanations["a32"].reason
    assert isinstance(why, BorrowingLimit) and why.available == 24


def test_a_tier_1_job_that_would_borrow_waits_saying_its_tier_cannot_borrow() -> None:
    plan = plan_for(one_team(), nodes(4), [pending("p", "a", 1, gpus=8, replicas=2)], now=0.0)
    assert admitted(plan) == set() and preempted(plan) == set() and plan.reservations == ()
    why = plan.explanations["p"].reason
    assert isinstance(why, QuotaExceeded)
    assert (why.queue, why.resource, why.requested, why.available, why.used, why.limit) == ("a", "gpu", 16, 8, 0, 8)
    assert why.no_borrow_tier == 1
    assert why.message.startswith(
        "Tier 1 is not preemptible, so its jobs never borrow: queue a uses 0 of its nominal 8 gpu (8 left)"
    )


def test_a_tier_1_job_waits_while_it_would_borrow_and_starts_once_in_quota() -> None:
    """Its queue's own tier-1 job holds the nominal (not preemptible: no victim either); once
    that job has ended, the waiting one starts, in-quota, though 24 GPUs were idle all along."""
    held = running("r", "a", 1, ("n0", 8), started=0.0, time_limit=500.0)
    p = pending("p", "a", 1, submit=10.0)
    plan = plan_for(one_team(), nodes(4), [held, p], now=100.0)
    assert admitted(plan) == set() and preempted(plan) == set()
    why = plan.explanations["p"].reason
    assert isinstance(why, QuotaExceeded) and why.no_borrow_tier == 1 and (why.used, why.limit) == (8, 8)
    assert why.frees_at == 500.0 and why.frees_by == "r"
    later = plan_for(one_team(), nodes(4), [p], now=600.0)
    assert admitted(later) == {"p"} and not later.admissions[0].borrowing


def test_a_tier_1_job_preempts_in_its_own_queue_rather_than_borrow() -> None:
    """a and b each run a tier-3 job at their nominal 8 on a full 16-GPU cluster. Evicting b's
    (which checkpointed recently) would cost less, but would leave the tier-1 job borrowing
    (a's own 8 still held): it takes a's job, and starts within a's nominal."""
    a1 = running("a1", "a", 3, ("n0", 8), started=0.0)
    b1 = running("b1", "b", 3, ("n1", 8), started=0.0, last_checkpoint_at=9_000.0)
    p = pending("p", "a", 1, submit=9_990.0)
    plan = plan_for(policy(), nodes(2), [a1, b1, p], now=10_000.0)
    assert preempted(plan) == {"a1"}
    assert plan.explanations["p"].reason.victims == ("a1",)  # type: ignore[attr-defined]
    after = plan_for(policy(), nodes(2), [b1, p], now=10_200.0)
    assert admitted(after) == {"p"} and not after.admissions[0].borrowing


def test_a_tier_1_job_never_preempts_its_way_into_borrowing() -> None:
    """No victim set can bring a 16-GPU tier-1 job within a's nominal 8: it preempts nobody,
    though b's lower-tier jobs would free the GPUs, and waits with its tier's reason."""
    b1 = running("b1", "b", 3, ("n0", 8), started=0.0)
    b2 = running("b2", "b", 4, ("n1", 8), started=0.0)
    p = pending("p", "a", 1, gpus=8, replicas=2, submit=9_990.0)
    plan = plan_for(policy(), nodes(2), [b1, b2, p], now=10_000.0)
    assert preempted(plan) == set() and admitted(plan) == set()
    why = plan.explanations["p"].reason
    assert isinstance(why, QuotaExceeded) and why.no_borrow_tier == 1 and why.queue == "a"


def test_an_uncharged_tier_that_is_not_preemptible_is_not_quota_governed() -> None:
    """Quota does not count a tier that is not charged: it runs on whatever is idle."""
    pol = policy(
        queues=ONE_TEAM["queues"],
        tiers={1: {"name": "free-inference", "preemptible": False, "charged": False, "grace": "300s"}},
    )
    plan = plan_for(pol, nodes(4), [pending("p", "a", 1, gpus=8, replicas=3)], now=0.0)
    assert admitted(plan) == {"p"}
