"""Each pending reason names the rule that holds the job and ends with what the user can do,
worked out from its details (DESIGN §4.5): one engine scenario per reason, asserting the facts
the next step rests on, and, where the step is a change the user can make, that making it helps."""

from __future__ import annotations

import re
from dataclasses import replace

from support import admitted, nodes, pending, plan_for, policy, preempted, running

from warden.engine.model import JobState
from warden.engine.reasons import Reason, engine_time, from_dict, virtual_times

NOW = 10_000.0
NO_QUOTA = {"name": "cluster", "children": [{"name": "a"}, {"name": "b"}]}
LEASE_0 = {3: {"name": "experimentation", "lease": "0s", "grace": "120s", "scope": "quota"}}


def why(plan: object, job_id: str) -> Reason:
    return plan.explanations[job_id].reason  # type: ignore[attr-defined, no-any-return]


def test_quota_exceeded_names_the_job_whose_end_frees_enough_and_the_idle_tier() -> None:
    pol = policy(queues={"name": "cluster", "children": [
        {"name": "a", "nominal": {"gpu": 8}, "borrowing_limit": {"gpu": 0}},
        {"name": "b", "nominal": {"gpu": 16}},
    ]})  # fmt: skip
    a1 = running("a1", "a", 3, ("n0", 4), started=0.0, time_limit=10_840.0)
    a2 = running("a2", "a", 3, ("n0", 4), started=0.0, first_gpu=4)
    p = pending("p", "a", 3, gpus=4, submit=9_000.0)
    r = why(plan_for(pol, nodes(3), [a1, a2, p], now=NOW), "p")
    assert r.code == "QuotaExceeded"
    assert (r.queue, r.used, r.limit, r.available, r.requested) == ("a", 8, 8, 0, 4)  # type: ignore[attr-defined]
    assert (r.frees_at, r.frees_by) == (10_840.0, "a1")  # type: ignore[attr-defined]
    assert r.open_tier == 4  # type: ignore[attr-defined]
    m = r.render(virtual_times(NOW))
    assert "uses 8 of its 8 gpu quota" in m
    assert "enough frees at t=10840s (in 14m) when job a1 of the queue is expected to end" in m
    assert m.endswith("or submit at tier 4 to run on idle GPUs now.")
    # The step is true: at tier 4 the same job starts now.
    assert admitted(plan_for(pol, nodes(3), [a1, a2, replace(p, tier=4)], now=NOW)) == {"p"}


def test_quota_exceeded_without_idle_gpus_or_known_ends_offers_neither() -> None:
    pol = policy(queues={"name": "cluster", "children": [
        {"name": "a", "nominal": {"gpu": 8}, "borrowing_limit": {"gpu": 0}},
        {"name": "b", "nominal": {"gpu": 8}},
    ]})  # fmt: skip
    a1 = running("a1", "a", 3, ("n0", 8), started=0.0)
    b1 = running("b1", "b", 3, ("n1", 8), started=0.0)
    p = pending("p", "a", 3, gpus=4, submit=9_000.0)
    r = why(plan_for(pol, nodes(2), [a1, b1, p], now=NOW), "p")
    assert r.code == "QuotaExceeded"
    assert (r.frees_at, r.open_tier) == (None, None)  # type: ignore[attr-defined]
    assert "tier 4" not in r.message and "no running job of queue a has a time limit" in r.message


def test_borrowing_limit_states_the_queue_usage_and_limit() -> None:
    pol = policy(queues={"name": "cluster", "children": [
        {"name": "a", "nominal": {"gpu": 8}, "borrowing_limit": {"gpu": 4}},
        {"name": "b", "nominal": {"gpu": 16}},
    ]})  # fmt: skip
    a1 = running("a1", "a", 3, ("n0", 8), started=0.0, time_limit=20_000.0)
    a2 = running("a2", "a", 3, ("n1", 4), started=0.0, time_limit=12_000.0)
    p = pending("p", "a", 3, gpus=4, submit=9_000.0)
    r = why(plan_for(pol, nodes(3), [a1, a2, p], now=NOW), "p")
    assert r.code == "BorrowingLimit"
    assert (r.used, r.limit, r.available) == (12, 12, 0)  # type: ignore[attr-defined]
    assert (r.frees_at, r.frees_by) == (12_000.0, "a2")  # the first end that frees 4  # type: ignore[attr-defined]
    assert "(it uses 12 of 12)" in r.message and "when job a2 of the queue is expected to end" in r.message


