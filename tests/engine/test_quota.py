"""QuotaTree (warden.engine.quota): nominal, borrowing and lending limits along a queue path.

Expectations are worked out by hand from DESIGN §2 (vocabulary), §3 (the example policy) and
§4.2 (admission: every queue on the path within nominal + borrowing limit and the lenders'
lending limits; in-quota vs borrowing).
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from support import DESIGN_QUEUES

from warden.engine.model import Job
from warden.engine.policy import parse_policy
from warden.engine.quota import QuotaTree
from warden.engine.reasons import BorrowingLimit, QuotaExceeded


def tree(queues: dict[str, Any], capacity: dict[str, int] | None = None) -> QuotaTree:
    """The tree on a cluster of `capacity`; by default one its nominal quotas cover exactly."""
    pol = parse_policy({"queues": queues})
    return QuotaTree(pol, dict(pol.queues.nominal) if capacity is None else capacity)


def two_teams(a: dict[str, Any] | None = None, b: dict[str, Any] | None = None) -> QuotaTree:
    """Root `cluster` with teams a and b of 8 GPUs each, extra settings merged in."""
    return tree(
        {
            "name": "cluster",
            "children": [
                {"name": "a", "nominal": {"gpu": 8}, **(a or {})},
                {"name": "b", "nominal": {"gpu": 8}, **(b or {})},
            ],
        }
    )


def gpu(n: float) -> tuple[float, ...]:
    """A demand on a tree whose only governed resource is gpu."""
    return (float(n),)


def idx(t: QuotaTree, name: str) -> int:
    return t.index[name]


# ------------------------------------------------------------------------ in-quota vs borrowing


def test_demand_within_nominal_is_in_quota() -> None:
    t = two_teams()
    assert t.resources == ("gpu",)
    v = t.verdict("a", gpu(8))
    assert v.fits and v.in_quota and v.reason is None
    assert t.in_quota("a", gpu(8))


def test_demand_above_nominal_borrows_idle_capacity_of_a_sibling() -> None:
    t = two_teams()
    v = t.verdict("a", gpu(9))  # a's nominal is 8; b's 8 are idle and b lends all (unset)
    assert v.fits and not v.in_quota
    assert not t.in_quota("a", gpu(9))
    t.add("a", gpu(8))
    v = t.verdict("a", gpu(1))  # a is at nominal: one more GPU borrows
    assert v.fits and not v.in_quota
    assert t.verdict("b", gpu(8)).in_quota  # b's own nominal is untouched


def test_in_quota_needs_every_resource_within_nominal() -> None:
    t = tree(
        {
            "name": "cluster",
            "children": [
                {"name": "a", "nominal": {"gpu": 8, "cpu": 1000}},
                {"name": "b", "nominal": {"gpu": 8, "cpu": 1000}},
            ],
        }
    )
    assert t.resources == ("cpu", "gpu")
    job = Job("j", "a", 3, submit=0.0, gpus=4, cpu=1500)  # GPUs fine, CPU above a's 1000
    d = t.demand(job, "default")
    assert d == (1500.0, 4.0)
    v = t.verdict("a", d)
    assert v.fits and not v.in_quota


def test_cluster_total_caps_everyone() -> None:
    t = two_teams()
    v = t.verdict("a", gpu(17))  # the cluster has 16 (8 + 8)
    assert not v.fits
    assert v.reason is not None and v.reason.requested == 17 and v.reason.available == 16
    t.add("b", gpu(8))
    v = t.verdict("a", gpu(9))
    assert not v.fits and v.reason is not None and v.reason.available == 8


def test_the_root_is_the_cluster_not_its_childrens_nominal() -> None:
    """DESIGN §4.2: capacity no child's nominal covers is idle capacity any queue may borrow."""
    t = tree({"name": "cluster", "children": [{"name": "a", "nominal": {"gpu": 8}}]}, {"gpu": 32})
    assert t.limit[idx(t, "cluster")] == [32.0] and t.nominal[idx(t, "cluster")] == [32.0]
    v = t.verdict("a", gpu(32))
    assert v.fits and not v.in_quota
    v = t.verdict("a", gpu(33))
    assert not v.fits and v.reason == QuotaExceeded("cluster", "gpu", 33, 32, used=0, limit=32)


