"""Taking back borrowed capacity (DESIGN §4.3, §4.4): nominal reclaim of any preemptible tier and
never below the victim queue's nominal, fair-share reclaim between borrowers, the starvation
shield, and which borrower gives back first. Each scenario is one pass of the engine, fresh and
warm alike (`schedule`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from support import pending, preempted, reason, running

from warden.engine.model import Job, Node, Snapshot
from warden.engine.plan import Plan
from warden.engine.policy import Policy, parse_policy
from warden.engine.scheduler import Engine, schedule

HOUR = 3600.0
NOW = 10 * HOUR
"""Every running job below started hours ago: no lease protects it unless the test says so."""


def _policy(queues: list[dict[str, Any]], gpus: int = 8, **over: Any) -> Policy:
    data: dict[str, Any] = {
        "tiers": {2: {"requires_approval": False}},
        "queues": {"name": "cluster", "nominal": {"gpu": gpus}, "children": queues},
        "preemption": {"only_if_it_pays": False, "restart_overhead": "0s", "checkpoint_overhead": "0s"},
        "thrash": {"min_efficiency": 0.0},
    }
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return parse_policy(data)


def _plan(pol: Policy, nodes: tuple[Node, ...], jobs: list[Job], now: float = NOW) -> Plan:
    snap = Snapshot(nodes, tuple(jobs), pol)
    fresh = schedule(snap, now)
    engine = Engine()
    engine.plan(snap, now - 1.0)
    assert engine.plan(snap, now) == fresh  # a warm engine decides the same
    return fresh


def _kinds(plan: Plan) -> dict[str, str]:
    return {p.job_id: p.kind for p in plan.preemptions}


TWO_TEAMS = [{"name": "team-a", "nominal": {"gpu": 4}}, {"name": "team-b", "nominal": {"gpu": 4}}]
EIGHT = (Node("n0", 8),)


def test_a_lender_takes_back_from_a_higher_tier_borrower_once_its_lease_is_over() -> None:
    """Nominal reclaim whatever the victim's tier: team-b's tier-2 job borrows team-a's GPUs."""
    pol = _policy(TWO_TEAMS)
    b_own = running("b-own", "team-b", 2, ("n0", 4), started=0.0)
    b_borrow = running("b-borrow", "team-b", 2, ("n0", 4), started=0.0, first_gpu=4)
    a = pending("a", "team-a", 3, gpus=4, submit=NOW - 60)
    plan = _plan(pol, EIGHT, [b_own, b_borrow, a])
    assert _kinds(plan) in ({"b-borrow": "reclaim"}, {"b-own": "reclaim"})
    # Inside the tier-2 lease (4 h) nothing is taken: the lender waits for it.
    young = [replace(j, attempt=replace(j.attempt, started_at=NOW - HOUR)) for j in (b_own, b_borrow)]  # type: ignore[arg-type]
    plan = _plan(pol, EIGHT, [*young, a])
    assert not plan.preemptions
    assert reason(plan, "a") == "WaitingForLease"


def test_nominal_reclaim_of_a_higher_tier_can_be_turned_off() -> None:
    pol = _policy(TWO_TEAMS, preemption={"reclaim": {"nominal": "not_higher", "fair_share": "never"}})
    jobs = [
        running("b-own", "team-b", 2, ("n0", 4), started=0.0),
        running("b-borrow", "team-b", 2, ("n0", 4), started=0.0, first_gpu=4),
        pending("a", "team-a", 3, gpus=4, submit=NOW - 60),
    ]
    assert not _plan(pol, EIGHT, jobs).preemptions


def test_a_reclaim_takes_exactly_what_was_borrowed_and_waits_for_it() -> None:
    """team-b holds 6 of its 4: a 4-GPU gang and a 2-GPU job still in its lease. team-a's 2-GPU
    job must not take the 4-GPU gang (team-b would fall to 2 of its 4, and the 2 spare GPUs would
    become team-a's new borrowing): it waits for the 2-GPU job's lease, then takes that one."""
    pol = _policy(TWO_TEAMS, tiers={3: {"lease": "45m"}})
    gang = running("gang", "team-b", 3, [("n0", 2), ("n0", 2)], started=0.0)
    small = running("small", "team-b", 3, ("n0", 2), started=NOW - 600, first_gpu=4)
    a = pending("a", "team-a", 3, gpus=2, submit=NOW - 60)
    idle_a = running("a-own", "team-a", 3, ("n0", 2), started=0.0, first_gpu=6)
    plan = _plan(pol, EIGHT, [gang, small, a, idle_a])
    assert not plan.preemptions
    assert reason(plan, "a") == "WaitingForLease"
    later = NOW - 600 + 45 * 60 + 1
    plan = _plan(pol, EIGHT, [gang, small, a, idle_a], now=later)
    assert preempted(plan) == {"small"}


