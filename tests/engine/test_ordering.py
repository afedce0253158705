"""The order of pending jobs (DESIGN §4.1) and how it shows in explanations (§4.5).

tier → starvation breach → Fair Tree share → aging (inside a queue and tier) → submit → id;
`scheduling.order: fifo` is submit/id only; `head_of_line_blocking` stops the walk at the first
job that does not start.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from support import admitted, nodes, pending, plan_for, policy, running

from warden.engine.model import Job, JobState, Snapshot, UsageLedger
from warden.engine.plan import SortKey
from warden.engine.policy import Policy, parse_policy
from warden.engine.reasons import Position
from warden.engine.scheduler import Engine, rank

HOUR = 3600.0
DAY = 24 * HOUR


def ranked(
    pol: Policy, jobs: list[Job], now: float, usage: dict[str, float] | None = None
) -> list[tuple[SortKey, Job]]:
    return rank(Snapshot(nodes(1), tuple(jobs), pol, UsageLedger(now, usage or {})), now)


def ids(pol: Policy, jobs: list[Job], now: float, usage: dict[str, float] | None = None) -> list[str]:
    return [j.id for _, j in ranked(pol, jobs, now, usage)]


# ------------------------------------------------------------------------------------ tier


def test_tier_goes_first() -> None:
    pol = policy()
    now = 10 * HOUR
    jobs = [
        pending("t4", "a", 4, submit=0.0),
        pending("t3", "a", 3, submit=100.0),
        pending("t2", "b", 2, submit=200.0),  # b has used much more than a
        pending("t1", "b", 1, submit=9 * HOUR),
    ]
    assert ids(pol, jobs, now, usage={"b": 1e6}) == ["t1", "t2", "t3", "t4"]


def test_only_waiting_jobs_are_ranked() -> None:
    pol = policy()
    jobs = [
        pending("p", "a", 3),
        replace(pending("q", "a", 3), state=JobState.REQUEUED),
        replace(pending("w", "a", 2), state=JobState.AWAITING_APPROVAL),
        running("r", "a", 3, ("n0", 8), started=0.0),
        replace(pending("done", "a", 3), state=JobState.SUCCEEDED),
    ]
    assert sorted(ids(pol, jobs, 100.0)) == ["p", "q", "w"]


# ----------------------------------------------------------------------- starvation breach


def test_breach_goes_to_the_front_of_its_tier_but_not_ahead_of_a_higher_tier() -> None:
    pol = policy()  # default max_wait 24h
    now = 30 * HOUR
    jobs = [
        pending("a-fresh", "a", 3, submit=now - HOUR),  # a has used nothing
        pending("b-starved", "b", 3, submit=now - 25 * HOUR),  # b has used a lot, but waited > 24h
        pending("b-tier2", "b", 2, submit=now - 60.0),
        pending("a-tier4-starved", "a", 4, submit=0.0),
    ]
    assert ids(pol, jobs, now, usage={"b": 1e6}) == ["b-tier2", "b-starved", "a-fresh", "a-tier4-starved"]
    keys = {j.id: k for k, j in ranked(pol, jobs, now, usage={"b": 1e6})}
    assert keys["b-starved"].breach == 0 and keys["a-fresh"].breach == 2
    assert keys["b-starved"].to_dict()["starvation_breach"] is True
    assert keys["a-fresh"].to_dict()["starvation_breach"] is False


def test_breach_starts_when_the_wait_reaches_max_wait() -> None:
    pol = policy()
    now = 100 * HOUR
    at = pending("at", "b", 3, submit=now - DAY)
    just_before = pending("before", "b", 3, submit=now - DAY + 1.0)
    keys = {j.id: k for k, j in ranked(pol, [at, just_before], now)}
    assert keys["at"].breach == 0
    assert keys["before"].breach == 1  # starving (past 3/4 of it), not a breach
    assert keys["before"].to_dict()["starvation_breach"] is False
    assert keys["before"].to_dict()["starving"] is True


def test_a_job_starves_at_escalate_at_of_its_max_wait_and_goes_first_with_the_breaches() -> None:
    """A job of a queue fair share holds back goes first in its tier once it has waited
    `escalate_at` of its maximum wait, before it breaches; starving jobs, breached or not,
    rank among themselves by fair share."""
    pol = policy(fair_share={"aging": {"max_wait": {"default": "8h"}, "escalate_at": 0.5}})
    now = 100 * HOUR
    jobs = [
        pending("a-fresh", "a", 3, submit=now - HOUR),  # a has used nothing
        pending("b-4h", "b", 3, submit=now - 4 * HOUR),  # b has used much: starving at 4 h
        pending("b-3h", "b", 3, submit=now - 3 * HOUR),  # not yet
        pending("c-9h", "c", 3, submit=now - 9 * HOUR),  # breached; c has used even more
    ]
    usage = {"b": 1e6, "c": 2e6}
    assert ids(pol, jobs, now, usage) == ["b-4h", "c-9h", "a-fresh", "b-3h"]
    keys = {j.id: k for k, j in ranked(pol, jobs, now, usage)}
    assert [keys[i].breach for i in ("b-4h", "c-9h", "a-fresh", "b-3h")] == [1, 0, 2, 2]
    # escalate_at 1: starving only once past the maximum wait, as a breach.
    late = policy(fair_share={"aging": {"max_wait": {"default": "8h"}, "escalate_at": 1}})
    assert ids(late, jobs, now, usage) == ["c-9h", "a-fresh", "b-4h", "b-3h"]


@pytest.mark.parametrize("value", [0, -0.5, 1.5])
def test_escalate_at_outside_0_to_1_is_refused_naming_the_field(value: float) -> None:
    with pytest.raises(Exception) as err:
        policy(fair_share={"aging": {"escalate_at": value}})
    assert "fair_share.aging.escalate_at" in str(err.value)


def test_per_queue_max_wait_override() -> None:
    pol = policy(fair_share={"aging": {"max_wait": {"default": "24h", "b": "1h"}}})
    now = 10 * HOUR
    a_job = pending("a-2h", "a", 3, submit=now - 2 * HOUR)
    b_job = pending("b-2h", "b", 3, submit=now - 2 * HOUR)
    # b's max_wait is 1h: its job is starving, a's (24h) is not — b goes first although it used more.
    assert ids(pol, [a_job, b_job], now, usage={"b": 1e6}) == ["b-2h", "a-2h"]
    # Without the override neither is starving and fair share decides.
    assert ids(policy(), [a_job, b_job], now, usage={"b": 1e6}) == ["a-2h", "b-2h"]


def test_max_wait_set_on_a_department_applies_to_its_teams() -> None:
    data: dict[str, Any] = {
        "queues": {
            "name": "cluster",
            "children": [
                {"name": "research", "children": [{"name": "vision"}, {"name": "language"}]},
                {"name": "platform"},
            ],
        },
        "fair_share": {"aging": {"max_wait": {"research": "1h"}}},
    }
    pol = parse_policy(data)
    now = 10 * HOUR
    jobs = [pending("p", "platform", 3, submit=now - 2 * HOUR), pending("v", "vision", 3, submit=now - 2 * HOUR)]
    keys = {j.id: k for k, j in ranked(pol, jobs, now, usage={"vision": 1e6})}
    assert keys["v"].breach == 0 and keys["p"].breach == 2
    assert ids(pol, jobs, now, usage={"vision": 1e6}) == ["v", "p"]


def test_breach_counts_the_wait_of_earlier_attempts() -> None:
    pol = policy()
    now = 100 * HOUR
    # Requeued an hour ago, but 23.5 h of waiting carried over from earlier attempts: 24.5 h.
    requeued = pending("r", "b", 3, submit=0.0, state=JobState.REQUEUED, waited=23.5 * HOUR, pending_since=now - HOUR)
    fresh = pending("f", "a", 3, submit=now - 10.0)
    assert ids(pol, [fresh, requeued], now, usage={"b": 1e6}) == ["r", "f"]


# ------------------------------------------------------------------------------ fair share


def test_fair_share_goes_before_aging() -> None:
    pol = policy()
    now = 20 * HOUR
    old = pending("old", "a", 3, submit=now - 10 * HOUR)  # a has used more
    new = pending("new", "b", 3, submit=now - 60.0)
    assert ids(pol, [old, new], now, usage={"a": 50.0, "b": 10.0}) == ["new", "old"]
    assert ids(pol, [old, new], now, usage={"a": 10.0, "b": 50.0}) == ["old", "new"]


def test_sort_key_carries_the_fair_share_ratios() -> None:
    pol = policy()
    keys = {
        j.id: k
        for k, j in ranked(pol, [pending("x", "a", 3), pending("y", "b", 3)], 10.0, usage={"a": 30.0, "b": 10.0})
    }
    # a: (30/40) / (1/2) = 1.5; b: (10/40) / (1/2) = 0.5
    assert keys["x"].fair_share == pytest.approx((1.5,))
    assert keys["y"].fair_share == pytest.approx((0.5,))
    assert keys["y"].fair_rank < keys["x"].fair_rank


# ----------------------------------------------------------------------------------- aging


def test_aging_counts_wait_across_attempts_before_submit_time() -> None:
    pol = policy()
    now = 1_000.0
    # x: submitted first, but requeued at 900 with nothing carried over → waited 100 s.
    x = pending("x", "a", 3, submit=0.0, state=JobState.REQUEUED, pending_since=900.0)
    # y: submitted at 500, pending since → waited 500 s.
    y = pending("y", "a", 3, submit=500.0)
    # z: submitted at 800, requeued at 900 with 1,000 s carried over → waited 1,100 s.
    z = pending("z", "a", 3, submit=800.0, state=JobState.REQUEUED, waited=1_000.0, pending_since=900.0)
    result = ranked(pol, [x, y, z], now)
    assert [j.id for _, j in result] == ["z", "y", "x"]
    assert [k.waited for k, _ in result] == [1_100.0, 500.0, 100.0]


def test_aging_decides_between_equally_served_queues() -> None:
    pol = policy()
    now = 10_000.0
    # a and b tie in the Fair Tree (no usage): the job that waited longer goes first.
    a_job = pending("a1", "a", 3, submit=9_000.0)
    b_job = pending("b1", "b", 3, submit=0.0)
    assert ids(pol, [a_job, b_job], now) == ["b1", "a1"]


def test_aging_never_overrides_fair_share() -> None:
    pol = policy()
    now = 10_000.0
    # a used more than b: b's fresh job goes before a's old one.
    a_job = pending("a1", "a", 3, submit=0.0)
    b_job = pending("b1", "b", 3, submit=9_000.0)
    assert [j.id for _, j in rank(Snapshot(nodes(1), (a_job, b_job), pol, UsageLedger(now, {"a": 5.0})), now)] == [
        "b1",
        "a1",
    ]


# ---------------------------------------------------------------------------- submit, id


def test_equal_wait_goes_by_submit_time_then_id() -> None:
    pol = policy()
    now = 1_000.0
    late = pending("a-late", "a", 3, submit=300.0, pending_since=500.0, state=JobState.REQUEUED)
    early = pending("z-early", "a", 3, submit=100.0, pending_since=500.0, state=JobState.REQUEUED)
    assert ids(pol, [late, early], now) == ["z-early", "a-late"]
    j2 = pending("j2", "a", 3, submit=100.0)
    j10 = pending("j10", "a", 3, submit=100.0)
    assert ids(pol, [j2, j10], now) == ["j10", "j2"]  # ids compare as strings


# ------------------------------------------------------------------------------------ fifo


def test_fifo_order_is_submit_then_id_across_tiers_and_queues() -> None:
    pol = policy(scheduling={"order": "fifo"})
    now = 100 * HOUR
    jobs = [
        pending("t1-late", "a", 1, submit=50.0),
        pending("t4-early", "b", 4, submit=10.0),
        pending("t3-starved", "a", 3, submit=40.0),
        pending("t2-same-b", "b", 2, submit=20.0),
        pending("t2-same-a", "a", 2, submit=20.0),
    ]
    assert ids(pol, jobs, now, usage={"b": 1e6}) == ["t4-early", "t2-same-a", "t2-same-b", "t3-starved", "t1-late"]


def test_priority_order_is_tier_then_submit_then_id_ignoring_fair_share_and_age() -> None:
    pol = policy(scheduling={"order": "priority"})
    now = 100 * HOUR
    jobs = [
        pending("t1-late", "a", 1, submit=50.0),
        pending("t4-early", "b", 4, submit=10.0),
        pending("t3-starved", "a", 3, submit=40.0, waited=10 * DAY),
        pending("t3-early", "b", 3, submit=30.0),
        pending("t2-same-b", "b", 2, submit=20.0),
        pending("t2-same-a", "a", 2, submit=20.0),
    ]
    assert ids(pol, jobs, now, usage={"b": 1e6}) == [
        "t1-late",
        "t2-same-a",
        "t2-same-b",
        "t3-early",
        "t3-starved",
        "t4-early",
    ]
    keys = {j.id: k for k, j in ranked(pol, jobs, now)}
    assert keys["t4-early"].tier == 4 and keys["t4-early"].breach == 2


# ------------------------------------------------------------------------------ nominal first


def _kueue_like(**scheduling: Any) -> Policy:
    """Two queues of 4 GPUs under a root of 12, ranked by priority (as the `kueue` preset)."""
    return policy(
        queues={
            "name": "cluster",
            "nominal": {"gpu": 12},
            "children": [{"name": "a", "nominal": {"gpu": 4}}, {"name": "b", "nominal": {"gpu": 4}}],
        },
        scheduling={"order": "priority", "reservations": 0, **scheduling},
    )


def _b_at_nominal() -> list[Job]:
    """b already uses its 4 GPUs; an older b job (would borrow) and a newer a job (in-quota) wait
    for the 4 GPUs left, which fit one of them."""
    return [
        running("b-run", "b", 3, ("n0", 4), started=0.0),
        pending("b-old", "b", 3, gpus=4, submit=10.0),
        pending("a-new", "a", 3, gpus=4, submit=20.0),
        pending("a-t4", "a", 4, gpus=2, submit=5.0),
    ]


def test_nominal_first_ranks_jobs_that_would_borrow_after_the_others_of_their_tier() -> None:
    now = 100.0
    plain = plan_for(_kueue_like(), nodes(1), _b_at_nominal(), now)
    assert admitted(plain) == {"b-old"}  # older, and the same tier: it borrows the free GPUs
    first = plan_for(_kueue_like(nominal_first=True), nodes(1), _b_at_nominal(), now)
    assert admitted(first) == {"a-new"}
    # A lower tier still goes after: each queue's own jobs keep their priority order.
    order = [e.job_id for e in sorted(first.explanations.values(), key=lambda e: e.position)]
    assert order == ["b-old", "a-t4"]
    snap = Snapshot(nodes(1), tuple(_b_at_nominal()), _kueue_like(nominal_first=True), UsageLedger(now, {}))
    keys = {j.id: k for k, j in rank(snap, now)}
    assert list(keys) == ["a-new", "b-old", "a-t4"]
    assert keys["b-old"].borrows == 1 and keys["b-old"].to_dict()["would_borrow"] is True
    assert keys["a-new"].borrows == 0 and keys["b-old"].tier == 3
    assert sorted(keys.values()) == list(keys.values())  # sort keys sort as the jobs rank
    # Under fifo, tiers do not rank: every job that would borrow goes after the others.
    fifo = {j.id: k for k, j in rank(replace(snap, policy=_kueue_like(order="fifo", nominal_first=True)), now)}
    assert list(fifo) == ["a-t4", "a-new", "b-old"]


def test_nominal_first_reads_usage_as_the_pass_starts() -> None:
    """Admitting a-new takes a to its nominal: a's next job would borrow now, but the ranking
    of the pass does not move, and the plan is the same warm and fresh."""
    now = 100.0
    jobs = [
        running("b-run", "b", 3, ("n0", 4), started=0.0),
        pending("a-new", "a", 3, gpus=4, submit=20.0),
        pending("a-next", "a", 3, gpus=2, submit=30.0),
        pending("b-old", "b", 3, gpus=2, submit=10.0),
    ]
    pol = _kueue_like(nominal_first=True)
    plan = plan_for(pol, nodes(1, gpus=12), jobs, now)
    # a-next was in-quota as the pass started (0 + 2 of 4): it goes before b-old, and borrows
    # by the time its turn comes (a-new took a's 4 GPUs).
    assert [(a.job_id, a.borrowing) for a in plan.admissions] == [("a-new", False), ("a-next", True), ("b-old", True)]
    engine = Engine()
    snap = Snapshot(nodes(1, gpus=12), tuple(jobs), pol, UsageLedger(now, {}))
    assert engine.plan(snap, now) == plan and engine.plan(snap, now, ()) == plan


def test_nominal_first_needs_a_plain_order() -> None:
    with pytest.raises(ValueError, match=r"scheduling\.nominal_first: needs order priority or fifo"):
        policy(scheduling={"nominal_first": True})


def test_fifo_ignores_carried_over_wait() -> None:
    pol = policy(scheduling={"order": "fifo"})
    old = pending("old", "a", 3, submit=10.0)
    requeued = pending("requeued", "a", 3, submit=20.0, state=JobState.REQUEUED, waited=1e6, pending_since=30.0)
    assert ids(pol, [requeued, old], 100.0) == ["old", "requeued"]


# --------------------------------------------------------------------- head-of-line blocking


def _hol_jobs() -> list[Job]:
    serve = running("serve", "b", 1, ("n0", 4), started=0.0)  # tier 1: never preempted
    return [
        serve,
        pending("big", "a", 3, gpus=8, submit=0.0),  # head: 8 GPUs, only 4 free
        pending("small", "a", 3, gpus=2, submit=10.0),  # would fit
        pending("scav", "a", 4, gpus=1, submit=5.0),
        pending("appr", "a", 3, gpus=1, submit=20.0, state=JobState.AWAITING_APPROVAL),
    ]


def test_head_of_line_blocking_holds_everyone_behind_the_blocked_head() -> None:
    pol = policy(scheduling={"head_of_line_blocking": True, "reservations": 0})
    plan = plan_for(pol, nodes(1), _hol_jobs(), now=100.0)
    assert admitted(plan) == set()
    assert plan.explanations["big"].reason.code == "InsufficientCapacity"
    for job_id in ("small", "scav"):
        e = plan.explanations[job_id]
        assert e.reason == Position(e.position, "big")
    assert plan.explanations["appr"].reason.code == "AwaitingApproval"


def test_without_head_of_line_blocking_smaller_jobs_pass_the_head() -> None:
    pol = policy(scheduling={"reservations": 0})
    plan = plan_for(pol, nodes(1), _hol_jobs(), now=100.0)
    assert admitted(plan) == {"small", "scav"}
    assert plan.explanations["big"].reason.code == "InsufficientCapacity"


def test_head_of_line_blocking_starts_jobs_ahead_of_the_head() -> None:
    pol = policy(scheduling={"head_of_line_blocking": True, "reservations": 0})
    jobs = [
        running("serve", "b", 1, ("n0", 4), started=0.0),
        pending("first", "a", 3, gpus=2, submit=0.0),
        pending("big", "a", 3, gpus=8, submit=1.0),
        pending("after", "a", 3, gpus=1, submit=2.0),
    ]
    plan = plan_for(pol, nodes(1), jobs, now=100.0)
    assert admitted(plan) == {"first"}
    assert plan.explanations["after"].reason == Position(3, "big")


def test_fifo_strict_preset_blocks_behind_the_oldest_job() -> None:
    pol = policy(scheduling={"order": "fifo", "head_of_line_blocking": True, "reservations": 0})
    jobs = [
        running("serve", "b", 1, ("n0", 4), started=0.0),
        pending("old-big", "a", 4, gpus=8, submit=0.0),
        pending("t1-small", "a", 1, gpus=1, submit=5.0, state=JobState.PENDING),
    ]
    plan = plan_for(pol, nodes(1), jobs, now=100.0)
    assert admitted(plan) == set()
    assert plan.explanations["t1-small"].reason == Position(2, "old-big")


# ---------------------------------------------------------------------- explanations


def _full_cluster_jobs() -> list[Job]:
    """A cluster held by an unpreemptible tier-1 job, and waiting jobs of every kind."""
    return [
        running("serve", "b", 1, ("n0", 8), started=0.0),
        pending("p1", "a", 1, submit=500.0),
        pending("p2a", "a", 2, submit=300.0),
        pending("p2b", "b", 2, submit=100.0),
        pending("p3a", "a", 3, submit=50.0),
        pending("p3b", "b", 3, submit=0.0, waited=2 * DAY, state=JobState.REQUEUED, pending_since=10.0),
        pending("p3c", "b", 3, submit=20.0),
        pending("p4", "a", 4, gpus=1, submit=0.0),
        pending("held", "a", 3, submit=0.0, not_before=1e9),
        pending("appr", "b", 2, submit=1.0, state=JobState.AWAITING_APPROVAL),
    ]


def test_explanations_carry_the_rank_order_and_positions_one_to_n() -> None:
    pol = policy()
    now = 1_000.0
    jobs = _full_cluster_jobs()
    usage = {"a": 5.0, "b": 1.0}
    plan = plan_for(pol, nodes(1), jobs, now=now, usage=usage)
    assert admitted(plan) == set()
    expected = ranked(pol, jobs, now, usage)
    waiting = [j for j in jobs if j.state.waiting]
    assert len(plan.explanations) == len(waiting)
    by_position = sorted(plan.explanations.values(), key=lambda e: e.position)
    assert [e.position for e in by_position] == list(range(1, len(waiting) + 1))
    assert [(e.job_id, e.sort_key) for e in by_position] == [(j.id, k) for k, j in expected]
    keys = [e.sort_key for e in by_position]
    assert keys == sorted(keys)


def test_explanation_order_matches_the_rules_by_hand() -> None:
    pol = policy()
    now = 1_000.0
    plan = plan_for(pol, nodes(1), _full_cluster_jobs(), now=now, usage={"a": 5.0, "b": 1.0})
    by_position = sorted(plan.explanations.values(), key=lambda e: e.position)
    # tier 1; tier 2: b used less than a, so b's jobs first, appr (waited 999 s) before p2b (900 s);
    # tier 3: p3b waited 2 days + 990 s > 24 h (breach), then b before a: p3c, then a by wait: held, p3a;
    # tier 4.
    assert [e.job_id for e in by_position] == ["p1", "appr", "p2b", "p2a", "p3b", "p3c", "held", "p3a", "p4"]


def test_sort_key_to_dict_has_the_documented_fields() -> None:
    pol = policy()
    now = 1_000.0
    plan = plan_for(pol, nodes(1), _full_cluster_jobs(), now=now, usage={"a": 30.0, "b": 10.0})
    d = plan.explanations["p3b"].sort_key.to_dict()
    assert set(d) == {
        "would_borrow",
        "tier",
        "starvation_breach",
        "starving",
        "fair_rank",
        "fair_share",
        "waited_s",
        "submit",
        "id",
    }
    assert d["would_borrow"] is False  # only `nominal_first` ranks by it
    assert d["tier"] == 3
    assert d["starvation_breach"] is True
    assert d["waited_s"] == 2 * DAY + (now - 10.0)
    assert d["submit"] == 0.0 and d["id"] == "p3b"
    assert d["fair_share"] == pytest.approx([0.5])  # b: (10/40) / (1/2)
    assert isinstance(d["fair_share"], list)
    a = plan.explanations["p3a"].sort_key.to_dict()
    assert a["fair_share"] == pytest.approx([1.5]) and a["fair_rank"] > d["fair_rank"]
    assert a["waited_s"] == now - 50.0 and a["starvation_breach"] is False


def test_positions_count_admitted_jobs_too() -> None:
    pol = policy(queues={"name": "cluster", "children": [{"name": "a"}, {"name": "b"}]})
    now = 100.0
    jobs = [pending(f"j{i}", "a", 3, gpus=4, submit=float(i)) for i in range(5)]
    plan = plan_for(pol, nodes(1), jobs, now=now)
    assert admitted(plan) == {"j0", "j1"}
    order = [j.id for _, j in ranked(pol, jobs, now)]
    assert order == ["j0", "j1", "j2", "j3", "j4"]
    assert {e.job_id: e.position for e in plan.explanations.values()} == {"j2": 3, "j3": 4, "j4": 5}


def test_every_waiting_job_is_explained_on_an_empty_cluster() -> None:
    plan = plan_for(policy(), (), [pending("p", "a", 3, gpus=1)], now=0.0)
    assert plan.explanations["p"].reason.code == "InsufficientCapacity"
    assert plan.explanations["p"].position == 1
