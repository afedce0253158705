"""Nominal quotas that add up to more than the cluster has (warden.engine.overcommit)."""

from __future__ import annotations

from warden.engine.model import Node
from warden.engine.overcommit import Overcommit, cluster_totals, overcommitted
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


def test_quotas_that_fit_the_cluster_give_no_warning() -> None:
    assert overcommitted(parse_policy(tree(a={"gpu": 12}, b={"gpu": 8})), NODES) == ()


def test_each_overcommitted_resource_is_named_with_its_sums() -> None:
    policy = parse_policy(tree(a={"gpu": 16, "gpu:h100": 4, "cpu": 100_000}, b={"gpu": 8, "gpu:h100": 2, "cpu": 8_000}))
    found = overcommitted(policy, NODES)
    assert found == (Overcommit("gpu", 24, 20), Overcommit("gpu:h100", 6, 4))  # cpu: 108,000 of 128,000 fits
    message = found[0].message
    assert "add up to 24 but the cluster has 20" in message
    assert "nothing is ever reclaimed" in message and "× 0.833" in message
    assert found[0].to_dict()["message"] == message


def test_a_resource_the_cluster_does_not_report_is_not_compared() -> None:
    policy = parse_policy(tree(a={"memory": 1 << 20, "gpu:b200": 64}))
    assert overcommitted(policy, NODES) == ()
