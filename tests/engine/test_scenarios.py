"""The situations warden exists for, each as one or a few scheduling passes."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

from support import admitted, nodes, pending, plan_for, policy, preempted, reason, running

from warden.engine.model import JobState
from warden.engine.policy import Policy

NO_QUOTA = {"name": "cluster", "children": [{"name": "a"}, {"name": "b"}]}
A_HOLDS_ALL = {"name": "cluster", "children": [{"name": "a", "nominal": {"gpu": 16}}, {"name": "b"}]}
"""Queue a's nominal covers the 16-GPU cluster: its tier-1 jobs (never borrowing, DESIGN §4.2)
may take b's borrowed GPUs as well as wait for a's own."""


def roomy(**overrides: object) -> Policy:
    return policy(queues=A_HOLDS_ALL, **overrides)


def test_tier1_on_full_cluster_preempts_one_victim_then_waits_for_it() -> None:
    pol = roomy()
    cluster = nodes(2)
    a1 = running("a1", "a", 3, ("n0", 8), started=0.0)
    b1 = running("b1", "b", 3, ("n1", 8), started=0.0, last_checkpoint_at=9_000.0)
    p = pending("p", "a", 1, submit=9_990.0)
    plan = plan_for(pol, cluster, [a1, b1, p], now=10_000.0)
    assert admitted(plan) == set()
    assert preempted(plan) == {"b1"}  # b1 checkpointed recently: it loses the least
    pre = plan.preemptions[0]
    assert pre.for_job == "p" and pre.kind == "downward" and pre.grace == 120.0
    assert pre.lost_work == 8 * 1_000.0
    assert reason(plan, "p") == "WaitingForGrace"
    assert plan.explanations["p"].reason.victims == ("b1",)

    # Next pass: b1 is in its grace period. Nobody else is picked for the same need.
    b1_term = replace(b1, state=JobState.PREEMPTING, attempt=replace(b1.attempt, sigterm_at=10_000.0, kill_at=10_120.0))
    plan2 = plan_for(pol, cluster, [a1, b1_term, p], now=10_010.0)
    assert preempted(plan2) == set() and admitted(plan2) == set()
    assert plan2.explanations["p"].reason.victims == ("b1",)
    assert plan2.explanations["p"].reason.eta == 10_120.0

    # b1 has exited: p starts on its node.
    plan3 = plan_for(pol, cluster, [a1, p], now=10_050.0)
    assert admitted(plan3) == {"p"}
    assert plan3.admissions[0].placement[0].node == "n1"


def test_a_preemption_that_would_not_pay_waits_for_capacity_that_frees_by_itself() -> None:
    """Preempting v throws away 8 GPUs × 1,000 s; p could start when v is gone (its 120 s
    grace), so waiting pays unless capacity frees later than 1,000 s after that: at 11,120."""
    cluster = nodes(2)
    v = running("v", "b", 3, ("n1", 8), started=0.0, last_checkpoint_at=9_000.0)
    p = pending("p", "a", 2, submit=9_990.0)

    def first_pass(ends_at: float, **pol: object) -> object:
        soon = running("soon", "a", 3, ("n0", 8), started=0.0, time_limit=ends_at)
        return plan_for(roomy(**pol), cluster, [soon, v, p], now=10_000.0)

    waits = first_pass(10_500.0)
    assert preempted(waits) == set() and admitted(waits) == set()
    why = waits.explanations["p"].reason
    assert why.code == "PreemptionWouldNotPay" and why.victims == ("v",) and why.cost == 8 * 1_000.0
    assert why.frees_at == 10_500.0 and why.reserved_at == 10_500.0  # it holds what frees first
    assert "Preempting job v would throw away 2.22 GPU-hours" in why.message
    assert "frees by itself at t=10500s" in why.message
    assert preempted(first_pass(11_119.0)) == set()
    assert preempted(first_pass(11_121.0)) == {"v"}  # waiting would cost more than v loses
    assert preempted(first_pass(10_500.0, preemption={"only_if_it_pays": False})) == {"v"}


def test_capacity_that_frees_within_the_least_grace_is_waited_for_without_a_search() -> None:
    """No job signalled now is gone before min_grace (120 s): capacity that frees sooner beats
    every victim set, so the reason names none."""
    cluster = nodes(2)
    soon = running("soon", "a", 3, ("n0", 8), started=0.0, time_limit=10_060.0)
    v = running("v", "b", 3, ("n1", 8), started=0.0, last_checkpoint_at=9_000.0)
    p = pending("p", "a", 2, submit=9_990.0)
    waits = plan_for(roomy(), cluster, [soon, v, p], now=10_000.0)
    assert preempted(waits) == set() and admitted(waits) == set()
    why = waits.explanations["p"].reason
    assert why.code == "PreemptionWouldNotPay" and why.victims == () and why.cost == 0.0
    assert why.frees_at == 10_060.0 and why.reserved_at == 10_060.0
    assert why.message.startswith("Capacity frees by itself at t=10060s, before any job preempted now")
    later = running("soon", "a", 3, ("n0", 8), started=0.0, time_limit=10_121.0)
    why = plan_for(roomy(), cluster, [later, v, p], now=10_000.0).explanations["p"].reason
    assert why.code == "PreemptionWouldNotPay" and why.victims == ("v",)  # searched: it could pay


def test_a_starving_job_declines_only_while_it_can_reserve() -> None:
    """Without a reservation to hold what frees by itself, the capacity could go to another job:
    a starving job (it has waited escalate_at × its queue's max wait: 0.75 × 24 h by default)
    then preempts, even if it does not pay."""
    cluster = nodes(2)
    soon = running("soon", "a", 3, ("n0", 8), started=0.0, time_limit=100_060.0)
    v = running("v", "b", 3, ("n1", 8), started=0.0, last_checkpoint_at=99_000.0)
    no_reservations = roomy(scheduling={"reservations": 0})
    fresh = pending("p", "a", 2, submit=99_990.0)
    plan = plan_for(no_reservations, cluster, [soon, v, fresh], now=100_000.0)
    assert preempted(plan) == set()
    assert plan.explanations["p"].reason.code == "PreemptionWouldNotPay"
    assert plan.explanations["p"].reason.reserved_at is None
    not_yet = pending("p", "a", 2, submit=100_000.0 - 0.75 * 86_400.0 + 1.0)  # a second short of starving
    assert preempted(plan_for(no_reservations, cluster, [soon, v, not_yet], now=100_000.0)) == set()
    starving = pending("p", "a", 2, submit=100_000.0 - 0.75 * 86_400.0)  # 18 h of the default 24 h
    assert preempted(plan_for(no_reservations, cluster, [soon, v, starving], now=100_000.0)) == {"v"}
    assert preempted(plan_for(roomy(), cluster, [soon, v, starving], now=100_000.0)) == set()


def test_a_victim_that_loses_nothing_is_preempted_unless_capacity_frees_before_it_is_gone() -> None:
    cluster = nodes(2)
    v = running("v", "b", 3, ("n1", 8), started=0.0, sigterm_save_s=30.0)  # saves within its grace
    p = pending("p", "a", 2, submit=9_990.0)

    def preempted_when_soon_ends_at(end: float) -> set[str]:
        soon = running("soon", "a", 3, ("n0", 8), started=0.0, time_limit=end)
        return preempted(plan_for(roomy(), cluster, [soon, v, p], now=10_000.0))

    assert preempted_when_soon_ends_at(10_500.0) == {"v"}  # gone at 10,120, losing nothing
    assert preempted_when_soon_ends_at(10_110.0) == set()  # frees before v would be gone


def test_job_inside_its_lease_is_not_preempted() -> None:
    pol = policy()
    cluster = nodes(1)
    v = running("v", "a", 3, ("n0", 8), started=1_000.0)  # tier 3 lease: 45 min
    p = pending("p", "b", 2, submit=1_500.0)
    plan = plan_for(pol, cluster, [v, p], now=2_000.0)
    assert preempted(plan) == set()
    r = plan.explanations["p"].reason
    assert r.code == "WaitingForLease" and r.victims == ("v",) and r.earliest_at == 1_000.0 + 2_700.0
    later = plan_for(pol, cluster, [v, p], now=1_000.0 + 2_700.0)
    assert preempted(later) == {"v"}


def test_victim_choice_prefers_least_lost_work_over_newest() -> None:
    pol = policy()
    cluster = nodes(2)
    old = running("old", "a", 3, ("n0", 8), started=0.0, sigterm_save_s=30.0)
    new = running("new", "a", 3, ("n1", 8), started=5_000.0)
    p = pending("p", "b", 2, submit=9_000.0)
    plan = plan_for(pol, cluster, [old, new, p], now=10_000.0)
    # The newest job would lose 5,000 s × 8 GPUs; the old one saves on SIGTERM within its grace.
    assert preempted(plan) == {"old"}
    assert plan.preemptions[0].lost_work == 0.0


def test_sigterm_save_longer_than_grace_counts_as_lost_work() -> None:
    pol = policy()
    cluster = nodes(2)
    slow_save = running("slow", "a", 3, ("n0", 8), started=0.0, sigterm_save_s=500.0, last_checkpoint_at=4_000.0)
    recent = running("recent", "a", 3, ("n1", 8), started=0.0, last_checkpoint_at=9_000.0)
    p = pending("p", "b", 2, submit=9_000.0)
    plan = plan_for(pol, cluster, [slow_save, recent, p], now=10_000.0)
    assert preempted(plan) == {"recent"}


def test_gang_is_evicted_whole() -> None:
    pol = policy()
    cluster = nodes(2)
    gang = running("gang", "a", 3, [("n0", 8), ("n1", 8)], started=0.0)
    p = pending("p", "b", 2, submit=9_000.0)
    plan = plan_for(pol, cluster, [gang, p], now=10_000.0)
    assert [x.job_id for x in plan.preemptions] == ["gang"]
    assert plan.preemptions[0].lost_work == 16 * 10_000.0
    assert plan.preemptions[0].cost == 16 * 10_000.0


def test_minimal_victim_set_drops_unneeded_victims() -> None:
    pol = policy(queues=NO_QUOTA)
    cluster = nodes(2)
    cheap_small = running("cheap", "a", 3, ("n0", 4), started=0.0, last_checkpoint_at=9_900.0)
    other_small = running("other", "a", 3, ("n0", 4), started=0.0, first_gpu=4, last_checkpoint_at=9_000.0)
    whole = running("whole", "a", 3, ("n1", 8), started=0.0, last_checkpoint_at=9_800.0)
    p = pending("p", "b", 2, gpus=8, placement="pack", submit=9_000.0)
    plan = plan_for(pol, cluster, [cheap_small, other_small, whole, p], now=10_000.0)
    # Greedy by cost takes `cheap` (800) then `whole` (1,600); `cheap` alone frees only 4 GPUs on
    # n0, so the minimal set is {whole}.
    assert preempted(plan) == {"whole"}


def test_no_head_of_line_blocking_small_job_passes_a_big_one() -> None:
    pol = policy(queues=NO_QUOTA, scheduling={"reservations": 0})
    cluster = nodes(2)
    a1 = running("a1", "a", 3, ("n0", 8), started=0.0)
    big = pending("big", "a", 3, gpus=8, replicas=2, submit=0.0)
    small = pending("small", "b", 3, gpus=4, submit=10.0)
    plan = plan_for(pol, cluster, [a1, big, small], now=100.0)
    assert admitted(plan) == {"small"}
    assert reason(plan, "big") == "InsufficientCapacity"
    assert plan.explanations["big"].position < plan.explanations.get("small", plan.explanations["big"]).position + 1


def test_reservation_lets_only_jobs_that_end_in_time_backfill() -> None:
    pol = policy(queues=NO_QUOTA)
    cluster = nodes(2)
    a1 = running("a1", "a", 3, ("n0", 8), started=0.0, time_limit=1_000.0)
    big = pending("big", "a", 3, gpus=8, replicas=2, submit=0.0)
    short = pending("short", "b", 3, gpus=4, submit=10.0, time_limit=500.0)
    long = pending("long", "b", 3, gpus=4, submit=20.0, time_limit=5_000.0)
    scavenger = pending("scav", "b", 4, gpus=4, submit=30.0)
    plan = plan_for(pol, cluster, [a1, big, short, long, scavenger], now=100.0)
    # The tier-4 job could not be taken back at due − its grace (880 s): the efficiency floor
    # protects it until (60 + 30) / (1 − 0.9) s after its start, 1,000 s.
    assert admitted(plan) == {"short"}
    assert reason(plan, "scav") == "Reserved"
    r = plan.explanations["big"].reason
    assert r.code == "InsufficientCapacity" and r.reserved_at == 1_000.0
    assert [(x.job_id, x.due, x.waits_for) for x in plan.reservations] == [("big", 1_000.0, ("a1",))]
    long_reason = plan.explanations["long"].reason
    assert long_reason.code == "Reserved" and long_reason.for_job == "big"


def test_tier4_backfill_is_preempted_when_the_reservation_is_due() -> None:
    pol = policy(queues=NO_QUOTA)
    cluster = nodes(2)
    a1 = running("a1", "a", 3, ("n0", 8), started=0.0, time_limit=1_000.0)
    scav = running("scav", "b", 4, ("n1", 8), started=150.0)
    big = pending("big", "a", 3, gpus=8, replicas=2, submit=0.0)
    plan = plan_for(pol, cluster, [scav, big], now=1_000.0)  # a1 has ended
    assert preempted(plan) == {"scav"}
    assert plan.preemptions[0].kind == "downward"
    assert reason(plan, "big") == "WaitingForGrace"
    del a1


def test_lender_reclaims_borrowed_quota_from_same_tier() -> None:
    pol = policy()
    cluster = nodes(2)
    a1 = running("a1", "a", 3, ("n0", 8), started=0.0)
    a2 = running("a2", "a", 3, ("n1", 8), started=0.0, last_checkpoint_at=9_500.0)
    b1 = pending("b1", "b", 3, submit=9_000.0)
    plan = plan_for(pol, cluster, [a1, a2, b1], now=10_000.0)
    assert preempted(plan) == {"a2"}
    assert plan.preemptions[0].kind == "reclaim"


def test_no_reclaim_from_a_queue_within_its_nominal() -> None:
    pol = policy()
    cluster = nodes(2)
    a1 = running("a1", "a", 3, ("n0", 8), started=0.0)
    b0 = running("b0", "b", 3, ("n1", 8), started=0.0)
    b1 = pending("b1", "b", 3, submit=9_000.0)
    plan = plan_for(pol, cluster, [a1, b0, b1], now=10_000.0)
    assert preempted(plan) == set() and admitted(plan) == set()
    assert reason(plan, "b1") in {"QuotaExceeded", "BorrowingLimit", "InsufficientCapacity"}


def test_borrowing_job_may_not_preempt_other_queues() -> None:
    pol = policy()
    cluster = nodes(3)
    a1 = running("a1", "a", 3, ("n0", 8), started=0.0)
    b1 = running("b1", "b", 4, ("n1", 8), started=0.0)
    other = running("a-scav", "a", 4, ("n2", 8), started=0.0)
    p = pending("p", "a", 3, submit=9_000.0)  # a is at nominal: p would borrow
    plan = plan_for(pol, cluster, [a1, b1, other, p], now=10_000.0)
    # Scope `quota`: a borrowing job may only preempt inside its own queue.
    assert preempted(plan) == {"a-scav"}


def test_thrash_budget_protects_a_job_preempted_too_often() -> None:
    pol = policy()
    cluster = nodes(1)
    now = 100_000.0
    victim = running("v", "a", 3, ("n0", 8), started=0.0, preempted_at=(now - 3_000.0, now - 2_000.0, now - 1_000.0))
    p = pending("p", "b", 2, submit=now - 10)
    plan = plan_for(pol, cluster, [victim, p], now=now)
    assert preempted(plan) == set()
    r = plan.explanations["p"].reason
    assert r.code == "WaitingForLease" and r.earliest_at == now - 3_000.0 + 86_400.0
    two = replace(victim, preempted_at=victim.preempted_at[1:])
    assert preempted(plan_for(pol, cluster, [two, p], now=now)) == {"v"}


def test_efficiency_floor_stretches_the_lease() -> None:
    pol = policy()
    cluster = nodes(1)
    victim = running("v", "a", 3, ("n0", 8), started=0.0, startup_s=600.0)
    p = pending("p", "b", 2, submit=2_900.0)
    # Past the 45-minute lease, but with the save a preemption forces (assumed 30 s: none
    # reported yet) η = (3000 − 600 − 30) / 3000 = 0.79 < 0.9: protected until
    # (600 + 30) / (1 − 0.9) = 6,300 s.
    plan = plan_for(pol, cluster, [victim, p], now=3_000.0)
    assert preempted(plan) == set()
    r = plan.explanations["p"].reason
    assert r.code == "WaitingForLease" and abs(r.earliest_at - 6_300.0) < 1e-6
    assert preempted(plan_for(pol, cluster, [victim, p], now=6_000.0)) == set()
    assert preempted(plan_for(pol, cluster, [victim, p], now=6_300.0)) == {"v"}


def test_thrash_loop_long_job_is_preempted_at_most_budget_times() -> None:
    """Short tier-2 jobs keep arriving; the long tier-3 job B still makes progress."""
    pol = policy(queues=NO_QUOTA)
    cluster = nodes(1)
    now = 0.0
    b = running("B", "a", 3, ("n0", 8), started=0.0, startup_s=60.0)
    preemptions: list[float] = []
    for k in range(12):
        now += 3_000.0  # each short job arrives just after B's lease (45 min) has run out
        short = pending(f"s{k}", "b", 2, submit=now)
        plan = plan_for(pol, cluster, [b, short], now=now)
        if "B" in preempted(plan):
            preemptions.append(now)
            # B exits at once, the short job runs 60 s, then B restarts (a new attempt).
            b = replace(
                b,
                preempted_at=(*b.preempted_at, now),
                attempt=replace(b.attempt, started_at=now + 60.0, number=b.attempt.number + 1),
            )
    in_window = [t for t in preemptions if t > now - 86_400.0]
    assert 1 <= len(in_window) <= 3
    # Every restart ran at least its lease before the next preemption.
    assert all(t2 - t1 >= 2_700.0 for t1, t2 in pairwise(preemptions))


def test_awaiting_approval_never_starts() -> None:
    plan = plan_for(policy(), nodes(1), [pending("p", "a", 2, state=JobState.AWAITING_APPROVAL)], now=0.0)
    assert admitted(plan) == set() and reason(plan, "p") == "AwaitingApproval"


def test_requeue_backoff_holds_the_job() -> None:
    plan = plan_for(policy(), nodes(1), [pending("p", "a", 3, not_before=50.0)], now=10.0)
    assert reason(plan, "p") == "ThrashBackoff" and plan.explanations["p"].reason.until == 50.0
    assert admitted(plan_for(policy(), nodes(1), [pending("p", "a", 3, not_before=50.0)], now=50.0)) == {"p"}


def test_unpreemptible_tier_is_never_a_victim() -> None:
    pol = policy()
    serve = running("serve", "a", 1, ("n0", 8), started=0.0)
    p = pending("p", "b", 1, submit=5.0)
    plan = plan_for(pol, nodes(1), [serve, p], now=100_000.0)
    assert preempted(plan) == set()


def test_equal_tier_never_preempts_without_reclaim() -> None:
    pol = policy(queues=NO_QUOTA)
    v = running("v", "a", 3, ("n0", 8), started=0.0)
    p = pending("p", "b", 3, submit=5.0)
    assert preempted(plan_for(pol, nodes(1), [v, p], now=100_000.0)) == set()