def test_insufficient_capacity_says_why_it_holds_no_reservation() -> None:
    pol = policy(queues=NO_QUOTA)
    full = running("full", "a", 3, ("n0", 8), started=0.0)
    p = pending("p", "a", 3, submit=9_000.0)
    r = why(plan_for(pol, nodes(1), [full, p], now=NOW), "p")
    assert r.code == "InsufficientCapacity"
    assert (r.reserved_at, r.unreserved, r.reservations) == (None, "no_forecast", None)  # type: ignore[attr-defined]
    assert "no time limit" in r.message

    ends = replace(full, time_limit=11_000.0)
    q = pending("q", "a", 3, submit=9_500.0)
    plan = plan_for(pol, nodes(1), [ends, p, q], now=NOW)
    assert why(plan, "p").reserved_at == 11_000.0  # type: ignore[attr-defined]
    assert "without any action" in why(plan, "p").message
    r = why(plan, "q")
    assert (r.reserved_at, r.unreserved, r.reservations) == (None, "taken", 1)  # type: ignore[attr-defined]
    assert "all 1 reservations (`scheduling.reservations`) are taken" in r.message


def test_fragmented_offers_the_placement_that_fits_now() -> None:
    pol = policy(queues=NO_QUOTA)
    half0 = running("h0", "b", 3, ("n0", 4), started=0.0)
    half1 = running("h1", "b", 3, ("n1", 4), started=0.0)
    gang = pending("g", "a", 3, gpus=4, submit=9_000.0, replicas=2, placement="pack")
    r = why(plan_for(pol, nodes(2), [half0, half1, gang], now=NOW), "g")
    assert r.code == "Fragmented" and r.any_fits and r.split_gpus is None  # type: ignore[attr-defined]
    assert "with `--placement any`" in r.message
    assert admitted(plan_for(pol, nodes(2), [half0, half1, replace(gang, placement="any")], now=NOW)) == {"g"}

    one = pending("one", "a", 3, gpus=8, submit=9_000.0)
    r = why(plan_for(pol, nodes(2), [half0, half1, one], now=NOW), "one")
    assert r.code == "Fragmented" and not r.any_fits and r.split_gpus == 4  # type: ignore[attr-defined]
    assert "as replicas of 4 GPUs each" in r.message
    split = replace(one, gpus=4, replicas=2, placement="any")
    assert admitted(plan_for(pol, nodes(2), [half0, half1, split], now=NOW)) == {"one"}


def test_reserved_names_the_time_limit_that_lets_the_job_backfill() -> None:
    pol = policy(queues=NO_QUOTA)
    r1 = running("r1", "a", 3, ("n0", 8), started=0.0, time_limit=11_000.0)
    r2 = running("r2", "a", 3, ("n1", 4), started=0.0, time_limit=12_000.0)
    big = pending("big", "a", 3, gpus=8, replicas=2, submit=1.0)
    small = pending("small", "b", 3, gpus=4, submit=2.0)
    plan = plan_for(pol, nodes(2), [r1, r2, big, small], now=NOW)
    r = why(plan, "small")
    assert r.code == "Reserved" and r.for_job == "big" and r.due == 12_000.0  # type: ignore[attr-defined]
    assert r.backfill_s == 2_000.0  # type: ignore[attr-defined]
    assert "a time limit under 33m20s (`--time-limit`) would let it start now" in r.message
    limited = replace(small, time_limit=1_999.0)
    assert "small" in admitted(plan_for(pol, nodes(2), [r1, r2, big, limited], now=NOW))


def test_waiting_for_lease_names_the_lease() -> None:
    v = running("v", "b", 3, ("n0", 8), started=9_400.0)
    p = pending("p", "a", 1, submit=9_990.0)
    r = why(plan_for(policy(), nodes(1), [v, p], now=NOW), "p")
    assert r.code == "WaitingForLease"
    assert (r.rule, r.victim, r.lease_s, r.earliest_at) == ("lease", "v", 2_700.0, 12_100.0)  # type: ignore[attr-defined]
    assert "job v's minimum-runtime lease of 45m ends at t=12100s" in r.message


