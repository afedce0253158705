"""bench/shortfall.py: a queue's shortfall is charged to the reasons its waiting jobs get, and
the part of it above the queue's nominal quota is told apart. A hand-made run; no timing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from warden.engine.policy import parse_policy
from warden.sim.cluster import pool
from warden.sim.presets import SimPolicy
from warden.sim.records import Trace, TraceJob
from warden.sim.simulator import Simulation

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("shortfall", ROOT / "bench" / "shortfall.py")
assert spec is not None and spec.loader is not None
shortfall = importlib.util.module_from_spec(spec)
sys.modules["shortfall"] = shortfall
spec.loader.exec_module(shortfall)


def test_a_lenders_wait_for_a_borrowers_lease_is_its_shortfall_and_is_below_its_nominal() -> None:
    """8 GPUs; `a` and `b` have a nominal of 4 each. `a` takes all 8 at t=0 with two tier-3 jobs
    of 4 (lease 45 min), borrowing 4; at t=60 `b` asks for 4: it is owed 4 (half the pool) and
    holds none until the lease ends and it reclaims what `a` borrows. That whole stretch is
    short, below b's nominal, waiting for the lease; then each holds its share, and `a`, left
    with its nominal, is not short while its reclaimed job waits. A tier-4 job of `b` is owed
    nothing."""
    data = {
        "queues": {
            "name": "cluster",
            "nominal": {"gpu": 8},
            "children": [{"name": "a", "nominal": {"gpu": 4}}, {"name": "b", "nominal": {"gpu": 4}}],
        }
    }
    sp = SimPolicy("lease", parse_policy(data, "<test>"))
    jobs = (
        TraceJob("a1", 0.0, 4, 7200.0, queue="a", gpus_per_replica=4, seq=0),
        TraceJob("a2", 0.0, 4, 7200.0, queue="a", gpus_per_replica=4, seq=1),
        TraceJob("b1", 60.0, 4, 600.0, queue="b", gpus_per_replica=4, seq=2),
        TraceJob("b4", 60.0, 8, 600.0, queue="b", tier=4, gpus_per_replica=8, seq=3),
    )
    hook = shortfall.Shortfall(["a", "b"], {"a": 0.5, "b": 0.5}, 8, {"a": 4.0, "b": 4.0}, {1, 2, 3})
    run = Simulation(Trace(jobs, "hand", "native"), pool(8), sp, on_pass=hook).run()
    result = hook.result(run.ended_at)
    lease_end = 45 * 60.0
    b = result["b"]
    # the reclaimed job saves in no time on SIGTERM at its lease's end and exits at once: b starts then
    assert b["short_gpu_hours"] == pytest.approx(4 * (lease_end - 60.0) / 3600, abs=0.05)
    assert b["short_while_at_nominal_share"] == 0.0  # all of it below its quota: reclaim's job
    assert b["below_nominal_borrowed_by"] == {"tier 3": 1.0}  # a borrowed the other 4 GPUs
    (main,) = [p for p in b["short_by_reason"] if p["share_of_short"] > 0.5]
    assert (main["reason"], main["tier"]) == ("WaitingForLease", 3)
    assert all(p["tier"] != 4 for p in b["short_by_reason"])
    # a reclaim never takes a below its nominal: it holds its owed half while b1 runs
    assert result["a"]["short_gpu_hours"] == pytest.approx(0.0, abs=0.05)