def test_a_root_without_a_known_capacity_is_unlimited() -> None:
    """Where the caller knows no capacity (or the cluster reports none of a resource, 0),
    placement alone bounds the cluster."""
    pol = parse_policy({"queues": {"name": "cluster", "children": [{"name": "a", "nominal": {"gpu": 8, "cpu": 10}}]}})
    for t in (QuotaTree(pol), QuotaTree(pol, {"gpu": 0, "memory": 64})):
        assert t.limit[idx(t, "cluster")] == [math.inf, math.inf]
        assert t.verdict("a", (1000.0, 1000.0)).fits


def test_a_root_whose_children_promise_more_than_the_cluster_keeps_their_sum() -> None:
    """Nominal quotas beyond the cluster (reported as such): the root keeps their sum, and
    placement bounds the cluster, so a lender's kept capacity is not held against GPUs that do
    not exist."""
    t = two_teams(b={"lending_limit": {"gpu": 0}})
    small = tree(
        {
            "name": "cluster",
            "children": [
                {"name": "a", "nominal": {"gpu": 8}},
                {"name": "b", "nominal": {"gpu": 8}, "lending_limit": {"gpu": 0}},
            ],
        },
        {"gpu": 4},
    )
    assert small.limit[idx(small, "cluster")] == t.limit[idx(t, "cluster")] == [16.0]
    assert small.verdict("a", gpu(8)).fits


def test_lending_limits_hold_at_the_root_whose_limit_is_the_capacity() -> None:
    """On 128 GPUs, research (limit 64 + 64) may have all but the 16 platform keeps (its
    lending limit lends 16 of its 32): 112. Once platform uses 10 of them it holds back the 6
    left: 128 − 10 − 6 = 112 still."""
    t = tree(DESIGN_QUEUES, {"gpu": 128})
    assert t.verdict("vision", gpu(112)).fits
    v = t.verdict("vision", gpu(113))
    assert not v.fits and isinstance(v.reason, BorrowingLimit) and v.reason.available == 112
    t.add("platform", gpu(10))
    assert t.verdict("language", gpu(112)).fits
    assert not t.verdict("language", gpu(113)).fits
    assert t.verdict("platform", gpu(118)).fits  # platform itself may borrow the rest


# ------------------------------------------------------------------------------ borrowing limit


def test_borrowing_limit_caps_a_queue_above_nominal() -> None:
    t = two_teams(a={"borrowing_limit": {"gpu": 4}})
    v = t.verdict("a", gpu(12))  # 8 nominal + 4 borrowed
    assert v.fits and not v.in_quota
    v = t.verdict("a", gpu(13))
    assert not v.fits
    assert v.reason == BorrowingLimit("a", "gpu", 13, 12, used=0, limit=12)


def test_borrowing_limit_reason_counts_what_the_queue_already_uses() -> None:
    t = two_teams(a={"borrowing_limit": {"gpu": 4}})
    t.add("a", gpu(8))
    assert t.verdict("a", gpu(4)).fits
    v = t.verdict("a", gpu(8))
    assert not v.fits
    assert isinstance(v.reason, BorrowingLimit)
    assert (v.reason.queue, v.reason.resource, v.reason.requested, v.reason.available) == ("a", "gpu", 8, 4)


def test_borrowing_limit_zero_means_quota_exceeded_at_nominal() -> None:
    t = two_teams(a={"borrowing_limit": {"gpu": 0}})
    t.add("a", gpu(6))
    assert t.verdict("a", gpu(2)).in_quota
    v = t.verdict("a", gpu(4))
    assert not v.fits
    assert v.reason == QuotaExceeded("a", "gpu", 4, 2, used=6, limit=8)


def test_borrowing_limit_on_a_department_caps_all_its_teams_together() -> None:
    # research: nominal 8 + borrowing 4 = 12 for vision and language together; root has 24.
    t = tree(
        {
            "name": "cluster",
            "children": [
                {
                    "name": "research",
                    "nominal": {"gpu": 8},
                    "borrowing_limit": {"gpu": 4},
                    "children": [
                        {"name": "vision", "nominal": {"gpu": 4}},
                        {"name": "language", "nominal": {"gpu": 4}},
                    ],
                },
                {"name": "platform", "nominal": {"gpu": 16}},
            ],
        }
    )
    t.add("vision", gpu(10))
    assert t.verdict("language", gpu(2)).fits
    v = t.verdict("language", gpu(3))
    assert not v.fits
    assert v.reason == BorrowingLimit("research", "gpu", 3, 2, used=10, limit=12)


# ------------------------------------------------------------------------------- lending limit


