"""The policy file (DESIGN §3): loading, resolution, defaults, durations and every refusal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

import warden
from warden.engine.policy import (
    Policy,
    PolicyError,
    PolicyIssue,
    QueueSpec,
    default_policy,
    format_duration,
    load_policy,
    parse_duration,
    parse_policy,
    policy_json_schema,
)

DEMO = Path(warden.__file__).parent / "demo" / "policy.yaml"

# DESIGN §3's example, verbatim: a file written like this must load.
EXAMPLE = """\
tiers:
  1: {name: production-inference, preemptible: false, grace: 300s, requires_approval: true, scope: cluster}
  2: {name: pretraining, lease: 4h, grace: 300s, requires_approval: true, scope: quota}
  3: {name: experimentation, lease: 45m, grace: 120s, scope: quota}
  4: {name: opportunistic, lease: 0s, grace: 120s, charged: false, scope: quota}
min_grace: 120s                 # refuse any policy or job with a shorter grace
max_lease: 8h
fair_share: {half_life: 7d, aging: {max_wait: {default: 24h}}}
thrash: {min_efficiency: 0.9, max_preemptions: {per: 24h, count: 3}}
queues:
  name: cluster
  children:
    - {name: research, weight: 2, nominal: {gpu: 64}, borrowing_limit: {gpu: 64},
       children: [{name: vision, nominal: {gpu: 32}}, {name: language, nominal: {gpu: 32}}]}
    - {name: platform, weight: 1, nominal: {gpu: 32}, lending_limit: {gpu: 16}}