def test_a_queue_below_its_share_takes_back_from_the_one_furthest_above() -> None:
    """Fair-share reclaim between borrowers: three teams of nominal 2 on 12 GPUs, each asking
    for more than its share (owed 4 each). team-c holds 2 (its nominal) and asks for 2 more;
    team-a holds 8, team-b 2: team-c takes from team-a, the furthest above its share (at 6 of
    its 4 after two victims, still 1.5 × team-c's share with the job: the default margin)."""
    teams = [{"name": f"team-{x}", "nominal": {"gpu": 2}} for x in "abc"]
    pol = _policy(teams, gpus=12)
    nodes = (Node("n0", 12),)
    jobs: list[Job] = []
    gpu = 0
    for team, count in (("a", 8), ("b", 2), ("c", 2)):
        for i in range(count):
            jobs.append(running(f"{team}{i}", f"team-{team}", 3, ("n0", 1), started=float(i), first_gpu=gpu))
            gpu += 1
        jobs.append(pending(f"{team}-more", f"team-{team}", 3, gpus=4, submit=NOW - 600))
    jobs.append(pending("c-next", "team-c", 3, gpus=2, submit=NOW - 60))
    plan = _plan(pol, nodes, jobs)
    taken = preempted(plan)
    assert taken and all(j.startswith("a") for j in taken), plan.preemptions
    assert set(_kinds(plan).values()) == {"fair_share"}
    # team-b, below what it is owed, is left alone; team-a keeps at least its owed 4 GPUs.
    assert len(taken) <= 3


def test_fair_share_reclaim_stops_where_the_swap_would_not_lower_the_larger_share() -> None:
    """Two teams each at their owed share: no fair-share reclaim either way."""
    teams = [{"name": f"team-{x}", "nominal": {"gpu": 2}} for x in "ab"]
    pol = _policy(teams, gpus=8)
    jobs = [running(f"a{i}", "team-a", 3, ("n0", 1), started=0.0, first_gpu=i) for i in range(4)]
    jobs += [running(f"b{i}", "team-b", 3, ("n0", 1), started=0.0, first_gpu=4 + i) for i in range(4)]
    jobs += [pending("a-more", "team-a", 3, gpus=1, submit=NOW - 60), pending("b-more", "team-b", 3, gpus=1)]
    assert not _plan(pol, EIGHT, jobs).preemptions


@pytest.mark.parametrize(("mode", "taken"), [("final", True), ("above_share", False), ("never", False)])
def test_above_share_takes_only_what_the_victim_queue_holds_above_its_owed_share(mode: str, taken: bool) -> None:
    """Two teams of nominal 2 on 8 GPUs, both asking for more (owed 4 each): team-a holds 6 in
    two 3-GPU jobs, team-b 2 and asks for 1 more (then 2). Taking a 3-GPU job lowers the larger share
    (team-b at 3/4 after, team-a at 3/4), so `final` with no margin takes it; `above_share` does not, as
    team-a would be left below what it is owed."""
    teams = [{"name": f"team-{x}", "nominal": {"gpu": 2}} for x in "ab"]
    pol = _policy(teams, gpus=8, preemption={"reclaim": {"fair_share": mode, "fair_share_margin": 1.0}})
    jobs = [running(f"a{i}", "team-a", 3, ("n0", 3), started=0.0, first_gpu=3 * i) for i in range(2)]
    jobs += [running("b0", "team-b", 3, ("n0", 2), started=0.0, first_gpu=6)]
    jobs += [pending("a-more", "team-a", 3, gpus=3, submit=NOW - 600), pending("b-more", "team-b", 3, gpus=1)]
    jobs += [pending("b-later", "team-b", 3, gpus=2, submit=NOW - 60)]
    plan = _plan(pol, EIGHT, jobs)
    assert (set(_kinds(plan).values()) == {"fair_share"}) is taken, plan.preemptions
    assert bool(plan.preemptions) is taken


