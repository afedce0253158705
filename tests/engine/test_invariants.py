"""DESIGN §4.6: the engine's invariants, checked after every pass of long random histories.

Hypothesis draws a small cluster, a policy (a 2–3 level queue tree with random quotas, tiers,
thrash guard, ordering and reservations), a stream of jobs and the gaps between passes;
`engine_driver` plays the history and hands every (snapshot, plan, now) to `check_pass` before
it applies the plan, and `check_history` looks across passes at the end.

The checks themselves, and the readings of DESIGN they rest on, are in `tests/invariants.py`.

Unmarked tests run short histories (about 15 s); `slow` ones run many long ones (about two
minutes on one core). WARDEN_PROPERTY_EXPLORE=1 runs the slow tests randomised (not
derandomised) with many more examples, to hunt for new counterexamples.
"""

from __future__ import annotations

import math
import os
import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import pytest
from engine_driver import Driver, EnginePath, JobSpec, run_history
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from invariants import check_history, check_pass

from warden.engine.model import Job, JobState, Node
from warden.engine.policy import Policy, parse_policy

EPS = 1e-9
INF = math.inf
FLAVORS = ("a100", "h100")
EXPLORE = os.environ.get("WARDEN_PROPERTY_EXPLORE") == "1"

# =============================================================================== strategies


@dataclass(frozen=True)
class History:
    nodes: tuple[Node, ...]
    policy_data: dict[str, Any]
    specs: tuple[JobSpec, ...]
    gaps: tuple[float, ...]
    engine: EnginePath = "changed"

    @property
    def policy(self) -> Policy:
        return parse_policy(self.policy_data)


def _maybe(draw: st.DrawFn, strategy: st.SearchStrategy[Any], p_none: int = 1, of: int = 2) -> Any:
    """`None` with probability p_none/of, else a draw from `strategy`."""
    return None if draw(st.integers(0, of - 1)) < p_none else draw(strategy)