"""

H, M, D = 3600.0, 60.0, 86400.0


def example() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(EXAMPLE)
    return data


def refused(data: Any) -> PolicyError:
    with pytest.raises(PolicyError) as info:
        parse_policy(data)
    return info.value


def issue_at(err: PolicyError, path: str) -> PolicyIssue:
    found = [i for i in err.issues if i.path == path]
    assert found, f"no issue at {path}; got:\n{err}"
    return found[0]


# ------------------------------------------------------------------------------ the example


def test_design_example_loads_with_its_values() -> None:
    p = parse_policy(EXAMPLE)
    assert [p.tier(t).name for t in (1, 2, 3, 4)] == [
        "production-inference",
        "pretraining",
        "experimentation",
        "opportunistic",
    ]
    assert p.tier(1).preemptible is False and p.tier(1).scope == "cluster"
    assert p.tier(2).lease == 4 * H and p.tier(2).grace == 300
    assert p.tier(3).lease == 45 * M and p.tier(4).lease == 0 and p.tier(4).charged is False
    assert (p.min_grace, p.max_lease) == (120, 8 * H)
    assert p.fair_share.half_life == 7 * D
    assert p.fair_share.aging.max_wait == {"default": 24 * H}
    assert p.thrash.min_efficiency == 0.9
    assert (p.thrash.max_preemptions.per, p.thrash.max_preemptions.count) == (24 * H, 3)


def test_demo_file_is_the_design_example() -> None:
    assert load_policy(DEMO) == parse_policy(EXAMPLE)


def test_example_queue_tree_resolves() -> None:
    p = parse_policy(EXAMPLE)
    assert p.queues.name == "cluster"
    assert p.queues.nominal == {"gpu": 96}  # the root names no nominal: children's sum
    research = p.find_queue("research")
    assert research is not None
    assert research.nominal == {"gpu": 64} and research.borrowing_limit == {"gpu": 64}
    assert research.weight == 2 and research.lending_limit is None
    platform = p.find_queue("platform")
    assert platform is not None and platform.lending_limit == {"gpu": 16}
    assert p.queue_names() == ["cluster", "research", "vision", "language", "platform"]
    assert [q.name for q in p.leaves()] == ["vision", "language", "platform"]
    assert p.path_to("vision") == ("cluster", "research", "vision")
    assert p.path_to("platform") == ("cluster", "platform")
    assert p.parent_of("language") == "research" and p.parent_of("cluster") is None
    assert p.find_queue("nope") is None
    assert p.governed_resources() == ("gpu",)


def test_inner_nominal_keeps_its_own_resources_and_sums_the_others() -> None:
    p = parse_policy(
        {
            "queues": {
                "name": "root",
                "nominal": {"cpu": 64000},
                "children": [
                    {"name": "a", "nominal": {"gpu": 8, "memory": 1024}},
                    {"name": "b", "nominal": {"gpu": 4, "gpu:a100": 2}},
                ],
            }
        }
    )
    assert p.queues.nominal == {"cpu": 64000, "gpu": 12, "memory": 1024, "gpu:a100": 2}
    assert p.governed_resources() == ("cpu", "gpu", "gpu:a100", "memory")


def test_to_dict_is_resolved_and_round_trips() -> None:
    p = parse_policy(EXAMPLE)
    d = p.to_dict()
    assert list(d["tiers"]) == [1, 2, 3, 4]
    assert d["tiers"][2]["lease"] == "4h" and d["tiers"][1]["grace"] == "5m"
    assert d["min_grace"] == "2m" and d["fair_share"]["half_life"] == "7d"
    assert d["queues"]["nominal"] == {"gpu": 96}
    assert [c["name"] for c in d["queues"]["children"]] == ["research", "platform"]
    assert "parent" not in d["queues"]
    assert d["scheduling"] == {
        "order": "governed",
        "head_of_line_blocking": False,
        "reservations": 1,
        "requeue_timestamp": "submit",
        "nominal_first": False,
    }
    assert parse_policy(d) == p
    assert parse_policy(yaml.safe_dump(d)) == p
    assert parse_policy(json.loads(json.dumps(d))) == p  # JSON keys tiers by "1".."4"


def test_policy_is_frozen() -> None:
    p = default_policy()
    with pytest.raises(ValidationError):
        p.min_grace = 1.0
    with pytest.raises(ValidationError):
        p.queues.weight = 3.0


# ----------------------------------------------------------------------------------- defaults


@pytest.mark.parametrize("empty", [None, "", "# nothing here\n", {}])
def test_empty_input_gives_the_defaults(empty: Any) -> None:
    assert parse_policy(empty) == default_policy()


def test_default_tiers_are_design_s_four() -> None:
    tiers = default_policy().tiers
    assert {
        n: (t.name, t.preemptible, t.lease, t.grace, t.requires_approval, t.scope, t.charged) for n, t in tiers.items()
    } == {
        1: ("production-inference", False, 0.0, 300.0, True, "cluster", True),
        2: ("pretraining", True, 4 * H, 300.0, True, "quota", True),
        3: ("experimentation", True, 45 * M, 120.0, False, "quota", True),
        4: ("opportunistic", True, 0.0, 120.0, False, "quota", False),
    }


def test_default_settings() -> None:
    p = default_policy()
    assert (p.min_grace, p.max_lease) == (120, 8 * H)
    assert p.fair_share.half_life == 7 * D and p.max_wait_for("default") == 24 * H
    assert (
        p.thrash.min_efficiency,
        p.thrash.max_preemptions.count,
        p.thrash.max_preemptions.per,
        p.thrash.requeue_backoff,
    ) == (0.9, 3, 24 * H, 0)
    assert (
        p.preemption.restart_overhead,
        p.preemption.checkpoint_overhead,
        p.preemption.max_attempts_per_pass,
        p.preemption.victim_order,
    ) == (60, 30, 16, "cost")
    assert (p.scheduling.order, p.scheduling.head_of_line_blocking, p.scheduling.reservations) == ("governed", False, 1)
    assert p.queue_names() == ["cluster", "default"]
    assert [q.name for q in p.leaves()] == ["default"]
    assert p.governed_resources() == ()


@pytest.mark.parametrize("key", [3, "3"])
def test_a_partial_tier_is_merged_over_its_default(key: int | str) -> None:
    p = parse_policy({"tiers": {key: {"lease": "30m"}}})
    assert p.tier(3).name == "experimentation" and p.tier(3).lease == 30 * M
    assert p.tier(3).grace == 120
    assert p.tier(1) == default_policy().tier(1)  # tiers not given keep their defaults


def test_needs_approval() -> None:
    p = default_policy()
    assert p.needs_approval(1, is_admin=False) and p.needs_approval(2, is_admin=False)
    assert not p.needs_approval(1, is_admin=True)
    assert not p.needs_approval(3, is_admin=False) and not p.needs_approval(4, is_admin=False)


def test_max_wait_per_queue_override_and_inheritance() -> None:
    data = example()
    data["fair_share"]["aging"]["max_wait"] = {"research": "2h", "vision": "30m"}
    p = parse_policy(data)
    assert p.max_wait_for("vision") == 30 * M  # its own
    assert p.max_wait_for("language") == 2 * H  # its parent's
    assert p.max_wait_for("platform") == 24 * H  # the default, kept when not given
    assert p.max_wait_for("unknown") == 24 * H


# ---------------------------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("45m", 2700),
        ("8h", 28800),
        ("7d", 604800),
        ("1h30m", 5400),
        ("0s", 0),
        ("1d12h", 129600),
        ("1.5h", 5400),
        (" 2m ", 120),
        ("300", 300),
        (90, 90),
        (2.5, 2.5),
        (0, 0),
    ],
)
def test_parse_duration(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (300, "5m"),
        (14400, "4h"),
        (90, "90s"),
        (0, "0s"),
        (120, "2m"),
        (86400, "1d"),
        (604800, "7d"),
        (5400, "90m"),
        (3601, "1h1s"),
        (0.5, "0.5s"),
    ],
)
def test_format_duration_is_the_shortest_form(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@given(st.one_of(st.integers(min_value=0, max_value=10**9), st.floats(min_value=0, max_value=1e9, allow_nan=False)))
def test_format_duration_parses_back_exactly(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize(
    "bad", ["5x", "", "m", "-5m", "5 m", "1h-30m", -1, -0.5, True, None, float("inf"), float("nan"), "inf", [1]]
)
def test_bad_durations_are_refused(bad: Any) -> None:
    with pytest.raises(PolicyError) as info:
        parse_duration(bad)
    assert info.value.issues[0].value is bad


def test_durations_dump_as_canonical_strings_only_in_json_mode() -> None:
    p = parse_policy({"tiers": {3: {"lease": "300s"}}})
    assert p.tier(3).model_dump()["lease"] == 300.0
    assert p.tier(3).model_dump(mode="json")["lease"] == "5m"


# ----------------------------------------------------------------------------------- refusals


def test_grace_below_min_grace_quotes_the_file() -> None:
    err = refused(EXAMPLE.replace("lease: 45m, grace: 120s", "lease: 45m, grace: 60s"))
    assert str(err).splitlines() == ["tiers.3.grace: grace 60s is below min_grace 120s (got '60s')"]


def test_a_custom_min_grace_applies_to_default_tiers_too() -> None:
    err = refused({"min_grace": "5m"})
    assert [i.path for i in err.issues] == ["tiers.3.grace", "tiers.4.grace"]
    assert issue_at(err, "tiers.3.grace").value == "2m"
    assert "below min_grace 5m" in issue_at(err, "tiers.4.grace").message


def test_a_tier_with_a_bad_value_is_not_also_checked_against_the_limits() -> None:
    err = refused({"min_grace": "5m", "tiers": {3: {"grace": "5x"}, 4: {"grace": "5m"}}})
    assert [(i.path, i.value) for i in err.issues] == [("tiers.3.grace", "5x")]


def test_lease_above_max_lease() -> None:
    err = refused({"max_lease": "1h", "tiers": {3: {"lease": "30m"}}})
    assert [i.path for i in err.issues] == ["tiers.2.lease"]
    assert issue_at(err, "tiers.2.lease").value == "4h"
    err = refused({"tiers": {3: {"lease": "9h"}}})
    assert issue_at(err, "tiers.3.lease").value == "9h"
    assert "above max_lease 8h" in issue_at(err, "tiers.3.lease").message


def test_tier_time_limits_default_to_none_and_fall_back_as_slurm_s() -> None:
    assert all(t.time_limit is None and t.max_time_limit is None for t in default_policy().tiers.values())
    p = parse_policy({"tiers": {2: {"time_limit": "8h", "max_time_limit": "2d"}, 3: {"max_time_limit": "1d"}}})
    assert (p.tier(2).time_limit, p.tier(2).max_time_limit, p.tier(2).default_time_limit) == (8 * H, 2 * D, 8 * H)
    assert p.tier(3).default_time_limit == D  # no default: the maximum, as DefaultTime falls back to MaxTime
    assert p.tier(4).default_time_limit is None
    assert p.to_dict()["tiers"][2]["time_limit"] == "8h" and parse_policy(p.to_dict()) == p


@pytest.mark.parametrize(
    ("tiers", "limits", "path", "value", "says"),
    [
        ({3: {"time_limit": "2d", "max_time_limit": "1d"}}, {}, "tiers.3.time_limit", "2d", "above max_time_limit 1d"),
        ({3: {"time_limit": "0s"}}, {}, "tiers.3.time_limit", "0s", "longer than 0s"),
        ({4: {"max_time_limit": 0}}, {}, "tiers.4.max_time_limit", "0s", "longer than 0s"),
        ({3: {"max_time_limit": "400d"}}, {}, "tiers.3.max_time_limit", "400d", "above limits.max_time_limit 365d"),
        (
            {2: {"time_limit": "2h"}},
            {"max_time_limit": "1h"},
            "tiers.2.time_limit",
            "2h",
            "above limits.max_time_limit 1h",
        ),
    ],
)
def test_tier_time_limits_out_of_bounds_are_refused(
    tiers: dict[int, dict[str, Any]], limits: dict[str, Any], path: str, value: str, says: str
) -> None:
    err = refused({"tiers": tiers, "limits": limits})
    assert [i.path for i in err.issues] == [path]
    assert issue_at(err, path).value == value and says in issue_at(err, path).message


def test_children_nominal_above_the_parent() -> None:
    data = example()
    data["queues"]["children"][0]["children"][1]["nominal"]["gpu"] = 40
    err = refused(data)
    i = issue_at(err, "queues.children[0].nominal.gpu")
    assert i.value == 64
    assert "72" in i.message and "vision, language" in i.message


@pytest.mark.parametrize("tier", [5, 0, "x"])
def test_unknown_tier(tier: int | str) -> None:
    i = issue_at(refused({"tiers": {tier: {"name": "extra"}}}), f"tiers.{tier}")
    assert (i.value, i.message, i.allowed) == (tier, "unknown tier", "1, 2, 3, 4")


def test_a_tier_given_twice() -> None:
    assert issue_at(refused({"tiers": {3: {}, "3": {}}}), "tiers.3").message == "tier given twice"


def test_duplicate_queue_name_in_the_tree() -> None:
    data = example()
    data["queues"]["children"][1]["name"] = "vision"
    i = issue_at(refused(data), "queues.children[1].name")
    assert i.value == "vision" and "queues.children[0].children[0]" in i.message


def flat(*queues: Any) -> dict[str, Any]:
    return {"queues": list(queues)}


def test_cycle_in_flat_form() -> None:
    err = refused(
        flat({"name": "root"}, {"name": "a", "parent": "b"}, {"name": "b", "parent": "c"}, {"name": "c", "parent": "a"})
    )
    i = issue_at(err, "queues[1].parent")
    assert i.value == "b" and i.message == "cycle in parent links: a -> b -> c -> a"
    assert len(err.issues) == 1  # one cycle, reported once


def test_unknown_parent_in_flat_form() -> None:
    i = issue_at(refused(flat({"name": "root"}, {"name": "a", "parent": "nobody"})), "queues[1].parent")
    assert i.value == "nobody" and i.message == "unknown parent queue"


@pytest.mark.parametrize(
    ("queues", "value"),
    [
        ([{"name": "a", "parent": "b"}, {"name": "b", "parent": "a"}], "b"),
        ([{"name": "a"}, {"name": "b"}], ["a", "b"]),
    ],
)
def test_flat_form_needs_exactly_one_root(queues: list[dict[str, Any]], value: Any) -> None:
    err = refused(flat(*queues))
    assert value in [i.value for i in err.issues]


def test_flat_form_refuses_duplicates_and_children_and_reports_entries_by_index() -> None:
    err = refused(
        flat(
            {"name": "root"},
            {"name": "a", "parent": "root", "children": []},
            {"name": "a", "parent": "root"},
            {"name": "b", "parent": "root", "nominal": {"gpu": -2}},
            7,
        )
    )
    assert issue_at(err, "queues[1].children").value == []
    assert issue_at(err, "queues[2].name").value == "a"
    assert issue_at(err, "queues[3].nominal.gpu").value == -2
    assert issue_at(err, "queues[4]").value == 7


def test_flat_form_semantic_checks_name_the_entry() -> None:
    err = refused(flat({"name": "root", "nominal": {"gpu": 4}}, {"name": "a", "parent": "root", "nominal": {"gpu": 8}}))
    assert issue_at(err, "queues[0].nominal.gpu").value == 4


def test_unknown_resource_name() -> None:
    data = example()
    data["queues"]["children"][0]["nominal"]["tpu"] = 8
    i = issue_at(refused(data), "queues.children[0].nominal.tpu")
    assert (i.value, i.message) == ("tpu", "unknown resource")
    assert i.allowed is not None and "gpu:<flavor>" in i.allowed


def test_negative_quota() -> None:
    data = example()
    data["queues"]["children"][1]["nominal"]["gpu"] = -1
    assert issue_at(refused(data), "queues.children[1].nominal.gpu").value == -1


def test_a_quota_must_be_an_integer() -> None:
    err = refused({"queues": {"name": "r", "borrowing_limit": {"gpu": 1.5, "cpu": True}}})
    assert issue_at(err, "queues.borrowing_limit.gpu").value == 1.5
    assert issue_at(err, "queues.borrowing_limit.cpu").value is True


@pytest.mark.parametrize(
    ("data", "path", "value", "allowed_has"),
    [
        ({"tiers": {3: {"graec": "1m"}}}, "tiers.3.graec", "1m", "grace"),
        ({"bogus": 1}, "bogus", 1, "min_grace"),
        ({"queues": {"name": "r", "wieght": 2}}, "queues.wieght", 2, "weight"),
        ({"thrash": {"max_preemptions": {"every": "1h"}}}, "thrash.max_preemptions.every", "1h", "count"),
    ],
)
def test_unknown_field(data: dict[str, Any], path: str, value: Any, allowed_has: str) -> None:
    i = issue_at(refused(data), path)
    assert (i.value, i.message) == (value, "unknown field")
    assert i.allowed is not None and allowed_has in i.allowed


def test_lending_limit_above_nominal() -> None:
    data = example()
    data["queues"]["children"][1]["lending_limit"] = {"gpu": 40}
    i = issue_at(refused(data), "queues.children[1].lending_limit.gpu")
    assert i.value == 40 and "nominal gpu 32" in i.message


@pytest.mark.parametrize("bad", ["-5s", -1, "5x"])
def test_a_bad_checkpoint_overhead_is_refused_naming_the_field(bad: Any) -> None:
    i = issue_at(refused({"preemption": {"checkpoint_overhead": bad}}), "preemption.checkpoint_overhead")
    assert i.value == bad
    assert parse_policy({"preemption": {"checkpoint_overhead": "0s"}}).preemption.checkpoint_overhead == 0.0
    assert parse_policy({"preemption": {"checkpoint_overhead": "2m"}}).preemption.checkpoint_overhead == 120.0


def test_bad_duration_in_a_file() -> None:
    i = issue_at(refused({"tiers": {3: {"lease": "5x"}}}), "tiers.3.lease")
    assert i.value == "5x" and i.allowed is not None and "1h30m" in i.allowed


def test_a_nested_queue_may_not_name_a_parent() -> None:
    data = example()
    data["queues"]["children"][1]["parent"] = "cluster"
    assert issue_at(refused(data), "queues.children[1].parent").value == "cluster"


@pytest.mark.parametrize(
    ("data", "path", "value"),
    [
        ({"fair_share": {"half_life": "0s"}}, "fair_share.half_life", "0s"),
        ({"fair_share": {"aging": {"max_wait": {"nobody": "1h"}}}}, "fair_share.aging.max_wait.nobody", "nobody"),
        ({"thrash": {"min_efficiency": 1.0}}, "thrash.min_efficiency", 1.0),
        ({"thrash": {"min_efficiency": -0.1}}, "thrash.min_efficiency", -0.1),
        ({"thrash": {"max_preemptions": {"count": 0}}}, "thrash.max_preemptions.count", 0),
        ({"preemption": {"victim_order": "random"}}, "preemption.victim_order", "random"),
        ({"preemption": {"max_attempts_per_pass": -1}}, "preemption.max_attempts_per_pass", -1),
        ({"preemption": {"reclaim": {"fair_share_margin": 0.5}}}, "preemption.reclaim.fair_share_margin", 0.5),
        ({"preemption": {"reclaim": {"fair_share_margin": 1e9}}}, "preemption.reclaim.fair_share_margin", 1e9),
        ({"preemption": {"reclaim": {"fair_share": "sometimes"}}}, "preemption.reclaim.fair_share", "sometimes"),
        ({"scheduling": {"order": "lifo"}}, "scheduling.order", "lifo"),
        ({"scheduling": {"reservations": -1}}, "scheduling.reservations", -1),
        ({"min_grace": "-1m"}, "min_grace", "-1m"),
        ({"tiers": {1: {"scope": "world"}}}, "tiers.1.scope", "world"),
        ({"tiers": {2: {"name": ""}}}, "tiers.2.name", ""),
        ({"queues": {"name": "a b"}}, "queues.name", "a b"),
        ({"queues": {"name": "r", "children": [{"name": "x", "weight": 0}]}}, "queues.children[0].weight", 0),
        ({"queues": {"name": "r", "children": [{"weight": 2}]}}, "queues.children[0].name", None),
    ],
)
def test_other_refusals_name_path_and_value(data: dict[str, Any], path: str, value: Any) -> None:
    i = issue_at(refused(data), path)
    if value is not None:
        assert i.value == value


def test_several_errors_are_reported_together() -> None:
    data = example()
    data["min_grace"] = "150s"  # tiers 3 and 4 fall below
    data["tiers"][5] = {"name": "extra"}  # unknown tier
    data["tiers"][2]["lease"] = "5x"  # bad duration
    data["thrash"]["surprise"] = True  # unknown field
    data["queues"]["children"][0]["nominal"]["tpu"] = 1  # unknown resource
    err = refused(data)
    paths = [i.path for i in err.issues]
    assert set(paths) == {
        "tiers.5",
        "tiers.2.lease",
        "tiers.3.grace",
        "tiers.4.grace",
        "thrash.surprise",
        "queues.children[0].nominal.tpu",
    }
    assert str(err).splitlines() == [str(i) for i in err.issues]
    assert "tiers.3.grace: grace 120s is below min_grace 150s (got '120s')" in str(err)


def test_problems_across_the_queue_tree_are_all_collected() -> None:
    err = refused(
        {
            "queues": {
                "name": "root",
                "nominal": {"gpu": 10},
                "children": [
                    {"name": "a", "nominal": {"gpu": 8}},
                    {"name": "b", "nominal": {"gpu": 4}, "lending_limit": {"gpu": 5}},
                    {"name": "a"},
                ],
            }
        }
    )
    assert [i.path for i in err.issues] == [
        "queues.nominal.gpu",
        "queues.children[1].lending_limit.gpu",
        "queues.children[2].name",
    ]


# ------------------------------------------------------------------------ flat and nested forms


def test_flat_and_nested_forms_give_equal_trees() -> None:
    data = example()
    data["queues"] = [
        {"name": "cluster"},
        {"name": "research", "parent": "cluster", "weight": 2, "nominal": {"gpu": 64}, "borrowing_limit": {"gpu": 64}},
        {"name": "vision", "parent": "research", "nominal": {"gpu": 32}},
        {"name": "platform", "parent": "cluster", "weight": 1, "nominal": {"gpu": 32}, "lending_limit": {"gpu": 16}},
        {"name": "language", "parent": "research", "nominal": {"gpu": 32}},
    ]
    from_flat = parse_policy(data)
    assert from_flat == parse_policy(EXAMPLE)
    assert from_flat.queues.parent is None
    assert from_flat.queue_names() == ["cluster", "research", "vision", "language", "platform"]


def test_queues_can_be_built_in_python() -> None:
    tree = QueueSpec(name="root", children=(QueueSpec(name="a", nominal={"gpu": 2}),))
    assert tree.nominal == {"gpu": 2}
    assert Policy(queues=tree).path_to("a") == ("root", "a")


# ------------------------------------------------------------------------ files and YAML text


def test_yaml_syntax_error_is_one_issue_with_the_line() -> None:
    err = refused("tiers:\n  1: {name: x\n  2: y\n")
    assert len(err.issues) == 1
    assert err.issues[0].path == "<file>" and "line 3" in err.issues[0].message


def test_duplicate_yaml_keys_are_refused() -> None:
    err = refused("min_grace: 2m\nmax_lease: 8h\nmin_grace: 5m\n")
    assert err.issues[0].path == "<file>"
    assert "duplicate key 'min_grace'" in err.issues[0].message
    assert "line 3" in err.issues[0].message


@pytest.mark.parametrize("text", ["- a\n- b\n", "just text\n", "42\n"])
def test_a_policy_must_be_a_mapping(text: str) -> None:
    assert refused(text).issues[0].path == "<file>"


def test_load_policy_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(PolicyError) as info:
        load_policy(missing)
    assert str(missing) in str(info.value) and info.value.source == str(missing)


def test_load_policy_of_a_directory(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path)


def test_load_policy_reports_the_file_as_source(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("tiers: {9: {}}\n")
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert info.value.source == str(path) and info.value.issues[0].path == "tiers.9"


# -------------------------------------------------------------------------------- JSON schema


def test_json_schema_validates_the_file_format() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = policy_json_schema()
    assert isinstance(schema, dict) and schema["type"] == "object"
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)

    as_json = json.loads(json.dumps(example()))  # a JSON file keys tiers by "1".."4"
    assert not list(validator.iter_errors(as_json))
    assert not list(validator.iter_errors({"tiers": {"3": {"lease": "30m"}}}))
    assert not list(validator.iter_errors({"preemption": {"checkpoint_overhead": "45s"}}))
    described = schema["$defs"]["PreemptionSpec"]["properties"]["checkpoint_overhead"]
    assert "checkpoint save is assumed to take" in described["description"]
    assert not list(validator.iter_errors({"queues": [{"name": "r"}, {"name": "a", "parent": "r"}]}))
    assert not list(validator.iter_errors(json.loads(json.dumps(parse_policy(EXAMPLE).to_dict()))))
    bad: dict[str, Any]
    for bad in (
        {"tiers": {"5": {}}},
        {"min_grace": "5x"},
        {"preemption": {"checkpoint_overhead": "-30s"}},
        {"preemption": {"checkpoint_overhead": -30}},
        {"bogus": 1},
        {"queues": {"name": "r", "nominal": {"tpu": 1}}},
        {"queues": {"name": "r", "nominal": {"gpu": -1}}},
    ):
        assert list(validator.iter_errors(bad)), bad


def test_every_duplicate_key_is_refused_with_the_files_other_problems() -> None:
    """A file's problems come at once: each duplicate key, and what validation finds beside."""
    err = refused("min_grace: 2m\nbogus: 1\nmin_grace: 5m\ntiers:\n  3: {lease: 1h, lease: 2h, grace: soon}\n")
    messages = [str(i) for i in err.issues]
    assert sum("duplicate key" in m for m in messages) == 2, messages
    assert any("duplicate key 'lease' at line 5" in m for m in messages), messages
    assert any(m.startswith("bogus: unknown field") for m in messages), messages
    assert any(m.startswith("tiers.3.grace: not a duration") for m in messages), messages


@pytest.mark.parametrize("text", ["", "  \n", "# nothing here\n", "---\n# only a comment\n"])
def test_a_policy_file_without_settings_is_refused(tmp_path: Path, text: str) -> None:
    """In force, a file without settings would reset every setting: `load_policy` (what `policy
    check` and a server's --policy read) refuses it, as `PUT /v1/policy` does."""
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert [i.path for i in info.value.issues] == [""] and str(info.value).startswith("holds no settings")
    assert parse_policy(text) == default_policy()  # parsed as data, nothing set is the defaults


def test_a_character_yaml_does_not_allow_is_one_issue() -> None:
    err = refused("\x9d")
    assert len(err.issues) == 1 and err.issues[0].path == "<file>" and "YAML syntax error" in str(err)
