"""What `describe` shows beyond the database rows: the save-does-not-fit-the-grace warning, the
effective grace and lease, a held job's reason. Built on records a real store returns."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from support import move

from warden.engine.lifecycle import Event
from warden.engine.model import JobState, ReplicaPlacement
from warden.engine.policy import parse_policy
from warden.engine.reasons import AwaitingApproval, WaitingForLease
from warden.server.views import action_view, holder, job_detail, job_summary, warnings
from warden.store.jobs import StoredAttempt, StoredJob
from warden.store.repo import Store

POLICY = parse_policy(
    {
        "min_grace": "120s",
        "preemption": {"restart_overhead": "30s"},
        "queues": {"name": "cluster", "children": [{"name": "team"}]},
    }
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(f"sqlite:///{tmp_path / 'warden.db'}")
    yield s
    s.close()


def running_job(store: Store, *, grace_s: float | None = None, **facts: object) -> tuple[StoredJob, StoredAttempt]:
    """A 2 × 4-GPU job whose first attempt started at t=1000 and reported `facts`."""
    job_id = store.submit(
        name="train",
        user="u",
        queue="team",
        tier=3,
        command=["true"],
        actor="u",
        now=900.0,
        replicas=2,
        gpus=4,
        grace_s=grace_s,
    )
    move(store, job_id, JobState.RUNNING, reason="running", actor="warden", now=1000.0, attempt=1)
    store.start_attempt(
        job_id,
        1,
        started_at=1000.0,
        assignment=[ReplicaPlacement("n0", (0, 1, 2, 3)), ReplicaPlacement("n1", (0, 1, 2, 3))],
    )
    if facts:
        store.update_attempt(job_id, 1, **facts)
    job, attempt = store.get(job_id), store.attempt(job_id, 1)
    assert job is not None and attempt is not None
    return job, attempt


def test_a_save_longer_than_the_grace_warns_with_the_work_a_preemption_would_lose(store: Store) -> None:
    job, attempt = running_job(store, startup_s=20.0, last_checkpoint_at=1400.0, sigterm_save_s=300.0)
    [text] = warnings(job, [attempt], now=1700.0, policy=POLICY)
    # 8 GPUs × 300 s since the last checkpoint = 40 GPU-minutes.
    assert "save takes 5m, longer than its grace of 2m" in text and "40.0 GPU-minutes" in text


def test_without_a_reported_startup_the_warning_assumes_the_policys_restart_overhead(store: Store) -> None:
    job, attempt = running_job(store, sigterm_save_s=300.0)
    [text] = warnings(job, [attempt], now=1330.0, policy=POLICY)
    # Progress began at 1000 + 30 s of assumed startup: 8 GPUs × 300 s = 40 GPU-minutes, as the engine prices it.
    assert "40.0 GPU-minutes" in text


def test_no_warning_when_the_save_fits_or_is_unknown_or_the_attempt_ended(store: Store) -> None:
    job, fits = running_job(store, last_checkpoint_at=1400.0, sigterm_save_s=60.0)
    assert warnings(job, [fits], now=1700.0, policy=POLICY) == []
    job, unknown = running_job(store, last_checkpoint_at=1400.0)
    assert warnings(job, [unknown], now=1700.0, policy=POLICY) == []
    job, _ = running_job(store, last_checkpoint_at=1400.0, sigterm_save_s=300.0)
    store.end_attempt(job.id, 1, ended_at=1600.0, exit_codes=[0, 0], reason="completed")
    ended = store.attempt(job.id, 1)
    assert ended is not None
    assert warnings(job, [ended], now=1700.0, policy=POLICY) == []


def test_the_grace_shown_is_the_one_the_job_gets_never_below_min_grace(store: Store) -> None:
    job, attempt = running_job(store, grace_s=60.0)  # submitted before min_grace was raised to 120 s
    detail = job_detail(job, store.events(job.id), [attempt], now=1100.0, policy=POLICY)
    assert detail["grace_s"] == 120.0
    store.update(job.id, lease_s=7200.0)  # fixed at submission, before max_lease was lowered to 1 h
    longer = store.get(job.id)
    assert longer is not None
    stricter = parse_policy(
        {
            "max_lease": "1h",
            "tiers": {2: {"lease": "1h"}},
            "queues": {"name": "cluster", "children": [{"name": "team"}]},
        }
    )
    assert job_detail(longer, (), [attempt], now=1100.0, policy=stricter)["lease_s"] == 3600.0


def test_a_held_job_shows_its_hold_as_the_reason_it_waits(store: Store) -> None:
    job_id = store.submit(name="", user="u", queue="team", tier=3, command=["true"], actor="u", now=10.0)
    reason = "quarantined: scheduling passes failed with ValueError: boom while this job waited"
    store.flag(
        job_id,
        JobState.PENDING,
        Event.HELD,
        reason=reason,
        now=20.0,
        given=reason,
        explanation={
            "reason": {"code": "Held", "message": f"Held: {reason}.", "details": {}},
            "sort_key": None,
            "position": None,
        },
    )
    job = store.get(job_id)
    assert job is not None
    summary = job_summary(job, now=30.0)
    assert summary["state"] == "PENDING" and summary["held_reason"] == reason
    assert summary["reason"]["code"] == "Held" and summary["wait_s"] == 20.0
    assert job_detail(job, store.events(job_id), (), now=30.0, policy=POLICY)["events"][-1]["reason"] == reason


def test_a_job_being_stopped_shows_cancelling_or_stopping_in_every_view(store: Store) -> None:
    """`shown_state`: RUNNING while it runs; STOPPING once its time limit's SIGTERM came;
    CANCELLING once a cancel marked it, in its grace or before; PREEMPTING after a preemption's
    SIGTERM; `state` stays the stored one throughout."""

    def shown(job_id: int) -> set[str]:
        job, attempt = store.get(job_id), store.attempt(job_id, 1)
        assert job is not None and attempt is not None
        views = (
            job_summary(job, 1100.0, attempt, POLICY),
            job_detail(job, (), [attempt], now=1100.0, policy=POLICY),
            holder(0, attempt, job),
            action_view(job, attempt),
        )
        assert {v["state"] for v in views} == {job.state.value}
        return {v["shown_state"] for v in views}

    timed, _ = running_job(store)
    assert shown(timed.id) == {"RUNNING"}
    store.update_attempt(timed.id, 1, timed_out=True, sigterm_at=1050.0, kill_at=1170.0)
    assert shown(timed.id) == {"STOPPING"}

    cancelled, _ = running_job(store)
    store.flag(cancelled.id, JobState.RUNNING, Event.CANCEL_MARKED, reason="cancel requested by u", now=1040.0)
    assert shown(cancelled.id) == {"CANCELLING"}  # marked, its SIGTERM not sent yet
    store.update_attempt(cancelled.id, 1, state="terminating", sigterm_at=1050.0, kill_at=1170.0)
    assert shown(cancelled.id) == {"CANCELLING"}

    preempted, _ = running_job(store)
    store.update_attempt(preempted.id, 1, state="terminating", sigterm_at=1050.0, kill_at=1170.0)
    move(store, preempted.id, JobState.PREEMPTING, reason="preempted", actor="warden", now=1050.0)
    assert shown(preempted.id) == {"PREEMPTING"}


def test_a_waiting_jobs_fair_share_is_shown_as_it_is_now(store: Store) -> None:
    """The stored explanation keeps the ratios of its last change; the view reads the ledger."""
    from warden.engine.fairshare import fair_order
    from warden.engine.model import UsageLedger

    job_id = store.submit(name="", user="u", queue="team", tier=3, command=["true"], actor="u", now=10.0)
    stale = {"tier": 3, "starvation_breach": False, "fair_rank": 0, "fair_share": [9.0], "waited_s": 0.0}
    store.set_explanations({job_id: {"reason": None, "sort_key": {**stale, "submit": 10.0, "id": str(job_id)}}})
    job = store.get(job_id)
    assert job is not None
    ledger = UsageLedger(20.0, {"team": 5.0})
    shown = job_detail(job, (), (), now=30.0, policy=POLICY, ledger=ledger)["sort_key"]
    assert shown["fair_share"] == list(fair_order(POLICY, ledger.usage)["team"][1]) != [9.0]
    assert shown["waited_s"] == 20.0
    assert job_detail(job, (), (), now=30.0, policy=POLICY)["sort_key"]["fair_share"] == [9.0]


def test_queue_views_owe_a_tier_4_job_nothing_and_count_none_of_its_gpus_delivered(store: Store) -> None:
    """The server's owed and delivered GPU-hours follow the simulator's definition: only jobs
    of a charged tier are owed a share, and only their attempts are delivered."""
    from warden.engine.model import Node, UsageLedger
    from warden.server.views import queue_views

    policy = parse_policy({"queues": {"name": "cluster", "children": [{"name": "team"}, {"name": "spare"}]}})
    nodes = (Node("n0", 8), Node("n1", 8))
    running_job(store)  # team: 2 × 4 GPUs from t=1000, submitted at 900
    opportunistic = store.submit(
        name="scavenge", user="u", queue="spare", tier=4, command=["true"], actor="u", now=900.0, gpus=8
    )
    move(store, opportunistic, JobState.RUNNING, reason="running", actor="warden", now=1000.0, attempt=1)
    store.start_attempt(opportunistic, 1, started_at=1000.0, assignment=[ReplicaPlacement("n1", tuple(range(8)))])
    rows = {r["name"]: r for r in queue_views(policy, store, UsageLedger(), nodes, 4600.0)}
    H = 3600.0
    assert rows["team"]["owed_gpu_hours"] == pytest.approx(8 * (4600 - 900) / H)  # its demand: all it wants
    assert rows["team"]["delivered_gpu_hours"] == pytest.approx(8 * (4600 - 1000) / H)
    assert (rows["spare"]["owed_gpu_hours"], rows["spare"]["delivered_gpu_hours"]) == (0, 0)
    assert rows["spare"]["gpus_in_use"] == 8  # it does hold them
    # Owed now: team asks for its 8 GPUs and is owed them; spare's tier-4 job is owed nothing,
    # and the root is owed what its leaves are.
    assert (rows["team"]["owed_gpus"], rows["spare"]["owed_gpus"], rows["cluster"]["owed_gpus"]) == (8, 0, 8)


def test_queue_views_say_what_each_queue_borrows_beyond_its_nominal(store: Store) -> None:
    """Borrowed GPUs are what a queue's charged jobs hold beyond its nominal (a tier-4 job
    borrows nothing: quota does not count it); the root is the cluster and borrows from nobody.
    The borrowing and lending limits are the policy's (null: none)."""
    from warden.engine.model import Node, UsageLedger
    from warden.server.views import queue_views

    policy = parse_policy(
        {
            "queues": {
                "name": "cluster",
                "children": [
                    {"name": "team", "nominal": {"gpu": 2}, "borrowing_limit": {"gpu": 6}},
                    {"name": "spare", "nominal": {"gpu": 6}, "lending_limit": {"gpu": 4}},
                ],
            }
        }
    )
    running_job(store)  # team: 2 × 4 GPUs
    opportunistic = store.submit(
        name="scavenge", user="u", queue="spare", tier=4, command=["true"], actor="u", now=900.0, gpus=8
    )
    move(store, opportunistic, JobState.RUNNING, reason="running", actor="warden", now=1000.0, attempt=1)
    rows = {r["name"]: r for r in queue_views(policy, store, UsageLedger(), (Node("n0", 16),), 1000.0)}
    assert (rows["team"]["gpus_in_use"], rows["team"]["gpus_borrowed"]) == (8, 6)
    assert (rows["spare"]["gpus_in_use"], rows["spare"]["gpus_borrowed"]) == (8, 0)
    assert rows["cluster"]["gpus_borrowed"] is None
    assert (rows["team"]["borrowing_limit"], rows["team"]["lending_limit"]) == ({"gpu": 6}, None)
    assert (rows["spare"]["borrowing_limit"], rows["spare"]["lending_limit"]) == (None, {"gpu": 4})