def test_design_example_lender_keeps_nominal_minus_lending_limit() -> None:
    """DESIGN §3: platform nominal 32, lending_limit 16 → research gets at most 64 + 16 = 80."""
    t = tree(DESIGN_QUEUES)
    assert t.verdict("vision", gpu(80)).fits
    v = t.verdict("vision", gpu(81))
    assert not v.fits
    assert v.reason is not None and v.reason.code == "BorrowingLimit"
    assert (v.reason.resource, v.reason.requested, v.reason.available) == ("gpu", 81, 80)


def test_lending_limit_across_two_teams_of_the_borrowing_department() -> None:
    t = tree(DESIGN_QUEUES)
    t.add("vision", gpu(32))
    t.add("language", gpu(32))  # research at its nominal 64
    assert t.verdict("language", gpu(16)).fits
    assert not t.verdict("language", gpu(17)).fits
    assert not t.verdict("vision", gpu(17)).fits


def test_lender_using_part_of_what_it_keeps_still_holds_the_rest() -> None:
    # platform uses 10 of the 16 it keeps: 6 stay held, research gets 96 − 10 − 6 = 80.
    t = tree(DESIGN_QUEUES)
    t.add("platform", gpu(10))
    assert t.verdict("language", gpu(80)).fits
    assert not t.verdict("language", gpu(81)).fits


def test_lender_using_more_than_it_keeps_leaves_the_rest_of_the_cluster() -> None:
    # platform uses 20 (> its kept 16): nothing more is held, research gets 96 − 20 = 76.
    t = tree(DESIGN_QUEUES)
    t.add("platform", gpu(20))
    assert t.verdict("vision", gpu(76)).fits
    assert not t.verdict("vision", gpu(77)).fits


def test_lender_can_always_take_back_what_it_keeps() -> None:
    t = tree(DESIGN_QUEUES)
    t.add("vision", gpu(80))  # research borrowed all platform lends
    v = t.verdict("platform", gpu(16))
    assert v.fits and v.in_quota
    assert not t.verdict("platform", gpu(17)).fits  # the other 16 are lent out


def test_unset_lending_limit_lends_everything() -> None:
    queues = {**DESIGN_QUEUES, "children": [DESIGN_QUEUES["children"][0], {"name": "platform", "nominal": {"gpu": 32}}]}
    t = tree(queues)
    assert t.verdict("vision", gpu(96)).fits  # research: 64 + all of platform's 32 (≤ 128)


def test_lending_limit_zero_lends_nothing() -> None:
    t = two_teams(b={"lending_limit": {"gpu": 0}})
    v = t.verdict("a", gpu(8))
    assert v.fits and v.in_quota
    assert not t.verdict("a", gpu(9)).fits


def test_team_lending_limit_holds_inside_a_borrowing_department() -> None:
    """vision lends nothing (lending_limit 0): language can use its own 32 plus what platform
    lends (16), i.e. 48 — never vision's 32, which vision must be able to take at any time."""
    queues = {
        **DESIGN_QUEUES,
        "children": [
            {
                **DESIGN_QUEUES["children"][0],
                "children": [
                    {"name": "vision", "nominal": {"gpu": 32}, "lending_limit": {"gpu": 0}},
                    {"name": "language", "nominal": {"gpu": 32}},
                ],
            },
            DESIGN_QUEUES["children"][1],
        ],
    }
    t = tree(queues)
    assert t.verdict("language", gpu(48)).fits
    assert not t.verdict("language", gpu(49)).fits


# -------------------------------------------------------------------------------- hierarchical


def test_team_borrows_from_its_sibling_team_before_leaving_the_department() -> None:
    t = tree(DESIGN_QUEUES)
    v = t.verdict("vision", gpu(64))  # vision over its 32, research within its 64
    assert v.fits and not v.in_quota
    t.add("vision", gpu(64))
    assert t.over_nominal(idx(t, "vision"))
    assert not t.over_nominal(idx(t, "research"))  # borrowed inside the department only
    # The next 16 come from platform (what it lends): research goes over nominal.
    assert t.verdict("vision", gpu(16)).fits
    t.add("vision", gpu(16))
    assert t.over_nominal(idx(t, "research"))
    assert not t.verdict("vision", gpu(1)).fits


def test_sibling_within_department_nominal_is_not_in_quota_when_department_is_over() -> None:
    t = tree(DESIGN_QUEUES)
    t.add("vision", gpu(60))
    # language asks 8: within its own 32, but research would reach 68 > 64.
    v = t.verdict("language", gpu(8))
    assert v.fits and not v.in_quota
    assert t.verdict("language", gpu(4)).in_quota


