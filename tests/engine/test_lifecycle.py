"""The job lifecycle (`warden.engine.lifecycle`): the table is DESIGN §5, every edge is walked by
the function of its event, every pair the table lacks is refused, and the functions change
exactly the fields they say."""

from __future__ import annotations

import itertools
from dataclasses import fields, replace

import pytest

from warden.engine import lifecycle as lc
from warden.engine.lifecycle import EDGES, Event, IllegalTransition
from warden.engine.model import Attempt, Job, JobState, ReplicaPlacement

S = JobState
PLACED = (ReplicaPlacement("n0", (0, 1)),)


def job_in(state: JobState, *, signalled: bool = False) -> Job:
    attempt = None
    if state.holds_resources:
        attempt = Attempt(3, 100.0, PLACED, True, 30.0, 4.0, 150.0, 6.0)
        if signalled or state is S.PREEMPTING:
            attempt = replace(attempt, sigterm_at=200.0, kill_at=320.0)
    return Job(
        "7", "q", 3, 1.0, state, 2, 2, 500, 1024, "a100", "pack", "ana",
        600.0, 90.0, 3600.0, 12.0, 50.0 if state.waiting else None, 70.0 if state.waiting else None,
        (3.0,), state.waiting, attempt,
    )  # fmt: skip


STATE_ONLY = {Event.APPROVED, Event.LAUNCHED, Event.STARTED, Event.CANCELLED}
"""Events that change a job's state alone: no function of their own."""


def walk(event: Event, job: Job, target: JobState) -> Job:
    """The lifecycle's function for `event`, asked to reach `target` (where it may choose)."""
    now = 500.0
    if event is Event.ADMITTED:
        return lc.admitted(job, now, Attempt(4, now, PLACED), starts=target is S.RUNNING)
    if event is Event.EXITED:
        return lc.exited(job, target, preempted_at=None)
    if event in STATE_ONLY:  # the edge is the whole rule: the store checks it and moves the state
        lc.check(event, job.state, target)
        return replace(job, state=target)
    calls = {
        Event.SIGNALLED: lambda: lc.signalled(job, now, now + 120.0),
        Event.REQUEUED: lambda: lc.requeued(job, now, backoff=30.0),
        Event.UNSTARTED: lambda: lc.unstarted(job, now),
    }
    return calls[event]()


def test_the_table_holds_design_section_5() -> None:
    """`(AWAITING_APPROVAL →) PENDING → ADMITTED → STARTING → RUNNING → {SUCCEEDED | FAILED |
    CANCELLED | TIMEOUT}`, with `RUNNING → PREEMPTING → REQUEUED → PENDING` on preemption."""
    path = [
        (S.AWAITING_APPROVAL, S.PENDING), (S.PENDING, S.ADMITTED), (S.ADMITTED, S.STARTING),
        (S.STARTING, S.RUNNING), (S.RUNNING, S.SUCCEEDED), (S.RUNNING, S.FAILED), (S.RUNNING, S.CANCELLED),
        (S.RUNNING, S.TIMEOUT), (S.RUNNING, S.PREEMPTING), (S.PREEMPTING, S.REQUEUED), (S.REQUEUED, S.PENDING),
    ]  # fmt: skip
    for source, target in path:
        assert any(lc.allows(e.event, source, target) for e in EDGES), (source, target)
    for state in lc.TERMINAL:  # nothing leaves a terminal state
        assert all(not lc.allows(e.event, state, t) for e in EDGES for t in JobState)


@pytest.mark.parametrize(
    ("event", "source", "target"),
    [
        (e.event, s, t)
        for e in EDGES
        if e.event is not Event.SUBMITTED
        for s in sorted(e.source)
        for t in sorted(e.target)
    ],
    ids=lambda v: v.value if hasattr(v, "value") else str(v),
)
def test_every_edge_is_walked_by_its_events_function(event: Event, source: JobState, target: JobState) -> None:
    job = job_in(source)
    moved = walk(event, job, target)
    assert moved.state is target
    assert (moved.id, moved.queue, moved.tier, moved.submit, moved.replicas, moved.gpus) == (
        job.id, job.queue, job.tier, job.submit, job.replicas, job.gpus,
    )  # fmt: skip


