"""Decayed dominant-resource usage and the Fair Tree order (warden.engine.fairshare, DESIGN §4.1).

Usage is ∫ dominant share dt, halved every half-life; siblings are compared at every level of
the queue tree by (usage share among siblings) / (weight share among siblings), the lowest first,
ties by name.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import pending, policy, running

from warden.engine.fairshare import accrue, cluster_capacity, dominant_share, fair_order
from warden.engine.model import Job, JobState, Node, UsageLedger
from warden.engine.policy import parse_policy

HOUR = 3600.0
CAP = (16, 64_000, 262_144)  # 16 GPUs, 64 cores, 256 GiB


def pol_1h(**overrides: Any):
    return policy(fair_share={"half_life": "1h"}, **overrides)


# ---------------------------------------------------------------------------- dominant share


def test_cluster_capacity_sums_nodes() -> None:
    cluster = (Node("n0", 8, cpu=32_000, memory=131_072), Node("n1", 8, cpu=32_000, memory=131_072))
    assert cluster_capacity(cluster) == CAP


def test_dominant_share_is_gpu_when_gpus_dominate() -> None:
    # 2 replicas × (2 GPUs, 2 cores, 8 GiB): gpu 4/16 = .25, cpu 4000/64000 = .0625, mem 16384/262144 = .0625
    job = Job("j", "a", 3, submit=0.0, replicas=2, gpus=2, cpu=2_000, memory=8_192)
    assert dominant_share(job, CAP) == pytest.approx(0.25)


def test_dominant_share_is_cpu_when_cpu_dominates() -> None:
    job = Job("j", "a", 3, submit=0.0, replicas=2, gpus=1, cpu=16_000)  # gpu 2/16, cpu 32000/64000
    assert dominant_share(job, CAP) == pytest.approx(0.5)


def test_dominant_share_is_memory_when_memory_dominates() -> None:
    job = Job("j", "a", 3, submit=0.0, gpus=1, memory=196_608)  # gpu 1/16, mem 3/4
    assert dominant_share(job, CAP) == pytest.approx(0.75)


def test_dominant_share_ignores_resources_the_cluster_does_not_track() -> None:
    job = Job("j", "a", 3, submit=0.0, gpus=2, cpu=100_000, memory=100_000)
    assert dominant_share(job, (8, 0, 0)) == pytest.approx(0.25)
    cpu_only = Job("c", "a", 3, submit=0.0, gpus=0, cpu=16_000)
    assert dominant_share(cpu_only, CAP) == pytest.approx(0.25)


# ---------------------------------------------------------------------------------- accrue


def test_usage_halves_after_exactly_one_half_life() -> None:
    pol = pol_1h()
    ledger = UsageLedger(100.0, {"a": 80.0, "b": 10.0})
    one = accrue(ledger, [], CAP, pol, 100.0 + HOUR)
    assert one.at == 100.0 + HOUR
    assert one.usage["a"] == pytest.approx(40.0, rel=1e-12)
    assert one.usage["b"] == pytest.approx(5.0, rel=1e-12)
    two = accrue(ledger, [], CAP, pol, 100.0 + 2 * HOUR)
    assert two.usage["a"] == pytest.approx(20.0, rel=1e-12)


def test_default_half_life_is_seven_days() -> None:
    ledger = UsageLedger(0.0, {"a": 1.0})
    assert accrue(ledger, [], CAP, policy(), 7 * 86_400.0).usage["a"] == pytest.approx(0.5)


def test_constant_share_over_a_short_interval_accrues_share_times_dt() -> None:
    pol = policy()  # half-life 7 days: 60 s is short
    job = running("r", "a", 3, ("n0", 4), started=0.0)  # 4 of 16 GPUs: share 0.25
    out = accrue(UsageLedger(1_000.0), [job], CAP, pol, 1_060.0)
    assert out.usage["a"] == pytest.approx(0.25 * 60.0, rel=1e-4)
    assert out.usage.get("b", 0.0) == 0.0


def test_constant_share_over_a_half_life_matches_the_decayed_integral() -> None:
    pol = pol_1h()
    job = running("r", "a", 3, ("n0", 8), started=0.0)  # share 0.5
    out = accrue(UsageLedger(0.0), [job], CAP, pol, HOUR)
    # Midpoint sum of 0.5 · 2^{-(H - t)/H} over t in [0, H], independent of the closed form.
    steps = 20_000
    dt = HOUR / steps
    expected = sum(0.5 * 2 ** (-(HOUR - (k + 0.5) * dt) / HOUR) * dt for k in range(steps))
    assert out.usage["a"] == pytest.approx(expected, rel=1e-6)
    assert out.usage["a"] < 0.5 * HOUR  # decay made it less than the undecayed share × dt


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(1.0, 20_000.0), min_size=1, max_size=6))
def test_accruing_in_steps_equals_accruing_at_once(steps: list[float]) -> None:
    pol = pol_1h()
    jobs = [running("r", "a", 3, ("n0", 8), started=0.0), running("s", "b", 3, ("n1", 2), started=0.0)]
    ledger = UsageLedger(0.0, {"a": 500.0, "c": 7.0})
    t, stepped = 0.0, ledger
    for s in steps:
        t += s
        stepped = accrue(stepped, jobs, CAP, pol, t)
    once = accrue(ledger, jobs, CAP, pol, t)
    assert stepped.at == once.at == t
    for q in ("a", "b", "c"):
        assert stepped.usage[q] == pytest.approx(once.usage[q], rel=1e-9)


def test_uncharged_tier_4_accrues_nothing() -> None:
    pol = pol_1h()
    scav = running("s", "a", 4, ("n0", 8), started=0.0)
    out = accrue(UsageLedger(0.0, {"a": 10.0}), [scav], CAP, pol, HOUR)
    assert out.usage["a"] == pytest.approx(5.0)  # decay only


def test_tier_marked_uncharged_in_the_policy_accrues_nothing() -> None:
    pol = pol_1h(tiers={3: {"charged": False}})
    job = running("r", "a", 3, ("n0", 8), started=0.0)
    out = accrue(UsageLedger(0.0), [job], CAP, pol, HOUR)
    assert out.usage.get("a", 0.0) == 0.0


def test_jobs_that_hold_no_resources_accrue_nothing() -> None:
    pol = pol_1h()
    waiting = pending("p", "a", 3, gpus=8)
    requeued = replace(waiting, id="q", state=JobState.REQUEUED)
    done = replace(running("d", "a", 3, ("n0", 8), started=0.0), state=JobState.SUCCEEDED)
    out = accrue(UsageLedger(0.0), [waiting, requeued, done], CAP, pol, HOUR)
    assert out.usage.get("a", 0.0) == 0.0


def test_a_job_in_its_grace_period_still_accrues() -> None:
    pol = pol_1h()
    term = running("t", "a", 3, ("n0", 8), started=0.0, state=JobState.PREEMPTING)
    out = accrue(UsageLedger(0.0), [term], CAP, pol, 60.0)
    assert out.usage["a"] > 0.0


def test_jobs_of_one_queue_add_up() -> None:
    pol = pol_1h()
    two = [running("x", "a", 3, ("n0", 4), started=0.0), running("y", "a", 3, ("n0", 4), started=0.0)]
    one = [running("z", "a", 3, ("n0", 8), started=0.0)]
    assert accrue(UsageLedger(0.0), two, CAP, pol, 500.0).usage["a"] == pytest.approx(
        accrue(UsageLedger(0.0), one, CAP, pol, 500.0).usage["a"]
    )


def test_accrue_to_an_earlier_or_equal_time_is_a_no_op() -> None:
    pol = pol_1h()
    job = running("r", "a", 3, ("n0", 8), started=0.0)
    ledger = UsageLedger(1_000.0, {"a": 3.0})
    for until in (999.0, 0.0, 1_000.0):
        out = accrue(ledger, [job], CAP, pol, until)
        assert out.at == 1_000.0
        assert dict(out.usage) == {"a": 3.0}


# ------------------------------------------------------------------------------- fair order


def order(pol, usage: dict[str, float]) -> list[str]:
    ranks = fair_order(pol, usage)
    return sorted(ranks, key=lambda q: ranks[q][0])


def two(wa: float = 1, wb: float = 1, na: str = "a", nb: str = "b"):
    return parse_policy(
        {"queues": {"name": "cluster", "children": [{"name": na, "weight": wa}, {"name": nb, "weight": wb}]}}
    )


def test_ranks_are_zero_to_n_minus_one_over_all_leaves() -> None:
    pol = policy()
    ranks = fair_order(pol, {"a": 1.0})
    assert sorted(r for r, _ in ranks.values()) == [0, 1]
    assert set(ranks) == {"a", "b"}


def test_sibling_that_used_less_goes_first() -> None:
    assert order(two(), {"a": 10.0, "b": 5.0}) == ["b", "a"]
    assert order(two(), {"a": 5.0, "b": 10.0}) == ["a", "b"]


def test_ratio_is_usage_share_over_weight_share() -> None:
    ranks = fair_order(two(wa=3, wb=1), {"a": 6.0, "b": 4.0})
    # a: (6/10) / (3/4) = 0.8; b: (4/10) / (1/4) = 1.6
    assert ranks["a"][1] == pytest.approx((0.8,))
    assert ranks["b"][1] == pytest.approx((1.6,))


def test_weight_two_may_use_twice_as_much_before_ranking_behind() -> None:
    # "z" has weight 2 and sorts last by name, so only the weights can put it first.
    pol = two(wa=1, wb=2, na="a", nb="z")
    assert order(pol, {"z": 19.0, "a": 10.0}) == ["z", "a"]  # 19 < 2 × 10
    assert order(pol, {"z": 21.0, "a": 10.0}) == ["a", "z"]  # 21 > 2 × 10
    assert order(two(na="a", nb="z"), {"z": 19.0, "a": 10.0}) == ["a", "z"]  # equal weights


def test_equal_ratios_tie_by_name() -> None:
    assert order(two(na="beta", nb="alpha"), {"alpha": 4.0, "beta": 4.0}) == ["alpha", "beta"]


def test_zero_usage_everywhere_ties_every_leaf() -> None:
    pol = parse_policy(
        {
            "queues": {
                "name": "cluster",
                "children": [
                    {"name": "zeta", "children": [{"name": "z1"}]},
                    {"name": "alpha", "children": [{"name": "a2"}, {"name": "a1"}]},
                    {"name": "mid"},
                ],
            }
        }
    )
    ranks = fair_order(pol, {})
    assert {rank for rank, _ in ranks.values()} == {0}
    assert all(ratios == (0.0,) * len(ratios) for _, ratios in ranks.values())


def test_ties_are_shared_only_where_every_level_ties() -> None:
    pol = parse_policy(
        {
            "queues": {
                "name": "cluster",
                "children": [
                    {"name": "zeta", "children": [{"name": "z1"}, {"name": "z2"}]},
                    {"name": "alpha", "children": [{"name": "a1"}, {"name": "a2"}]},
                ],
            }
        }
    )
    # Departments tie (equal usage); inside zeta, z2 used more than z1.
    ranks = fair_order(pol, {"z1": 0.0, "z2": 10.0, "a1": 5.0, "a2": 5.0})
    assert ranks["z1"][0] == ranks["a1"][0] == ranks["a2"][0] < ranks["z2"][0]


DEPARTMENTS: dict[str, Any] = {
    "queues": {
        "name": "cluster",
        "children": [
            {"name": "x", "children": [{"name": "x1"}, {"name": "x2"}]},
            {"name": "y", "children": [{"name": "y1"}, {"name": "y2"}]},
        ],
    }
}


def test_department_with_low_usage_puts_all_its_teams_first() -> None:
    pol = parse_policy(DEPARTMENTS)
    usage = {"x1": 10.0, "x2": 0.0, "y1": 6.0, "y2": 6.0}  # x used 10, y used 12
    # x1 used more than y1 and y2, but its department used less: all of x goes first.
    assert order(pol, usage) == ["x2", "x1", "y1", "y2"]
    usage = {"x1": 10.0, "x2": 3.0, "y1": 6.0, "y2": 6.0}  # x used 13 now
    assert order(pol, usage) == ["y1", "y2", "x2", "x1"]


def test_ratios_are_reported_from_the_root_down() -> None:
    pol = parse_policy(DEPARTMENTS)
    ranks = fair_order(pol, {"x1": 10.0, "x2": 0.0, "y1": 6.0, "y2": 6.0})
    # level 1: x (10/22)/(1/2), y (12/22)/(1/2); level 2 inside x: x1 (10/10)/(1/2), x2 0
    assert ranks["x1"][1] == pytest.approx((20 / 22, 2.0))
    assert ranks["x2"][1] == pytest.approx((20 / 22, 0.0))
    assert ranks["y1"][1] == pytest.approx((24 / 22, 1.0))


def test_department_weights_apply_at_their_level() -> None:
    data = {
        "queues": {
            "name": "cluster",
            "children": [
                {"name": "x", "weight": 3, "children": [{"name": "x1"}]},
                {"name": "y", "weight": 1, "children": [{"name": "y1"}]},
            ],
        }
    }
    pol = parse_policy(data)
    assert order(pol, {"x1": 29.0, "y1": 10.0}) == ["x1", "y1"]
    assert order(pol, {"x1": 31.0, "y1": 10.0}) == ["y1", "x1"]


def test_inner_queue_usage_entries_are_ignored() -> None:
    pol = parse_policy(DEPARTMENTS)
    # Only leaves hold usage; a stray entry for a department must not change the order.
    assert order(pol, {"x": 100.0, "x1": 1.0, "y1": 2.0}) == order(pol, {"x1": 1.0, "y1": 2.0})


def test_order_of_the_design_policy_with_default_weights() -> None:
    pol = parse_policy(
        {
            "queues": {
                "name": "cluster",
                "children": [
                    {
                        "name": "research",
                        "weight": 2,
                        "nominal": {"gpu": 64},
                        "children": [
                            {"name": "vision", "nominal": {"gpu": 32}},
                            {"name": "language", "nominal": {"gpu": 32}},
                        ],
                    },
                    {"name": "platform", "weight": 1, "nominal": {"gpu": 32}},
                ],
            }
        }
    )
    # research (weight 2) may use up to twice what platform (weight 1) used before ranking behind.
    assert order(pol, {"vision": 19.0, "platform": 10.0}) == ["language", "vision", "platform"]
    assert order(pol, {"vision": 21.0, "platform": 10.0}) == ["platform", "language", "vision"]
    assert math.isfinite(fair_order(pol, {"vision": 1.0})["platform"][1][0])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=6),
    st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.5, 1e-300, 7e5]), min_size=6, max_size=6),
)
def test_a_flat_tree_ranks_as_the_same_leaves_one_level_down(weights: list[int], used: list[float]) -> None:
    """A root whose children are all leaves takes a shortcut (`_flat_order`); under one more
    level, the walk ranks the same leaves the same, with one more ratio in front."""
    leaves = [{"name": f"q{i}", "weight": w} for i, w in enumerate(weights)]
    flat = parse_policy({"queues": {"name": "root", "children": leaves}})
    nested = parse_policy({"queues": {"name": "root", "children": [{"name": "dept", "children": leaves}]}})
    usage = {f"q{i}": u for i, u in enumerate(used[: len(weights)]) if u != 3.5}  # 3.5: no entry
    walked = fair_order(nested, usage)
    assert fair_order(flat, usage) == {q: (rank, ratios[1:]) for q, (rank, ratios) in walked.items()}
    assert list(fair_order(flat, usage)) == list(walked)