# ------------------------------------------------------------------------ usage bookkeeping


def test_add_then_remove_restores_usage_exactly() -> None:
    t = tree(DESIGN_QUEUES)
    before = [row[:] for row in t.usage], [row[:] for row in t.held]
    t.add("platform", gpu(5))
    t.add("vision", gpu(7))
    assert t.usage[idx(t, "cluster")] == [12.0]
    assert t.usage[idx(t, "research")] == [7.0]
    t.remove("vision", gpu(7))
    t.remove("platform", gpu(5))
    assert ([row[:] for row in t.usage], [row[:] for row in t.held]) == before


def test_add_charges_every_queue_on_the_path() -> None:
    t = tree(DESIGN_QUEUES)
    t.add("language", gpu(3))
    assert t.usage[idx(t, "language")] == [3.0]
    assert t.usage[idx(t, "research")] == [3.0]
    assert t.usage[idx(t, "cluster")] == [3.0]
    assert t.usage[idx(t, "vision")] == [0.0]
    assert t.usage[idx(t, "platform")] == [0.0]


def test_rollback_undoes_only_what_came_after_the_mark() -> None:
    t = tree(DESIGN_QUEUES)
    t.add("vision", gpu(10))
    m = t.mark()
    t.add("platform", gpu(20))
    t.remove("vision", gpu(4))
    t.rollback(m)
    assert t.usage[idx(t, "vision")] == [10.0]
    assert t.usage[idx(t, "platform")] == [0.0]
    assert t.usage[idx(t, "cluster")] == [10.0]
    # The held-back capacity follows: platform keeps its 16 again.
    assert t.verdict("vision", gpu(70)).fits and not t.verdict("vision", gpu(71)).fits


RESOURCE_QUEUES: dict[str, Any] = {
    "name": "cluster",
    "children": [
        {
            "name": "d1",
            "nominal": {"gpu": 16, "cpu": 8000},
            "lending_limit": {"gpu": 4},
            "children": [
                {"name": "t1", "nominal": {"gpu": 8, "cpu": 4000}, "lending_limit": {"cpu": 1000}},
                {"name": "t2", "nominal": {"gpu": 8, "cpu": 4000}},
            ],
        },
        {"name": "t3", "nominal": {"gpu": 8, "memory": 1024}, "lending_limit": {"memory": 0}},
    ],
}
LEAVES = ("t1", "t2", "t3")


def _expected_held(t: QuotaTree) -> list[list[float]]:
    """held(q) = max(0, kept − usage, Σ held of the children), recomputed from scratch."""

    def held(i: int, r: int) -> float:
        below = sum(held(c, r) for c in t.children[i])
        return max(0.0, t.kept[i][r] - t.usage[i][r], below)

    return [[held(i, r) for r in range(len(t.resources))] for i in range(len(t.names))]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(LEAVES), st.lists(st.integers(0, 12), min_size=3, max_size=3), st.booleans(), st.booleans()
        ),
        max_size=30,
    )
)
def test_random_add_remove_mark_rollback_restore_usage(ops: list[tuple[str, list[int], bool, bool]]) -> None:
    t = tree(RESOURCE_QUEUES)
    assert t.resources == ("cpu", "gpu", "memory")
    fresh = [row[:] for row in t.usage], [row[:] for row in t.held]
    states: list[tuple[int, list[list[float]], list[list[float]]]] = []
    added: dict[str, list[float]] = {q: [0.0, 0.0, 0.0] for q in LEAVES}
    for leaf, amounts, take_mark, remove in ops:
        if take_mark:
            states.append((t.mark(), [row[:] for row in t.usage], [row[:] for row in t.held]))
        d = tuple(float(a) for a in amounts)
        if remove and all(x >= y for x, y in zip(added[leaf], d)):  # never below zero
            t.remove(leaf, d)
            added[leaf] = [x - y for x, y in zip(added[leaf], d)]
        else:
            t.add(leaf, d)
            added[leaf] = [x + y for x, y in zip(added[leaf], d)]
        # Usage of every queue is the sum over the leaves below it.
        assert t.usage[idx(t, "d1")] == [a + b for a, b in zip(added["t1"], added["t2"])]
        assert t.usage[idx(t, "cluster")] == [a + b + c for a, b, c in zip(*(added[q] for q in LEAVES))]
        assert t.held == _expected_held(t)
    for token, usage, held in reversed(states):
        t.rollback(token)
        assert t.usage == usage
        assert t.held == held
    t.rollback(0)
    assert t.usage == fresh[0]
    assert t.held == fresh[1]