def test_every_pair_the_table_lacks_is_refused() -> None:
    allowed = {(e.event, s, t) for e in EDGES for s in e.source for t in e.target}
    allowed |= {(f.event, s, s) for f in lc.FLAGS for s in f.states}
    for event, source, target in itertools.product(Event, JobState, JobState):
        if event is Event.NOTED:
            assert lc.allows(event, source, target) is (source is target)
            continue
        expected = (event, source, target) in allowed
        assert lc.allows(event, source, target) is expected, (event, source, target)
        if not expected:
            with pytest.raises(IllegalTransition, match=f"no {event.value} edge from {source.value}"):
                lc.check(event, source, target)
    assert lc.allows(Event.SUBMITTED, None, S.PENDING) and not lc.allows(Event.SUBMITTED, None, S.RUNNING)
    assert not lc.allows(Event.APPROVED, None, S.PENDING)


def test_a_function_called_from_the_wrong_state_refuses() -> None:
    with pytest.raises(IllegalTransition):
        lc.admitted(job_in(S.RUNNING), 1.0, Attempt(4, 1.0, PLACED), starts=True)
    with pytest.raises(IllegalTransition):
        lc.signalled(job_in(S.PREEMPTING), 1.0, 2.0)
    with pytest.raises(IllegalTransition):
        lc.requeued(job_in(S.PREEMPTING), 1.0, backoff=0.0)  # it passes through REQUEUED first
    with pytest.raises(IllegalTransition):  # a job that holds resources ends CANCELLED by its exit
        lc.check(Event.CANCELLED, S.RUNNING, S.CANCELLED)


def test_each_function_changes_what_it_says_and_nothing_else() -> None:
    now = 500.0
    pending = job_in(S.PENDING)
    attempt = Attempt(4, now, PLACED, True)
    # admitted: its wait so far kept, back-off and claim over, nothing else changed
    assert lc.admitted(pending, now, attempt, starts=False) == replace(
        pending, state=S.ADMITTED, attempt=attempt, waited=12.0 + (now - 50.0),
        pending_since=None, not_before=None, claim=False,
    )  # fmt: skip
    assert lc.admitted(pending, now, attempt, starts=True, time_limit=99.0) == replace(
        pending, state=S.RUNNING, attempt=attempt, waited=12.0 + (now - 50.0),
        pending_since=None, not_before=None, claim=False, time_limit=99.0,
    )  # fmt: skip
    running = job_in(S.RUNNING)
    assert running.attempt is not None
    assert lc.signalled(running, now, now + 120.0) == replace(
        running, state=S.PREEMPTING, attempt=replace(running.attempt, sigterm_at=now, kill_at=now + 120.0)
    )
    signalled = lc.signalled(running, now, now + 120.0)
    # a preemption's exit: the attempt left behind, the SIGTERM in the thrash guard's record
    gone = lc.exited(signalled, S.REQUEUED, preempted_at=now)
    assert gone == replace(signalled, state=S.REQUEUED, attempt=None, preempted_at=(3.0, now), claim=False)
    # an eviction (its node went down) is no preemption: the record is unchanged
    assert lc.exited(running, S.REQUEUED, preempted_at=None).preempted_at == (3.0,)
    back = lc.requeued(gone, now + 5.0, backoff=30.0)
    assert back == replace(gone, state=S.PENDING, pending_since=now + 5.0, not_before=now + 35.0)
    assert lc.requeued(gone, now + 5.0, backoff=0.0).not_before is None
    assert lc.requeued(gone, now + 5.0, backoff=0.0, restart_age=True).waited == 0.0
    assert lc.finished(running) == replace(running, state=S.SUCCEEDED)
    assert lc.unstarted(job_in(S.ADMITTED), now) == replace(
        job_in(S.ADMITTED), state=S.PENDING, attempt=None, pending_since=now, not_before=None, claim=False
    )
    # the engine's last view of a job that left its snapshot: terminal, so a warm engine drops it
    assert lc.left(running) == replace(running, state=S.CANCELLED, claim=False)
    reported = replace(running.attempt, checkpoint_s=9.0)
    assert lc.reported(running, reported) == replace(running, attempt=reported)


