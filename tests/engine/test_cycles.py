"""Preemption cycles (`warden.engine.cycles`): over the thrash budget in some window, counted as
the guard counts, and alternating with one other job, whatever third parties do in between."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from support import policy, running

from warden.engine.cycles import (
    Alternating,
    OverBudget,
    Preempted,
    alternating,
    over_budget,
    preemption_cycle,
    preemption_cycles,
)
from warden.engine.policy import MaxPreemptions
from warden.engine.quota import QuotaTree
from warden.engine.rules import RuleContext, thrash_budget

DAY = 86400.0
BUDGET = MaxPreemptions(per=DAY, count=3)


def of(job: str, *times: float, by: str | None = "p") -> list[Preempted]:
    return [Preempted(t, job, by) for t in times]


def test_the_budget_allows_count_preemptions_in_a_window_and_flags_one_more() -> None:
    assert over_budget("a", of("a", 0, 10, 20), BUDGET) is None
    found = over_budget("a", of("a", 0, 10, 20, 30), BUDGET)
    assert found == OverBudget(count=4, limit=3, per_s=DAY, window_start=0, window_end=30)
    assert found.to_dict() == {
        "kind": "over_budget",
        "message": "Preempted 4 times within 30s, more than the thrash budget of 3 per 1d.",
        "details": {"count": 4, "limit": 3, "per_s": DAY, "window_start": 0, "window_end": 30},
    }


def test_preemptions_exactly_a_window_apart_are_not_in_one_window() -> None:
    assert over_budget("a", of("a", 0, 1, 2, DAY), BUDGET) is None
    assert over_budget("a", of("a", 0, 1, 2, DAY - 0.001), BUDGET) is not None


def test_the_busiest_window_is_reported_and_every_kind_counts() -> None:
    history = [
        *of("a", 0, 1),
        *(Preempted(t, "a", None, "eviction") for t in (5 * DAY, 5 * DAY + 1, 5 * DAY + 2)),
        Preempted(5 * DAY + 3, "a", "q", "reclaim"),
        Preempted(5 * DAY + 4, "a", "q", "preemption"),
        *of("b", 5 * DAY + 5, 5 * DAY + 6),  # another job's
    ]
    found = over_budget("a", history, BUDGET)
    assert found is not None and (found.count, found.window_start, found.window_end) == (5, 5 * DAY, 5 * DAY + 4)


def test_a_round_trip_and_back_alternates_and_flags_both_jobs() -> None:
    history = [Preempted(1, "a", "b"), Preempted(2, "b", "a")]
    assert alternating("a", history) is None and alternating("b", history) is None  # one round trip only
    history.append(Preempted(3, "a", "b"))
    assert alternating("a", history) == Alternating("b", 3, 2, 1, 1, 3)
    assert alternating("b", history) == Alternating("a", 3, 1, 2, 1, 3)
    assert preemption_cycle("a", history, BUDGET) == alternating("a", history)


def test_repeats_in_one_direction_are_one_turn_and_third_parties_do_not_break_a_run() -> None:
    history = [
        Preempted(1, "a", "b"),
        Preempted(2, "a", "b"),  # same direction: still the first turn
        Preempted(3, "a", "c"),  # a third party in between is ignored
        Preempted(4, "b", "a"),
        Preempted(5, "c", "a"),
        Preempted(6, "a", None, "eviction"),  # names no job
    ]
    assert alternating("a", history) is None
    history.append(Preempted(7, "a", "b"))
    found = alternating("a", history)
    assert found is not None and (found.partner, found.turns, found.preempted_by_partner) == ("b", 3, 3)
    assert alternating("c", history) is None  # a by c, then c by a: two turns


def test_the_partner_with_most_turns_is_named_and_a_job_can_be_in_both_kinds() -> None:
    history = [Preempted(float(t), "a" if t % 2 else "b", "b" if t % 2 else "a") for t in range(1, 6)]
    history += [Preempted(10.0 + t, "a" if t % 2 else "c", "c" if t % 2 else "a") for t in range(1, 4)]
    cycles = preemption_cycles("a", history, BUDGET)
    assert [c.kind for c in cycles] == ["alternating", "over_budget"]
    assert isinstance(cycles[0], Alternating) and (cycles[0].partner, cycles[0].turns) == ("b", 5)
    assert "back and forth in 5 turns" in cycles[0].message


def test_no_history_no_cycle() -> None:
    assert preemption_cycles("a", [], BUDGET) == ()
    assert preemption_cycle("a", of("b", 0, 1, 2, 3, 4), BUDGET) is None


@settings(max_examples=200, deadline=None)
@given(
    times=st.lists(st.integers(0, 10 * 3600), max_size=12),
    count=st.integers(1, 5),
    per=st.sampled_from([600.0, 3600.0, 7200.0]),
)
def test_over_budget_agrees_with_the_guard_asked_at_each_preemption(times: list[int], count: int, per: float) -> None:
    """The guard, asked just before each preemption with the earlier ones as `preempted_at`,
    would have blocked one of them exactly when the history is over budget."""
    budget = MaxPreemptions(per=per, count=count)
    ordered = sorted(float(t) for t in times)
    blocked = any(_guard_blocks(ordered[:i], t, budget) for i, t in enumerate(ordered))
    assert (over_budget("a", of("a", *ordered), budget) is not None) == blocked
    found = over_budget("a", of("a", *ordered), budget)
    if found is not None:
        assert found.window_end - found.window_start < per
        assert found.count == sum(1 for t in ordered if found.window_end - per < t <= found.window_end)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from("abc")), max_size=12))
def test_alternation_is_a_property_of_the_pair(pairs: list[tuple[str, str]]) -> None:
    history = [Preempted(float(i), v, b) for i, (v, b) in enumerate(pairs) if v != b]
    for job in "abc":
        found = alternating(job, history)
        if found is not None:
            back = alternating(found.partner, history)
            assert back is not None and back.turns >= 3
            mutual = [p for p in history if {p.victim, p.by} == {job, found.partner}]
            assert found.preempted_by_partner + found.preempted_partner == len(mutual)


def _guard_blocks(earlier: list[float], now: float, budget: MaxPreemptions) -> bool:
    pol = policy(thrash={"max_preemptions": {"per": budget.per, "count": budget.count}})
    v = running("v", "a", 3, ("n0", 8), started=0.0, preempted_at=tuple(earlier))
    return thrash_budget(RuleContext(pol, QuotaTree(pol), now), v) is not None
