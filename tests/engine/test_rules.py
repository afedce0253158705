"""Who may preempt whom (DESIGN §4.3) and what a victim costs (§4.4), rule by rule.

Each rule gets a preemptor P and a candidate victim V and either lets V be taken (None) or
blocks it until a time (inf: time will not help). Expectations come from the DESIGN text.
"""

from __future__ import annotations

import math
from dataclasses import replace
from random import Random
from typing import Any

import pytest
from support import DESIGN_QUEUES, nodes, pending, plan_for, policy, preempted, running

from warden.engine.model import Job
from warden.engine.policy import Policy, parse_policy
from warden.engine.quota import QuotaTree
from warden.engine.rules import (
    PAIR_READS,
    PAIR_RULES,
    RULES,
    VICTIM_RULES,
    Block,
    PairRule,
    Preemptor,
    RuleContext,
    allowed,
    blocks,
    checkpoint_of,
    closes_at,
    direction,
    downward_key,
    efficiency,
    efficiency_floor,
    grace_of,
    guarded,
    lease,
    lease_of,
    lost_work,
    pair_key,
    preemptible,
    preemptors,
    protection,
    scope,
    startup_of,
    thrash_budget,
    victim_cost,
)

INF = math.inf
HOUR = 3600.0
DAY = 24 * HOUR


def ctx(pol: Policy, now: float = 0.0, usage: dict[str, float] | None = None) -> RuleContext:
    """A context whose quota tree holds `usage` GPUs per leaf."""
    tree = QuotaTree(pol)
    for leaf, gpus in (usage or {}).items():
        tree.add(leaf, (float(gpus),))
    return RuleContext(pol, tree, now)


def pre(job: Job, in_quota: bool = True) -> Preemptor:
    return Preemptor(job, in_quota, (float(job.total_gpus),))


def victim(queue: str = "a", tier: int = 3, started: float = 0.0, **kw: Any) -> Job:
    return running("v", queue, tier, ("n0", 8), started=started, **kw)


# ---------------------------------------------------------------------------- direction


@pytest.mark.parametrize("p_tier,v_tier", [(1, 2), (1, 4), (2, 3), (3, 4)])
def test_downward_preemption_is_allowed(p_tier: int, v_tier: int) -> None:
    c = ctx(policy())
    assert direction(c, pre(pending("p", "b", p_tier)), victim("a", v_tier)) is None
    # Downward does not need P to be in-quota nor V to borrow, and works inside one queue too.
    assert direction(c, pre(pending("p", "a", p_tier), in_quota=False), victim("a", v_tier)) is None


@pytest.mark.parametrize("p_tier,v_tier", [(2, 1), (3, 2), (4, 3), (3, 3), (4, 4)])
def test_upward_or_same_tier_without_reclaim_is_blocked(p_tier: int, v_tier: int) -> None:
    c = ctx(policy())  # nobody over nominal
    b = direction(c, pre(pending("p", "b", p_tier)), victim("a", v_tier))
    assert b is not None and b.until == INF


def test_reclaim_same_tier_from_a_queue_over_its_nominal() -> None:
    c = ctx(policy(), usage={"a": 16})  # a borrowed b's 8
    assert direction(c, pre(pending("p", "b", 3)), victim("a", 3)) is None


def test_reclaim_needs_the_victims_side_over_nominal() -> None:
    c = ctx(policy(), usage={"a": 8})  # a exactly at nominal
    assert direction(c, pre(pending("p", "b", 3)), victim("a", 3)) == Block("direction")


def test_reclaim_needs_the_preemptor_in_quota() -> None:
    c = ctx(policy(), usage={"a": 16})
    b = direction(c, pre(pending("p", "b", 3), in_quota=False), victim("a", 3))
    assert b is not None and b.until == INF


def test_nominal_reclaim_takes_any_tier_unless_the_policy_says_not_higher() -> None:
    """Borrowed capacity is reclaimable by its lender whatever the borrower's tier (DESIGN §4.3)."""
    c = ctx(policy(), usage={"a": 16})
    assert direction(c, pre(pending("p", "b", 3)), victim("a", 2)) is None
    pol = policy(preemption={"reclaim": {"nominal": "not_higher"}})
    assert direction(ctx(pol, usage={"a": 16}), pre(pending("p", "b", 3)), victim("a", 2)) is not None