def test_the_written_out_constructor_names_every_field() -> None:
    """The functions build a job field by field (cheaper than `replace`): a field added to `Job`
    must be added there too, or this fails."""
    assert [f.name for f in fields(Job)] == [
        "id", "queue", "tier", "submit", "state", "replicas", "gpus", "cpu", "memory", "flavor",
        "placement", "user", "lease", "grace", "time_limit", "waited", "pending_since",
        "not_before", "preempted_at", "claim", "attempt",
    ]  # fmt: skip
    assert [f.name for f in fields(Attempt)] == [
        "number", "started_at", "assignment", "borrowing", "startup_s", "checkpoint_s",
        "last_checkpoint_at", "sigterm_save_s", "sigterm_at", "kill_at", "lent",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("cancel", "timed_out", "signalled", "killed", "evicted", "codes", "state", "reason"),
    [
        (True, False, True, False, False, [0], S.CANCELLED, "cancelled"),
        (True, True, True, False, False, [0], S.CANCELLED, "cancelled"),  # an accepted cancel always ends so
        (False, True, True, False, False, [-15], S.TIMEOUT, "timeout"),
        (False, True, True, True, False, [-9], S.TIMEOUT, "timeout"),  # SIGKILL at the deadline
        (False, True, True, False, False, [0], S.TIMEOUT, "timeout"),  # left by itself in its grace
        (False, False, True, False, False, [0, 0], S.REQUEUED, "preempted"),
        (False, False, True, True, False, [-9], S.REQUEUED, "killed"),
        (False, False, False, False, True, [-9], S.REQUEUED, "evicted"),
        (False, False, False, False, False, [0, 0], S.SUCCEEDED, "completed"),
        (False, False, False, False, False, [0, 3], S.FAILED, "failed"),
        (False, False, False, False, False, [None], S.FAILED, "failed"),
    ],
)
def test_an_exit_means_what_its_circumstances_say(
    cancel: bool,
    timed_out: bool,
    signalled: bool,
    killed: bool,
    evicted: bool,
    codes: list[int | None],
    state: JobState,
    reason: str,
) -> None:
    got = lc.outcome(
        cancel_requested=cancel,
        timed_out=timed_out,
        signalled=signalled,
        killed=killed,
        evicted=evicted,
        exit_codes=codes,
    )
    assert (got.state, got.reason) == (state, reason)


def test_timeout_ends_a_job_from_every_state_that_holds_resources_and_nothing_leaves_it() -> None:
    for source in lc.HOLDING:
        assert lc.allows(Event.EXITED, source, S.TIMEOUT)
        gone = lc.exited(job_in(source), S.TIMEOUT, preempted_at=None)
        # terminal: the attempt kept for the record, no preemption counted, never requeued
        assert gone == replace(job_in(source), state=S.TIMEOUT)
    for state in JobState:
        assert not lc.allows(Event.EXITED, state, S.TIMEOUT) or state in lc.HOLDING
        assert not any(lc.allows(e.event, S.TIMEOUT, state) for e in EDGES)
    assert S.TIMEOUT.terminal and not S.TIMEOUT.holds_resources and not S.TIMEOUT.waiting


