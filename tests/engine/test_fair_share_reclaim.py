"""Invariant 10 (DESIGN §4.6): while demand is unchanged, no two queues take capacity from each
other back and forth by fair-share reclaim; and the owed share the engine enforces is the
function the metrics integrate.

Hypothesis draws a queue tree (one or two levels, random nominal quotas and weights), a full
cluster of running jobs and a backlog per leaf, all submitted before the history starts, of
one charged tier, with jobs that never finish: demand never changes. The warm engine then
plays passes, requeued victims waiting again; every fair-share reclaim is one swap, and no swap
may ever be undone.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from engine_driver import JobSpec, run_history
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from invariants import check_pass

from warden.engine.accounting import owed_now, queue_weights, waterfill
from warden.engine.model import Job, Node
from warden.engine.policy import parse_policy

DAY = 86_400.0


@st.composite
def contended(draw: st.DrawFn) -> tuple[tuple[Node, ...], dict[str, Any], tuple[JobSpec, ...]]:
    gpus = draw(st.integers(4, 16))
    nodes = (Node("n0", gpus),)
    two_levels = draw(st.booleans())
    leaves = [f"q{i}" for i in range(draw(st.integers(2, 4)))]
    spec_of = {
        q: {"name": q, "nominal": {"gpu": draw(st.integers(0, 4))}, "weight": draw(st.sampled_from([1, 2]))}
        for q in leaves
    }
    if two_levels and len(leaves) >= 3:
        children: list[dict[str, Any]] = [
            {"name": "dept", "children": [spec_of[q] for q in leaves[:2]]},
            *(spec_of[q] for q in leaves[2:]),
        ]
    else:
        children = [spec_of[q] for q in leaves]
    policy = {
        "tiers": {3: {"lease": "0s", "grace": "120s"}},
        "queues": {
            "name": "cluster",
            "nominal": {"gpu": max(gpus, sum(spec_of[q]["nominal"]["gpu"] for q in leaves))},
            "children": children,
        },
        "preemption": {
            "restart_overhead": "0s",
            "checkpoint_overhead": "0s",
            "only_if_it_pays": False,
            "reclaim": {
                "fair_share": draw(st.sampled_from(["final", "above_share"])),
                "fair_share_margin": draw(st.sampled_from([1.0, 1.5])),
            },
        },
        "thrash": {"min_efficiency": 0.0, "max_preemptions": {"per": "1h", "count": 1000}},
        "scheduling": {"reservations": 0},
    }
    specs: list[JobSpec] = []
    for q in leaves:
        for k in range(draw(st.integers(0, 6))):
            size = draw(st.integers(1, 3))
            job = Job(f"{q}-{k}", q, 3, submit=float(len(specs)) * 1e-3, gpus=size)
            specs.append(JobSpec(job, duration=100 * DAY, sigterm_save_s=1.0))
    return nodes, policy, tuple(specs)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(contended())
def test_no_two_queues_take_capacity_back_and_forth_by_fair_share_reclaim(
    case: tuple[tuple[Node, ...], dict[str, Any], tuple[JobSpec, ...]],
) -> None:
    nodes, data, specs = case
    policy = parse_policy(data)
    paths = {q.name: policy.path_to(q.name) for q in policy.leaves()}

    def sides(a: str, b: str) -> tuple[str, str]:
        """The children of the lowest common ancestor on a's and b's side."""
        pa, pb = paths[a], paths[b]
        i = 0
        while i < min(len(pa), len(pb)) and pa[i] == pb[i]:
            i += 1
        return pa[i], pb[i]

    swaps: list[tuple[float, str, str]] = []

    def on_plan(snapshot: Any, plan: Any, now: float) -> None:
        check_pass(snapshot, plan, now, __import__("random").Random(0))
        jobs = {j.id: j for j in snapshot.jobs}
        for p in plan.preemptions:
            if p.kind == "fair_share":
                taker, giver = sides(jobs[p.for_job].queue, jobs[p.job_id].queue)
                swaps.append((now, taker, giver))

    run_history(nodes, policy, specs, (30.0,) * 40, on_plan=on_plan, engine="changed")
    seen: set[tuple[str, str]] = set()
    for now, taker, giver in swaps:
        assert (giver, taker) not in seen, f"at {now}: {taker} took back from {giver}, which had taken from it: {swaps}"
        seen.add((taker, giver))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.lists(st.integers(0, 50), min_size=1, max_size=8),
    # Entitlements are nominal GPUs over the total (at least 1/total) or weights (> 0): 0 or ≥ 0.01.
    st.lists(st.one_of(st.just(0.0), st.floats(0.01, 10.0)), min_size=8, max_size=8),
    st.integers(0, 100),
)
def test_owed_now_is_the_metrics_water_fill(demand: list[int], weights: list[float], capacity: int) -> None:
    """`owed_now` (what a pass enforces) is one row of `waterfill` (what the metrics integrate),
    weighted as `owed_gpu_seconds` weights: never more than asked, never more than the cluster."""
    queues = [f"q{i}" for i in range(len(demand))]
    entitlement = dict(zip(queues, weights))
    owed = owed_now(dict(zip(queues, map(float, demand))), entitlement, capacity)
    w = queue_weights(entitlement, queues)
    keep = w > 0
    row = np.zeros(len(queues))
    if keep.any() and capacity > 0:
        row[keep] = waterfill(np.array([demand], dtype=float)[:, keep], w[keep], float(capacity))[0]
    assert [owed[q] for q in queues] == list(row)
    assert sum(owed.values()) <= capacity + 1e-9
    assert all(owed[q] <= d + 1e-9 for q, d in zip(queues, demand))
