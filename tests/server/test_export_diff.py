"""`GET /v1/history/export` and `POST /v1/policy/diff` on a real service (SQLite, the local
executor, real processes) whose clock the test moves and whose passes the test runs.

The export of a run without timing noise (jobs end when the test says, at clock times it
chooses), replayed in the simulator under the same policy, admits the same jobs in the same
order at the same times and preempts the same victims for the same jobs. So does the export of
jobs without the SDK that exit 0 on SIGTERM, some declaring `saves_on_sigterm`, preempted and
cancelled: its durations are the work each was seen to need, each saying what it rests on. The
diff of a policy that changes one queue's weight names exactly the waiting jobs the engine
ranks elsewhere. The submit field `saves_on_sigterm` is stored, shown, and refused (422, naming
it) when it is no boolean."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from apiclient import Clock, ClockedExecutor, api_service, exited
from apiclient import submit_until as submit
from fastapi.testclient import TestClient

from warden.engine.model import JobState, Node
from warden.engine.policy import parse_policy
from warden.engine.scheduler import rank
from warden.server.service import Service
from warden.sim.experiment import prepare, run_policy
from warden.sim.loaders import load_trace
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
        4: {"name": "opportunistic", "lease": "0s", "charged": False},
    },
    "queues": {"name": "cluster", "children": [{"name": "a"}, {"name": "b"}, {"name": "c"}]},
}


DECLARED = {"traps_sigterm": True, "saves_on_sigterm": True}


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Service, TestClient, Clock]]:
    clock = Clock(T0)
    ledger = {"a": 1000.0, "b": 2000.0, "c": 3000.0}
    with api_service(tmp_path, POLICY, (NODE,), clock, ClockedExecutor(clock), ledger) as (svc, client):
        yield svc, client, clock  # the test runs the passes


def finish(svc: Service, job_id: str, done: Path) -> None:
    done.touch()
    exited(svc, job_id)


def test_the_exported_run_replayed_in_the_simulator_admits_and_preempts_alike(
    setup: tuple[Service, TestClient, Clock], tmp_path: Path
) -> None:
    svc, client, clock = setup
    files = {name: tmp_path / f"done-{name}" for name in ("j1", "j2", "j3", "j4")}

    def at(t: float) -> None:
        clock.t = T0 + t
        svc.reconciler.reconcile()

    j1 = submit(svc, files["j1"], "a", 3, 2, 1000)  # t=0, runs 1000 s
    at(0)
    clock.t = T0 + 5
    j2 = submit(svc, files["j2"], "b", 3, 2, 300)  # t=5, runs 300 s: preempted at 10, run again from zero
    at(5)
    clock.t = T0 + 10
    j3 = submit(svc, files["j3"], "b", 2, 2, 60)  # t=10, tier 2: preempts j2 (of its own queue, the cheaper)
    at(10)
    exited(svc, j2)  # its SIGTERM ended it at once
    at(10)
    clock.t = T0 + 20
    j4 = submit(svc, files["j4"], "a", 4, 2, 30)  # t=20, tier 4: waits behind j2
    at(20)
    finish(svc, j3, files["j3"])
    at(70)
    finish(svc, j2, files["j2"])
    at(370)
    finish(svc, j4, files["j4"])
    at(400)
    finish(svc, j1, files["j1"])
    at(1000)

    started = sorted(
        (a.started_at - T0, job) for job in (j1, j2, j3, j4) for a in svc.store.attempts(job)
    )  # every attempt of the run, in admission order
    assert started == [(0, j1), (5, j2), (10, j3), (70, j2), (370, j4)]
    preempted = sorted((p.sigterm_at - T0, str(p.job_id), p.preemptor) for p in svc.store.preemptions(0, 100))
    assert preempted == [(10, j2, j3)]

    r = client.get("/v1/history/export", params={"since": T0 - 1})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/csv")
    assert r.headers["X-Total-Count"] == "4"
    trace_file = tmp_path / "history.csv"
    trace_file.write_bytes(r.content)
    trace = load_trace(trace_file)
    by_id = {j.job_id: j for j in trace.jobs}
    assert {i: (j.duration, j.resumable, j.num_gpus, j.tier, j.queue) for i, j in by_id.items()} == {
        j1: (1000.0, False, 2, 3, "a"),
        j2: (300.0, False, 2, 3, "b"),
        j3: (60.0, False, 2, 2, "b"),
        j4: (30.0, False, 2, 4, "a"),
    }

    run = run_policy(prepare(trace_file, nodes=(NODE,)), sim_policy("same", parse_policy(POLICY))).run
    simulated = sorted((a.admitted_at, j.job_id) for j in run.jobs for a in j.attempts)
    assert simulated == started
    sim_preempted = sorted(
        (a.sigterm_at, j.job_id, a.cause.by) for j in run.jobs for a in j.attempts if a.preempted and a.cause
    )
    assert sim_preempted == preempted

    parquet = client.get("/v1/history/export", params={"since": T0 - 1, "format": "parquet"})
    assert parquet.status_code == 200, parquet.text
    (tmp_path / "history.parquet").write_bytes(parquet.content)
    assert load_trace(tmp_path / "history.parquet").jobs == trace.jobs


def test_the_export_refuses_a_window_past_its_bound_and_an_unknown_format(
    setup: tuple[Service, TestClient, Clock],
) -> None:
    _, client, _ = setup
    r = client.get("/v1/history/export", params={"since": T0 - 401 * 86400})
    assert r.status_code == 422
    assert r.json()["error"]["field"] == "since"
    r = client.get("/v1/history/export", params={"format": "xlsx"})
    assert r.status_code == 422
    assert (r.json()["error"]["field"], r.json()["error"]["value"]) == ("format", "xlsx")
    r = client.get("/v1/history/export")  # nothing ran: a header alone
    assert r.status_code == 200 and r.text.count("\n") == 1 and r.text.startswith("job_id,submit,num_gpus,duration")


def test_a_diff_that_changes_one_weight_names_exactly_the_waiting_jobs_that_move(
    setup: tuple[Service, TestClient, Clock], tmp_path: Path
) -> None:
    svc, client, clock = setup
    done = tmp_path / "never"
    big = submit(svc, done, "a", 3, 4)
    svc.reconciler.reconcile()  # holds the whole node
    assert svc.store.get(big).state.holds_resources  # type: ignore[union-attr]
    clock.t = T0 + 60
    top = submit(svc, done, "b", 2, 4)  # tier 2: first whatever the weights
    waiting = {q: submit(svc, done, q, 3, 2) for q in ("a", "b", "c")}
    last = submit(svc, done, "c", 4, 1)  # tier 4: last whatever the weights

    new = yaml.safe_load(yaml.safe_dump(POLICY))
    new["queues"]["children"][2]["weight"] = 10
    r = client.post("/v1/policy/diff", json={"source": yaml.safe_dump(new)})
    assert r.status_code == 200, r.text
    out = r.json()

    with svc.reconciler.lock:
        snapshot = svc.reconciler.snapshots.live(clock.t)
    before = {j.id: i for i, (_, j) in enumerate(rank(snapshot, clock.t), 1)}
    after = {j.id: i for i, (_, j) in enumerate(rank(replace(snapshot, policy=parse_policy(new)), clock.t), 1)}
    moved = {job for job in before if before[job] != after[job]}
    assert moved == set(waiting.values())  # c jumps ahead of a and b
    assert {p["id"] for p in out["pending"] if p["moved"]} == moved
    assert {p["id"]: (p["before"]["position"], p["after"]["position"]) for p in out["pending"] if p["moved"]} == {
        job: (before[job], after[job]) for job in moved
    }
    assert top not in {p["id"] for p in out["pending"]} and last not in {p["id"] for p in out["pending"]}
    assert out["running"] == []
    assert out["unchanged"] == {"running": 1, "pending": 2}
    assert out["settings"] == [{"path": "queues.c.weight", "before": 1.0, "after": 10.0}]
    assert out["applicable"] is True and out["queues_missing"] == []
    assert svc.store.current_policy() is None  # nothing applied

    same = client.post("/v1/policy/diff", json={"source": yaml.safe_dump(POLICY)}).json()
    assert (same["pending"], same["running"], same["settings"]) == ([], [], [])


def test_a_diff_shows_running_jobs_preemptible_later_and_refuses_a_bad_policy(
    setup: tuple[Service, TestClient, Clock], tmp_path: Path
) -> None:
    svc, client, clock = setup
    job = submit(svc, tmp_path / "never", "a", 3, 2)
    svc.reconciler.reconcile()
    clock.t = T0 + 60
    longer = yaml.safe_load(yaml.safe_dump(POLICY))
    longer["max_lease"] = "8h"
    longer["tiers"][3]["lease"] = "1h"  # the job keeps the lease it was submitted with (0s)…
    longer["thrash"]["min_efficiency"] = 0.5  # …but the efficiency floor stretches it
    longer["preemption"]["restart_overhead"] = "10m"
    out = client.post("/v1/policy/diff", json={"source": yaml.safe_dump(longer)}).json()
    assert [(r["id"], r["before"], r["after"]) for r in out["running"]] == [
        (
            job,
            {"preemptible_from": T0 + 60, "preempted": False},  # now
            {"preemptible_from": pytest.approx(T0 + 1200), "preempted": False},  # 10m startup / (1 - 0.5)
        )
    ]

    bad = yaml.safe_load(yaml.safe_dump(POLICY))
    bad["queues"]["children"][0]["weight"] = -1
    r = client.post("/v1/policy/diff", json={"source": yaml.safe_dump(bad)})
    assert r.status_code == 422
    error = r.json()["error"]
    assert "weight" in error["field"] and error["value"] == -1
    gone = yaml.safe_load(yaml.safe_dump(POLICY))
    gone["queues"]["children"] = gone["queues"]["children"][1:]
    out = client.post("/v1/policy/diff", json={"source": yaml.safe_dump(gone)}).json()
    assert out["applicable"] is False
    assert [(m["id"], m["queue"]) for m in out["queues_missing"]] == [(job, "a")]


def test_a_running_job_is_exported_with_its_work_so_far(
    setup: tuple[Service, TestClient, Clock], tmp_path: Path
) -> None:
    svc, client, clock = setup
    job = submit(svc, tmp_path / "done", "a", 3, 1)
    svc.reconciler.reconcile()
    clock.t = T0 + 42
    text = client.get("/v1/history/export", params={"since": T0}).text  # a running job: its work so far
    rows = list(io.StringIO(text))
    assert len(rows) == 2 and rows[1].startswith(f"{job},{T0!r},1,42.0,a,3,ana,1,1,")


def test_durations_are_the_work_observed_with_their_basis_and_replay_preempts_alike(
    setup: tuple[Service, TestClient, Clock], tmp_path: Path
) -> None:
    svc, client, clock = setup
    done = {name: tmp_path / f"done-{name}" for name in "ABCDH"}

    def at(t: float) -> None:
        clock.t = T0 + t
        svc.reconciler.reconcile()

    # Every job exits 0 on SIGTERM, none through the SDK; A and D declare it.
    a = submit(svc, done["A"], "a", 3, 1, **DECLARED)  # preempted at 100, done at 450
    b = submit(svc, done["B"], "a", 3, 1, traps_sigterm=True)  # preempted at 100, done at 450
    c = submit(svc, done["C"], "b", 3, 1, traps_sigterm=True)  # preempted at 100, cancelled at 450
    d = submit(svc, done["D"], "b", 3, 1, **DECLARED)  # preempted at 100, still running at 500
    at(0)
    clock.t = T0 + 100
    h = submit(svc, done["H"], "b", 2, 4)  # tier 2, the whole node: preempts the four
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