def test_same_tier_same_queue_is_never_preempted() -> None:
    c = ctx(policy(), usage={"a": 16})  # a over nominal; P in a
    b = direction(c, pre(pending("p", "a", 3)), victim("a", 3))
    assert b is not None and b.until == INF


def test_uncharged_victim_is_not_reclaimed_by_the_same_tier() -> None:
    c = ctx(policy(), usage={"a": 16})
    assert direction(c, pre(pending("p", "b", 4)), victim("a", 4)) is not None


def test_reclaim_between_sibling_teams_of_a_department() -> None:
    # vision borrowed language's nominal inside research; research itself is within its 64.
    c = ctx(parse_policy({"queues": DESIGN_QUEUES}), usage={"vision": 60})
    v = victim("vision", 3)
    assert direction(c, pre(pending("p", "language", 3)), v) is None
    # platform is not owed anything: the borrowing stayed inside research.
    assert direction(c, pre(pending("p", "platform", 3)), v) is not None


def test_reclaim_across_departments_when_the_department_borrowed() -> None:
    c = ctx(parse_policy({"queues": DESIGN_QUEUES}), usage={"vision": 30, "language": 50})  # research at 80
    assert direction(c, pre(pending("p", "platform", 3)), victim("vision", 3)) is None
    assert direction(c, pre(pending("p", "platform", 3)), victim("language", 3)) is None
    # vision is within its own nominal: language (same department) has nothing to reclaim from it.
    assert direction(c, pre(pending("p", "language", 3)), victim("vision", 3)) is not None


# -------------------------------------------------------------------------------- scope


def test_quota_scope_in_quota_preemptor_may_preempt_anywhere() -> None:
    c = ctx(policy())
    assert scope(c, pre(pending("p", "b", 3), in_quota=True), victim("a", 4)) is None


def test_quota_scope_borrowing_preemptor_only_inside_its_own_queue() -> None:
    c = ctx(policy())
    p = pre(pending("p", "a", 3), in_quota=False)
    assert scope(c, p, victim("a", 4)) is None
    b = scope(c, p, victim("b", 4))
    assert b == Block("scope") and b.until == INF


def test_cluster_scope_preempts_anywhere_even_when_borrowing() -> None:
    c = ctx(policy())  # tier 1 has scope: cluster by default
    assert scope(c, pre(pending("p", "a", 1), in_quota=False), victim("b", 3)) is None


def test_scope_follows_the_policy() -> None:
    c = ctx(policy(tiers={2: {"scope": "cluster"}, 1: {"scope": "quota"}}))
    assert scope(c, pre(pending("p", "a", 2), in_quota=False), victim("b", 3)) is None
    assert scope(c, pre(pending("p", "a", 1), in_quota=False), victim("b", 3)) is not None


# -------------------------------------------------------------------------- preemptible


@pytest.mark.parametrize("v_tier,allowed", [(1, False), (2, True), (3, True), (4, True)])
def test_default_preemptible_tiers(v_tier: int, allowed: bool) -> None:
    b = preemptible(ctx(policy()), victim("a", v_tier))
    assert (b is None) == allowed
    if b is not None:
        assert b.until == INF


def test_preemptible_follows_the_policy() -> None:
    c = ctx(policy(tiers={3: {"preemptible": False}}))
    assert preemptible(c, victim("a", 3)) is not None


# -------------------------------------------------------------------------------- lease


def test_tier_lease_protects_until_it_has_run_out() -> None:
    pol = policy()  # tier 3: 45 min
    v = victim("a", 3, started=1_000.0)
    assert lease(ctx(pol, now=1_000.0 + 2_699.0), v) == Block("lease", 3_700.0)
    assert lease(ctx(pol, now=3_700.0), v) is None
    assert lease(ctx(pol, now=10_000.0), v) is None


def test_job_lease_overrides_the_tiers() -> None:
    pol = policy()
    short = victim("a", 3, started=0.0, lease=600.0)
    assert lease(ctx(pol, now=599.0), short) == Block("lease", 600.0)
    assert lease(ctx(pol, now=600.0), short) is None
    zero = victim("a", 2, started=0.0, lease=0.0)  # tier 2's 4 h lease does not apply
    assert lease(ctx(pol, now=0.0), zero) is None


def test_job_lease_is_capped_at_max_lease() -> None:
    pol = policy()  # max_lease 8h
    v = victim("a", 3, started=0.0, lease=10 * HOUR)
    assert lease_of(pol, v) == 8 * HOUR
    assert lease(ctx(pol, now=8 * HOUR - 1), v) == Block("lease", 8 * HOUR)
    assert lease(ctx(pol, now=8 * HOUR), v) is None