FLAG_CHANGES = {
    Event.HELD: ({"held_reason": "it broke the pass"}, lc.WAITING, "it broke the pass"),
    Event.RELEASED: ({"held_reason": None}, lc.WAITING, None),
    Event.CANCEL_MARKED: ({"cancel_requested": True}, lc.HOLDING, None),
    Event.CLAIMED: ({"claim": True}, lc.WAITING, None),
    Event.CLAIM_ENDED: ({"claim": False}, lc.WAITING, None),
    Event.TIMED_OUT: ({"timed_out": True}, lc.HOLDING, None),
}


@pytest.mark.parametrize("event", [f.event for f in lc.FLAGS])
def test_every_flag_event_gives_its_flags_in_its_states_and_is_refused_elsewhere(event: Event) -> None:
    changes, states, given = FLAG_CHANGES[event]
    assert lc.flag(event).states == states
    assert lc.flag(event).attempt is (event is Event.TIMED_OUT)
    for state in JobState:
        if state in states:
            assert lc.flagged(event, state, given) == changes
            assert lc.allows(event, state, state)
        else:
            with pytest.raises(IllegalTransition, match=f"no {event.value} edge from {state.value}"):
                lc.flagged(event, state, given)
    with pytest.raises(ValueError, match="carries"):  # a value where none is carried, or none where one is
        lc.flagged(event, next(iter(states)), None if given is not None else "a reason")


def test_only_flag_events_are_flagged_and_every_flag_column_is_the_tables() -> None:
    assert set(FLAG_CHANGES) == {f.event for f in lc.FLAGS}
    for event in (Event.NOTED, Event.CANCELLED, Event.ADMITTED):
        with pytest.raises(ValueError, match="no flag event"):
            lc.flagged(event, S.PENDING)
    assert {"held_reason", "cancel_requested", "claim", "timed_out"} == lc.FLAG_COLUMNS
    assert lc.sets(Event.CANCELLED) == {"cancel_requested": True, "held_reason": None}
    assert lc.sets(Event.ADMITTED) == {} and lc.sets(Event.HELD) == {}


def test_a_claim_is_set_on_a_waiting_job_alone_and_nothing_else_changes() -> None:
    for state in JobState:
        job = replace(job_in(state), claim=not state.waiting)
        if state.waiting:
            assert lc.claimed(job, True) == replace(job, claim=True)
            assert lc.claimed(job, False) == replace(job, claim=False)
        else:
            for on in (True, False):
                with pytest.raises(IllegalTransition):
                    lc.claimed(job, on)


def test_docs_show_the_table_the_engine_holds() -> None:
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "engine.md").read_text()
    assert lc.table() in docs, "docs/engine.md: paste `warden.engine.lifecycle.table()` under 'The job lifecycle'"


@pytest.mark.parametrize("state", list(JobState))
@pytest.mark.parametrize("cancel_requested", [False, True])
@pytest.mark.parametrize("stopping", [False, True])
def test_a_job_being_stopped_shows_cancelling_or_stopping(
    state: JobState, cancel_requested: bool, stopping: bool
) -> None:
    """Slurm's CG, in two words: a job that holds resources shows CANCELLING once a cancel
    marked it (signalled yet or not), STOPPING once SIGTERM came for another cause; a PREEMPTING
    job says so itself, and every other job shows its state."""
    shown = lc.shown(state, cancel_requested=cancel_requested, stopping=stopping)
    if state in (S.ADMITTED, S.STARTING, S.RUNNING) and cancel_requested:
        assert shown == "CANCELLING"
    elif state in (S.ADMITTED, S.STARTING, S.RUNNING) and stopping:
        assert shown == "STOPPING"
    else:
        assert shown == state.value
    assert shown in {s.value for s in JobState} | set(lc.SHOWN_ONLY)


def test_the_shown_only_states_are_no_states_of_the_table() -> None:
    assert not set(lc.SHOWN_ONLY) & {s.value for s in JobState}
    assert lc.SHOWN_ONLY == ("CANCELLING", "STOPPING")
