"""The export's durations are the work each job needs, from what was observed, and say what
they rest on: a real service (SQLite, the local executor, real processes that trap SIGTERM and
exit 0, none using the SDK) whose clock the test moves. Replayed under the same policy, the
export preempts as many jobs as the run did, at the same utilization. The submit field
`saves_on_sigterm` is stored, shown, and refused (422, naming it) when it is no boolean."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from apiclient import Clock, ClockedExecutor, api_service, exited, submit_until
from fastapi.testclient import TestClient

from warden.engine.model import JobState, Node
from warden.engine.policy import parse_policy
from warden.server.service import Service
from warden.sim.experiment import prepare, run_policy
from warden.sim.presets import sim_policy

T0 = 1_000_000.0
NODE = Node("node-0", 4, 16_000, 64_000)
POLICY = {
    "min_grace": "120s",
    "thrash": {"min_efficiency": 0, "max_preemptions": {"per": "24h", "count": 100}},
    "preemption": {"restart_overhead": "0s", "checkpoint_overhead": "0s"},
    "tiers": {
        2: {"name": "pretraining", "lease": "0s", "requires_approval": False},
        3: {"name": "experimentation", "lease": "0s"},
    },
    "queues": {"name": "cluster", "children": [{"name": "a"}, {"name": "b"}]},
}


DECLARED = {"traps_sigterm": True, "saves_on_sigterm": True}


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Service, TestClient, Clock]]:
    clock = Clock(T0)
    with api_service(tmp_path, POLICY, (NODE,), clock, ClockedExecutor(clock)) as (svc, client):
        yield svc, client, clock  # the test runs the passes


def test_durations_are_the_work_observed_with_their_basis_and_replay_preempts_alike(
    setup: tuple[Service, TestClient, Clock], tmp_path: Path
) -> None:
    svc, client, clock = setup
    done = {name: tmp_path / f"done-{name}" for name in "ABCDH"}

    def at(t: float) -> None:
        clock.t = T0 + t
        svc.reconciler.reconcile()

    # Every job exits 0 on SIGTERM, none through the SDK; A and D declare it.
    a = submit_until(svc, done["A"], "a", 3, 1, **DECLARED)  # preempted at 100, done at 450
    b = submit_until(svc, done["B"], "a", 3, 1, traps_sigterm=True)  # preempted at 100, done at 450
    c = submit_until(svc, done["C"], "b", 3, 1, traps_sigterm=True)  # preempted at 100, cancelled at 450
    d = submit_until(svc, done["D"], "b", 3, 1, **DECLARED)  # preempted at 100, still running at 500
    at(0)
    clock.t = T0 + 100
    h = submit_until(svc, done["H"], "b", 2, 4)  # tier 2, the whole node: preempts the four
    at(100)
    exited(svc, a, b, c, d)
    at(100)
    done["H"].touch()
    exited(svc, h)
    at(150)
    clock.t = T0 + 450
    done["A"].touch()
    done["B"].touch()
    assert client.post(f"/v1/jobs/{c}/cancel").status_code == 202
    exited(svc, a, b, c)
    at(450)
    clock.t = T0 + 500

    states = {j: svc.store.get(j).state for j in (a, b, c, d, h)}  # type: ignore[union-attr]
    assert states == {
        a: JobState.SUCCEEDED,
        b: JobState.SUCCEEDED,
        c: JobState.CANCELLED,
        d: JobState.RUNNING,
        h: JobState.SUCCEEDED,
    }
    firsts = {j: svc.store.attempts(j)[0] for j in (a, b, c, d)}
    assert {j: (x.lost_work_gpu_s, x.lost_work_basis) for j, x in firsts.items()} == {
        a: (0.0, "declared"),
        b: (100.0, "assumed"),
        c: (100.0, "assumed"),
        d: (0.0, "declared"),
    }
    cancelled = svc.store.attempts(c)[1]
    assert (cancelled.reason, cancelled.lost_work_gpu_s, cancelled.lost_work_basis) == ("cancelled", None, None)

    r = client.get("/v1/history/export", params={"since": T0 - 1})
    assert r.status_code == 200, r.text
    assert r.headers["Warning"] == (
        '299 - "3 of 5 durations rest on an assumption: 2 never finished (at_least: they need at least what '
        "they ran); 1 had their lost work assumed at a preemption (assumed: they may need more) (column "
        'duration_basis)"'
    )
    rows = {row["job_id"]: row for row in csv.DictReader(io.StringIO(r.text))}
    assert {j: (float(x["duration"]), x["duration_basis"], x["resumable"]) for j, x in rows.items()} == {
        a: (400.0, "observed", "true"),  # 100 before its declared save, 300 after
        b: (300.0, "assumed", "false"),  # its last run; what its first one kept is unknown
        c: (300.0, "at_least", "false"),  # cancelled: the most it ran, not 0
        d: (450.0, "at_least", "true"),  # running: 100 kept + 350 so far
        h: (50.0, "observed", "false"),
    }

    trace = tmp_path / "history.csv"
    trace.write_bytes(r.content)
    replay = run_policy(prepare(trace, nodes=(NODE,)), sim_policy("same", parse_policy(POLICY)))
    simulated = sorted((round(x.admitted_at, 3), j.job_id) for j in replay.run.jobs for x in j.attempts)
    started = sorted((x.started_at - T0, j) for j in (a, b, c, d, h) for x in svc.store.attempts(j))
    assert simulated == started  # the same admissions at the same times
    held = sum(
        gpus * ((x.ended_at if x.ended_at is not None else clock.t) - x.started_at)
        for j, gpus in ((a, 1), (b, 1), (c, 1), (d, 1), (h, 4))
        for x in svc.store.attempts(j)
    )
    assert replay.summary["preemptions"] == len(svc.store.preemptions(0, 100)) == 4
    assert replay.summary["utilization"] == pytest.approx(held / (4 * 500), abs=0.005)


def test_saves_on_sigterm_is_stored_shown_and_refused_when_it_is_no_boolean(
    setup: tuple[Service, TestClient, Clock],
) -> None:
    svc, client, _ = setup
    body = {"queue": "a", "tier": 3, "command": ["true"], "gpus": 0, "workdir": "/"}
    for bad in ("yes", 1, None, "true"):
        r = client.post("/v1/jobs", json={**body, "saves_on_sigterm": bad})
        assert r.status_code == 422, r.text
        error = r.json()["error"]
        assert (error["field"], error["value"]) == ("saves_on_sigterm", bad)
    assert svc.store.list() == ()  # nothing stored
    r = client.post("/v1/jobs", json={**body, "saves_on_sigterm": True})
    assert r.status_code == 201, r.text
    job = r.json()["id"]
    assert svc.store.get(job).saves_on_sigterm is True  # type: ignore[union-attr]
    assert client.get(f"/v1/jobs/{job}").json()["saves_on_sigterm"] is True
    plain = client.post("/v1/jobs", json=body).json()["id"]
    assert client.get(f"/v1/jobs/{plain}").json()["saves_on_sigterm"] is False
