"""Time limits end to end (issue 34): a real server process, real job processes and real
signals. A job past its limit gets SIGTERM, its grace and SIGKILL, and ends TIMEOUT (never
FAILED, never requeued) with events naming the limit; a tier's default applies to a job
submitted without one and its maximum refuses one above it; a requeued job's next attempt gets
the whole limit from its own start."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from serverproc import Server, cli, server_fixture, submit, until_state, wait_for

LIMIT, GRACE = 2.0, 2.0
LATE = 3.0
"""How late after its moment a pass may act on a loaded machine (passes run once a second)."""
POLICY = """\
min_grace: 1s
thrash: {min_efficiency: 0}
preemption: {restart_overhead: 0s, checkpoint_overhead: 0s, only_if_it_pays: false}
tiers:
  3: {lease: 1s, grace: 2s, max_time_limit: 1h}
  4: {grace: 2s, time_limit: 2s}
queues:
  name: cluster
  children:
    - {name: vision, nominal: {gpu: 2}}
    - {name: language, nominal: {gpu: 2}}
"""

# Notes each attempt it starts and each SIGTERM; then `ignore`s it (only SIGKILL ends it) or
# `save`s (a short pause) and exits 0 inside its grace.
JOB = """\
import os, signal, sys, time
out, on_sigterm = sys.argv[1], sys.argv[2]
def sigterm(*_):
    open(out + ".sigterm", "a").write(f"{time.time()}\\n")
    if on_sigterm == "save":
        time.sleep(0.3)
        sys.exit(0)
signal.signal(signal.SIGTERM, sigterm)
open(out + ".started", "a").write(os.environ["WARDEN_ATTEMPT"] + "\\n")
while True:
    time.sleep(0.05)