@pytest.mark.parametrize(("margin", "taken"), [(1.0, True), (1.5, False)])
def test_a_fair_share_margin_asks_for_a_larger_imbalance(margin: float, taken: bool) -> None:
    """The scenario above under `final`: team-b with the job at 3/4 of its owed share, team-a
    left at 3/4: a swap the rule as written makes, and a margin of 1.5 (team-a would have to
    keep 9/8 of its share) does not."""
    teams = [{"name": f"team-{x}", "nominal": {"gpu": 2}} for x in "ab"]
    pol = _policy(teams, gpus=8, preemption={"reclaim": {"fair_share_margin": margin}})
    jobs = [running(f"a{i}", "team-a", 3, ("n0", 3), started=0.0, first_gpu=3 * i) for i in range(2)]
    jobs += [running("b0", "team-b", 3, ("n0", 2), started=0.0, first_gpu=6)]
    jobs += [pending("a-more", "team-a", 3, gpus=3, submit=NOW - 600), pending("b-more", "team-b", 3, gpus=1)]
    jobs += [pending("b-later", "team-b", 3, gpus=2, submit=NOW - 60)]
    assert bool(_plan(pol, EIGHT, jobs).preemptions) is taken


@pytest.mark.parametrize("shield", ["max_lease", "always", "off"])
def test_a_starving_borrower_is_not_reclaimed(shield: str) -> None:
    """team-b's borrowing job waited a day before it started (past escalate_at × max_wait): the
    lender may not take it back while the shield lasts (max_lease, 8 h of its attempt)."""
    pol = _policy(TWO_TEAMS, preemption={"reclaim": {"starvation_shield": shield}})
    b_own = running("b-own", "team-b", 3, ("n0", 4), started=NOW - HOUR)
    starved = replace(running("starved", "team-b", 3, ("n0", 4), started=NOW - HOUR, first_gpu=4), waited=30 * HOUR)
    a = pending("a", "team-a", 3, gpus=4, submit=NOW - 60)
    b_own = replace(b_own, waited=30 * HOUR)
    plan = _plan(pol, EIGHT, [b_own, starved, a])
    if shield == "off":
        assert preempted(plan)
    else:
        assert not plan.preemptions
    # After max_lease of its attempt, the bounded shield lifts.
    plan = _plan(pol, EIGHT, [b_own, starved, a], now=NOW - HOUR + 8 * HOUR + 1)
    assert bool(plan.preemptions) is (shield != "always")


def test_downward_preemption_ignores_the_starvation_shield() -> None:
    pol = _policy(TWO_TEAMS, tiers={1: {"requires_approval": False}, 2: {"requires_approval": False}})
    starved = replace(running("starved", "team-a", 3, ("n0", 8), started=NOW - HOUR), waited=30 * HOUR)
    p = pending("p", "team-a", 2, gpus=4, submit=NOW - 60)
    assert preempted(_plan(pol, EIGHT, [starved, p])) == {"starved"}


def test_reclaim_victims_come_from_the_queue_furthest_above_its_share_on_equal_cost() -> None:
    """Equal costs (nothing lost, no restart cost): the victim comes from the queue furthest
    above its owed share, not the most recently started job."""
    teams = [{"name": f"team-{x}", "nominal": {"gpu": 2}} for x in "abc"]
    pol = _policy(teams, gpus=12)
    nodes = (Node("n0", 12),)
    saves = {"sigterm_save_s": 1.0}  # saves on SIGTERM: nothing lost, every cost 0
    jobs = [running(f"a{i}", "team-a", 3, ("n0", 1), started=float(i), first_gpu=i, **saves) for i in range(7)]
    jobs += [running(f"b{i}", "team-b", 3, ("n0", 1), started=100.0 + i, first_gpu=7 + i, **saves) for i in range(5)]
    jobs += [pending("a-more", "team-a", 3, gpus=1), pending("b-more", "team-b", 3, gpus=1)]
    jobs += [pending("c", "team-c", 3, gpus=1, submit=NOW - 60)]
    plan = _plan(pol, nodes, jobs)
    assert len(plan.preemptions) == 1 and plan.preemptions[0].job_id.startswith("a"), plan.preemptions
