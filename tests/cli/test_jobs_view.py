"""What `warden queue` and `warden describe` show, at 80 columns, of what the API answers (a
stand-in server answers with the rows; tests/server/test_cli_client.py runs them on real ones)."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from fakeapi import fake_apis
from typer.testing import CliRunner

from warden.cli.main import app
from warden.engine import lifecycle
from warden.engine.model import JobState

runner = CliRunner()


def row(job_id: str, state: str = "RUNNING", **fields: Any) -> dict[str, Any]:
    """A job as `GET /v1/jobs` lists it, its `shown_state` as the server gives it."""
    out: dict[str, Any] = {
        "id": job_id,
        "name": f"job-{job_id}",
        "user": "alice",
        "queue": "vision",
        "tier": 3,
        "state": state,
        "replicas": 1,
        "gpus": 2,
        "gpus_per_replica": 2,
        "submit_at": time.time() - 600,
        "wait_s": 30.0,
        "position": None,
        "reason": None,
        "cancel_requested": False,
        "nodes": [],
        "started_at": None,
        "kill_at": None,
        "lease_end_at": None,
        "efficiency": None,
        "expected_start": None,
    }
    out.update(fields)
    out.setdefault(
        "shown_state",
        lifecycle.shown(JobState(state), cancel_requested=out["cancel_requested"], stopping=out["kill_at"] is not None),
    )
    return out


def detail(job: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A job as `GET /v1/jobs/{id}` answers it."""
    out = {
        **job,
        "command": ["python", "train.py"],
        "placement": "any",
        "lease_s": 2700.0,
        "grace_s": 120.0,
        "sort_key": None,
        "warnings": [],
        "preemption_cycle": None,
        "attempts": [],
        "preemptions": [],
        "events": [],
    }
    out.update(fields)
    return out


def warden(body: Any, *args: str) -> str:
    """`warden ARGS` against a stand-in answering `body`, at 80 columns (which all but a
    `--wide` listing fit)."""
    with fake_apis((200, body)) as [api]:
        result = runner.invoke(app, [*args, "--url", api.url, "--token", "t"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    if "--wide" not in args:
        assert all(len(line) <= 80 for line in result.output.splitlines()), result.output
    return result.output


def line_of(text: str, job_id: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"{job_id} "))


def test_a_job_in_its_grace_shows_its_terminating_state_and_sigkill_countdown() -> None:
    now = time.time()
    rows = [
        row("1", cancel_requested=True, kill_at=now + 42),
        row("2", "PREEMPTING", kill_at=now + 300),
        row("3", kill_at=now + 90),  # SIGTERM for another cause
        row("4", cancel_requested=True),  # marked, not signalled yet
        row("5"),
    ]
    text = warden(rows, "queue")
    assert line_of(text, "1").split()[4:5] == ["CANCELLING"] and "SIGKILL in 4" in line_of(text, "1")
    assert "PREEMPTING" in line_of(text, "2") and "SIGKILL in 5m" in line_of(text, "2")
    assert "STOPPING" in line_of(text, "3") and "SIGKILL in 1m" in line_of(text, "3")
    assert "CANCELLING" in line_of(text, "4") and "SIGKILL" not in line_of(text, "4")
    assert line_of(text, "5").split()[4] == "RUNNING"


def test_describe_says_a_cancel_stops_the_job_and_when_sigkill_comes() -> None:
    now = time.time()
    text = warden(detail(row("1", cancel_requested=True, kill_at=now + 42)), "describe", "1")
    assert "CANCELLING (RUNNING)" in text
    flat = " ".join(text.split())
    assert "stopping: a cancel was requested; it has until SIGKILL at" in flat and "(in 4" in flat
    marked = " ".join(warden(detail(row("1", cancel_requested=True)), "describe", "1").split())
    assert "the leading server sends SIGTERM at its next pass" in marked
    preempted = " ".join(warden(detail(row("2", "PREEMPTING", kill_at=now + 300)), "describe", "2").split())
    assert "stopping: it was preempted" in preempted and re.search(r"\(in (4m5\ds|5m)\)", preempted)


@pytest.mark.parametrize("state", ["SUCCEEDED", "PENDING"])
def test_a_job_that_holds_nothing_is_never_shown_stopping(state: str) -> None:
    now = time.time()
    text = warden([row("1", state, cancel_requested=True, kill_at=now - 5)], "queue")
    assert line_of(text, "1").split()[4] == state and "SIGKILL" not in text


def test_wide_shows_how_long_a_job_has_run_its_lease_end_and_nodes() -> None:
    now = time.time()
    rows = [
        row("1", started_at=now - 3725, lease_end_at=now + 720, nodes=["node-0", "node-1"], efficiency=0.93),
        row("2", tier=1, started_at=now - 60, lease_end_at=None, nodes=["node-2"]),
        row("3", "PENDING", reason={"code": "QuotaExceeded", "message": "…"}, position=1),
    ]
    text = warden(rows, "queue", "--wide")
    header = text.splitlines()[0].split()
    assert header[-4:] == ["ELAPSED", "LEASE-END", "NODES", "REASON"], header
    assert "1h2m" in line_of(text, "1") and "in 12m" in line_of(text, "1") and "node-0,node-1" in text
    assert "never" in line_of(text, "2") and "node-2" in line_of(text, "2")
    assert "ELAPSED" not in warden(rows, "queue")  # not in the default columns


def test_describe_a_running_job_says_where_since_when_its_lease_end_and_eta() -> None:
    now = time.time()
    job = row("1", started_at=now - 3725, lease_end_at=now + 720, nodes=["node-0", "node-1"], efficiency=0.93)
    flat = " ".join(warden(detail(job), "describe", "1").split())
    assert "running: since" in flat and "on node-0, node-1" in flat
    # The CLI renders a moment after `now` (a second or more on a loaded machine): "in 11m59s".
    assert "its lease ends at" in flat and re.search(r"\(in 1[12]m(\d+s)?\): preemptible from then", flat)
    assert "η 0.93" in flat
    over = " ".join(warden(detail({**job, "lease_end_at": now - 60}), "describe", "1").split())
    assert "its lease ended at" in over and re.search(r"\(1m(\d+s)? ago\): preemptible", over)
    never = " ".join(warden(detail(row("2", tier=1, started_at=now - 60)), "describe", "2").split())
    assert "never preempted (its tier is not preemptible)" in never


def test_describe_says_when_a_finished_jobs_command_was_dropped() -> None:
    dropped = detail(row("4", "SUCCEEDED"), command=[], command_expired_at=time.time() - 120)
    flat = " ".join(warden(dropped, "describe", "4").split())
    assert "command: dropped at" in flat
    assert re.search(r"\(2m(\d+s)? ago\) to make room \(limits.max_stored_bytes_per_user\)", flat)
    kept = " ".join(warden(detail(row("5", "SUCCEEDED"), command_expired_at=None), "describe", "5").split())
    assert "command: python train.py" in kept


def test_nodes_say_which_gpus_work_outside_warden_holds_where_the_executor_knows() -> None:
    from warden.cli.jobs import _node_state

    assert _node_state({"down": None, "gpus_foreign": 2, "gpu_indices_foreign": [0, 1]}) == (
        "up; 2 GPU(s) (0, 1) held outside warden"
    )
    assert (
        _node_state({"down": None, "gpus_foreign": 2, "gpu_indices_foreign": []}) == "up; 2 GPU(s) held outside warden"
    )
    assert _node_state({"down": "DRAIN (disk)", "gpus_foreign": 0}) == "down: DRAIN (disk)"