def test_issue_16_the_efficiency_floor_is_named_with_its_assumed_startup_and_knob() -> None:
    """Tier lease 0 s, restart_overhead 60 s, checkpoint_overhead 30 s: a tier-2 job waits 15
    minutes behind tier-3 jobs that reported no startup and no save, held by the efficiency
    floor ((60 s + 30 s) / (1 − 0.9) = 900 s). A tier-1 job does not: the floor never holds
    production back (DESIGN §4.3), so it preempts them at once."""
    pol = policy(tiers=LEASE_0, preemption={"restart_overhead": "60s"})
    t0 = 1_796_130_000.0  # epoch seconds, as the server's clock counts
    v1 = running("1", "b", 3, ("n0", 4), started=t0, startup_s=None)
    v2 = running("2", "b", 3, ("n0", 4), started=t0 + 7, startup_s=None, first_gpu=4)
    now = t0 + 10
    production = plan_for(pol, nodes(1), [v1, v2, pending("p", "a", 1, submit=t0 + 5)], now=now)
    assert preempted(production) == {"1", "2"} and why(production, "p").code == "WaitingForGrace"
    p = pending("p", "a", 2, submit=t0 + 5)
    plan = plan_for(pol, nodes(1), [v1, v2, p], now=now)
    assert preempted(plan) == set()
    r = why(plan, "p")
    assert r.code == "WaitingForLease" and set(r.victims) == {"1", "2"}  # type: ignore[attr-defined]
    assert (r.rule, r.victim, r.lease_s) == ("efficiency", "2", 0.0)  # type: ignore[attr-defined]
    assert (r.startup_s, r.startup_measured, r.min_efficiency) == (60.0, False, 0.9)  # type: ignore[attr-defined]
    assert (r.checkpoint_s, r.checkpoint_measured, r.save_measured) == (30.0, False, False)  # type: ignore[attr-defined]
    assert abs(r.earliest_at - (t0 + 7 + 900)) < 1e-3  # type: ignore[attr-defined]
    m = r.render(virtual_times(now))
    assert "efficiency floor" in m and "assumed startup of 1m (`preemption.restart_overhead`" in m
    assert "an assumed save of 30s (`preemption.checkpoint_overhead`: job 2 has reported none)" in m
    assert "below 0.9 (`thrash.min_efficiency`)" in m and re.search(r"\(in (14m5\ds|15m)\)", m), m
    assert "minimum-runtime lease" not in m
    # A measured startup is named as such, and moves the time.
    measured = [replace(v, attempt=replace(v.attempt, startup_s=30.0)) for v in (v1, v2)]  # type: ignore[arg-type]
    r = why(plan_for(pol, nodes(1), [*measured, p], now=now), "p")
    assert r.startup_measured is True and "measured startup of 30s" in r.message  # type: ignore[attr-defined]


def _held_by_the_floor(**attempt: object) -> Reason:
    """Why a tier-2 job waits for a tier-3 job (lease 0 s, startup 10.9 s reported) that has run
    44 s under `min_efficiency: 0.75`: the efficiency floor holds it."""
    pol = policy(tiers=LEASE_0, thrash={"min_efficiency": 0.75})
    v = running("v", "b", 3, ("n0", 8), started=NOW - 44, startup_s=10.9, **attempt)
    p = pending("p", "a", 2, submit=NOW - 5)
    plan = plan_for(pol, nodes(1), [v, p], now=NOW)
    assert preempted(plan) == set()
    r = why(plan, "p")
    assert r.code == "WaitingForLease" and r.rule == "efficiency"  # type: ignore[attr-defined]
    return r


def test_the_efficiency_floor_names_an_assumed_save_before_the_first_one() -> None:
    r = _held_by_the_floor()
    assert (r.checkpoint_s, r.checkpoint_measured, r.save_measured) == (30.0, False, False)  # type: ignore[attr-defined]
    assert abs(r.earliest_at - (NOW - 44 + (10.9 + 30.0) / 0.25)) < 1e-3  # type: ignore[attr-defined]
    assert (
        "with its measured startup of 11s and an assumed save of 30s (`preemption.checkpoint_overhead`: "
        "job v has reported none) a preemption sooner would push its η below 0.75"
    ) in r.message


