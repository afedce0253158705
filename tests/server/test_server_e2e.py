"""The control plane end to end: a real server process on a free port with fake GPUs, real job
processes and real signals, SQLite in a temporary state directory."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest
from serverproc import Server, kill_leftovers, server_fixture, shared_server_fixture, submit, until_state, wait_for

# Short leases and graces so the tests run in seconds; no efficiency floor and no assumed
# restart or checkpoint overhead (together they would stretch a 1 s lease to a minute).
POLICY = """\
min_grace: 2s
thrash: {min_efficiency: 0}
preemption: {restart_overhead: 0s, checkpoint_overhead: 0s}
tiers:
  1: {name: production-inference, preemptible: false, grace: 2s, requires_approval: true, scope: cluster}
  2: {name: pretraining, lease: 1h, grace: 2s, requires_approval: true}
  3: {name: experimentation, lease: 1s, grace: 2s}
  4: {name: opportunistic, lease: 0s, grace: 2s, charged: false}
queues:
  name: cluster
  children:
    - {name: vision, nominal: {gpu: 2}}
    - {name: language, nominal: {gpu: 2}}
"""

# A job that reports SIGTERM, saves (a marker) and exits 0; prints its environment first.
TRAINER = """\
import json, os, signal, sys, time
out = sys.argv[1]
def stop(*_):
    with open(out + ".sigterm", "a") as f:
        f.write(f"{time.time()}\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print(json.dumps({k: v for k, v in os.environ.items() if k.startswith(("WARDEN_", "CUDA_", "RANK", "WORLD_", "MASTER_", "LOCAL_RANK"))}), flush=True)
with open(out + ".started", "a") as f:
    f.write(f"{os.environ['WARDEN_ATTEMPT']}\\n")
time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 3600)
"""

STUBBORN = """\
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: open(sys.argv[1] + ".sigterm", "a").write(f"{time.time()}\\n"))
open(sys.argv[1] + ".started", "a").write("1\\n")
while True:
    time.sleep(0.05)
