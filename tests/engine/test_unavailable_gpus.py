"""GPU indices a node cannot give (held outside warden, failed, drained: `Node.unavailable`) are
never placed on and never counted as capacity, warm or cold."""

from __future__ import annotations

import random
import re
from dataclasses import replace

import pytest

from warden.engine.allocation import Allocation
from warden.engine.demand import cluster_gpus
from warden.engine.fairshare import cluster_capacity
from warden.engine.model import Attempt, Job, JobState, Node, ReplicaPlacement, Snapshot
from warden.engine.overcommit import cluster_totals
from warden.engine.plan import Plan
from warden.engine.policy import parse_policy
from warden.engine.scheduler import Engine, schedule
from warden.engine.synthetic import synthetic_snapshot

POLICY = parse_policy({"queues": {"name": "cluster", "children": [{"name": "a", "nominal": {"gpu": 4}}]}})


def _placed_on(plan: Plan) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for a in plan.admissions:
        for p in a.placement:
            out.setdefault(p.node, set()).update(p.gpus)
    return out


def _held(snapshot: Snapshot) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for j in snapshot.jobs:
        if j.state.holds_resources and j.attempt is not None:
            for p in j.attempt.assignment:
                out.setdefault(p.node, set()).update(p.gpus)
    return out


def _with_unavailable(snapshot: Snapshot, rng: random.Random, share: float) -> Snapshot:
    """Some nodes lose some of their GPUs that no job holds (as the server never marks one a
    warden attempt holds)."""
    held = _held(snapshot)
    nodes = []
    for n in snapshot.nodes:
        free = [g for g in range(n.gpus) if g not in held.get(n.name, set())]
        k = rng.randint(0, len(free)) if rng.random() < share else 0
        nodes.append(replace(n, unavailable=tuple(sorted(rng.sample(free, k)))))
    return replace(snapshot, nodes=tuple(nodes))


def test_no_job_is_placed_on_an_unavailable_gpu_and_warm_plans_equal_fresh_ones() -> None:
    rng = random.Random(11)
    snapshot, now = synthetic_snapshot(16, 8, 80, 10, 4)
    engine = Engine()
    marked = 0
    for step in range(8):
        if step % 2 == 0:  # and between those, passes on the same nodes
            snapshot = _with_unavailable(snapshot, rng, 0.6)
        unavailable = {n.name: set(n.unavailable) for n in snapshot.nodes}
        marked += sum(map(len, unavailable.values()))
        fresh = schedule(snapshot, now)
        assert engine.plan(snapshot, now) == fresh  # a node whose unavailable GPUs changed is a node change
        for node, gpus in _placed_on(fresh).items():
            assert not gpus & unavailable[node], (step, node, gpus, unavailable[node])
        started = {a.job_id: a for a in fresh.admissions}
        jobs = [
            replace(j, state=JobState.RUNNING, attempt=Attempt(1, now, started[j.id].placement))
            if j.id in started
            else j
            for j in snapshot.jobs
        ]
        snapshot = replace(snapshot, jobs=tuple(jobs))
        now += 60.0
    assert marked > 50, marked


def test_only_the_usable_gpus_are_capacity_and_the_lowest_usable_are_assigned() -> None:
    nodes = (Node("n0", 4, unavailable=(0, 1)), Node("n1", 2))
    assert cluster_capacity(nodes)[0] == 4 and cluster_gpus(nodes) == 4
    assert cluster_totals(nodes)["gpu"] == 4 and cluster_totals(nodes)["gpu:default"] == 4
    alloc = Allocation(nodes, POLICY)
    assert alloc.index.capacity_gpus("default") == 4 and alloc.index.capacity("n0")[0] == 2
    three = Job("big", "a", 3, 0.0, gpus=3, placement="pack")
    two = Job("pair", "a", 3, 1.0, gpus=2, placement="pack")
    plan = schedule(Snapshot(nodes, (three, two), POLICY), 10.0)
    assert [(a.job_id, a.placement[0].node, a.placement[0].gpus) for a in plan.admissions] == [("pair", "n0", (2, 3))]
    assert "big" in plan.explanations  # three usable GPUs on no node: it waits
    busy = replace(two, state=JobState.RUNNING, attempt=Attempt(1, 10.0, plan.admissions[0].placement))
    plan = schedule(Snapshot(nodes, (three, busy, replace(two, id="next")), POLICY), 20.0)
    assert [(a.job_id, a.placement[0].node, a.placement[0].gpus) for a in plan.admissions] == [("next", "n1", (0, 1))]


def test_a_job_ending_gives_back_its_gpus_but_never_an_unavailable_one() -> None:
    nodes = (Node("n0", 4, unavailable=(1,)),)
    running = Job(
        "r", "a", 3, 0.0, gpus=2, state=JobState.RUNNING, attempt=Attempt(1, 0.0, (ReplicaPlacement("n0", (0, 2)),))
    )
    engine = Engine()
    waiting = Job("w", "a", 3, 1.0, gpus=3)
    assert not engine.plan(Snapshot(nodes, (running, waiting), POLICY), 5.0).admissions
    ended = replace(running, state=JobState.SUCCEEDED)
    plan = engine.plan(Snapshot(nodes, (waiting,), POLICY), 6.0, [ended])
    assert [a.placement[0].gpus for a in plan.admissions] == [(0, 2, 3)]
    assert plan == schedule(Snapshot(nodes, (waiting,), POLICY), 6.0)


@pytest.mark.parametrize(
    ("unavailable", "what"),
    [((4,), "in range(4)"), ((-1,), "in range(4)"), ((2, 1), "sorted and distinct"), ((1, 1), "sorted and distinct")],
)
def test_bad_unavailable_indices_are_one_clear_error_naming_the_node_and_field(
    unavailable: tuple[int, ...], what: str
) -> None:
    with pytest.raises(ValueError, match=rf"node 'n0': unavailable: .*{re.escape(what)}"):
        schedule(Snapshot((Node("n0", 4, unavailable=unavailable),), (), POLICY), 0.0)


def test_a_job_recorded_on_an_unavailable_gpu_counts_once_and_nothing_overflows() -> None:
    """The server's record of an attempt may name GPUs the substrate gave to other work until it
    is corrected: the node's usable GPUs are all taken, and no pass places anything there."""
    nodes = (Node("n0", 4, unavailable=(0, 1)),)
    stale = Job(
        "s", "a", 3, 0.0, gpus=2, state=JobState.RUNNING, attempt=Attempt(1, 0.0, (ReplicaPlacement("n0", (0, 1)),))
    )
    waiting = Job("w", "a", 3, 1.0, gpus=1)
    snapshot = Snapshot(nodes, (stale, waiting), POLICY)
    engine = Engine()
    plan = engine.plan(snapshot, 5.0)
    assert not plan.admissions and plan == schedule(snapshot, 5.0)
    ended = replace(stale, state=JobState.SUCCEEDED)
    plan = engine.plan(Snapshot(nodes, (waiting,), POLICY), 6.0, [ended])
    assert [a.placement[0].gpus for a in plan.admissions] == [(2,)]