def test_lease_counts_from_the_start_of_the_current_attempt() -> None:
    pol = policy()
    v = victim("a", 3, started=0.0)
    restarted = replace(v, attempt=replace(v.attempt, number=2, started_at=10_000.0))
    assert lease(ctx(pol, now=11_000.0), restarted) == Block("lease", 12_700.0)


def test_job_without_an_attempt_is_never_a_victim() -> None:
    b = lease(ctx(policy(), now=1e9), pending("x", "a", 4))
    assert b is not None and b.until == INF


# -------------------------------------------------------------------------- thrash budget


def test_thrash_budget_allows_fewer_than_count_preemptions_in_the_window() -> None:
    pol = policy()  # 3 per 24h
    now = 10 * DAY
    v = victim("a", 3, preempted_at=(now - 2 * HOUR, now - HOUR))
    assert thrash_budget(ctx(pol, now=now), v) is None


def test_thrash_budget_spent_blocks_until_the_oldest_leaves_the_window() -> None:
    pol = policy()
    now = 10 * DAY
    v = victim("a", 3, preempted_at=(now - 3 * HOUR, now - 2 * HOUR, now - HOUR))
    assert thrash_budget(ctx(pol, now=now), v) == Block("thrash_budget", now - 3 * HOUR + DAY)
    # One second before that it is still blocked; at that time the oldest no longer counts.
    until = now - 3 * HOUR + DAY
    assert thrash_budget(ctx(pol, now=until - 1), v) is not None
    assert thrash_budget(ctx(pol, now=until), v) is None


def test_thrash_budget_with_more_than_count_waits_for_enough_to_expire() -> None:
    pol = policy()
    now = 10 * DAY
    times = (now - 4 * HOUR, now - 3 * HOUR, now - 2 * HOUR, now - HOUR)
    v = victim("a", 3, preempted_at=times)
    # 4 in the window, at most 2 may remain: the second oldest must leave it.
    assert thrash_budget(ctx(pol, now=now), v) == Block("thrash_budget", now - 3 * HOUR + DAY)


def test_thrash_budget_ignores_preemptions_outside_the_window() -> None:
    pol = policy()
    now = 10 * DAY
    v = victim("a", 3, preempted_at=(now - 3 * DAY, now - DAY - 1, now - DAY, now - HOUR))
    assert thrash_budget(ctx(pol, now=now), v) is None


def test_thrash_budget_from_the_policy() -> None:
    pol = policy(thrash={"max_preemptions": {"per": "1h", "count": 1}})
    v = victim("a", 3, preempted_at=(5_000.0,))
    assert thrash_budget(ctx(pol, now=5_100.0), v) == Block("thrash_budget", 8_600.0)
    assert thrash_budget(ctx(pol, now=8_600.0), v) is None


# ------------------------------------------------------------------------ efficiency floor


def test_efficiency_formula() -> None:
    pol = policy()
    v = victim("a", 3, started=0.0, startup_s=600.0, checkpoint_s=900.0, sigterm_save_s=300.0)
    assert efficiency(pol, v, 3_000.0) == pytest.approx((3_000 - 900) / 3_000)
    assert efficiency(pol, v, 9_000.0) == pytest.approx(0.9)
    # restart_overhead 60 s and, before a first save, one checkpoint_overhead of 30 s assumed
    unknown = victim("a", 3, started=0.0, startup_s=None)
    assert efficiency(pol, unknown, 600.0) == pytest.approx((600 - 90) / 600)
    assert efficiency(pol, unknown, 900.0) == pytest.approx(0.9)


def test_efficiency_floor_stretches_the_lease() -> None:
    pol = policy()  # min_efficiency 0.9
    v = victim("a", 3, started=1_000.0, startup_s=600.0, checkpoint_s=300.0, sigterm_save_s=300.0)
    # η ≥ 0.9 once T_run ≥ (600 + 300) / (1 − 0.9) = 9,000 s.
    until = 1_000.0 + 9_000.0
    b = efficiency_floor(ctx(pol, now=5_000.0), v)
    assert b is not None and b.rule == "efficiency" and b.until == pytest.approx(until)
    assert efficiency_floor(ctx(pol, now=until - 1), v) is not None
    assert efficiency_floor(ctx(pol, now=until), v) is None