def test_the_efficiency_floor_names_one_save_of_the_reported_duration() -> None:
    r = _held_by_the_floor(sigterm_save_s=15.8)
    assert (r.checkpoint_s, r.checkpoint_measured, r.save_measured) == (15.8, False, True)  # type: ignore[attr-defined]
    assert abs(r.earliest_at - (NOW - 44 + (10.9 + 15.8) / 0.25)) < 1e-3  # type: ignore[attr-defined]
    assert "with its measured startup of 11s and one save of 16s, as long as its reported save takes" in r.message


def test_the_efficiency_floor_names_the_last_measured_save_never_the_sum() -> None:
    """Three saves of 15.8 s (47.4 s in all), the last one 15.8 s: the floor counts one save."""
    r = _held_by_the_floor(checkpoint_s=47.4, sigterm_save_s=15.8, last_checkpoint_at=NOW - 10)
    assert (r.checkpoint_s, r.checkpoint_measured, r.save_measured) == (15.8, True, None)  # type: ignore[attr-defined]
    assert abs(r.earliest_at - (NOW - 44 + (10.9 + 15.8) / 0.25)) < 1e-3  # type: ignore[attr-defined]
    assert "with its measured startup of 11s and one save of 16s, as long as its last measured save took" in r.message


def test_a_stored_efficiency_reason_from_before_the_assumed_save_still_renders() -> None:
    old = {"code": "WaitingForLease", "details": {
        "victims": ["v"], "earliest_at": 600.0, "rule": "efficiency", "victim": "v", "lease_s": 0.0,
        "startup_s": 60.0, "startup_measured": False, "checkpoint_s": 0.0, "min_efficiency": 0.9,
    }}  # fmt: skip
    assert "and 0s of checkpoints a preemption sooner" in from_dict(old).message


def test_waiting_for_lease_names_the_thrash_budget() -> None:
    pol = policy(tiers=LEASE_0)
    v = running("v", "b", 3, ("n0", 8), started=9_000.0, preempted_at=(2_000.0, 5_000.0, 8_000.0))
    assert preempted(plan_for(pol, nodes(1), [v, pending("p", "a", 1, submit=9_990.0)], now=NOW)) == {"v"}
    p = pending("p", "a", 2, submit=9_990.0)  # the budget holds back tiers 2–4, never tier 1
    r = why(plan_for(pol, nodes(1), [v, p], now=NOW), "p")
    assert r.code == "WaitingForLease"
    assert (r.rule, r.thrash_count, r.thrash_window_s) == ("thrash_budget", 3, 86_400.0)  # type: ignore[attr-defined]
    assert r.earliest_at == 2_000.0 + 86_400.0  # type: ignore[attr-defined]
    assert "preempted 3 times within 1d (`thrash.max_preemptions`)" in r.message


def test_waiting_for_grace_and_would_not_pay_say_the_job_needs_nothing() -> None:
    a1 = running("a1", "a", 3, ("n0", 8), started=0.0)
    b1 = running("b1", "b", 3, ("n1", 8), started=0.0, last_checkpoint_at=9_000.0)
    p = pending("p", "a", 2, submit=9_990.0)
    r = why(plan_for(policy(), nodes(2), [a1, b1, p], now=NOW), "p")
    assert r.code == "WaitingForGrace" and "claimed for the job" in r.message
    soon = replace(a1, time_limit=10_500.0)
    r = why(plan_for(policy(), nodes(2), [soon, b1, p], now=NOW), "p")
    assert r.code == "PreemptionWouldNotPay" and "(`preemption.only_if_it_pays`)" in r.message
    # Tier 1 is bound by its victims' leases and grace, not by what they would lose.
    r = why(plan_for(policy(), nodes(2), [soon, b1, replace(p, tier=1)], now=NOW), "p")
    assert r.code == "WaitingForGrace"


