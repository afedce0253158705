"""Lost work that tells what it rests on, on a real server process with fake GPUs and real
signals: two trainers without the SDK keep the contract (tests/server/plaintrainer.py: they
trap SIGTERM, save by temp file, fsync and rename, and exit 0 in their grace). Preempted, the
one submitted with `saves_on_sigterm` loses nothing and says so; the other is charged the work
since its start, described as assumed. A cancel is no preemption: a cancelled job, and one cancelled in the
grace of its preemption, are charged no lost work in the metrics, the views or the history's
totals, and `describe` says why each figure is what it is."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from plaintrainer import PATH as TRAINER
from plaintrainer import attempts_started
from serverproc import Server, cli, server_fixture, submit, until_state, wait_for

from warden.store import Store

POLICY = """\
min_grace: 2s
thrash: {min_efficiency: 0, max_preemptions: {per: 24h, count: 100}}
preemption: {restart_overhead: 0s, checkpoint_overhead: 0s}
tiers:
  1: {name: production-inference, preemptible: false, grace: 10s, requires_approval: true, scope: cluster}
  3: {name: experimentation, lease: 0s, grace: 10s}
queues:
  name: cluster
  children:
    - {name: vision}
    - {name: language}
    - {name: serving}
"""

DECLARED_WHY = "none: exited 0 within its grace after SIGTERM (declared saves-on-sigterm)"
ASSUMED_WHY = (
    "assumed: no checkpoint was reported and the job did not declare --saves-on-sigterm; counted from its last start"
)
CANCELLED_WHY = "none: the job was cancelled; a cancel is no preemption, and nothing of this attempt runs again"


server = server_fixture(POLICY)


def job(c: httpx.Client, job_id: str) -> dict[str, Any]:
    return dict(c.get(f"/v1/jobs/{job_id}").json())


def exited(c: httpx.Client, job_id: str, number: int) -> dict[str, Any]:
    """The job once its attempt `number` has ended."""
    return wait_for(
        lambda: len((j := job(c, job_id))["attempts"]) >= number and j["attempts"][number - 1]["ended_at"] and j,
        what=f"attempt {number} of job {job_id} to end",
    )


def running(c: httpx.Client, job_id: str, marks: Path, number: int) -> None:
    """Wait until attempt `number` of the job runs its loop."""
    until_state(c, job_id, "RUNNING")
    wait_for(lambda: attempts_started(marks) == number, what=f"attempt {number} of job {job_id} to start")


def lost_metric(c: httpx.Client, queue: str) -> float | None:
    m = re.search(rf'^warden_lost_work_gpu_seconds_total\{{queue="{queue}"\}} (\S+)$', c.get("/metrics").text, re.M)
    return None if m is None else float(m.group(1))


def loss(attempt: dict[str, Any]) -> tuple[Any, Any, Any]:
    return attempt["lost_work_gpu_s"], attempt["lost_work_basis"], attempt["lost_work_why"]


def test_a_declared_save_loses_nothing_an_undeclared_one_is_assumed_and_a_cancel_is_charged_nothing(
    server: Server, tmp_path: Path
) -> None:
    d_marks, p_marks = tmp_path / "declared", tmp_path / "plain"
    with server.client() as c:
        declared = submit(
            c,
            queue="vision",
            tier=3,
            gpus=2,
            saves_on_sigterm=True,
            command=[sys.executable, str(TRAINER), str(d_marks)],
        )
        plain = submit(c, queue="language", tier=3, gpus=2, command=[sys.executable, str(TRAINER), str(p_marks)])
        running(c, declared, d_marks, 1)
        running(c, plain, p_marks, 1)
        time.sleep(0.5)  # some progress, which only a save keeps

        high = submit(c, queue="serving", tier=1, gpus=4, command=["sleep", "3600"])
        d, p = exited(c, declared, 1), exited(c, plain, 1)
        d1, p1 = d["attempts"][0], p["attempts"][0]
        assert d1["exit_codes"] == [0] and p1["exit_codes"] == [0]  # both kept the contract
        assert d_marks.with_suffix(".sigterm").exists() and p_marks.with_suffix(".sigterm").exists()
        assert d["saves_on_sigterm"] is True and p["saves_on_sigterm"] is False
        assert loss(d1) == (0.0, "declared", DECLARED_WHY)
        [signalled] = [e["reason"] for e in d["events"] if e["to"] == "PREEMPTING"]
        assert "GPU-s (none if it exits 0 in its grace: declared saves-on-sigterm); grace 10s" in signalled
        p_lost = p1["lost_work_gpu_s"]
        assert p_lost >= 2 * 0.5 and loss(p1) == (p_lost, "assumed", ASSUMED_WHY)
        assert [(x["lost_work_gpu_hours"], x["lost_work_basis"], x["lost_work_why"]) for x in d["preemptions"]] == [
            (0.0, "declared", DECLARED_WHY)
        ]
        assert [(x["lost_work_basis"], x["lost_work_why"]) for x in p["preemptions"]] == [("assumed", ASSUMED_WHY)]
        listed = {x["victim"]: x for x in c.get("/v1/preemptions").json()}
        assert {v: (x["lost_work_basis"], x["lost_work_why"]) for v, x in listed.items()} == {
            declared: ("declared", DECLARED_WHY),
            plain: ("assumed", ASSUMED_WHY),
        }
        assert lost_metric(c, "vision") == 0.0 and lost_metric(c, "language") == pytest.approx(p_lost)

        described = cli(server.url, "describe", declared, columns=200, check=True).stdout
        assert "saves on SIGTERM (declared)" in described
        assert f"lost work of #1: {DECLARED_WHY}" in described
        assert f"lost work of #1: {ASSUMED_WHY}" in cli(server.url, "describe", plain, columns=200).stdout

        # A cancel is no preemption: the job it ends is charged nothing.
        until_state(c, high, "RUNNING")
        assert c.post(f"/v1/jobs/{high}/cancel").status_code == 202
        h = until_state(c, high, "CANCELLED")
        assert loss(h["attempts"][0]) == (None, None, None) and h["preemptions"] == []
        running(c, declared, d_marks, 2)
        running(c, plain, p_marks, 2)

        # Preempted, then cancelled in its grace: the preemption is listed, charged nothing.
        p_marks.with_suffix(".hold").write_text("")
        again = submit(c, queue="serving", tier=1, gpus=4, command=["sleep", "3600"])
        until_state(c, plain, "PREEMPTING")
        wait_for(lambda: len(p_marks.with_suffix(".sigterm").read_text().split()) == 2, what="the second SIGTERM")
        assert c.post(f"/v1/jobs/{plain}/cancel").status_code == 202
        p_marks.with_suffix(".release").write_text("")
        p = until_state(c, plain, "CANCELLED")
        p2 = p["attempts"][1]
        assert p2["preemption_kind"] == "preemption" and p2["exit_codes"] == [0]
        assert loss(p2) == (0.0, "cancelled", CANCELLED_WHY)
        assert [x["lost_work_basis"] for x in p["preemptions"]] == ["assumed", "cancelled"]
        d = exited(c, declared, 2)
        assert loss(d["attempts"][1]) == (0.0, "declared", DECLARED_WHY)
        assert lost_metric(c, "vision") == 0.0 and lost_metric(c, "language") == pytest.approx(p_lost)
        assert lost_metric(c, "serving") is None
        assert f"lost work of #2: {CANCELLED_WHY}" in cli(server.url, "describe", plain, columns=200).stdout

        store = Store.open(f"sqlite:///{server.state_dir / 'warden.db'}", upgrade=False)
        try:
            # the history's lost GPU-hours are differences of these totals
            assert store.lost_work_totals() == {"vision": 0.0, "language": pytest.approx(p_lost)}
        finally:
            store.close()
        for j in (declared, again):
            c.post(f"/v1/jobs/{j}/cancel")