def test_efficiency_floor_uses_restart_overhead_when_startup_is_unknown() -> None:
    pol = policy(preemption={"restart_overhead": "5m"}, thrash={"min_efficiency": 0.75})
    v = victim("a", 3, started=0.0, startup_s=None)
    assert startup_of(pol, v) == 300.0
    b = efficiency_floor(ctx(pol, now=100.0), v)
    # with one save of checkpoint_overhead (30 s): the job has not saved yet
    assert b is not None and b.until == pytest.approx((300.0 + 30.0) / 0.25)


def test_before_its_first_save_the_floor_counts_one_assumed_save() -> None:
    pol = policy(preemption={"checkpoint_overhead": "40s"}, thrash={"min_efficiency": 0.8})
    v = victim("a", 3, started=1_000.0, startup_s=60.0)
    assert checkpoint_of(pol, v) == 40.0
    until = 1_000.0 + (60.0 + 40.0) / 0.2
    b = efficiency_floor(ctx(pol, now=1_100.0), v)
    assert b is not None and b.until == pytest.approx(until)
    assert efficiency_floor(ctx(pol, now=until - 1), v) is not None
    assert efficiency_floor(ctx(pol, now=until), v) is None


def test_before_its_first_save_a_known_save_duration_is_counted_once() -> None:
    pol = policy(preemption={"checkpoint_overhead": "40s"}, thrash={"min_efficiency": 0.8})
    v = victim("a", 3, started=1_000.0, startup_s=60.0, sigterm_save_s=15.0)
    assert checkpoint_of(pol, v) == 15.0
    b = efficiency_floor(ctx(pol, now=1_100.0), v)
    assert b is not None and b.until == pytest.approx(1_000.0 + (60.0 + 15.0) / 0.2)


def test_after_a_save_the_floor_counts_one_save_the_last_measured() -> None:
    pol = policy(preemption={"checkpoint_overhead": "40s"}, thrash={"min_efficiency": 0.8})
    v = victim("a", 3, started=1_000.0, startup_s=60.0, checkpoint_s=50.0, sigterm_save_s=25.0)
    assert checkpoint_of(pol, v) == 25.0  # two saves of 25 s so far: one counts, not the sum
    b = efficiency_floor(ctx(pol, now=1_100.0), v)
    assert b is not None and b.until == pytest.approx(1_000.0 + (60.0 + 25.0) / 0.2)


def test_no_number_of_reported_saves_moves_the_floor() -> None:
    """A job that reports a save of 1 s every second has spent as long saving as it has run;
    the floor counts one save of 1 s all the same, so it lifts at one fixed time."""
    pol = policy()  # min_efficiency 0.9
    lifts = []
    for ran in (100.0, 1_000.0, 5_000.0):
        v = victim("a", 3, started=0.0, startup_s=5.0, checkpoint_s=ran, sigterm_save_s=1.0, last_checkpoint_at=ran)
        b = efficiency_floor(ctx(pol, now=ran - 50.0), v)
        lifts.append(None if b is None else b.until)
    assert lifts[0] == pytest.approx((5.0 + 1.0) / 0.1) and lifts[1:] == [None, None]


def test_the_stretched_lease_never_runs_past_max_lease() -> None:
    pol = policy(max_lease="1h", tiers={2: {"lease": "1h"}}, thrash={"min_efficiency": 0.99})  # 90 s / 0.01 = 2.5 h
    v = victim("a", 3, started=1_000.0, startup_s=None)
    b = efficiency_floor(ctx(pol, now=1_100.0), v)
    assert b is not None and b.until == pytest.approx(1_000.0 + 3_600.0)
    assert efficiency_floor(ctx(pol, now=1_000.0 + 3_600.0), v) is None


def test_the_thrash_guard_never_holds_back_a_tier_1_preemptor() -> None:
    """Tier 1 is bound by its victims' leases alone: the efficiency floor and the preemption
    budget protect a victim from tiers 2–4 and from reclaims, not from production."""
    pol = policy(tiers={4: {"lease": "0s"}, 3: {"lease": "10m"}})
    spent = (5_000.0, 5_100.0, 5_200.0)  # the budget used up: 3 in 24 h
    for v in (victim("a", 4, started=5_900.0, startup_s=None), victim("a", 4, started=5_300.0, preempted_at=spent)):
        c = ctx(pol, now=6_000.0)
        assert protection(c, v) > 6_000.0  # held from tiers 2–4
        assert protection(c, v, guard=False) == 0.0  # not from tier 1
        assert guarded(2, v.tier) and guarded(3, v.tier) and not guarded(1, v.tier)
    leased = victim("a", 3, started=5_800.0, startup_s=None)  # inside its lease of 10 m
    assert protection(ctx(pol, now=6_000.0), leased, guard=False) == 5_800.0 + 600.0
    assert guarded(1, 1)  # a tier-1 victim is taken only by reclaim, which the guard bounds