def test_gates_name_their_knob_or_command() -> None:
    pol = policy(scheduling={"head_of_line_blocking": True})
    full = running("full", "a", 3, ("n0", 8), started=0.0)
    ask = pending("ask", "a", 2, submit=1.0, state=JobState.AWAITING_APPROVAL)
    back = pending("back", "a", 3, submit=2.0, not_before=NOW + 300)
    head = pending("head", "a", 3, submit=3.0)
    behind = pending("behind", "b", 3, gpus=4, submit=4.0)
    lost = pending("lost", "nope", 3, submit=5.0)
    plan = plan_for(pol, nodes(1), [full, ask, back, head, behind, lost], now=NOW)
    assert why(plan, "ask").render(job_id="ask").endswith("an admin runs `warden approve ask`.")
    assert "(in 5m) (`thrash.requeue_backoff`)" in why(plan, "back").render(virtual_times(NOW))
    r = why(plan, "behind")
    assert r.code == "Position" and "(`scheduling.head_of_line_blocking`)" in r.message
    unknown = why(plan_for(policy(), nodes(1), [lost], now=NOW), "lost")
    assert unknown.code == "UnknownQueue" and unknown.queues == ("a", "b")  # type: ignore[attr-defined]
    assert unknown.message.endswith("submit it again to one that is: a, b.")


def test_a_stored_reason_renders_again_as_it_was() -> None:
    """What a shell stores (`to_dict`) rebuilds to the same reason, rendered at any moment."""
    v = running("v", "b", 3, ("n0", 8), started=NOW - 10, startup_s=None)
    p = pending("p", "a", 1, submit=NOW - 5)
    plan = plan_for(policy(tiers=LEASE_0), nodes(1), [v, p], now=NOW)
    for e in plan.explanations.values():
        stored = e.reason.to_dict()
        again = from_dict({"code": stored["code"], "details": stored["details"]})
        assert again == e.reason and again.render(engine_time) == stored["message"]
    assert not re.search(r"\d{10}", why(plan, "p").render(virtual_times(NOW)))


def test_a_full_cluster_names_who_borrows_from_the_jobs_queue_and_when_it_takes_it_back() -> None:
    """The root's quota is the cluster: a job of queue a (in-quota) waits because queue b holds
    a's unused nominal. Not "queue cluster uses 16 of its 16 gpu quota": the cluster is full,
    b borrows 8 of a's, and the job reclaims them once b1's lease ends (45m after it started; its 8
    GPUs make room for the job's 4)."""
    pol = policy(scheduling={"reservations": 0})
    b1 = running("b1", "b", 3, ("n0", 8), started=NOW - 600)
    b2 = running("b2", "b", 3, ("n1", 8), started=NOW - 300)
    p = pending("p", "a", 3, gpus=4, submit=NOW - 60)
    r = why(plan_for(pol, nodes(2), [b1, b2, p], now=NOW), "p")
    assert r.code == "QuotaExceeded" and r.queue == "cluster"  # type: ignore[attr-defined]
    facts = r.details()
    assert (facts["cluster"], facts["own_queue"], facts["lent"], facts["borrowers"], facts["borrowed"]) == (
        True,
        "a",
        8,
        ["b"],
        8,
    )
    assert facts["reclaimable"] is True and facts["reclaim_at"] == NOW - 600 + 45 * 60  # b1's lease, first to end
    m = r.render(virtual_times(NOW))
    assert m.startswith("The cluster is full: all 16 gpu are in use and the job needs 4; "), m
    assert "queue a lends the 8 gpu of its nominal it does not use: queue b holds 8 beyond its nominal" in m
    assert "which the job may take back (reclaim) from t=12100s (in 35m), as their leases end" in m
    assert "quota" not in m and from_dict(r.to_dict()) == r  # stored and rebuilt as it was


def test_a_full_cluster_owes_nothing_to_a_queue_that_uses_its_nominal() -> None:
    pol = policy(scheduling={"reservations": 0})
    a1 = running("a1", "a", 3, ("n0", 8), started=NOW - 600)
    b1 = running("b1", "b", 3, ("n1", 8), started=NOW - 600)
    b2 = running("b2", "b", 3, ("n2", 8), started=NOW - 600)
    p = pending("p", "a", 3, gpus=4, submit=NOW - 60)
    r = why(plan_for(pol, nodes(3), [a1, b1, b2, p], now=NOW), "p")
    assert r.code == "QuotaExceeded" and r.details()["cluster"] is True  # type: ignore[attr-defined]
    m = r.message
    assert m.startswith("The cluster is full: all 24 gpu are in use and the job needs 4; ")
    assert "queue a uses all of its nominal, so nothing is owed to the job: queue b holds 8 beyond its nominal" in m
    quiet = why(plan_for(pol, nodes(2), [a1, b1, p], now=NOW), "p")  # nobody borrows
    assert "every queue is within its nominal, queue a included" in quiet.message
