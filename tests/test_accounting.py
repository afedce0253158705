"""`warden.engine.accounting`: one definition per meaning, and the shells agreeing with it.

Hand-computed cases for each function, then checks that the engine's rules, the simulator's
workload model and the server's views give the numbers these functions give.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import policy, running

from warden.engine import rules
from warden.engine.accounting import (
    assumed_checkpoint,
    assumed_startup,
    attempt_eta,
    checkpoint_basis,
    clean_exit_in_grace,
    effective_grace,
    effective_lease,
    held_gpu_seconds,
    measured_loss,
    owed_gpu_seconds,
    policy_entitlement,
    predicted_lost_work,
    save_fits_grace,
    unsaved_since,
    wait_time,
)
from warden.engine.model import Job, JobState
from warden.engine.policy import parse_policy
from warden.sim.records import TraceJob
from warden.sim.workload import sigterm_exit

POL = policy(min_grace="120s", max_lease="2h", tiers={2: {"lease": "1h"}}, preemption={"restart_overhead": "45s"})


# -------------------------------------------------------------------------- grace, lease, startup


def test_the_grace_is_the_request_else_the_tiers_never_below_min_grace() -> None:
    assert effective_grace(POL, 3, None) == POL.tier(3).grace
    assert effective_grace(POL, 3, 600.0) == 600.0
    assert effective_grace(POL, 3, 30.0) == 120.0  # asked before min_grace was raised


def test_the_lease_is_the_request_else_the_tiers_never_above_max_lease() -> None:
    assert effective_lease(POL, 3, None) == POL.tier(3).lease
    assert effective_lease(POL, 3, 600.0) == 600.0
    assert effective_lease(POL, 3, 5 * 3600.0) == 2 * 3600.0


def test_an_unreported_startup_is_the_policys_restart_overhead() -> None:
    assert assumed_startup(POL, None) == 45.0
    assert assumed_startup(POL, 7.0) == 7.0


def test_the_checkpoint_counted_is_one_save_the_last_measured_else_known_else_assumed() -> None:
    assert POL.preemption.checkpoint_overhead == 30.0  # the default
    # saved already: one save, the last one measured, never what all the saves added up to
    assert (checkpoint_basis(47.4, 15.8), assumed_checkpoint(POL, 47.4, 15.8)) == ("measured", 15.8)
    assert (checkpoint_basis(3600.0, 0.9), assumed_checkpoint(POL, 3600.0, 0.9)) == ("measured", 0.9)
    # not saved yet: one save, the one a preemption forces on SIGTERM
    assert (checkpoint_basis(0.0, 15.8), assumed_checkpoint(POL, 0.0, 15.8)) == ("save", 15.8)
    assert (checkpoint_basis(0.0, 0.0), assumed_checkpoint(POL, 0.0, 0.0)) == ("save", 0.0)
    assert (checkpoint_basis(0.0, None), assumed_checkpoint(POL, 0.0, None)) == ("assumed", 30.0)
    none = policy(preemption={"checkpoint_overhead": "0s"})
    assert assumed_checkpoint(none, 0.0, None) == 0.0


def test_an_ended_attempts_eta_counts_the_checkpoints_it_measured_not_the_assumption() -> None:
    # ran 44 s to its SIGTERM with a startup of 10.9 s and no save: η counts no checkpoint
    assert attempt_eta(0.0, 44.0, 60.0, 10.9, 0.0) == pytest.approx((44.0 - 10.9) / 44.0)


def test_eta_is_never_negative() -> None:
    # 20 s into a 60 s startup with a 30 s save assumed: no progress yet, η 0, not −2.5
    job = running("1", "a", 3, ("n", 1), 0.0)
    assert rules.efficiency(policy(preemption={"restart_overhead": "60s"}), job, 20.0) == 0.0
    assert attempt_eta(0.0, 20.0, None, 60.0, 30.0) == 0.0


# -------------------------------------------------------------------------------------- waiting


def test_wait_adds_the_time_since_the_job_last_entered_pending_to_earlier_waits() -> None:
    assert wait_time(30.0, 100.0, 0.0, now=160.0) == 90.0
    assert wait_time(0.0, None, 50.0, now=80.0) == 30.0  # never requeued: since submit
    assert wait_time(30.0, 100.0, 0.0, now=90.0) == 30.0  # a clock behind pending_since adds nothing
    assert wait_time(30.0, None, 0.0, now=500.0, waiting=False) == 30.0  # running: what it waited


# ------------------------------------------------------------------------------------ lost work


def test_unsaved_progress_starts_at_the_later_of_startup_end_and_the_last_checkpoint() -> None:
    assert unsaved_since(1000.0, 200.0, None) == 1200.0
    assert unsaved_since(1000.0, 200.0, 1500.0) == 1500.0
    assert unsaved_since(1000.0, 200.0, 900.0) == 1200.0  # an earlier attempt's checkpoint


def test_predicted_lost_work_is_zero_only_when_a_reported_save_fits_the_grace() -> None:
    assert save_fits_grace(120.0, 120.0) and not save_fits_grace(121.0, 120.0) and not save_fits_grace(None, 120.0)
    assert predicted_lost_work(8, 5000.0, 0.0, 100.0, 4000.0, sigterm_save_s=60.0, grace=120.0) == 0.0
    assert predicted_lost_work(8, 5000.0, 0.0, 100.0, 4000.0, sigterm_save_s=300.0, grace=120.0) == 8 * 1000.0
    assert predicted_lost_work(8, 5000.0, 0.0, 100.0, None, sigterm_save_s=None, grace=120.0) == 8 * 4900.0
    assert predicted_lost_work(8, 50.0, 0.0, 100.0, None, sigterm_save_s=None, grace=120.0) == 0.0  # in startup


def test_measured_lost_work_is_zero_when_a_save_finished_between_sigterm_and_exit() -> None:
    # SIGTERM at 5000, the save on SIGTERM reported at 5090, exit at 5100: nothing lost.
    assert measured_loss(8, 5000.0, 0.0, 100.0, 5090.0, ended_at=5100.0) == (0.0, "reported")
    # The same even though the prediction (a 300 s save, 120 s grace) said all would be lost.
    assert predicted_lost_work(8, 5000.0, 0.0, 100.0, 4000.0, 300.0, 120.0) == 8 * 1000.0


def test_measured_lost_work_without_a_save_after_sigterm_counts_since_the_last_checkpoint() -> None:
    assert measured_loss(8, 5000.0, 0.0, 100.0, 4000.0, ended_at=5120.0) == (8 * 1000.0, "reported")
    assert measured_loss(8, 5000.0, 0.0, 100.0, None, ended_at=5120.0) == (8 * 4900.0, "assumed")
    # A checkpoint said to end after the exit did not survive it: nothing counts as saved.
    assert measured_loss(8, 5000.0, 0.0, 100.0, 5200.0, ended_at=5120.0) == (8 * 4900.0, "assumed")


def test_a_declared_save_kept_by_a_clean_exit_loses_nothing_and_a_reported_one_after_sigterm_comes_first() -> None:
    assert measured_loss(8, 5000.0, 0.0, 100.0, None, 5010.0, declared_save=True) == (0.0, "declared")
    assert measured_loss(8, 5000.0, 0.0, 100.0, 4000.0, 5010.0, declared_save=True) == (0.0, "declared")
    assert measured_loss(8, 5000.0, 0.0, 100.0, 5005.0, 5010.0, declared_save=True) == (0.0, "reported")


def test_a_clean_exit_in_grace_is_every_process_exiting_0_after_sigterm_before_sigkill() -> None:
    assert clean_exit_in_grace(100.0, 220.0, 130.0, False, [0, 0])
    assert clean_exit_in_grace(100.0, None, 130.0, False, [0])
    assert not clean_exit_in_grace(None, None, 130.0, False, [0])  # no SIGTERM: no save on it
    assert not clean_exit_in_grace(100.0, 220.0, 220.5, True, [-9])  # SIGKILL at the deadline
    assert not clean_exit_in_grace(100.0, 220.0, 130.0, False, [0, 1])  # one rank failed
    assert not clean_exit_in_grace(100.0, 220.0, 130.0, False, [0, None])  # a status nobody read
    assert not clean_exit_in_grace(100.0, 220.0, 130.0, False, [])
    assert not clean_exit_in_grace(100.0, 220.0, 230.0, False, [0])  # after the deadline


@settings(max_examples=200, deadline=None)
@given(
    started=st.floats(0, 1e5),
    startup=st.floats(0, 1e3),
    ran=st.floats(0, 1e5),
    ckpt=st.one_of(st.none(), st.floats(0, 1)),
    gpus=st.integers(1, 64),
)
def test_a_job_that_saves_nothing_after_sigterm_loses_what_was_predicted_at_sigterm(
    started: float, startup: float, ran: float, ckpt: float | None, gpus: int
) -> None:
    sigterm = started + ran
    last = None if ckpt is None else started + ckpt * ran
    predicted = predicted_lost_work(gpus, sigterm, started, startup, last, None, 120.0)
    assert measured_loss(gpus, sigterm, started, startup, last, ended_at=sigterm + 120.0).gpu_s == predicted


def test_held_gpu_seconds_are_gpus_times_the_time_held_for_numbers_and_arrays() -> None:
    assert held_gpu_seconds(4.0, 100.0, 160.0) == 240.0
    assert list(held_gpu_seconds(np.array([1.0, 2.0]), np.array([0.0, 10.0]), np.array([5.0, 20.0]))) == [5.0, 20.0]


# ---------------------------------------------------------------------------- owed vs delivered


def test_entitlement_is_the_nominal_gpu_share_else_the_weight_share() -> None:
    quotas = parse_policy(
        {
            "queues": {
                "name": "c",
                "children": [{"name": "a", "nominal": {"gpu": 6}}, {"name": "b", "nominal": {"gpu": 2}}],
            }
        }
    )
    assert policy_entitlement(quotas) == {"a": 0.75, "b": 0.25}
    weights = parse_policy({"queues": {"name": "c", "children": [{"name": "a", "weight": 3}, {"name": "b"}]}})
    assert policy_entitlement(weights) == {"a": 0.75, "b": 0.25}


def test_owed_gpu_seconds_water_fill_the_cluster_by_entitlement() -> None:
    """8 GPUs, a weighs 3 and b 1. Hour 1: both want 8 (a owed 6, b 2); hour 2: only b wants 8
    (owed 8); hour 3: a wants 7 and b 1 (b is owed its 1, a the other 7)."""
    h = 3600.0
    owed = owed_gpu_seconds(
        ["a", "b"],
        job_queue=[0, 1, 0, 1],
        num_gpus=[8, 8, 7, 1],
        submit=[0, 0, 2 * h, 2 * h],
        finished=[h, 2 * h, math.nan, math.nan],
        entitlement={"a": 0.75, "b": 0.25},
        gpus=8,
        start=0.0,
        end=3 * h,
    )
    assert owed["a"] == pytest.approx((6 + 0 + 7) * h)
    assert owed["b"] == pytest.approx((2 + 8 + 1) * h)


def test_a_queue_without_entitlement_is_owed_nothing_and_none_at_all_means_equal_weights() -> None:
    def owed(entitlement: dict[str, float]) -> dict[str, float]:
        return owed_gpu_seconds(["a", "b"], [0, 1], [8, 8], [0, 0], [100, 100], entitlement, 8, 0.0, 100.0)

    assert owed({"a": 1.0}) == {"a": 800.0, "b": 0.0}
    assert owed({}) == {"a": 400.0, "b": 400.0}
    assert owed_gpu_seconds([], [], [], [], [], {}, 8, 0.0, 100.0) == {}


# ------------------------------------------------------------------------- the shells agree


jobs_in_flight = st.builds(
    lambda started, startup, ckpt, save, grace, tier, spent: running(
        "v",
        "a",
        tier,
        ("n0", 8),
        started=started,
        startup_s=startup,
        sigterm_save_s=save,
        checkpoint_s=spent,
        last_checkpoint_at=None if ckpt is None else started + ckpt,
        grace=grace,
    ),
    started=st.floats(0, 1e5),
    startup=st.one_of(st.none(), st.floats(0, 600)),
    ckpt=st.one_of(st.none(), st.floats(-100, 5000)),
    save=st.one_of(st.none(), st.floats(0, 600)),
    grace=st.one_of(st.none(), st.floats(0, 600)),
    tier=st.sampled_from([2, 3, 4]),
    spent=st.sampled_from([0.0, 0.0, 12.5, 300.0]),
)


@settings(max_examples=200, deadline=None)
@given(job=jobs_in_flight, later=st.floats(0, 1e4))
def test_the_engine_prices_a_victim_with_the_shared_definitions(job: Job, later: float) -> None:
    a = job.attempt
    assert a is not None
    now = a.started_at + later
    grace = effective_grace(POL, job.tier, job.grace)
    assert rules.grace_of(POL, job) == grace
    assert rules.lease_of(POL, job) == effective_lease(POL, job.tier, job.lease)
    assert rules.startup_of(POL, job) == assumed_startup(POL, a.startup_s)
    assert rules.checkpoint_of(POL, job) == assumed_checkpoint(POL, a.checkpoint_s, a.sigterm_save_s)
    assert rules.lost_work(POL, job, now) == predicted_lost_work(
        job.total_gpus,
        now,
        a.started_at,
        assumed_startup(POL, a.startup_s),
        a.last_checkpoint_at,
        a.sigterm_save_s,
        grace,
    )


@settings(max_examples=200, deadline=None)
@given(
    waited=st.floats(0, 1e5),
    since=st.one_of(st.none(), st.floats(0, 1e5)),
    submit=st.floats(0, 1e5),
    now=st.floats(0, 2e5),
    state=st.sampled_from(list(JobState)),
)
def test_the_engine_ages_a_job_by_the_shared_wait(
    waited: float, since: float | None, submit: float, now: float, state: JobState
) -> None:
    job = Job("j", "a", 3, submit, state, waited=waited, pending_since=since)
    assert job.wait_at(now) == wait_time(waited, since, submit, now, state.waiting)


@pytest.mark.parametrize("interval", [None, 100.0])
@pytest.mark.parametrize("resumable", [True, False])
@pytest.mark.parametrize("save_s", [0.0, 30.0, 200.0])
def test_the_simulator_books_as_lost_what_the_shared_measurement_gives(
    interval: float | None, resumable: bool, save_s: float
) -> None:
    """Over a grid of SIGTERM times (during startup, work, a periodic save), with SIGKILL 120 s
    later: the progress an exit loses (`done - saved`) is `Exit.lost`, the shared measurement."""
    job = TraceJob(
        "j",
        0.0,
        1,
        1000.0,
        startup_seconds=50.0,
        checkpoint_interval=interval,
        checkpoint_seconds=save_s,
        resumable=resumable,
    )
    for t in np.arange(0.0, 900.0, 7.5):
        ex = sigterm_exit(job, 0.0, 0.0, float(t), float(t) + 120.0)
        assert ex.lost == pytest.approx(ex.done - ex.saved, abs=1e-9), (t, ex)


def test_owed_hours_of_a_run_in_which_no_job_started() -> None:
    """No admitted job leaves the waterfill with nothing to sum: it still answers in floats."""
    from warden.sim.metrics import summarize
    from warden.sim.records import SimJob, SimRun

    never = SimJob("j0", "a", 3, "", 10.0, 1, 5.0, None, 0.0, ())
    summary = summarize(SimRun("governed", "x", 0, 1, (never,), 0.0, 10.0))
    assert isinstance(summary, dict)