def test_a_gpu_trainer_without_a_save_is_not_preempted_before_its_save_is_paid_for() -> None:
    """Startup 10.9 s reported, min_efficiency 0.75, no save reported yet: at 44 s a preemption
    would force a save (assumed 30 s) and leave η far below the floor; it lifts at
    (10.9 + 30) / (1 − 0.75) = 163.6 s."""
    pol = policy(tiers={3: {"lease": "0s"}}, thrash={"min_efficiency": 0.75})
    v = victim("a", 3, started=0.0, startup_s=10.9)
    assert efficiency(pol, v, 44.0) == pytest.approx((44.0 - 40.9) / 44.0)
    b = efficiency_floor(ctx(pol, now=44.0), v)
    assert b is not None and b.until == pytest.approx((10.9 + 30.0) / 0.25)
    assert protection(ctx(pol, now=44.0), v) == pytest.approx(163.6)
    assert efficiency_floor(ctx(pol, now=163.6), v) is None
    assert efficiency(pol, v, 163.6) == pytest.approx(0.75)


def test_zero_min_efficiency_protects_only_the_overhead() -> None:
    pol = policy(thrash={"min_efficiency": 0})
    v = victim("a", 3, started=100.0, startup_s=50.0, checkpoint_s=30.0, sigterm_save_s=10.0)
    assert efficiency_floor(ctx(pol, now=159.0), v) is not None
    assert efficiency_floor(ctx(pol, now=160.0), v) is None


# --------------------------------------------------------------------- lost work and cost


def test_lost_work_is_zero_when_the_sigterm_save_fits_the_grace() -> None:
    pol = policy()  # tier 3 grace 120 s
    for save in (30.0, 120.0):
        v = victim("a", 3, started=0.0, startup_s=100.0, sigterm_save_s=save)
        assert lost_work(pol, v, 10_000.0) == 0.0
        assert victim_cost(pol, v, 10_000.0) == (100.0 * 8, 0.0)


def test_a_longer_grace_lets_a_slow_save_fit() -> None:
    pol = policy()
    v = victim("a", 3, started=0.0, sigterm_save_s=500.0, grace=600.0)
    assert grace_of(pol, v) == 600.0
    assert lost_work(pol, v, 10_000.0) == 0.0


def test_lost_work_since_the_last_checkpoint_when_the_save_does_not_fit() -> None:
    pol = policy()
    v = victim("a", 3, started=0.0, startup_s=100.0, sigterm_save_s=121.0, last_checkpoint_at=7_000.0)
    assert lost_work(pol, v, 10_000.0) == 8 * 3_000.0
    assert victim_cost(pol, v, 10_000.0) == (8 * 3_000.0 + 8 * 100.0, 8 * 3_000.0)


def test_lost_work_without_a_checkpoint_counts_from_the_end_of_startup() -> None:
    pol = policy()
    v = victim("a", 3, started=1_000.0, startup_s=200.0)
    assert lost_work(pol, v, 5_000.0) == 8 * (5_000.0 - 1_200.0)


def test_a_checkpoint_older_than_this_attempts_progress_does_not_extend_lost_work() -> None:
    pol = policy()
    v = victim("a", 3, started=1_000.0, startup_s=200.0, last_checkpoint_at=500.0)
    assert lost_work(pol, v, 5_000.0) == 8 * (5_000.0 - 1_200.0)


def test_lost_work_during_startup_is_zero() -> None:
    pol = policy()
    v = victim("a", 3, started=1_000.0, startup_s=200.0)
    assert lost_work(pol, v, 1_100.0) == 0.0
    assert victim_cost(pol, v, 1_100.0) == (8 * 200.0, 0.0)


def test_lost_work_and_cost_count_every_gpu_of_the_gang() -> None:
    pol = policy()
    gang = running("g", "a", 3, [("n0", 4), ("n1", 4), ("n2", 4)], started=0.0, startup_s=10.0)
    assert gang.total_gpus == 12
    assert victim_cost(pol, gang, 110.0) == (12 * 100.0 + 12 * 10.0, 12 * 100.0)