def test_check_never_changes_usage() -> None:
    t = tree(DESIGN_QUEUES)
    t.add("vision", gpu(30))
    before = [row[:] for row in t.usage], t.mark()
    for leaf in ("vision", "language", "platform"):
        for n in (1, 50, 200):
            t.verdict(leaf, gpu(n))
            t.in_quota(leaf, gpu(n))
    assert ([row[:] for row in t.usage], t.mark()) == before


# ---------------------------------------------------------------------- governed resources


def test_resources_no_queue_names_are_not_checked() -> None:
    t = two_teams(a={"borrowing_limit": {"gpu": 0}})
    assert t.resources == ("gpu",)
    job = Job("j", "a", 3, submit=0.0, gpus=2, cpu=10**9, memory=10**9)
    d = t.demand(job, "default")
    assert d == (2.0,)
    assert t.verdict("a", d).in_quota


def test_policy_without_quotas_governs_nothing() -> None:
    t = tree({"name": "cluster", "children": [{"name": "a"}, {"name": "b"}]})
    assert not t.governed()
    assert t.demand(Job("j", "a", 3, submit=0.0, gpus=64), "default") == ()


def test_cpu_quota_is_checked_when_named() -> None:
    t = tree(
        {
            "name": "cluster",
            "children": [
                {"name": "a", "nominal": {"gpu": 8, "cpu": 4000}, "borrowing_limit": {"cpu": 0}},
                {"name": "b", "nominal": {"gpu": 8, "cpu": 4000}},
            ],
        }
    )
    job = Job("j", "a", 3, submit=0.0, replicas=2, gpus=1, cpu=2500)  # 5000 millicores in all
    v = t.verdict("a", t.demand(job, "default"))
    assert not v.fits
    assert v.reason == QuotaExceeded("a", "cpu", 5000, 4000, used=0, limit=4000)


# ------------------------------------------------------------------------------ GPU flavors


FLAVOR_QUEUES: dict[str, Any] = {
    "name": "cluster",
    "children": [
        {"name": "a", "nominal": {"gpu": 16, "gpu:h100": 8}, "borrowing_limit": {"gpu:h100": 0}},
        {"name": "b", "nominal": {"gpu": 16, "gpu:h100": 8}},
    ],
}


def test_flavored_quota_counts_only_jobs_on_that_flavor() -> None:
    t = tree(FLAVOR_QUEUES)
    assert t.resources == ("gpu", "gpu:h100")
    job = Job("j", "a", 3, submit=0.0, replicas=2, gpus=4)
    assert t.demand(job, "h100") == (8.0, 8.0)
    assert t.demand(job, "a100") == (8.0, 0.0)
    t.add("a", t.demand(job, "h100"))
    # a's 8 H100s are used: another H100 job exceeds them, the same job on A100s fits.
    v = t.verdict("a", t.demand(job, "h100"))
    assert not v.fits and v.reason == QuotaExceeded("a", "gpu:h100", 8, 0, used=8, limit=8)
    v = t.verdict("a", t.demand(job, "a100"))
    assert v.fits and v.in_quota


def test_flavor_only_quota_leaves_other_flavors_ungoverned() -> None:
    t = tree(
        {
            "name": "cluster",
            "children": [
                {"name": "a", "nominal": {"gpu:h100": 8}, "borrowing_limit": {"gpu:h100": 0}},
                {"name": "b", "nominal": {"gpu:h100": 8}},
            ],
        }
    )
    assert t.resources == ("gpu:h100",)
    job = Job("j", "a", 3, submit=0.0, gpus=64)
    assert t.demand(job, "a100") == (0.0,)
    assert t.verdict("a", t.demand(job, "a100")).fits
    assert not t.verdict("a", t.demand(job, "h100")).fits


# ---------------------------------------------------------------------- tree navigation


def test_lowest_common_ancestor() -> None:
    t = tree(DESIGN_QUEUES)

    def lca(a: str, b: str) -> tuple[str | None, ...]:
        return tuple(None if i < 0 else t.names[i] for i in t.lowest_common_ancestor(a, b))

    assert lca("vision", "language") == ("research", "vision", "language")
    assert lca("language", "vision") == ("research", "language", "vision")
    assert lca("vision", "platform") == ("cluster", "research", "platform")
    assert lca("platform", "language") == ("cluster", "platform", "research")


