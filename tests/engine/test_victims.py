"""The pass prices its victims with `rules.cost_at` written out inline (`phases.victims`): on
random victims, at the `now` their facts were kept at and at a later one, every candidate costs
exactly (same floats) what `rules.victim_cost` — the function the rule tests pin — says.
"""

from __future__ import annotations

from random import Random

import pytest
from support import DESIGN_QUEUES, running

from warden.engine.allocation import Allocation
from warden.engine.model import Job, Node, Snapshot
from warden.engine.phases.state import PassState
from warden.engine.phases.victims import Victims
from warden.engine.policy import Policy, parse_policy
from warden.engine.rules import protection, victim_cost

QUEUES = ("vision", "language", "platform")


def _policy(order: str) -> Policy:
    return parse_policy(
        {
            "queues": DESIGN_QUEUES,
            "preemption": {"victim_order": order, "restart_overhead": "90s"},
            "tiers": {3: {"lease": "10m"}, 4: {"lease": "0s"}},
        }
    )


def _victims(rng: Random, count: int) -> tuple[tuple[Node, ...], list[Job]]:
    """`count` running jobs of random shapes and histories, one node each."""
    cluster = tuple(Node(f"n{i}", 8) for i in range(count))
    jobs = []
    for i in range(count):
        started = rng.uniform(0.0, 50_000.0)
        facts: dict[str, object] = {}
        if rng.random() < 0.7:
            facts["startup_s"] = rng.choice([0.0, rng.uniform(0.0, 900.0)])
        else:
            facts["startup_s"] = None
        if rng.random() < 0.6:
            facts["last_checkpoint_at"] = started + rng.uniform(-100.0, 20_000.0)
            facts["checkpoint_s"] = rng.uniform(0.0, 300.0)
        if rng.random() < 0.3:
            facts["sigterm_save_s"] = rng.uniform(0.0, 400.0)
        if rng.random() < 0.2:
            facts["grace"] = rng.choice([120.0, 600.0])
        replicas = rng.choice([1, 1, 2, 4])
        gpus = rng.choice([1, 2]) if replicas > 1 else rng.choice([1, 2, 4, 8])
        placement = [(f"n{i}", gpus)] * replicas
        jobs.append(running(f"v{i}", rng.choice(QUEUES), rng.choice([2, 3, 3, 4]), placement, started, **facts))
    return cluster, jobs


def _pool(alloc: Allocation, snap: Snapshot, now: float) -> dict[str, tuple[float, float]]:
    """(cost, lost work) of every candidate the pass prices at `now`."""
    state = PassState(snap, now, alloc, {}, {})
    return {c.job.id: (c.cost, c.lost) for c in Victims(state).pool().free_now}


@pytest.mark.parametrize("order", ["cost", "newest", "smallest"])
@pytest.mark.parametrize("seed", range(4))
def test_the_pass_prices_victims_as_the_rules_do(order: str, seed: int) -> None:
    rng = Random(seed)
    pol = _policy(order)
    cluster, jobs = _victims(rng, 400)
    snap = Snapshot(cluster, tuple(jobs), pol)
    alloc = Allocation(cluster, pol)
    alloc.sync(jobs)
    first = 60_000.0
    later = first + rng.uniform(1.0, 30_000.0)
    for now in (first, later):  # the second prices from facts kept at `first`
        priced = _pool(alloc, snap, now)
        assert priced, "every victim protected: the test would check nothing"
        for job in jobs:
            if job.id in priced:
                assert priced[job.id] == victim_cost(pol, job, now), job
    # The candidates are the jobs the victim rules let go at the time their facts were kept.
    state = PassState(snap, first, Allocation(cluster, pol), {}, {})
    assert set(_pool(alloc, snap, first)) == {j.id for j in jobs if protection(state.ctx, j) <= first}