def test_policy_restart_overhead_is_used_when_startup_is_unknown() -> None:
    pol = policy(preemption={"restart_overhead": "2m"})
    v = victim("a", 3, started=0.0, startup_s=None)
    # progress from 0 + 120 s; cost adds 120 s × 8 GPUs
    assert victim_cost(pol, v, 1_000.0) == (8 * 880.0 + 8 * 120.0, 8 * 880.0)
    measured = victim("a", 3, started=0.0, startup_s=30.0)
    assert victim_cost(pol, measured, 1_000.0) == (8 * 970.0 + 8 * 30.0, 8 * 970.0)


def test_job_without_an_attempt_loses_nothing() -> None:
    assert lost_work(policy(), pending("p", "a", 3), 1_000.0) == 0.0


# -------------------------------------------------------------------------------- blocks


def test_blocks_is_zero_when_nothing_protects_the_victim() -> None:
    pol = policy()
    v = victim("a", 3, started=0.0, startup_s=60.0)
    assert blocks(ctx(pol, now=10_000.0), pre(pending("p", "b", 2)), v) == 0.0


def test_blocks_is_the_latest_time_a_timed_rule_lifts() -> None:
    pol = policy()
    # lease (45 min) lifts at 2,700; the efficiency floor, counting one assumed save of 30 s
    # (no save reported yet), at (600 + 30) / 0.1 = 6,300.
    v = victim("a", 3, started=0.0, startup_s=600.0)
    assert blocks(ctx(pol, now=1_000.0), pre(pending("p", "b", 2)), v) == pytest.approx(6_300.0)
    # Add a spent thrash budget that lifts later still.
    now = 1_000.0
    spent = replace(v, preempted_at=(now - 100.0, now - 50.0, now - 10.0))
    assert blocks(ctx(pol, now=now), pre(pending("p", "b", 2)), spent) == now - 100.0 + DAY
    # Only the lease left.
    short = victim("a", 3, started=0.0, startup_s=0.0)
    assert blocks(ctx(pol, now=1_000.0), pre(pending("p", "b", 2)), short) == 2_700.0


@pytest.mark.parametrize("case", ["upward", "unpreemptible", "scope", "same-queue-same-tier"])
def test_blocks_is_inf_when_time_will_not_help(case: str) -> None:
    pol = policy()
    c = ctx(pol, now=1_000.0)  # the victim is also inside its lease: inf must still win
    v = victim("a", 3, started=500.0)
    if case == "upward":
        p = pre(pending("p", "b", 4))
    elif case == "unpreemptible":
        p, v = pre(pending("p", "b", 1)), victim("a", 1, started=500.0)
    elif case == "scope":
        p, v = pre(pending("p", "b", 3), in_quota=False), victim("a", 4, started=500.0)
    else:
        p = pre(pending("p", "a", 3))
    assert blocks(c, p, v) == INF


# ------------------------------------------------------------------ reclaim inside a pass


def test_team_reclaims_its_nominal_from_a_sibling_that_borrowed_it() -> None:
    """vision (nominal 32) runs 64 GPUs — all of research's 64 — and platform its 32: the cluster
    is full. language (nominal 32, using 0) submits 8 GPUs at the same tier. After evicting one
    8-GPU vision job language is within its own and research's nominal: that is a reclaim."""
    pol = parse_policy({"queues": DESIGN_QUEUES})
    jobs = [running(f"v{i}", "vision", 3, (f"n{i}", 8), started=0.0) for i in range(8)]
    jobs += [running(f"p{i}", "platform", 3, (f"n{8 + i}", 8), started=0.0) for i in range(4)]
    jobs.append(pending("L", "language", 3, gpus=8, submit=5_000.0))
    plan = plan_for(pol, nodes(12), jobs, now=10_000.0)
    victims = preempted(plan)
    assert len(victims) == 1 and next(iter(victims)).startswith("v")
    assert plan.preemptions[0].kind == "reclaim"
    assert plan.explanations["L"].reason.code == "WaitingForGrace"


# ------------------------------------------------------------------------ the declarations
# Every rule declares what it reads, and the pass derives its shortcuts from the declarations:
# these check each declaration against the rule's own check, on random jobs and quota states.

LEAVES = ("vision", "language", "platform")


