"""Containment end to end with a real server process: a job that reaches its time limit while
no server runs is stopped by its supervisor, and the server that comes back records it
TIMEOUT as if it had stopped it itself; a job past the policy's memory bound fails, and says
why. (Outside signals and stops: test_outside_warden.py; cgroups, bounds and devices:
tests/executors/test_local.py.)"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from serverproc import Server, end_everything, server_fixture, submit, until_state, wait_for

from warden.engine.model import JobState, Node
from warden.engine.policy import parse_policy
from warden.executors import cgroups
from warden.executors.local import LocalExecutor
from warden.executors.shim import TIME_LIMIT_SLACK_S
from warden.server.service import Service
from warden.store import Store

POLICY = """\
min_grace: 1s
thrash: {min_efficiency: 0}
preemption: {restart_overhead: 0s, checkpoint_overhead: 0s, only_if_it_pays: false}
tiers:
  3: {lease: 1s, grace: 1s}
queues:
  name: cluster
  children:
    - {name: vision, nominal: {gpu: 2}}
"""

server = server_fixture(POLICY)
LIMIT = 3.0
"""Long enough for the test to kill the server before its own pass would stop the job."""


def test_the_time_limit_is_kept_while_no_server_runs(server: Server, tmp_path: Path) -> None:
    assert server.log is not None
    contained = isinstance(cgroups.find_layout("warden/local"), cgroups.Layout)
    said = "containment: each replica in a cgroup of its own" if contained else "WARNING: containment: no cgroups"
    assert said in server.log.read_text()  # how its jobs are contained, said at start
    with server.client() as c:
        job = submit(c, queue="vision", tier=3, time_limit="3s", command=["sleep", "60"])
        started = until_state(c, job, "RUNNING")["attempts"][0]["started_at"]
    server.kill9()
    exit_path = server.state_dir / "jobs" / job / "attempt-1" / "rank-0.exit.json"
    wait_for(exit_path.exists, timeout=15, what="the shim's exit record")
    record = json.loads(exit_path.read_text())
    assert record["exit_code"] == -15 and record["limit_sigterm_at"] is not None
    assert LIMIT + TIME_LIMIT_SLACK_S - 1.0 <= record["limit_sigterm_at"] - started <= LIMIT + TIME_LIMIT_SLACK_S + 1.0
    server.start()
    with server.client() as c:
        done = until_state(c, job, "TIMEOUT", "SUCCEEDED", "FAILED", "CANCELLED")
        assert done["state"] == "TIMEOUT", done["events"]
        a = done["attempts"][0]
        assert a["reason"] == "timeout" and a["timed_out"] is True and a["exit_codes"] == [-15]
        assert a["sigterm_at"] == pytest.approx(record["limit_sigterm_at"])
        reasons = [e["reason"] for e in done["events"]]
        assert "ran out its time limit of 3s: SIGTERM from its supervisor, no server running then" in reasons
        assert reasons[-1] == "ran out its time limit of 3s: exited -15 after SIGTERM"


HOG = "x = [b'x' * (8 << 20) for _ in range(40)]"  # 320 MiB, each page written


@pytest.mark.skipif(
    not isinstance(cgroups.find_layout("warden/local"), cgroups.Layout), reason="no cgroups on this machine"
)
def test_a_job_past_its_memory_bound_fails_and_says_why(tmp_path: Path) -> None:
    """The policy's containment.default_memory bounds a job that asked for no memory: the
    kernel's OOM killer kills it inside its cgroup, and the job FAILED (its own doing, never an
    eviction) with the OOM kill in its exit's event."""
    store = Store.open(f"sqlite:///{tmp_path / 'warden.db'}")
    (tmp_path / "state").mkdir()
    policy = parse_policy(
        {"containment": {"default_memory": 48}, "queues": {"name": "cluster", "children": [{"name": "vision"}]}}
    )
    svc = Service(store, LocalExecutor(), (Node("node-0", 1, 16_000, 64_000),), policy, tmp_path / "state")
    try:
        job = store.submit(
            name="", user="ana", queue="vision", tier=3, command=[sys.executable, "-c", HOG], workdir="/",
            actor="ana", now=time.time(), gpus=1,
        )  # fmt: skip

        def ended() -> bool:
            svc.reconciler.reconcile()
            got = store.get(job)
            return got is not None and got.state.terminal

        wait_for(ended, what="the job's end")
        got = store.get(job)
        assert got is not None and got.state is JobState.FAILED
        [attempt] = store.attempts(job)
        assert list(attempt.exit_codes or ()) == [-9]
        assert any("OOM killer" in e.reason for e in store.events(job)), [e.reason for e in store.events(job)]
    finally:
        end_everything(svc)
        store.close()