def test_lowest_common_ancestor_of_a_leaf_with_itself_has_no_sides() -> None:
    t = tree(DESIGN_QUEUES)
    assert t.lowest_common_ancestor("vision", "vision") == (idx(t, "vision"), -1, -1)


def test_over_nominal_is_strictly_above_on_any_resource() -> None:
    t = tree(
        {
            "name": "cluster",
            "children": [
                {"name": "a", "nominal": {"gpu": 8, "cpu": 1000}},
                {"name": "b", "nominal": {"gpu": 8, "cpu": 1000}},
            ],
        }
    )
    a = idx(t, "a")
    assert not t.over_nominal(a)
    t.add("a", (1000.0, 8.0))  # (cpu, gpu): exactly at nominal
    assert not t.over_nominal(a)
    t.add("a", (0.0, 1.0))
    assert t.over_nominal(a)
    t.remove("a", (0.0, 1.0))
    t.add("a", (1.0, 0.0))  # GPUs at nominal, one millicore over
    assert t.over_nominal(a)
    assert not t.over_nominal(idx(t, "b"))


def test_transfer_charges_only_what_the_leaving_jobs_do_not_cover() -> None:
    t = two_teams()
    t.add("a", gpu(8))
    # b's job will replace a's 8 once it exits: the root is charged nothing more, b its 8.
    left = t.transfer("b", gpu(8), [t.path_usage("a", gpu(8))])
    assert t.usage[idx(t, "cluster")][0] == 8.0
    assert t.usage[idx(t, "b")][0] == 8.0 and t.usage[idx(t, "a")][0] == 8.0
    # The root's 8 are taken over; a's own 8 will vanish at exit and are left over.
    assert left == [[(idx(t, "a"), (8.0,))]]
    token = t.mark()
    left = t.transfer("b", gpu(4), [t.path_usage("a", gpu(2))])  # more than what leaves: root +2
    assert t.usage[idx(t, "cluster")][0] == 10.0
    assert left == [[(idx(t, "a"), (2.0,))]]
    t.rollback(token)
    assert t.usage[idx(t, "cluster")][0] == 8.0


def test_adjust_adds_and_removes_per_queue_usage() -> None:
    t = two_teams()
    t.adjust([(idx(t, "a"), (3.0,)), (idx(t, "cluster"), (3.0,))], 1)
    assert t.usage[idx(t, "a")][0] == t.usage[idx(t, "cluster")][0] == 3.0
    t.adjust([(idx(t, "a"), (3.0,)), (idx(t, "cluster"), (3.0,))], -1)
    assert t.usage[idx(t, "a")][0] == t.usage[idx(t, "cluster")][0] == 0.0


def test_rollback_restores_every_derived_value_exactly() -> None:
    """A change deep in the tree moves `held` up to the root; a rollback writes back exactly
    the values it replaced, and `check()` finds every derived value true to its definition."""
    pol = parse_policy(
        {
            "queues": {
                "name": "root",
                "nominal": {"gpu": 16},
                "children": [
                    {
                        "name": "dept",
                        "nominal": {"gpu": 8},
                        "lending_limit": {"gpu": 2},
                        "children": [
                            {"name": "a", "nominal": {"gpu": 4}, "lending_limit": {"gpu": 0}},
                            {"name": "b", "nominal": {"gpu": 4}},
                        ],
                    },
                    {"name": "other", "nominal": {"gpu": 8}},
                ],
            }
        }
    )
    t = QuotaTree(pol, {"gpu": 16})
    t.add("b", gpu(3))
    t.forget()
    assert t.held[t.index["dept"]][0] == 4.0  # a keeps all 4 of its nominal
    before = [[list(row) for row in getattr(t, name)] for name in ("usage", "held", "child_held", "child_excess")]
    mark = t.mark()
    t.add("a", gpu(2))
    t.check()
    dept, root = t.index["dept"], t.index["root"]
    assert t.held[t.index["a"]][0] == 2.0 and t.held[dept][0] == 2.0 and t.child_held[root][0] == 2.0
    t.transfer("other", gpu(4), [t.path_usage("b", gpu(3))])
    t.depart("b", gpu(3))
    t.check()
    t.rollback(mark)
    t.check()
    after = [[list(row) for row in getattr(t, name)] for name in ("usage", "held", "child_held", "child_excess")]
    assert after == before