@st.composite
def clusters(draw: st.DrawFn) -> tuple[Node, ...]:
    count = draw(st.integers(1, 6))
    two_flavors = draw(st.integers(0, 3)) == 0
    blocks = draw(st.booleans())
    cpu = draw(st.sampled_from([0, 0, 0, 16_000, 64_000]))
    memory = draw(st.sampled_from([0, 0, 0, 65_536, 262_144]))
    unavailable = draw(st.integers(0, 2)) == 0  # GPUs held outside warden, failed or drained
    out = []
    for i in range(count):
        gpus = draw(st.integers(1, 8))
        out.append(
            Node(
                f"n{i}",
                gpus=gpus,
                cpu=cpu,
                memory=memory,
                flavor=draw(st.sampled_from(FLAVORS)) if two_flavors else "default",
                block=draw(st.sampled_from([None, "r0", "r1"])) if blocks else None,
                unavailable=tuple(sorted(draw(st.sets(st.integers(0, gpus - 1), max_size=gpus // 2))))
                if unavailable
                else (),
            )
        )
    return tuple(out)


@st.composite
def queue_trees(draw: st.DrawFn, cluster: tuple[Node, ...]) -> dict[str, Any]:
    """A 2–3 level tree whose quotas pass validation: children's nominal sums fit their
    parent's, lending limits stay within nominal."""
    total = {
        "gpu": sum(n.gpus for n in cluster),
        "cpu": sum(n.cpu for n in cluster),
        "memory": sum(n.memory for n in cluster),
    }
    for fl in sorted({n.flavor for n in cluster}):
        total[f"gpu:{fl}"] = sum(n.gpus for n in cluster if n.flavor == fl)
    choices = ["none", "gpu", "gpu", "gpu", "gpu-tight"]
    if total["cpu"]:
        choices.append("gpu+cpu")
    if len({n.flavor for n in cluster}) > 1:
        choices.append("flavor")
    mode = draw(st.sampled_from(choices))
    resources = {
        "none": [],
        "gpu": ["gpu"],
        "gpu-tight": ["gpu"],
        "gpu+cpu": ["gpu", "cpu"],
        "flavor": ["gpu"] + [f"gpu:{f}" for f in FLAVORS],
    }[mode]
    counter = iter(range(100))

    def amount(r: str, top: int | None = None) -> int:
        cap = max(1, total.get(r, 0) if top is None else top)
        if r == "cpu":
            return draw(st.integers(0, cap // 1000)) * 1000
        if mode == "gpu-tight":
            return draw(st.integers(0, max(1, cap // 2)))
        return draw(st.integers(0, cap))

    def build(depth: int, levels: int) -> tuple[dict[str, Any], dict[str, int]]:
        """A queue and its resolved nominal (what validation fills in)."""
        name = "root" if depth == 0 else f"q{next(counter)}"
        q: dict[str, Any] = {"name": name}
        if depth > 0 and draw(st.integers(0, 2)) == 0:
            q["weight"] = draw(st.sampled_from([0.5, 2.0, 3.0]))
        kids: list[dict[str, Any]] = []
        sums: dict[str, int] = defaultdict(int)
        n_kids = draw(st.integers(1 if depth == 0 else 0, 3)) if depth < levels - 1 else 0
        if depth == 0:
            n_kids = max(n_kids, 1)
        for _ in range(n_kids):
            child, resolved = build(depth + 1, levels)
            kids.append(child)
            for r, v in resolved.items():
                sums[r] += v
        nominal: dict[str, int] = {}
        resolved = dict(sums)
        for r in resources:
            if depth == 0 and draw(st.booleans()):
                # A root sized to the cluster (the usual setup); else the children's sum.
                nominal[r] = max(sums.get(r, 0), total.get(r, 0))
                resolved[r] = nominal[r]
            elif not kids:
                if draw(st.integers(0, 4)) > 0:
                    nominal[r] = amount(r)
                    resolved[r] = nominal[r]
            elif draw(st.integers(0, 3)) == 0:
                nominal[r] = sums.get(r, 0) + amount(r) // 2
                resolved[r] = nominal[r]
        if nominal:
            q["nominal"] = nominal
        if depth > 0 and resources:
            borrow = {r: amount(r) for r in resources if draw(st.integers(0, 2)) == 0}
            if borrow:
                q["borrowing_limit"] = borrow
            lend = {
                r: amount(r, resolved.get(r, 0)) if resolved.get(r, 0) else 0
                for r in resources
                if draw(st.integers(0, 3)) == 0
            }
            lend = {r: min(v, resolved.get(r, 0)) for r, v in lend.items()}
            if lend:
                q["lending_limit"] = lend
        if kids:
            q["children"] = kids
        return q, resolved

    levels = draw(st.sampled_from([2, 3]))
    tree, _ = build(0, levels)
    return tree


@st.composite
def partitioned_trees(draw: st.DrawFn, cluster: tuple[Node, ...]) -> dict[str, Any]:
    """Leaves whose GPU nominals split the cluster between them (the setup reclaim is for):
    any team running beyond its share borrows what another team is entitled to."""
    total = sum(n.gpus for n in cluster)
    counter = iter(range(100))
    shape = draw(st.lists(st.integers(0, 2), min_size=2, max_size=3))  # grandchildren per child
    leaves = sum(max(1, k) for k in shape)
    cuts = sorted(draw(st.lists(st.integers(0, total), min_size=leaves - 1, max_size=leaves - 1)))
    shares = iter(b - a for a, b in zip([0, *cuts], [*cuts, total]))

    def leaf() -> dict[str, Any]:
        q: dict[str, Any] = {"name": f"q{next(counter)}", "nominal": {"gpu": next(shares)}}
        if draw(st.integers(0, 3)) == 0:
            q["borrowing_limit"] = {"gpu": draw(st.integers(0, total))}
        if draw(st.integers(0, 4)) == 0:
            q["lending_limit"] = {"gpu": draw(st.integers(0, q["nominal"]["gpu"]))}
        return q

    children = []
    for k in shape:
        if k == 0:
            children.append(leaf())
        else:
            children.append({"name": f"q{next(counter)}", "children": [leaf() for _ in range(k)]})
    return {"name": "root", "nominal": {"gpu": total}, "children": children}


@st.composite
def policy_data(draw: st.DrawFn, cluster: tuple[Node, ...], pressure: bool, reclaim: bool = False) -> dict[str, Any]:
    min_grace = draw(st.sampled_from([120, 120, 180]))
    leases = [0, 0, 60, 300] if pressure else [0, 60, 600, 1800, 2700, 7200]
    tiers: dict[int, dict[str, Any]] = {}
    for t in (1, 2, 3, 4):
        spec: dict[str, Any] = {
            "lease": draw(st.sampled_from(leases)),
            "grace": min_grace + draw(st.sampled_from([0, 0, 60, 180, 600])),
        }
        if t == 1:
            spec["preemptible"] = draw(st.integers(0, 5)) == 0
        else:
            spec["preemptible"] = draw(st.integers(0, 6)) > 0
        if t == 2 and draw(st.integers(0, 4)) == 0:
            spec["scope"] = "cluster"
        if t == 3 and draw(st.integers(0, 5)) == 0:
            spec["charged"] = False
        if t == 4 and draw(st.integers(0, 3)) == 0:
            spec["charged"] = True
        tiers[t] = spec
    return {
        "tiers": tiers,
        "min_grace": min_grace,
        "fair_share": {
            "half_life": draw(st.sampled_from(["1h", "1d", "7d"])),
            "aging": {
                "max_wait": {"default": draw(st.sampled_from(["10m", "1h", "24h"]))},
                "escalate_at": draw(st.sampled_from([0.25, 0.75, 1.0])),
            },
        },
        "thrash": {
            "min_efficiency": draw(st.sampled_from([0.0, 0.0, 0.5] if pressure else [0.0, 0.5, 0.9, 0.95])),
            "max_preemptions": {
                "per": draw(st.sampled_from(["1h", "6h", "24h"])),
                "count": draw(st.integers(1, 6 if pressure else 4)),
            },
            "requeue_backoff": draw(st.sampled_from([0, 0, 0, 60, 600])),
        },
        "preemption": {
            "restart_overhead": draw(st.sampled_from([0, 30, 60, 300])),
            "checkpoint_overhead": draw(st.sampled_from([0, 0, 30, 120])),
            "victim_order": draw(st.sampled_from(["cost", "cost", "newest", "smallest"])),
            "max_attempts_per_pass": draw(st.sampled_from([32, 32, 32, 1, 3])),
            "only_if_it_pays": draw(st.sampled_from([True, True, False])),
            "protect_before_time_limit": draw(st.sampled_from([0, 0, 0, 60, 600, 3600])),
        },
        "scheduling": {
            "order": (order := draw(st.sampled_from(["governed", "governed", "fifo", "priority"]))),
            "nominal_first": order != "governed" and draw(st.booleans()),
            "reservations": draw(st.integers(0, 2)),
            "head_of_line_blocking": draw(st.integers(0, 11)) == 0,
        },
        "queues": draw(partitioned_trees(cluster) if reclaim else queue_trees(cluster)),
    }


def _leaves(tree: dict[str, Any]) -> list[str]:
    kids = tree.get("children", [])
    return [tree["name"]] if not kids else [leaf for k in kids for leaf in _leaves(k)]


@st.composite
def job_specs(
    draw: st.DrawFn,
    cluster: tuple[Node, ...],
    leaves: list[str],
    horizon: int,
    pressure: bool,
    tiers: list[int] | None = None,
) -> tuple[JobSpec, ...]:
    biggest = max(n.gpus for n in cluster)
    flavors = sorted({n.flavor for n in cluster})
    tracked_cpu = any(n.cpu for n in cluster)
    tracked_mem = any(n.memory for n in cluster)
    count = draw(st.integers(8, 30) if pressure else st.integers(3, 24))
    out = []
    for i in range(count):
        if tiers is not None:
            tier = draw(st.sampled_from(tiers))
        else:
            tier = draw(st.sampled_from([1, 2, 2, 3, 3, 3, 4, 4]) if pressure else st.integers(1, 4))
        duration = draw(st.sampled_from([60, 600, 1800, 3600, 7200, 14_400]) | st.integers(30, 14_400))
        awaiting = tier <= 2 and draw(st.integers(0, 11 if pressure else 5)) == 0
        # Under pressure, lower tiers tend to come first and fill the cluster for later ones.
        submit = draw(st.integers(0, horizon // 2 if pressure and tier >= 3 else horizon))
        job = Job(
            id=f"j{i:02d}",
            queue=draw(st.sampled_from(leaves)),
            tier=tier,
            submit=float(submit),
            state=JobState.AWAITING_APPROVAL if awaiting else JobState.PENDING,
            replicas=draw(st.sampled_from([1, 1, 1, 2, 3])),
            gpus=draw(st.integers(1, biggest) | st.integers(1, 8)),
            cpu=draw(st.sampled_from([0, 1000, 8000])) if tracked_cpu else 0,
            memory=draw(st.sampled_from([0, 4096, 65_536])) if tracked_mem else 0,
            flavor=_maybe(draw, st.sampled_from(flavors), 3, 4) if len(flavors) > 1 else None,
            placement=draw(st.sampled_from(["any", "any", "pack", "block"])),
            lease=_maybe(draw, st.sampled_from([0.0, 300.0, 3600.0]), 4, 5),
            grace=_maybe(draw, st.sampled_from([0.0, 130.0, 300.0]), 4, 5),
            time_limit=_maybe(draw, st.sampled_from([0.5, 1.0, 1.0, 2.0]).map(lambda f, d=duration: f * d)),
        )
        out.append(
            JobSpec(
                job=job,
                duration=float(duration),
                approve_after=_maybe(draw, st.integers(0, 3600).map(float), 1, 5) if awaiting else None,
                startup_s=_maybe(draw, st.integers(0, 600).map(float)),
                checkpoint_every=_maybe(draw, st.integers(120, 3600).map(float), 3, 5),
                checkpoint_cost=float(draw(st.integers(0, 120))),
                sigterm_save_s=_maybe(draw, st.integers(0, 400).map(float), 2, 3),
                exit_fracs=tuple(draw(st.lists(st.sampled_from([0.0, 0.1, 0.5, 1.0, 1.0]), min_size=1, max_size=3))),
            )
        )
    return tuple(out)


@st.composite
def histories(
    draw: st.DrawFn, min_steps: int, max_steps: int, pressure: bool = False, reclaim: bool = False
) -> History:
    """`pressure`: short leases, a loose thrash guard, low tiers first (many preemptions);
    `reclaim`: also queues that split the cluster and mostly one tier (many reclaims)."""
    pressure = pressure or reclaim
    cluster = draw(clusters())
    data = draw(policy_data(cluster, pressure, reclaim))
    gaps = tuple(float(g) for g in draw(st.lists(st.integers(1, 1800), min_size=min_steps, max_size=max_steps)))
    horizon = int(min(sum(gaps), 4 * 3600) * (0.5 if pressure else 0.8))
    tiers = [3, 3, 3, 3, 2, 4] if reclaim else None
    specs = draw(job_specs(cluster, _leaves(data["queues"]), horizon, pressure, tiers))
    # Production's path: one warm Engine, told what changed (or shown every snapshot whole);
    # every plan is compared with a fresh pass's.
    engine: EnginePath = draw(st.sampled_from(["changed", "changed", "warm"]))
    return History(cluster, data, specs, gaps, engine)


def play(h: History) -> Driver:
    rng = random.Random(0)
    driver = run_history(
        h.nodes,
        h.policy,
        h.specs,
        h.gaps,
        on_plan=lambda snap, plan, now: check_pass(snap, plan, now, rng),
        engine=h.engine,
    )
    check_history(driver)
    return driver


# ======================================================================================= tests

_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


def _settings(examples: int, explore_examples: int | None = None) -> settings:
    if EXPLORE and explore_examples is not None:
        return settings(
            max_examples=explore_examples,
            deadline=None,
            derandomize=False,
            database=None,
            suppress_health_check=_HEALTH,
            print_blob=True,
        )
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=_HEALTH,
        print_blob=True,
    )


SHORT = 40
LONG = 30  # the suite must stay under 20 minutes on 2 cores; EXPLORE runs 3000


@_settings(SHORT)
@given(histories(min_steps=15, max_steps=25))
def test_invariants_hold_over_short_histories(h: History) -> None:
    play(h)


@_settings(SHORT)
@given(histories(min_steps=15, max_steps=25, pressure=True))
def test_invariants_hold_under_preemption_pressure(h: History) -> None:
    play(h)


@_settings(SHORT)
@given(histories(min_steps=15, max_steps=25, reclaim=True))
def test_invariants_hold_when_teams_reclaim_their_share(h: History) -> None:
    play(h)


@pytest.mark.slow
@_settings(LONG, 3000)
@given(histories(min_steps=20, max_steps=60))
def test_invariants_hold_over_long_histories(h: History) -> None:
    play(h)


@pytest.mark.slow
@_settings(LONG, 3000)
@given(histories(min_steps=20, max_steps=60, pressure=True))
def test_invariants_hold_over_long_histories_under_pressure(h: History) -> None:
    play(h)


@pytest.mark.slow
@_settings(LONG, 3000)
@given(histories(min_steps=20, max_steps=60, reclaim=True))
def test_invariants_hold_over_long_histories_with_reclaim(h: History) -> None:
    play(h)


def test_driver_applies_a_preemption_and_its_exit() -> None:
    """The driver itself: signal, grace, exit at the chosen time, requeue, restart."""
    pol = parse_policy(
        {
            "queues": {"name": "c", "children": [{"name": "a"}, {"name": "b"}]},
            "thrash": {"min_efficiency": 0.0},
            "tiers": {3: {"lease": "0s"}},
        }
    )
    cluster = (Node("n0", 8),)
    low = JobSpec(Job("low", "a", 3, submit=0.0, gpus=8), duration=10_000.0, exit_fracs=(0.5,))
    high = JobSpec(Job("high", "b", 2, submit=100.0, gpus=8), duration=1_000.0)
    driver = run_history(cluster, pol, (low, high), gaps=(1_000.0,) * 4)
    assert [r.now for r in driver.log] == [0.0, 100.0, 160.0, 1_160.0]
    ev = driver.evictions[0]
    assert (ev.job_id, ev.for_job, ev.sigterm_at, ev.kill_at, ev.exit_at) == ("low", "high", 100.0, 220.0, 160.0)
    exit_pass = driver.log[2]
    assert exit_pass.exited == ("low",) and [a.job_id for a in exit_pass.plan.admissions] == ["high"]
    requeued = next(j for j in exit_pass.snapshot.jobs if j.id == "low")
    assert requeued.state is JobState.PENDING and requeued.pending_since == 160.0 and requeued.attempt is None
    last = driver.log[3]
    assert last.completed == ("high",) and [a.job_id for a in last.plan.admissions] == ["low"]
    assert driver.jobs["low"].attempt.number == 2 and driver.jobs["low"].preempted_at == (100.0,)
    check_history(driver)


# ================================================= engine bugs the property tests isolated
# Each is the minimal pass of a counterexample the histories above found, kept as a
# regression test.


def _quota_policy(queues: dict[str, Any], **extra: Any) -> Policy:
    return parse_policy({"queues": queues, **extra})


def test_victim_set_is_minimal_across_flavors() -> None:
    """Found: victims came from the first GPU flavor where preempting made room, minimal only
    within that flavor (fixed)."""
    from support import pending, plan_for, preempted, running

    pol = _quota_policy(
        {"name": "root", "children": [{"name": "a", "nominal": {"gpu": 4}, "borrowing_limit": {"gpu": 0}}]},
        thrash={"min_efficiency": 0.0},
    )
    cluster = (Node("n0", 4, flavor="a100"), Node("n1", 4, flavor="h100"))
    scav = running("scav", "a", 4, ("n0", 4), started=0.0)  # tier 4: not charged to a's quota
    cheap = running("cheap", "a", 3, ("n1", 2), started=0.0, last_checkpoint_at=9_990.0)
    keep = running("keep", "a", 2, ("n1", 2), started=0.0, first_gpu=2)
    p = pending("p", "a", 2, gpus=1, submit=9_000.0)  # any flavor; a is at its limit of 4
    plan = plan_for(pol, cluster, [scav, cheap, keep, p], now=10_000.0)
    # Once `cheap` is gone, p fits a's quota and n1 (h100) has room: `scav` is not needed
    # (on a100 alone p would need both).
    assert preempted(plan) == {"cheap"}


def test_borrowing_preemptor_may_not_preempt_outside_its_queue() -> None:
    """Found: a preemptor counted as in-quota when it would be once other branches' borrowing
    were reclaimed, even though its victims reclaimed none of it (fixed)."""
    from support import nodes, pending, plan_for, preempted, running

    pol = _quota_policy(
        {
            "name": "root",
            "children": [
                {
                    "name": "d",
                    "nominal": {"gpu": 8},
                    "children": [{"name": "a", "nominal": {"gpu": 8}}, {"name": "b", "nominal": {"gpu": 0}}],
                },
                {"name": "e", "nominal": {"gpu": 8}, "children": [{"name": "c", "nominal": {"gpu": 8}}]},
            ],
        }
    )
    borrower = running("borrower", "b", 3, ("n0", 4), started=0.0)  # b borrows 4 of d's 8
    scav = running("scav", "c", 4, ("n1", 8), started=0.0, sigterm_save_s=10.0)
    p = pending("p", "a", 3, gpus=8, submit=9_000.0)  # d: 4 + 8 > 8, so p would borrow
    plan = plan_for(pol, nodes(2), [borrower, scav, p], now=10_000.0)
    # p (scope: quota) is in-quota only once `borrower` goes: it may reclaim from `borrower`,
    # but not evict `scav` in department e and then run borrowing.
    assert "scav" not in preempted(plan)


def test_in_flight_eviction_with_room_for_two_serves_both() -> None:
    """Found: a terminating job served at most one waiting job, so the next one got a new
    victim for a need the eviction in flight already covered (fixed)."""
    from support import nodes, pending, plan_for, policy, preempted, running

    pol = policy(queues={"name": "c", "children": [{"name": "a"}, {"name": "b"}]}, scheduling={"reservations": 0})
    leaving = running(
        "leaving", "a", 3, ("n0", 8), started=0.0, state=JobState.PREEMPTING, sigterm_at=9_990.0, kill_at=10_110.0
    )
    v = running("v", "a", 3, ("n1", 8), started=0.0)
    p1 = pending("p1", "b", 2, gpus=4, submit=9_000.0)
    p2 = pending("p2", "b", 2, gpus=4, submit=9_001.0)
    plan = plan_for(pol, nodes(2), [leaving, v, p1, p2], now=10_000.0)
    # `leaving` frees 8 GPUs on n0 by t=10,110: room for p1 and p2; v (80,000 GPU-s) stays.
    assert preempted(plan) == set()


def test_reclaims_in_one_pass_stop_at_the_lenders_nominal() -> None:
    """Found: reclaim eligibility counted victims signalled for other preemptors in the same
    pass as still there, so two reclaims took a side below its nominal (fixed)."""
    from support import nodes, pending, plan_for, preempted, running

    pol = _quota_policy(
        {
            "name": "root",
            "children": [
                {"name": "x", "nominal": {"gpu": 8}},
                {"name": "y", "nominal": {"gpu": 4}},
                {"name": "z", "nominal": {"gpu": 4}},
            ],
        },
        tiers={4: {"preemptible": False}},
    )
    x1 = running("x1", "x", 3, ("n0", 4), started=0.0)
    x2 = running("x2", "x", 3, ("n0", 4), started=0.0, first_gpu=4)
    x3 = running("x3", "x", 3, ("n1", 4), started=0.0)
    s = running("s", "x", 4, ("n1", 4), started=0.0, first_gpu=4)  # not charged, not preemptible
    p1 = pending("p1", "y", 3, gpus=4, submit=9_000.0)
    p2 = pending("p2", "z", 3, gpus=4, submit=9_001.0)
    plan = plan_for(pol, nodes(2), [x1, x2, x3, s, p1, p2], now=10_000.0)
    # x uses 12 of its nominal 8: it borrows 4, so one 4-GPU job may be reclaimed, not two.
    assert len(preempted(plan) & {"x1", "x2", "x3"}) <= 1


def test_terminating_job_covers_a_quota_need() -> None:
    """Found: a job lacking only quota got a victim chosen by placement slots, never the
    terminating job whose exit frees the quota (fixed)."""
    from support import pending, plan_for, preempted, running

    pol = _quota_policy(
        {
            "name": "root",
            "nominal": {"gpu": 16},
            "children": [{"name": "a", "nominal": {"gpu": 8}, "borrowing_limit": {"gpu": 0}}, {"name": "b"}],
        }
    )
    cluster = (Node("n0", 8), Node("n1", 4), Node("n2", 4))
    keep = running("keep", "b", 1, ("n0", 6), started=0.0)
    leaving = running(
        "leaving",
        "a",
        3,
        ("n0", 2),
        started=0.0,
        first_gpu=6,
        state=JobState.PREEMPTING,
        sigterm_at=9_990.0,
        kill_at=10_110.0,
    )
    v = running("v", "a", 3, ("n1", 4), started=0.0)
    p = pending("p", "a", 2, gpus=4, submit=9_000.0)
    plan = plan_for(pol, cluster, [keep, leaving, v, p], now=10_000.0)
    # n2 is idle; p lacks only 2 GPUs of a's quota (6 used of 8), which `leaving` frees by
    # t=10,110: no new victim.
    assert preempted(plan) == set()
    assert plan.explanations["p"].reason.victims == ("leaving",)  # type: ignore[attr-defined]


def test_terminating_jobs_beat_a_free_new_victim() -> None:
    """Found: placement domains were ranked by (cost, victims) counting terminating jobs as
    victims, so under `victim_order: newest` a new victim costing 0 beat two terminating jobs
    that already made room (fixed)."""
    from support import nodes, pending, plan_for, policy, preempted, running

    pol = policy(
        queues={"name": "c", "children": [{"name": "a"}, {"name": "b"}]}, preemption={"victim_order": "newest"}
    )
    t1 = running("t1", "a", 3, ("n0", 2), started=0.0, state=JobState.PREEMPTING, sigterm_at=9_990.0, kill_at=10_110.0)
    t2 = running(
        "t2",
        "a",
        3,
        ("n0", 2),
        started=0.0,
        first_gpu=2,
        state=JobState.PREEMPTING,
        sigterm_at=9_990.0,
        kill_at=10_110.0,
    )
    v = running("v", "a", 3, ("n1", 4), started=0.0, sigterm_save_s=10.0)  # costs 0 to preempt
    p = pending("p", "b", 2, gpus=4, submit=9_000.0)
    plan = plan_for(pol, nodes(2, gpus=4), [t1, t2, v, p], now=10_000.0)
    # t1 and t2 free n0 by t=10,110, which is all p needs: v stays.
    assert preempted(plan) == set()


def test_in_flight_eviction_shares_its_quota() -> None:
    from support import nodes, pending, plan_for, preempted, running

    pol = _quota_policy(
        {
            "name": "root",
            "nominal": {"gpu": 8},
            "children": [{"name": "a", "nominal": {"gpu": 4}}, {"name": "b", "nominal": {"gpu": 4}}],
        }
    )
    x = running("x", "a", 3, ("n0", 4), started=0.0, state=JobState.PREEMPTING, sigterm_at=9_990.0, kill_at=10_110.0)
    v = running("v", "b", 3, ("n0", 4), started=0.0, first_gpu=4)
    p1 = pending("p1", "a", 2, gpus=2, submit=9_000.0)
    p2 = pending("p2", "b", 2, gpus=2, submit=9_001.0)
    plan = plan_for(pol, nodes(2), [x, v, p1, p2], now=10_000.0)
    # n1 is idle; the root's quota (8) is full. x's exit frees 4 GPUs of it by t=10,110: room
    # for p1 (2) and p2 (2), so v (40,000 GPU-seconds) must not be evicted for p2.
    assert preempted(plan) == set()


def test_terminating_job_beats_a_free_new_victim_for_a_gang_slot() -> None:
    from support import pending, plan_for, policy, preempted, running

    pol = policy(queues={"name": "c", "children": [{"name": "a"}, {"name": "b"}]}, scheduling={"reservations": 0})
    cluster = (Node("n0", 4), Node("n1", 4), Node("n2", 3))
    v = running("v", "a", 3, ("n0", 3), started=0.0, sigterm_save_s=10.0)  # costs 0 to preempt
    t = running("t", "a", 3, ("n1", 3), started=0.0, state=JobState.PREEMPTING, sigterm_at=9_990.0, kill_at=10_110.0)
    p = pending("p", "b", 2, gpus=3, replicas=2, submit=9_000.0)
    plan = plan_for(pol, cluster, [v, t, p], now=10_000.0)
    # p needs two 3-GPU slots: n2 is free, and t's exit frees n1 by t=10,110. The engine
    # signals v (n0 sorts before n1) instead of waiting for t.
    assert preempted(plan) == set()
    assert plan.explanations["p"].reason.victims == ("t",)  # type: ignore[attr-defined]