def test_queue_views_place_the_least_served_leaf_first_in_the_fair_share_order(store: Store) -> None:
    from warden.engine.model import Node, UsageLedger
    from warden.server.views import queue_views

    policy = parse_policy(
        {"queues": {"name": "cluster", "children": [{"name": "a"}, {"name": "b"}, {"name": "c", "weight": 4}]}}
    )
    nodes = (Node("n0", 8),)
    ledger = UsageLedger(0.0, {"a": 10.0, "b": 2.0, "c": 4.0})  # c: twice b's usage, four times its weight
    rows = {r["name"]: r["fair_share_position"] for r in queue_views(policy, store, ledger, nodes, 10.0)}
    assert rows == {"cluster": None, "c": 1, "b": 2, "a": 3}
    even = {r["name"]: r["fair_share_position"] for r in queue_views(policy, store, UsageLedger(), nodes, 10.0)}
    assert even == {"cluster": None, "a": 1, "b": 1, "c": 1}  # nobody used anything: one rank


def test_a_waiting_jobs_reason_is_rendered_when_it_is_read(store: Store) -> None:
    """The stored sentence names engine seconds; the API renders it at the request's `now` in
    local time and relative words, and leaves the details as stored."""
    t0 = 1_796_130_000.0
    stored = WaitingForLease(("1", "2"), t0 + 607, "efficiency", "2", 0.0, 60.0, False, 0.0, 0.9).to_dict()
    assert "t=1796130607s" in stored["message"]
    job_id = store.submit(name="", user="u", queue="team", tier=1, command=["true"], actor="u", now=t0)
    store.set_explanations({job_id: {"reason": stored, "sort_key": None, "position": 1}})
    job = store.get(job_id)
    assert job is not None
    early = job_summary(job, now=t0 + 7)["reason"]
    late = job_detail(job, store.events(job_id), (), now=t0 + 307, policy=POLICY)["reason"]
    clock = datetime.fromtimestamp(t0 + 607).strftime("%H:%M")
    assert f"at {clock} (in 10m)" in early["message"] and f"at {clock} (in 5m)" in late["message"]
    for shown in (early, late):
        assert shown["code"] == "WaitingForLease" and shown["details"] == stored["details"]
        assert not re.search(r"\d{10}", shown["message"])
        assert "efficiency floor" in shown["message"] and "`preemption.restart_overhead`" in shown["message"]


