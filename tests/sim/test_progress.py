"""Progress of a simulation run and the time left for the runs of one command: the share of a
run done only grows, from 0 to exactly 1, and the estimate is unknown before any progress,
never negative, and 0 at the end."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warden.sim.experiment import Setup, prepare, run_policy
from warden.sim.presets import resolve_policy
from warden.sim.progress import SimProgress, describe_left, time_left
from warden.sim.simulator import Simulation


@pytest.fixture
def contended(tmp_path: Path) -> Setup:
    """80 jobs for 8 GPUs, submitted over two hours: most of them finish after the last submit."""
    rng = random.Random(7)
    lines = ["job_id,submit,num_gpus,duration,queue,tier,checkpoint_interval,checkpoint_seconds,resumable"]
    for i in range(80):
        lines.append(
            f"j{i},{i * 90},{rng.choice([1, 2, 4, 8])},{rng.randint(600, 7200)},{rng.choice('ab')},"
            f"{rng.choice([2, 3, 4])},600,30,{rng.choice(['true', 'false'])}"
        )
    path = tmp_path / "contended.csv"
    path.write_text("\n".join(lines) + "\n")
    return prepare(path, gpus=8)


@pytest.mark.parametrize("preset", ["governed", "fifo_backfill", "slurm", "k8s"])
def test_the_share_done_grows_from_zero_to_exactly_one(contended: Setup, preset: str) -> None:
    seen: list[SimProgress] = []
    sp = resolve_policy(preset, contended.nominal, contended.gpus)
    Simulation(contended.trace, contended.nodes, sp, on_progress=seen.append, progress_every_s=0.0).run()
    fractions = [p.fraction for p in seen]
    assert fractions[0] == 0.0 and seen[0].arrived == seen[0].finished == 0
    assert fractions == sorted(fractions)
    assert seen[-1].ended and fractions[-1] == 1.0
    assert [p.ended for p in seen].count(True) == 1
    assert seen[-2].arrived == seen[-2].finished == seen[-2].jobs == 80
    # The drain after the last submit is not done when the last job has arrived.
    at_last_submit = next(p for p in seen if p.arrived == p.jobs)
    assert at_last_submit.finished < at_last_submit.jobs and at_last_submit.fraction < 0.8
    assert all(p.first_submit == 0.0 and p.last_submit == 79 * 90 for p in seen)
    assert [p.clock for p in seen] == sorted(p.clock for p in seen)


def test_run_policy_reports_the_start_and_the_end_and_at_most_ten_times_a_second(contended: Setup) -> None:
    seen: list[SimProgress] = []
    outcome = run_policy(contended, "governed", seen.append)
    assert seen[0].fraction == 0.0 and not seen[0].ended
    assert seen[-1].ended and seen[-1].fraction == 1.0
    assert len(seen) <= 2 + outcome.run.wall_s / 0.1 + 1


def test_a_run_with_no_jobs_the_cluster_can_run_is_done_at_its_end(tmp_path: Path) -> None:
    path = tmp_path / "big.csv"
    path.write_text("job_id,submit,num_gpus,duration\nhuge,0,64,100\n")
    seen: list[SimProgress] = []
    run_policy(prepare(path, gpus=8), "fifo_backfill", seen.append)
    assert [(p.jobs, p.fraction, p.ended) for p in seen] == [(0, 0.0, False), (0, 1.0, True)]


# ------------------------------------------------------------------------------ the estimate


@pytest.mark.parametrize(
    ("args", "left"),
    [
        ((10.0, 10.0, 0.5, 0, 1), 10.0),  # half of the only run in 10 s
        ((10.0, 10.0, 0.25, 0, 3), 110.0),  # 30 s for this run, 40 s each for the two to come
        ((70.0, 10.0, 0.5, 2, 4), 40.0),  # 10 s for this run, the last as long as the mean (30 s)
        ((20.0, 0.0, 0.0, 1, 3), 40.0),  # a run just begun: as long as the one done, twice
        ((25.0, 5.0, 0.0, 1, 3), 35.0),  # … less what the current one has already taken
        ((30.0, 25.0, 0.0, 1, 2), 0.0),  # taking longer than the mean, nothing known yet: 0, not less
        ((5.0, 5.0, 0.0, 0, 3), None),  # no run done, none begun: unknown
        ((50.0, 0.0, 0.0, 3, 3), 0.0),  # all done
        ((50.0, 10.0, 1.0, 2, 3), 0.0),  # the last run at its end
    ],
)
def test_time_left_arithmetic(args: tuple[float, float, float, int, int], left: float | None) -> None:
    assert time_left(*args) == left


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "estimating time left"),
        (0.0, "done"),
        (3.2, "<10s left"),
        (42.0, "~40s left"),
        (58.0, "~1m left"),
        (720.0, "~12m left"),
        (3599.0, "~1h left"),
        (7500.0, "~2h5m left"),
    ],
)
def test_describe_left(seconds: float | None, text: str) -> None:
    assert describe_left(seconds) == text


runs_of_progress = st.lists(
    st.lists(st.tuples(st.floats(0.001, 100.0), st.floats(0.0, 1.0)), max_size=8), min_size=1, max_size=5
)
"""Runs made one after the other; each a list of (wall seconds since the last report, share
done): the shares are sorted into a run that only moves forward and ends at 1."""


@given(runs_of_progress)
def test_the_estimate_over_runs_that_only_move_forward(runs: list[list[tuple[float, float]]]) -> None:
    total, elapsed = len(runs), 0.0
    for done, steps in enumerate(runs):
        run_elapsed = 0.0
        fractions = [*sorted(f for _, f in steps), 1.0]
        for (dt, _), fraction in zip([*steps, (1.0, 1.0)], fractions, strict=True):
            elapsed += dt
            run_elapsed += dt
            left = time_left(elapsed, run_elapsed, fraction, done, total)
            if done == 0 and fraction == 0.0:
                assert left is None
            else:
                assert left is not None and left >= 0.0
        if done == total - 1:
            assert time_left(elapsed, run_elapsed, 1.0, done, total) == 0.0
    assert time_left(elapsed, 0.0, 0.0, total, total) == 0.0
