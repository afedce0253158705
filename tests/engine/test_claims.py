"""Capacity a preemption frees is the preemptor's (`Job.claim`, `Plan.claims`).

The scenario: 8 GPUs; `research{vision, language}` has a nominal of 4 and may borrow 2,
`platform` a nominal of 4 and lends 2. `vision` borrows up to 6 GPUs, then three platform jobs
and one in-quota `language` job `l1` of 2 GPUs arrive. `l1` reclaims from `vision`; while its
victims are in their grace, and in the pass in which they exit, no other job (the platform jobs
rank ahead of `l1` by fair share, and may borrow) is admitted into what they free. Played
through the warm engine told only what changed, with every plan checked against a fresh pass.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from engine_driver import Driver, JobSpec, run_history
from support import admitted, pending, reason, running

from warden.engine.model import Node, Snapshot
from warden.engine.policy import Policy, parse_policy
from warden.engine.scheduler import schedule

CLUSTER = (Node("n0", 8),)
QUEUES: dict[str, Any] = {
    "name": "cluster",
    "nominal": {"gpu": 8},
    "children": [
        {
            "name": "research",
            "nominal": {"gpu": 4},
            "borrowing_limit": {"gpu": 2},
            "children": [{"name": "vision", "nominal": {"gpu": 2}}, {"name": "language", "nominal": {"gpu": 2}}],
        },
        {"name": "platform", "nominal": {"gpu": 4}, "lending_limit": {"gpu": 2}},
    ],
}


def _policy(lease: str) -> Policy:
    tiers = {t: {"lease": lease, "grace": "120s"} for t in (2, 3, 4)}
    return parse_policy(
        {
            "tiers": tiers,
            "queues": QUEUES,
            # The fair-share swap as written (margin 1): the arithmetic the tests below state.
            "preemption": {"restart_overhead": "0s", "checkpoint_overhead": "0s", "reclaim": {"fair_share_margin": 1}},
            "thrash": {"min_efficiency": 0.0, "max_preemptions": {"per": "24h", "count": 100}},
            # platform has used little: it ranks ahead of research in every pass.
            "fair_share": {"half_life": "7d"},
        }
    )


def _specs(lease_s: float) -> tuple[JobSpec, ...]:
    later = lease_s + 10.0  # the vision jobs' leases have run out when the others arrive
    vision = [JobSpec(pending(f"v{i}", "vision", 3, gpus=1, submit=float(i)), duration=86_400.0) for i in range(6)]
    platform = [JobSpec(pending(f"p{i}", "platform", 3, gpus=1, submit=later), duration=86_400.0) for i in (1, 2, 3)]
    l1 = JobSpec(pending("l1", "language", 3, gpus=2, submit=later + 1.0), duration=86_400.0, exit_fracs=(0.5,))
    return (*vision, *platform, l1)


def _play(lease: str, lease_s: float) -> Driver:
    gaps = (1.0,) * 8 + (lease_s + 10.0,) + (15.0,) * 40
    return run_history(CLUSTER, _policy(lease), _specs(lease_s), gaps, engine="changed")


@pytest.mark.parametrize(("lease", "lease_s"), [("0s", 0.0), ("10m", 600.0)])
def test_reclaimed_capacity_goes_to_the_job_that_reclaimed_it(lease: str, lease_s: float) -> None:
    driver = _play(lease, lease_s)
    evictions = driver.evictions
    # Exactly the minimal victims, each preempted once: the platform jobs take the 2 free GPUs
    # and reclaim one more between them; l1 (2 GPUs) takes back by fair-share reclaim what
    # vision holds above what it is owed (demand 6, 2, 3 on weights 2, 2, 4 of 8 GPUs: vision
    # is owed 3, language 2): two jobs, fewer than an in-quota admission would need (3).
    by_victim = Counter(e.job_id for e in evictions)
    assert all(n == 1 for n in by_victim.values()), by_victim
    assert {e.job_id[0] for e in evictions} == {"v"}, evictions  # only vision borrowed
    for_l1 = [e for e in evictions if e.for_job == "l1"]
    assert sorted(e.job_id for e in for_l1) == ["v3", "v4"], evictions
    assert [e.job_id for e in evictions if e.for_job != "l1"] == ["v5"], evictions
    # l1 starts in the first pass after its victims are gone, and nobody was admitted into the
    # GPUs they freed meanwhile.
    l1_exit = max(e.exit_at for e in for_l1)
    started = {r.now: {a.job_id for a in r.plan.admissions} for r in driver.log}
    l1_start = next(t for t, ids in started.items() if "l1" in ids)
    assert l1_start == min(t for t in started if t >= l1_exit)
    job = driver.jobs["l1"]
    assert job.attempt is not None and job.attempt.started_at == l1_start
    # While it waited, it held its claim, and nothing else started on the cluster but the jobs
    # that claimed their own victims' capacity before it did.
    claimed = [r for r in driver.log if "l1" in r.plan.claims]
    assert claimed and all(r.now < l1_start for r in claimed)
    first_claim = claimed[0].now
    before = {c for r in driver.log if r.now <= first_claim for c in r.plan.claims} - {"l1"}
    assert all(ids <= before for t, ids in started.items() if first_claim < t < l1_start), started
    assert not any(r.plan.released_claims for r in driver.log)


def test_a_claim_no_longer_needed_is_released() -> None:
    """A claimant whose victims have gone and that cannot start (the cluster shrank, and what
    is left runs inside its lease) no longer claims anything: the plan says so."""
    pol = _policy("1h")
    l1 = pending("l1", "language", 3, gpus=2, submit=1.0, claim=True)
    v = running("v", "vision", 4, ("n0", 2), started=90.0)
    plan = schedule(Snapshot((Node("n0", 2),), (v, l1), pol), 100.0)
    assert plan.admissions == () and plan.preemptions == ()
    assert plan.claims == frozenset() and plan.released_claims == ("l1",)
    assert reason(plan, "l1") == "WaitingForLease"
    # Room elsewhere: admitted, and the claim simply ends with the admission.
    plan = schedule(Snapshot((Node("n0", 2), Node("n1", 2)), (v, l1), pol), 100.0)
    assert admitted(plan) == {"l1"} and plan.released_claims == ()


def test_claimants_go_first_and_keep_their_victims_capacity() -> None:
    """One pass: a claimant ranked below another job gets the capacity its victims freed."""
    pol = _policy("0s")
    p3 = pending("p3", "platform", 3, gpus=2, submit=0.0)
    l1 = pending("l1", "language", 3, gpus=2, submit=1.0)
    cluster = (Node("n0", 2),)
    assert admitted(schedule(Snapshot(cluster, (p3, l1), pol), 100.0)) == {"p3"}  # rank alone
    plan = schedule(Snapshot(cluster, (p3, replace(l1, claim=True)), pol), 100.0)
    assert admitted(plan) == {"l1"}
    assert plan.claims == frozenset() and plan.released_claims == ()


def test_a_claimant_goes_before_every_waiting_job_of_tiers_2_to_4_and_behind_tier_1() -> None:
    """What a claimant's victims free is its own against tiers 2–4 (a job of those admitted
    there would be preempted for it again, or leave it to preempt anew the next time), never
    against tier 1 (DESIGN §4.4: production does not wait behind a claim)."""
    pol = _policy("0s")
    cluster = (Node("n0", 2),)
    t2 = pending("t2", "platform", 2, gpus=2, submit=5.0)
    t3 = pending("t3", "platform", 3, gpus=2, submit=0.0)
    l1 = pending("l1", "language", 3, gpus=2, submit=1.0, claim=True)
    plan = schedule(Snapshot(cluster, (t3, l1, t2), pol), 100.0)
    assert admitted(plan) == {"l1"}
    order = sorted(plan.explanations.values(), key=lambda e: e.position)
    assert [e.job_id for e in order] == ["t2", "t3"]
    assert plan.explanations["t2"].position == 2  # after l1
    # A tier-1 job goes first and takes the capacity; the claimant ranks right behind it.
    t1 = pending("t1", "platform", 1, gpus=2, submit=9.0)
    plan = schedule(Snapshot(cluster, (t3, l1, t2, t1), pol), 100.0)
    assert admitted(plan) == {"t1"} and plan.explanations["l1"].position == 2