def _random_policy(rng: Random) -> Policy:
    tiers = {
        t: {
            "scope": rng.choice(["quota", "cluster"]),
            "preemptible": rng.random() < 0.8,
            "charged": rng.random() < 0.8,
            "lease": rng.choice(["0s", "10m", "1h"]),
        }
        for t in (1, 2, 3, 4)
    }
    return parse_policy(
        {
            "queues": DESIGN_QUEUES,
            "tiers": tiers,
            "thrash": {"max_preemptions": {"per": "1h", "count": 2}},
            "preemption": {"protect_before_time_limit": rng.choice(["0s", "0s", "10m", "2h"])},
        }
    )


def _random_ctx(rng: Random, pol: Policy, now: float | None = None) -> RuleContext:
    return ctx(
        pol,
        now=rng.uniform(0.0, 20_000.0) if now is None else now,
        usage={leaf: rng.choice([0, 8, 24, 40, 64]) for leaf in LEAVES},
    )


def _random_victim(rng: Random, job_id: str = "v") -> Job:
    started = rng.uniform(0.0, 15_000.0)
    return running(
        job_id,
        rng.choice(LEAVES),
        rng.randint(1, 4),
        ("n0", rng.choice([1, 4, 8])),
        started=started,
        startup_s=rng.choice([None, 30.0, 600.0]),
        checkpoint_s=rng.choice([0.0, 120.0]),
        preempted_at=tuple(sorted(rng.uniform(0.0, 20_000.0) for _ in range(rng.randint(0, 3)))),
        time_limit=rng.choice([None, 1_800.0, 7_200.0, 20_000.0]),
    )


def _random_preemptor(rng: Random, c: RuleContext) -> Preemptor:
    job = pending("p", rng.choice(LEAVES), rng.randint(1, 4), gpus=rng.choice([1, 8, 16]))
    return Preemptor(job, rng.random() < 0.5, (float(job.total_gpus),))


def _cases(seed: int, count: int = 300) -> list[tuple[RuleContext, Preemptor, Job]]:
    rng = Random(seed)
    out = []
    for _ in range(count):
        c = _random_ctx(rng, _random_policy(rng))
        out.append((c, _random_preemptor(rng, c), _random_victim(rng)))
    return out


def _check(rule: Any, c: RuleContext, p: Preemptor, v: Job) -> Block | None:
    return rule.check(c, p, v) if isinstance(rule, PairRule) else rule.check(c, v)


@pytest.mark.parametrize("seed", range(3))
def test_every_rule_blocks_under_its_own_name(seed: int) -> None:
    for c, p, v in _cases(seed):
        for rule in RULES:
            b = _check(rule, c, p, v)
            assert b is None or b.rule == rule.name


@pytest.mark.parametrize("seed", range(3))
def test_pair_rules_read_only_the_fields_of_the_victim_they_declare(seed: int) -> None:
    rng = Random(seed + 100)
    for c, p, v in _cases(seed):
        other = _random_victim(rng, "w")
        for rule in PAIR_RULES:
            alike = replace(other, **{f: getattr(v, f) for f in rule.reads})
            assert rule.check(c, p, alike) == rule.check(c, p, v), (rule.name, v, alike)
        same_key = replace(other, **{f: getattr(v, f) for f in PAIR_READS})
        assert pair_key(same_key) == pair_key(v) == tuple(getattr(v, f) for f in PAIR_READS)
        assert allowed(c, p, same_key) == allowed(c, p, v)


@pytest.mark.parametrize("seed", range(3))
def test_the_downward_key_decides_every_lower_tier_victim(seed: int) -> None:
    """Preemptors with one `downward_key` are allowed the same lower-tier victims, whatever
    the quota usage (the pass keeps one list per key)."""
    rng = Random(seed)
    for _ in range(200):
        pol = _random_policy(rng)
        c1, c2 = _random_ctx(rng, pol), _random_ctx(rng, pol)
        p1, p2 = _random_preemptor(rng, c1), _random_preemptor(rng, c2)
        p2 = replace(p2, job=replace(p2.job, tier=p1.job.tier))
        v = _random_victim(rng)
        if v.tier <= p1.job.tier:
            continue
        if downward_key(c1, p1) == downward_key(c2, p2):
            assert allowed(c1, p1, v) == allowed(c2, p2, v)
        assert allowed(c1, p1, v) == allowed(c2, p1, v)


