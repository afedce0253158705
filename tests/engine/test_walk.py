"""The class-by-class walk (`phases.explain`) gives the plan of a walk over every waiting job
one by one (`walk_reference.one_by_one`), on deep synthetic queues and policy variants that
make classes skip, come back and split: reservations (one and several), claims, head-of-line
blocking, the FIFO and priority orders, quota on CPU and memory.
"""

from __future__ import annotations

from dataclasses import replace
from random import Random
from typing import Any

import pytest
from walk_reference import one_by_one

from warden.engine.model import Snapshot
from warden.engine.policy import parse_policy
from warden.engine.scheduler import Engine, schedule
from warden.engine.synthetic import synthetic_policy, synthetic_snapshot

VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "three reservations": {"scheduling": {"reservations": 3}, "preemption": {"max_attempts_per_pass": 64}},
    "no reservation": {"scheduling": {"reservations": 0}},
    "head of line": {"scheduling": {"head_of_line_blocking": True}},
    "fifo": {"scheduling": {"order": "fifo", "reservations": 2}},
    "priority by eviction": {"scheduling": {"order": "priority", "requeue_timestamp": "eviction"}},
    "priority, nominal first": {"scheduling": {"order": "priority", "nominal_first": True, "reservations": 2}},
    "zero leases": {"tiers": {3: {"lease": "0s"}, 4: {"charged": True}}, "preemption": {"max_attempts_per_pass": 100}},
}


def _snapshot(seed: int, variant: dict[str, Any], nodes: int = 40, pending: int = 1500, running: int = 200) -> Snapshot:
    snap, _ = synthetic_snapshot(nodes, 8, pending, running, seed)
    data, _ = synthetic_policy(nodes * 8, Random(seed))
    for section, values in variant.items():
        data.setdefault(section, {})
        for k, v in values.items():
            if isinstance(v, dict) and isinstance(data[section].get(k), dict):
                data[section][k] = {**data[section][k], **v}
            else:
                data[section][k] = v
    rng = Random(seed + 7)
    # Some waiting jobs hold a claim, as if an earlier pass had preempted for them.
    jobs = tuple(replace(j, claim=True) if j.state.waiting and rng.random() < 0.01 else j for j in snap.jobs)
    return replace(snap, jobs=jobs, policy=parse_policy(data))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_class_walk_plans_what_a_walk_over_every_job_plans(variant: str, seed: int) -> None:
    snap = _snapshot(seed, VARIANTS[variant])
    now = max(j.submit for j in snap.jobs) + 60.0
    plan = schedule(snap, now)
    every = one_by_one(snap, now)
    assert plan.admissions == every.admissions
    assert plan.preemptions == every.preemptions
    assert plan.reservations == every.reservations
    assert plan.claims == every.claims and plan.released_claims == every.released_claims
    assert len(plan.explanations) == len(every.explanations)
    assert list(plan.explanations.items()) == list(every.explanations.items())


def test_a_warm_engine_walks_the_same_way_as_time_passes() -> None:
    """Pass after pass on one engine, with back-offs ending and waits breaching on the way."""
    snap = _snapshot(3, VARIANTS["three reservations"], pending=800)
    engine = Engine()
    now = max(j.submit for j in snap.jobs) + 1.0
    for step in range(6):
        plan = engine.plan(snap, now)
        assert plan == one_by_one(snap, now), f"step {step}"
        now += 600.0 * (step + 1)


def test_explanations_are_worked_out_only_when_read() -> None:
    snap = _snapshot(0, {})
    now = max(j.submit for j in snap.jobs) + 60.0
    plan = schedule(snap, now)
    waiting = sum(1 for j in snap.jobs if j.state.waiting)
    assert plan.explanations._done is None  # type: ignore[attr-defined]
    assert len(plan.explanations) == waiting - len(plan.admissions)
    assert plan.explanations._done is None  # type: ignore[attr-defined]
    first = next(iter(plan.explanations.values()))
    assert first.position >= 1 and plan.explanations._done is not None  # type: ignore[attr-defined]


def test_a_class_answered_before_a_reservation_is_looked_at_again_after_it() -> None:
    """Gangs of two full nodes fail before any reservation (one node never frees); a later
    one-node job reserves the node that frees; the next gang meets that reservation, so it
    must be decided again, not answered by what the first gang was told."""
    from support import nodes, pending, policy, running

    from warden.engine.model import UsageLedger

    pol = policy(queues={"name": "cluster", "children": [{"name": "a", "nominal": {"gpu": 32}}]})
    cluster = nodes(2)
    jobs = (
        running("r0", "a", 3, ("n0", 8), started=0.0, time_limit=500.0),
        running("r1", "a", 3, ("n1", 8), started=0.0),
        pending("g1", "a", 3, gpus=8, submit=10.0, replicas=2),
        pending("s1", "a", 3, gpus=8, submit=20.0),
        pending("g2", "a", 3, gpus=8, submit=30.0, replicas=2),
        pending("g3", "a", 3, gpus=8, submit=40.0, replicas=2, time_limit=50.0),
    )
    snap = Snapshot(cluster, jobs, pol, UsageLedger(100.0, {}))
    plan = schedule(snap, 100.0)
    every = one_by_one(snap, 100.0)
    assert [r.job_id for r in plan.reservations] == ["s1"]
    assert dict(plan.explanations) == dict(every.explanations)


def test_a_class_told_it_is_reserved_out_is_looked_at_again_when_the_holds_change() -> None:
    """A job that would fit but for a reservation is told `Reserved` (an outcome that stands
    only while the holds do); a short job then backfills into the reservation, and the next
    job like the first must be decided again."""
    from support import nodes, pending, policy, running

    from warden.engine.model import UsageLedger

    pol = policy(queues={"name": "cluster", "children": [{"name": "a", "nominal": {"gpu": 32}}]})
    jobs = (
        running("r0", "a", 3, ("n0", 8), started=0.0, time_limit=500.0),
        running("r1", "a", 3, ("n1", 8), started=0.0),
        pending("s1", "a", 3, gpus=8, submit=10.0, replicas=2),
        pending("x1", "a", 3, gpus=8, submit=20.0),
        pending("b1", "a", 3, gpus=4, submit=30.0, time_limit=50.0),
        pending("x2", "a", 3, gpus=8, submit=40.0),
    )
    snap = Snapshot(nodes(3), jobs, pol, UsageLedger(100.0, {}))
    plan = schedule(snap, 100.0)
    every = one_by_one(snap, 100.0)
    assert [r.job_id for r in plan.reservations] == ["s1"] and [a.job_id for a in plan.admissions] == ["b1"]
    assert plan.explanations["x1"].reason.code == "Reserved"
    assert dict(plan.explanations) == dict(every.explanations)
