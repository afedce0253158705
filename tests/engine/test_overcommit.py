"""Nominal quotas that add up to more than the cluster has, or cover less of it (warden.engine.overcommit)."""

from __future__ import annotations

from warden.engine.model import Node
from warden.engine.overcommit import Overcommit, Uncovered, cluster_totals, quota_warnings
from warden.engine.policy import parse_policy


def tree(**nominal: dict[str, int]) -> dict[str, object]:
    return {"queues": {"name": "cluster", "children": [{"name": q, "nominal": n} for q, n in nominal.items()]}}


NODES = (
    Node("a0", 8, cpu=64_000, flavor="a100"),
    Node("a1", 8, cpu=64_000, flavor="a100"),
    Node("h0", 4, flavor="h100"),
)


def test_the_cluster_totals_count_every_resource_a_quota_can_name() -> None:
    assert cluster_totals(NODES) == {"gpu": 20, "cpu": 128_000, "memory": 0, "gpu:a100": 16, "gpu:h100": 4}


def test_quotas_that_cover_the_cluster_exactly_give_no_warning() -> None:
    assert quota_warnings(parse_policy(tree(a={"gpu": 12}, b={"gpu": 8})), NODES) == ()


def test_capacity_no_quota_covers_is_reported_with_how_much() -> None:
    policy = parse_policy(tree(a={"gpu": 8, "gpu:a100": 16}, b={"cpu": 100_000}))
    found = quota_warnings(policy, NODES)
    assert found == (Uncovered("cpu", 100_000, 128_000), Uncovered("gpu", 8, 20))
    message = found[1].message
    assert message.startswith("12 of the cluster's 20 GPUs are covered by no queue's nominal quota: ")
    assert "every queue may borrow them (within its borrowing limit)" in message
    assert found[1].to_dict() == {
        "kind": "uncovered",
        "resource": "gpu",
        "nominal": 8,
        "capacity": 20,
        "message": message,
    }
    assert found[1].headline == "the policy's quotas cover less than this cluster"


def test_the_root_is_the_cluster_whatever_nominal_the_file_gives_it() -> None:
    """What the root's children cover counts, not a nominal the file gives the root itself."""
    data = tree(a={"gpu": 8})
    data["queues"]["nominal"] = {"gpu": 20}  # type: ignore[index]
    assert quota_warnings(parse_policy(data), NODES) == (Uncovered("gpu", 8, 20),)


def test_each_overcommitted_resource_is_named_with_its_sums() -> None:
    policy = parse_policy(tree(a={"gpu": 16, "gpu:h100": 4, "cpu": 100_000}, b={"gpu": 8, "gpu:h100": 2, "cpu": 8_000}))
    found = quota_warnings(policy, NODES)
    assert found == (  # cpu: 108,000 of 128,000 are covered
        Uncovered("cpu", 108_000, 128_000),
        Overcommit("gpu", 24, 20),
        Overcommit("gpu:h100", 6, 4),
    )
    message = found[1].message
    assert "add up to 24 but the cluster has 20" in message
    assert "nothing is ever reclaimed" in message and "× 0.833" in message
    assert found[1].to_dict()["message"] == message and found[1].to_dict()["kind"] == "overcommit"


def test_a_resource_the_cluster_does_not_report_is_not_compared() -> None:
    policy = parse_policy(tree(a={"memory": 1 << 20, "gpu:b200": 64}))
    assert quota_warnings(policy, NODES) == ()