@pytest.mark.parametrize("seed", range(3))
def test_each_rules_tier_test_is_a_necessary_condition(seed: int) -> None:
    """A rule that lets P take V passes its test on the two tiers alone (`could_preempt`)."""
    for c, p, v in _cases(seed):
        for rule in RULES:
            if _check(rule, c, p, v) is None:
                assert rule.tiers(c, p.job.tier, v.tier), (rule.name, p, v)


@pytest.mark.parametrize("seed", range(3))
def test_what_the_victim_rules_say_at_one_now_holds_at_every_later_one(seed: int) -> None:
    """The pass keeps the victim rules' answer between passes as a window: V may go from
    `protection` until `closes_at`. A rule that declares it never lifts blocks for good; one
    that starts later (`starts_at`, the same asked at any `now`) lets V go before its start and
    blocks for good from then on."""
    rng = Random(seed)
    started = 0
    for c, _, v in _cases(seed):
        later = RuleContext(c.policy, c.quota, c.now + rng.uniform(0.0, 10_000.0))
        for rule in VICTIM_RULES:
            b = rule.check(c, v)
            if b is not None and not rule.lifts:
                assert b.until == INF
            if rule.starts_at is not None:
                start = rule.starts_at(c, v)
                assert rule.starts_at(later, v) == start
                assert (rule.check(later, v) is not None) == (later.now >= start)
                started += start < INF
        for guard in (True, False):
            was, closes, now = protection(c, v, guard), closes_at(c, v, guard), protection(later, v, guard)
            if later.now >= closes:
                assert now == INF
            elif was > later.now:
                assert now == was
            else:
                assert now <= later.now
    assert started  # the cases reach a protection that starts


def test_a_borrower_in_quota_only_after_reclaim_searches_both_ways() -> None:
    """vision borrows 28 of research's nominal; 8 GPUs for language are within nominal only if
    that is reclaimed: a `scope: quota` job looks for a set that leaves it in-quota and for one
    in its own queue alone; a `scope: cluster` job, and one already in-quota, look once."""
    c = ctx(parse_policy({"queues": DESIGN_QUEUES}), usage={"vision": 60})
    job = pending("p", "language", 3)
    ways = preemptors(c, job, (8.0,))
    assert [(w.in_quota, w.reclaims) for w in ways] == [(True, True), (False, False)]
    assert len(preemptors(c, pending("p", "language", 1), (8.0,))) == 1
    assert len(preemptors(ctx(parse_policy({"queues": DESIGN_QUEUES})), job, (8.0,))) == 1


# ------------------------------------------------------------------- self-reported figures


def test_the_efficiency_counts_a_reported_span_at_most_the_attempts_age() -> None:
    pol = policy()
    liar = running("v", "a", 3, ("n0", 8), 0.0, startup_s=1e9)
    honest = running("v", "a", 3, ("n0", 8), 0.0, startup_s=500.0)
    assert efficiency(pol, liar, 500.0) == efficiency(pol, honest, 500.0)
    saver = running("v", "a", 3, ("n0", 8), 0.0, checkpoint_s=1e9)
    assert efficiency(pol, saver, 500.0) == efficiency(
        pol, running("v", "a", 3, ("n0", 8), 0.0, checkpoint_s=500.0), 500.0
    )
    assumed = pol.preemption.checkpoint_overhead
    assert efficiency(pol, honest, 1000.0) == pytest.approx((1000.0 - 500.0 - assumed) / 1000.0)


@pytest.mark.parametrize("min_efficiency", [0.0, 0.5, 0.9])
def test_a_startup_claimed_beyond_the_attempts_age_chooses_the_victim_a_startup_of_its_age_does(
    min_efficiency: float,
) -> None:
    pol = policy(thrash={"min_efficiency": min_efficiency}, tiers={3: {"lease": "0s"}})
    now = 10_000.0
    cluster = nodes(2)
    urgent = pending("p", "a", 2, gpus=8, submit=now - 1)  # tier 2: the floor protects from it

    def victims(startup: float) -> set[str]:
        jobs = [
            running("claimant", "b", 3, ("n0", 8), 2_000.0, startup_s=startup),
            running("other", "a", 3, ("n1", 8), 0.0),
            urgent,
        ]
        return preempted(plan_for(pol, cluster, jobs, now))

    # Claimed or of its age, the startup protects the claimant by the efficiency floor: the
    # other job goes either way.
    assert victims(1e9) == victims(now - 2_000.0) == {"other"}