"""


def job_command(tmp_path: Path, on_sigterm: str) -> list[str]:
    """The command of a JOB that writes its notes as `tmp_path/job.*`."""
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return [sys.executable, str(script), str(tmp_path / "job"), on_sigterm]


server = server_fixture(POLICY)


def timed_out(c: httpx.Client, job: str) -> dict[str, Any]:
    """The job once it ended TIMEOUT, checked to have run out its limit: SIGTERM at the limit
    (never before, at most a pass late), and its end by SIGTERM + its grace."""
    done = until_state(c, job, "TIMEOUT", "SUCCEEDED", "FAILED", "CANCELLED", timeout=30)
    assert done["state"] == "TIMEOUT", done["events"]
    a = done["attempts"][-1]
    assert a["reason"] == "timeout" and a["timed_out"] is True
    assert LIMIT <= a["sigterm_at"] - a["started_at"] <= LIMIT + LATE
    assert a["kill_at"] - a["sigterm_at"] == pytest.approx(GRACE, abs=0.1)
    assert a["ended_at"] <= a["kill_at"] + 1.0
    return done


def said(job: dict[str, Any]) -> list[tuple[str | None, str, str]]:
    return [(e["from"], e["to"], e["reason"]) for e in job["events"]]


def test_sleep_past_its_limit_gets_sigterm_and_ends_timeout(server: Server, tmp_path: Path) -> None:
    with server.client() as c:
        job = submit(c, queue="vision", tier=3, time_limit="2s", command=["sleep", "60"])
        done = timed_out(c, job)
        assert done["attempts"][0]["exit_codes"] == [-15] and done["exit_code"] == -15
        assert done["time_limit_s"] == LIMIT
        events = said(done)
        states = ["PENDING", "ADMITTED", "STARTING", "RUNNING", "RUNNING", "RUNNING", "TIMEOUT"]
        assert [to for _, to, _ in events] == states
        assert events[4] == ("RUNNING", "RUNNING", "ran out its time limit of 2s: it ends TIMEOUT")
        _, _, signalled = events[5]
        assert signalled.startswith("ran out its time limit of 2s: SIGTERM; grace 2s, SIGKILL at "), signalled
        assert events[6] == ("RUNNING", "TIMEOUT", "ran out its time limit of 2s: exited -15 after SIGTERM")
        assert done["events"][4]["details"]["time_limit_s"] == done["events"][5]["details"]["time_limit_s"] == LIMIT

        # Every listing of states knows TIMEOUT: the API's filter, `warden queue --state`, the export.
        assert [j["id"] for j in c.get("/v1/jobs", params={"state": "TIMEOUT"}).json()] == [job]
        assert c.get("/v1/jobs").json() == []  # finished: not among the unfinished
        listed = cli(server.url, "queue", "--state", "TIMEOUT", "--json", check=True).stdout
        assert [(r["id"], r["state"]) for r in json.loads(listed)] == [(job, "TIMEOUT")]
        export = c.get("/v1/history/export")
        assert export.status_code == 200, export.text
        assert [row["job_id"] for row in csv.DictReader(io.StringIO(export.text))] == [job]


@pytest.mark.parametrize(
    ("on_sigterm", "codes", "ending"),
    [
        ("ignore", [-9], "exited -9 after SIGTERM and SIGKILL at the deadline"),  # SIGKILL at its grace's end
        ("save", [0], "exited 0 after SIGTERM"),  # it leaves by itself inside its grace
    ],
)
def test_a_job_ends_timeout_whether_sigkill_ends_it_or_it_leaves_in_its_grace(
    server: Server, tmp_path: Path, on_sigterm: str, codes: list[int], ending: str
) -> None:
    with server.client() as c:
        job = submit(c, queue="vision", tier=3, time_limit="2s", command=job_command(tmp_path, on_sigterm))
        done = timed_out(c, job)
        a = done["attempts"][0]
        assert a["exit_codes"] == codes and done["exit_code"] == codes[0]
        assert said(done)[-1] == ("RUNNING", "TIMEOUT", f"ran out its time limit of 2s: {ending}")
        assert (tmp_path / "job.sigterm").exists()  # SIGTERM came first, then its grace
        assert (tmp_path / "job.started").read_text().split() == ["1"]  # never requeued
        if on_sigterm == "ignore":
            assert a["ended_at"] - a["kill_at"] < 1.0
        else:
            assert a["ended_at"] < a["kill_at"]


def test_a_tier_s_default_applies_and_its_maximum_refuses(server: Server, tmp_path: Path) -> None:
    with server.client() as c:
        # tier 4 sets time_limit: 2s; tier 3 only max_time_limit: 1h, its default then
        short = submit(c, queue="vision", tier=4, command=["sleep", "60"])
        no_default = submit(c, queue="vision", tier=3, command=["true"])
        assert c.get(f"/v1/jobs/{no_default}").json()["time_limit_s"] == 3600.0
        assert c.get(f"/v1/jobs/{short}").json()["time_limit_s"] == LIMIT
        timed_out(c, short)
        until_state(c, no_default, "SUCCEEDED")

        before = len(c.get("/v1/jobs", params={"all": True}).json())
        body = {"queue": "vision", "tier": 3, "time_limit": "2h", "command": ["true"], "workdir": str(tmp_path)}
        refused = c.post("/v1/jobs", json=body)
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert (error["field"], error["value"]) == ("time_limit", "2h")
        assert error["message"] == "is above tier 3's maximum of 1h (the policy's tiers.3.max_time_limit)"
        assert c.post("/v1/jobs", params={"dry_run": True}, json=body).status_code == 422
        assert submit(c, queue="vision", tier=3, time_limit="1h", command=["true"])  # the maximum itself is fine
        assert len(c.get("/v1/jobs", params={"all": True}).json()) == before + 1

    done = cli(server.url, "submit", "-q", "vision", "-t", "3", "--time-limit", "2h", "--", "true")
    assert done.returncode == 2 and done.stdout == ""
    assert "time_limit: is above tier 3's maximum of 1h (the policy's tiers.3.max_time_limit) (got '2h')" in done.stderr


def test_a_requeued_job_gets_its_whole_limit_again_from_its_next_attempt_s_start(
    server: Server, tmp_path: Path
) -> None:
    """Slurm counts each run of a requeued job from its start: so does warden."""
    limit = 4.0
    with server.client() as c:
        low = submit(c, queue="vision", tier=3, gpus=4, time_limit="4s", command=job_command(tmp_path, "save"))
        until_state(c, low, "RUNNING")
        wait_for(lambda: (tmp_path / "job.started").exists(), what="the first attempt to start")
        high = submit(c, queue="language", tier=1, gpus=2, command=["sleep", "0.1"])
        until_state(c, high, "SUCCEEDED", timeout=30)
        done = until_state(c, low, "TIMEOUT", "SUCCEEDED", "FAILED", "CANCELLED", timeout=30)
        assert done["state"] == "TIMEOUT", done["events"]
        first, second = done["attempts"]
        assert first["reason"] == "preempted" and first["preempted_for"] == high and first["timed_out"] is False
        assert first["sigterm_at"] - first["started_at"] < limit  # preempted inside its limit
        assert second["reason"] == "timeout" and second["timed_out"] is True
        # the second attempt ran its whole limit, counted from its own start, not the first's
        assert limit <= second["sigterm_at"] - second["started_at"] <= limit + LATE
        assert second["sigterm_at"] - first["started_at"] > limit + 1.0  # its lease, 1 s, ran before the preemption
        assert (tmp_path / "job.started").read_text().split() == ["1", "2"]
        states = [to for _, to, _ in said(done)]
        assert states[4:7] == ["PREEMPTING", "REQUEUED", "PENDING"] and states[-1] == "TIMEOUT"
