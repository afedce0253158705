"""Containment end to end with a real server process: a job that reaches its time limit while
no server runs is stopped by its supervisor, and the server that comes back records it
TIMEOUT as if it had stopped it itself. (Outside signals and stops: test_outside_warden.py;
cgroups, bounds and devices: tests/executors/test_local.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from serverproc import Server, server_fixture, submit, until_state, wait_for

from warden.executors import cgroups
from warden.executors.shim import TIME_LIMIT_SLACK_S

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
