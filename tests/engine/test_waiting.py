"""The waiting index kept between passes (`warden.engine.waiting`): what it derives while jobs
come and go equals what it would derive from scratch."""

from __future__ import annotations

from dataclasses import replace
from random import Random

import pytest
from support import pending

from warden.engine.model import JobState
from warden.engine.waiting import BY_ESTIMATE, OrderMode, WaitingIndex


@pytest.mark.parametrize("seed", range(5))
def test_a_kept_index_equals_a_fresh_one_as_jobs_come_and_go(seed: int) -> None:
    rng = Random(seed)
    index = WaitingIndex(OrderMode(governed=True, by_eviction=False))
    index.sync((), 0.0)
    jobs = {}
    for step in range(400):
        now = float(step)
        index.advance(now)
        if jobs and rng.random() < 0.45:
            gone = jobs.pop(rng.choice(sorted(jobs)))
            index.apply([replace(gone, state=JobState.CANCELLED)])
        else:
            job = pending(
                f"j{step}",
                rng.choice("ab"),
                3,
                gpus=rng.choice((1, 2)),
                submit=now - rng.uniform(0, 100),
                time_limit=rng.choice((60.0, 600.0, 3600.0, rng.uniform(1, 7200))),
                not_before=now + 5 if rng.random() < 0.1 else None,
            )
            jobs[job.id] = job
            index.apply([job])
        for cls in index.classes.values():
            if cls.key.estimate == BY_ESTIMATE and rng.random() < 0.5:
                cls.estimate_range()  # kept from here on, as a pass does
        index.check()
        fresh = WaitingIndex(index.mode)
        fresh.sync(jobs.values(), now)
        assert {k: c.members for k, c in index.classes.items()} == {k: c.members for k, c in fresh.classes.items()}
        assert {k: c.estimate_range() for k, c in index.classes.items()} == {
            k: c.estimate_range() for k, c in fresh.classes.items()
        }
