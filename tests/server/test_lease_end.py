"""`lease_end_at` in `GET /v1/jobs` is the engine's own figure: when the victim rules
(`rules.protection`) let the job's attempt go. While a job is protected it is exactly what a
pass asking now would find; for the lease and the efficiency floor it is the attempt's start +
max(lease, (startup + checkpoint) / (1 − min_efficiency)); it stays put once that time has
passed; it is null for a tier that is never preempted, which `preemptible` says."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from apiclient import Clock, api_service
from fastapi.testclient import TestClient
from support import move

from warden.engine import accounting
from warden.engine.model import JobState, Node, ReplicaPlacement
from warden.engine.policy import Policy
from warden.engine.quota import QuotaTree
from warden.engine.rules import RuleContext, protection
from warden.server.service import Service

T0 = 1_000_000.0
POLICY = {
    "thrash": {"min_efficiency": 0.9, "max_preemptions": {"count": 2, "per": "6h"}},
    "preemption": {"restart_overhead": "60s", "checkpoint_overhead": "30s"},
    "tiers": {3: {"name": "experimentation", "lease": "45m"}, 4: {"name": "opportunistic", "lease": "0s"}},
    "queues": {"name": "cluster", "children": [{"name": "team"}]},
}


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Service, TestClient, Clock]]:
    clock = Clock(T0)
    with api_service(tmp_path, POLICY, (Node("n0", 8, 64_000, 256_000),), clock) as (svc, client):
        yield svc, client, clock  # no pass runs: the rows are the test's


def running(svc: Service, tier: int, gpu: int, preempted_at: tuple[float, ...] = (), **facts: float) -> str:
    """A job of `tier` running on GPU `gpu` since T0, its attempt having reported `facts`."""
    store = svc.store
    job_id = store.submit(
        name="", user="ana", queue="team", tier=tier, command=["true"], workdir="/", actor="ana", now=T0 - 100
    )
    move(
        store,
        job_id,
        JobState.RUNNING,
        reason="running",
        actor="warden",
        now=T0,
        attempt=1,
        preempted_at=list(preempted_at),
    )
    store.start_attempt(job_id, 1, started_at=T0, assignment=[ReplicaPlacement("n0", (gpu,))])
    if facts:
        store.update_attempt(job_id, 1, **facts)
    return str(job_id)


def protected_until(svc: Service, job_id: str, now: float) -> float:
    """What a pass at `now` asks the engine: when the victim rules let the job go."""
    job = svc.store.get(int(job_id))
    assert job is not None
    attempt = svc.store.attempt(job.id, job.attempt)
    policy: Policy = svc.policy
    return protection(RuleContext(policy, QuotaTree(policy), now), job.to_engine(attempt))


def computed_before(policy: Policy, tier: int, startup: float, checkpoint: float) -> float:
    """The lease stretched by the efficiency floor, worked out by hand."""
    lease = accounting.effective_lease(policy, tier, None)
    return T0 + max(lease, (startup + checkpoint) / (1.0 - policy.thrash.min_efficiency))


def test_lease_end_at_is_the_engines_protection(setup: tuple[Service, TestClient, Clock]) -> None:
    svc, c, clock = setup
    policy = svc.policy
    jobs = {
        # the lease binds: (60 + 30) / 0.1 = 900 s < 45 min
        "lease": running(svc, 3, 0),
        # the efficiency floor binds: (600 + 30) / 0.1 = 6,300 s > 45 min
        "efficiency": running(svc, 3, 1, startup_s=600.0),
        # the last measured save counts instead of the assumed one, once, whatever the saves
        # add up to (1,200 s here): (60 + 400) / 0.1
        "checkpoints": running(svc, 3, 2, checkpoint_s=1_200.0, sigterm_save_s=400.0, last_checkpoint_at=T0 + 50),
        # no lease, so the floor alone: (60 + 30) / 0.1
        "floor only": running(svc, 4, 3),
        # preempted twice in the last 6 h: the thrash budget binds until the older one is 6 h old
        "thrash": running(svc, 3, 4, preempted_at=(T0 - 3_600.0, T0 - 1_800.0)),
        # never preempted
        "production": running(svc, 1, 5),
    }
    clock.t = T0 + 120
    shown = {j["id"]: j for j in c.get("/v1/jobs").json()}
    assert set(shown) == set(jobs.values())

    for name, job_id in jobs.items():
        until = protected_until(svc, job_id, clock.t)
        if name == "production":
            assert math.isinf(until) and shown[job_id]["lease_end_at"] is None
            assert shown[job_id]["preemptible"] is False  # null means "never", not "unknown"
            continue
        assert shown[job_id]["preemptible"] is True, name
        assert until > clock.t, name  # still protected: the figure is exactly the engine's
        assert shown[job_id]["lease_end_at"] == until, name

    assert shown[jobs["lease"]]["lease_end_at"] == computed_before(policy, 3, 60.0, 30.0) == T0 + 45 * 60
    for name, tier, startup, checkpoint in (
        ("efficiency", 3, 600.0, 30.0),
        ("checkpoints", 3, 60.0, 400.0),
        ("floor only", 4, 60.0, 30.0),
    ):
        # The efficiency rule names its time a microsecond early (its slack for 1 − 0.9).
        expected = computed_before(policy, tier, startup, checkpoint)
        assert shown[jobs[name]]["lease_end_at"] == pytest.approx(expected, abs=1e-5), name
    assert shown[jobs["thrash"]]["lease_end_at"] == T0 - 3_600.0 + 6 * 3_600.0

    # Once the protection lifted, a pass finds none; the listing keeps the time it lifted.
    clock.t = T0 + 10 * 3_600.0
    later = {j["id"]: j for j in c.get("/v1/jobs").json()}
    for name, job_id in jobs.items():
        if name != "production":
            assert protected_until(svc, job_id, clock.t) == 0.0, name
            assert later[job_id]["lease_end_at"] == shown[job_id]["lease_end_at"], name