"""


@pytest.fixture
def scripts(tmp_path: Path) -> dict[str, Path]:
    paths = {}
    for name, text in (("trainer", TRAINER), ("stubborn", STUBBORN)):
        p = tmp_path / f"{name}.py"
        p.write_text(textwrap.dedent(text))
        paths[name] = p
    return paths


server = server_fixture(POLICY)
shared_server = shared_server_fixture(POLICY)
"""For the tests whose requests are refused: they change nothing."""


def state(c: httpx.Client, job_id: str) -> str:
    return c.get(f"/v1/jobs/{job_id}").json()["state"]


def py(script: Path, *args: Any) -> list[str]:
    return [sys.executable, str(script), *map(str, args)]


# ------------------------------------------------------------------------------ running jobs


def test_a_job_runs_to_completion_with_its_gpus_environment_and_logs(
    server: Server, scripts: dict[str, Path], tmp_path: Path
) -> None:
    with server.client() as c:
        job = submit(c, queue="vision", tier=3, gpus=2, command=py(scripts["trainer"], tmp_path / "a", 0.2))
        done = until_state(c, job, "SUCCEEDED")
        assert done["exit_code"] == 0
        logs = c.get(f"/v1/jobs/{job}/logs").json()
        env = json.loads(logs["text"].splitlines()[0])
        assert env["WARDEN_JOB_ID"] == job and env["WARDEN_ATTEMPT"] == "1"
        assert len(env["CUDA_VISIBLE_DEVICES"].split(",")) == 2 and env["WARDEN_GRACE_SECONDS"] in ("2", "2.0")
        states = [e["to"] for e in c.get(f"/v1/jobs/{job}").json()["events"]]
        assert states == ["PENDING", "ADMITTED", "STARTING", "RUNNING", "SUCCEEDED"]


def test_a_failing_job_records_its_exit_code(server: Server, tmp_path: Path) -> None:
    with server.client() as c:
        job = submit(c, queue="vision", tier=3, command=[sys.executable, "-c", "import sys; sys.exit(3)"])
        assert until_state(c, job, "FAILED")["exit_code"] == 3


def test_a_tier1_job_preempts_a_tier3_job_after_its_lease(
    server: Server, scripts: dict[str, Path], tmp_path: Path
) -> None:
    with server.client() as c:
        low = submit(c, queue="vision", tier=3, gpus=4, command=py(scripts["trainer"], tmp_path / "low"))
        until_state(c, low, "RUNNING")
        high = submit(c, queue="language", tier=1, gpus=2, command=py(scripts["trainer"], tmp_path / "high", 0.1))
        until_state(c, high, "SUCCEEDED", timeout=30)
        assert (tmp_path / "low.sigterm").exists()  # it saw SIGTERM and left on its own
        detail = wait_for(lambda: (j := c.get(f"/v1/jobs/{low}").json())["attempts"][0]["state"] == "exited" and j)
        first = detail["attempts"][0]
        assert first["reason"] == "preempted" and first["exit_codes"] == [0] and first["preempted_for"] == high
        states = [e["to"] for e in detail["events"]]
        assert states[:7] == ["PENDING", "ADMITTED", "STARTING", "RUNNING", "PREEMPTING", "REQUEUED", "PENDING"]
        until_state(c, low, "RUNNING")  # requeued, runs again: a second attempt
        wait_for(lambda: (tmp_path / "low.started").read_text().split() == ["1", "2"])


def test_a_job_that_ignores_sigterm_is_killed_at_the_deadline(
    server: Server, scripts: dict[str, Path], tmp_path: Path
) -> None:
    with server.client() as c:
        low = submit(c, queue="vision", tier=3, gpus=4, command=py(scripts["stubborn"], tmp_path / "low"))
        until_state(c, low, "RUNNING")
        wait_for(lambda: (tmp_path / "low.started").exists())
        high = submit(c, queue="language", tier=1, gpus=1, command=py(scripts["trainer"], tmp_path / "high", 0.1))
        detail = wait_for(
            lambda: (j := c.get(f"/v1/jobs/{low}").json())["attempts"][0]["state"] == "exited" and j, timeout=30
        )
        first = detail["attempts"][0]
        assert first["reason"] == "killed" and first["exit_codes"] == [-9]
        assert (tmp_path / "low.sigterm").exists()
        assert first["kill_at"] - first["sigterm_at"] == pytest.approx(2.0, abs=0.05)
        assert first["ended_at"] - first["kill_at"] < 1.0
        until_state(c, high, "SUCCEEDED", timeout=30)


def test_a_job_inside_its_lease_is_not_preempted(tmp_path: Path, scripts: dict[str, Path]) -> None:
    policy = tmp_path / "lease.yaml"
    policy.write_text(POLICY.replace("lease: 1s", "lease: 1h"))
    s = Server(tmp_path / "state", policy=policy).start()
    try:
        with s.client() as c:
            low = submit(c, queue="vision", tier=3, gpus=4, command=py(scripts["trainer"], tmp_path / "low"))
            until_state(c, low, "RUNNING")
            high = submit(c, queue="language", tier=1, gpus=2, command=py(scripts["trainer"], tmp_path / "h", 0.1))
            j = wait_for(lambda: (x := c.get(f"/v1/jobs/{high}").json()).get("reason") and x)
            assert j["reason"]["code"] == "WaitingForLease" and j["state"] == "PENDING"
            assert state(c, low) == "RUNNING" and not (tmp_path / "low.sigterm").exists()
    finally:
        s.stop()
        kill_leftovers(tmp_path)


def test_a_gang_is_signalled_at_the_same_instant(server: Server, scripts: dict[str, Path], tmp_path: Path) -> None:
    with server.client() as c:
        gang = submit(c, queue="vision", tier=3, gpus=2, replicas=2, command=py(scripts["trainer"], tmp_path / "g"))
        until_state(c, gang, "RUNNING")
        wait_for(lambda: (tmp_path / "g.started").exists() and len((tmp_path / "g.started").read_text().split()) == 2)
        r = c.post(f"/v1/jobs/{gang}/cancel")
        assert r.status_code == 202
        until_state(c, gang, "CANCELLED")
        stamps = [float(x) for x in (tmp_path / "g.sigterm").read_text().split()]
        assert len(stamps) == 2 and abs(stamps[0] - stamps[1]) < 0.1


# ------------------------------------------------------------------------------ governance


def _token(c: httpx.Client, user: str, queues: list[str], role: str = "user") -> str:
    r = c.post("/v1/tokens", json={"user": user, "role": role, "queues": queues})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def test_tier2_from_a_user_waits_for_an_admins_approval(
    server: Server, scripts: dict[str, Path], tmp_path: Path
) -> None:
    with server.client() as admin:
        alice = _token(admin, "alice", ["vision"])
        with server.client(alice) as c:
            job = submit(c, queue="vision", tier=2, command=py(scripts["trainer"], tmp_path / "t2", 0.1))
            assert state(c, job) == "AWAITING_APPROVAL"
            j = wait_for(lambda: (x := c.get(f"/v1/jobs/{job}").json()).get("reason") and x)
            assert j["reason"]["code"] == "AwaitingApproval"
            assert c.post(f"/v1/jobs/{job}/approve").status_code == 403
        assert admin.post(f"/v1/jobs/{job}/approve").status_code == 200
        until_state(admin, job, "SUCCEEDED")
        actions = [a["action"] for a in admin.get("/v1/audit").json()]
        assert "approve" in actions and "token.create" in actions


def test_who_may_do_what(server: Server, tmp_path: Path) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    with server.client() as admin:
        alice, bob = _token(admin, "alice", ["vision"]), _token(admin, "bob", ["language"])
        with (
            server.client(alice) as a,
            server.client(bob) as b,
            server.client(None) as anon,
            server.client("not-a-token") as forged,
        ):
            mine = submit(a, queue="vision", tier=4, gpus=0, command=sleeper)
            assert a.post("/v1/jobs", json={"queue": "language", "tier": 3, "command": sleeper}).status_code == 403
            assert b.post(f"/v1/jobs/{mine}/cancel").status_code == 403
            assert a.put("/v1/policy", json={"source": POLICY}).status_code == 403
            assert a.post("/v1/tokens", json={"user": "eve"}).status_code == 403
            assert a.get("/v1/audit").status_code == 403
            assert anon.get("/v1/jobs").status_code == 401 and forged.get("/v1/jobs").status_code == 401
            assert anon.post("/v1/jobs", json={"queue": "vision", "tier": 3, "command": sleeper}).status_code == 401
            assert a.post(f"/v1/jobs/{mine}/cancel").status_code == 202
            theirs = submit(b, queue="language", tier=4, gpus=0, command=sleeper)
        assert admin.post(f"/v1/jobs/{theirs}/cancel").status_code == 202
        assert admin.put("/v1/policy", json={"source": POLICY + "# v2\n"}).json()["version"] >= 2
        until_state(admin, mine, "CANCELLED")
        until_state(admin, theirs, "CANCELLED")


@pytest.mark.parametrize(
    "body, field, status",
    [
        ({"queue": "nope", "tier": 3}, "queue", 422),
        ({"queue": "vision", "tier": 0}, "tier", 422),
        ({"queue": "vision", "tier": 5}, "tier", 422),
        ({"queue": "vision", "tier": 3, "gpus": 99}, "gpus", 422),
        ({"queue": "vision", "tier": 3, "grace": "1s"}, "grace", 422),
        ({"queue": "vision", "tier": 3, "colour": "red"}, "colour", 422),
        ({"queue": "vision", "tier": 3, "command": []}, "command", 422),
    ],
)
def test_bad_submissions_are_refused_by_field_and_change_nothing(
    shared_server: Server, body: dict[str, Any], field: str, status: int
) -> None:
    body = {"command": ["true"], **body}
    with shared_server.client() as c:
        before = c.get("/v1/jobs", params={"all": "true"}).json()
        r = c.post("/v1/jobs", json=body)
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert err["field"] == field and err["message"]
        assert c.get("/v1/jobs", params={"all": "true"}).json() == before


def test_malformed_json_is_a_400(shared_server: Server) -> None:
    with shared_server.client() as c:
        r = c.post("/v1/jobs", content=b"{not json", headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and "malformed JSON" in r.json()["error"]["message"]


# ------------------------------------------------------------------------------ restart


def test_the_server_killed_mid_run_restarts_and_readopts(tmp_path: Path, scripts: dict[str, Path]) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    s = Server(tmp_path / "state", policy=policy).start()
    try:
        with s.client() as c:
            # Runs until the test says go: the restart happens while it certainly runs.
            go = tmp_path / "go"
            code = (
                f"import os, time; open({str(tmp_path / 'r.started')!r}, 'a').write('1\\n')\n"
                f"while not os.path.exists({str(go)!r}): time.sleep(0.05)"
            )
            running = submit(c, queue="vision", tier=3, gpus=4, command=[sys.executable, "-c", code])
            until_state(c, running, "RUNNING")
            # Same queue and tier: it cannot preempt the running job, it must wait for its GPUs.
            waiting = submit(c, queue="vision", tier=3, gpus=2, command=py(scripts["trainer"], tmp_path / "w", 0.1))
        s.kill9()
        s.start()
        with s.client() as c:
            assert state(c, running) == "RUNNING" and state(c, waiting) == "PENDING"
            go.touch()
            until_state(c, running, "SUCCEEDED", timeout=30)
            assert (tmp_path / "r.started").read_text().split() == ["1"]  # never started twice
            until_state(c, waiting, "SUCCEEDED", timeout=30)
            detail = c.get(f"/v1/jobs/{waiting}").json()
            started = detail["attempts"][0]["started_at"]
            ended = c.get(f"/v1/jobs/{running}").json()["attempts"][0]["ended_at"]
            assert started >= ended  # the 4 GPUs were never given to both
    finally:
        s.stop()
        kill_leftovers(tmp_path)


def test_metrics_are_prometheus_text_without_per_job_labels(server: Server, tmp_path: Path) -> None:
    with server.client() as c:
        job = submit(c, queue="vision", tier=3, command=[sys.executable, "-c", "pass"])
        until_state(c, job, "SUCCEEDED")
        text = httpx.get(f"{server.url}/metrics", verify=server.tls()).text
    assert "warden_gpus 4.0" in text
    assert 'warden_queue_wait_seconds_bucket{le="1.0",queue="vision",tier="3"}' in text
    assert "# TYPE warden_preemptions_total counter" in text
    assert f'"{job}"' not in text and "job=" not in text