def test_an_approval_names_the_command_with_the_jobs_id(store: Store) -> None:
    job_id = store.submit(name="", user="u", queue="team", tier=2, command=["true"], actor="u", now=10.0)
    store.set_explanations({job_id: {"reason": AwaitingApproval(2).to_dict(), "sort_key": None, "position": 1}})
    job = store.get(job_id)
    assert job is not None
    assert f"`warden approve {job_id}`" in job_summary(job, now=20.0)["reason"]["message"]


@pytest.mark.parametrize(
    "facts, counted",
    [
        ({}, 45.0),  # no save reported: one of `preemption.checkpoint_overhead`
        ({"sigterm_save_s": 20.0}, 20.0),  # one save as long as the job's
        ({"checkpoint_s": 50.0, "sigterm_save_s": 25.0, "last_checkpoint_at": 1_400.0}, 25.0),  # its last save
    ],
)
def test_the_lease_end_counts_the_save_the_efficiency_floor_counts(
    store: Store, facts: dict[str, float], counted: float
) -> None:
    """Tier 3's lease is 45 min; a 1 h startup stretches it to (startup + one save) / (1 − 0.9),
    under a `max_lease` of 1 d (the stretched lease never runs past it)."""
    pol = parse_policy(
        {
            "max_lease": "1d",
            "preemption": {"restart_overhead": "30s", "checkpoint_overhead": "45s"},
            "queues": {"name": "cluster", "children": [{"name": "team"}]},
        }
    )
    job, attempt = running_job(store, startup_s=3_600.0, **facts)
    shown = job_summary(job, 2_000.0, attempt, pol)
    assert shown["lease_end_at"] == pytest.approx(1_000.0 + (3_600.0 + counted) / 0.1)
    # η counts the startup at most the attempt's age (1,000 s): all of it went to starting, and
    # the save counted on top does not make η negative.
    assert shown["efficiency"] == 0.0
