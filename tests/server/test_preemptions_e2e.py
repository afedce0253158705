"""A real preemption as the dashboard sees it: `GET /v1/preemptions` (victim, preemptor, kind,
grace, the grace used, lost work), the per-GPU holders of `GET /v1/nodes` and a job's times in
`GET /v1/jobs`, while the victim is in its grace and after it left. A real server process with
fake GPUs; the victim leaves its grace when the test tells it to."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest
from serverproc import ADMIN, Server, server_fixture, submit, until_state, wait_for

POLICY = """\
min_grace: 2s
thrash: {min_efficiency: 0}
preemption: {restart_overhead: 0s, checkpoint_overhead: 0s}
tiers:
  1: {name: production-inference, preemptible: false, grace: 2s, requires_approval: true, scope: cluster}
  3: {name: experimentation, lease: 1s, grace: 2s}
queues:
  name: cluster
  children:
    - {name: vision, nominal: {gpu: 2}}
    - {name: language, nominal: {gpu: 2}}
"""

# On SIGTERM: say so, then wait for the test's word before exiting 0.
HOLDER = """\
import os, signal, sys, time
out = sys.argv[1]
def stop(*_):
    open(out + ".sigterm", "a").write("1\\n")
    while not os.path.exists(out + ".release"):
        time.sleep(0.02)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open(out + ".started", "a").write(os.environ["WARDEN_ATTEMPT"] + "\\n")
time.sleep(3600)
"""
GRACE_S = 30.0


server = server_fixture(POLICY)


def holders(c: httpx.Client) -> list[dict[str, Any]]:
    [node] = c.get("/v1/nodes").json()
    return list(node["holders"])


def summary(c: httpx.Client, job_id: str) -> dict[str, Any]:
    [row] = [j for j in c.get("/v1/jobs").json() if j["id"] == job_id]
    return dict(row)


def test_a_preemption_is_listed_with_its_preemptor_grace_and_lost_work_and_the_gpus_show_who_holds_them(
    server: Server, tmp_path: Path
) -> None:
    script = tmp_path / "holder.py"
    script.write_text(textwrap.dedent(HOLDER))
    out = tmp_path / "low"
    with server.client() as c:
        low = submit(
            c, queue="vision", tier=3, gpus=4, grace=f"{GRACE_S:g}s", command=[sys.executable, str(script), str(out)]
        )
        until_state(c, low, "RUNNING")
        wait_for(lambda: out.with_suffix(".started").exists(), what="the victim's start")
        held = holders(c)
        assert [h["gpu"] for h in held] == [0, 1, 2, 3]
        assert all(
            h
            == {
                "gpu": h["gpu"],
                "job": low,
                "queue": "vision",
                "tier": 3,
                "user": "admin",
                "state": "RUNNING",
                "shown_state": "RUNNING",
                "kill_at": None,
                "reserved_for": None,
            }
            for h in held
        )
        running = summary(c, low)
        assert running["lease_end_at"] == running["started_at"] + 1.0 and running["kill_at"] is None
        assert isinstance(running["efficiency"], float)
        assert c.get("/v1/preemptions").json() == []

        high = submit(c, queue="language", tier=1, gpus=2, command=["sleep", "3600"])
        until_state(c, low, "PREEMPTING")
        wait_for(lambda: out.with_suffix(".sigterm").exists(), what="the victim's SIGTERM")
        attempt = c.get(f"/v1/jobs/{low}").json()["attempts"][0]
        assert attempt["state"] == "terminating"  # it stays in its grace until released
        assert [(h["job"], h["state"], h["shown_state"], h["kill_at"], h["reserved_for"]) for h in holders(c)] == [
            (low, "PREEMPTING", "PREEMPTING", attempt["kill_at"], high)
        ] * 4
        terminating = summary(c, low)
        assert terminating["kill_at"] == attempt["kill_at"] and terminating["lease_end_at"] is None
        assert terminating["shown_state"] == "PREEMPTING"
        [during] = c.get("/v1/preemptions").json()
        assert during["at"] == attempt["sigterm_at"] and during["kill_at"] == attempt["kill_at"]
        assert during["ended_at"] is None and during["grace_used_s"] is None and during["lost_work_gpu_hours"] is None
        assert during["lost_work_basis"] is None and during["lost_work_why"] is None

        out.with_suffix(".release").write_text("")
        [after] = wait_for(
            lambda: (p := c.get("/v1/preemptions").json())[0]["ended_at"] is not None and p, what="the victim's exit"
        )
        first = c.get(f"/v1/jobs/{low}").json()["attempts"][0]
        assert after == {
            "at": first["sigterm_at"],
            "victim": low,
            "victim_queue": "vision",
            "victim_tier": 3,
            "victim_user": "admin",
            "preemptor": high,
            "preemptor_queue": "language",
            "preemptor_tier": 1,
            "kind": "preemption",
            "reason": after["reason"],
            "grace_s": round(first["kill_at"] - first["sigterm_at"], 3),
            "grace_used_s": round(first["ended_at"] - first["sigterm_at"], 3),
            "kill_at": first["kill_at"],
            "ended_at": first["ended_at"],
            "lost_work_gpu_hours": round(first["lost_work_gpu_s"] / 3600, 6),
            "lost_work_basis": "assumed",  # it saved nothing it reported or declared
            "lost_work_why": "assumed: no checkpoint was reported and the job did not declare --saves-on-sigterm; "
            "counted from its last start",
        }
        assert after["reason"].startswith(f"preempted for job {high} (downward)")
        assert first["preemption_kind"] == "preemption"  # as `describe` shows the attempt
        assert after["grace_s"] == pytest.approx(GRACE_S, abs=0.5) and 0 < after["grace_used_s"] < after["grace_s"]
        # No checkpoint: every GPU-second since it started is lost (4 GPUs, no assumed startup).
        assert first["lost_work_gpu_s"] == pytest.approx(4 * (first["sigterm_at"] - first["started_at"]))
        assert after["lost_work_gpu_hours"] > 0
        assert c.get("/v1/preemptions", params={"since": after["at"] + 0.001}).json() == []

        until_state(c, high, "RUNNING")
        placed = c.get(f"/v1/jobs/{high}").json()["attempts"][-1]["placement"]
        [(_, gpus)] = [(p["node"], p["gpus"]) for p in placed]
        assert [(h["gpu"], h["job"], h["queue"], h["tier"], h["state"]) for h in holders(c)] == [
            (g, high, "language", 1, "RUNNING") for g in sorted(gpus)
        ]
        assert until_state(c, low, "PENDING")["attempt"] == 1  # requeued; 4 GPUs are not free


def test_a_job_preempted_again_and_again_lists_its_preemptions_and_is_flagged_once_over_budget(
    server: Server, tmp_path: Path
) -> None:
    """Two real preemptions, each for a tier-1 job cancelled afterwards so the victim runs again;
    then a policy whose budget allows one per 24 h: the history is over it. `describe` shows
    the preemptions and a warning, in 80 columns."""
    with server.client() as c:
        low = submit(c, queue="vision", tier=3, gpus=4, command=["sleep", "3600"])
        highs = []
        for _ in range(2):
            until_state(c, low, "RUNNING")
            highs.append(submit(c, queue="language", tier=1, gpus=2, command=["sleep", "3600"]))
            until_state(c, highs[-1], "RUNNING")
            assert c.post(f"/v1/jobs/{highs[-1]}/cancel").status_code == 202
        until_state(c, low, "RUNNING")
        detail = c.get(f"/v1/jobs/{low}").json()
        assert [(p["attempt"], p["by"], p["by_queue"], p["by_tier"], p["kind"]) for p in detail["preemptions"]] == [
            (1, highs[0], "language", 1, "preemption"),
            (2, highs[1], "language", 1, "preemption"),
        ]
        assert [p["at"] for p in detail["preemptions"]] == [a["sigterm_at"] for a in detail["attempts"][:2]]
        # no startup reported, no checkpoint, restart overhead 0 s: all of each attempt was progress
        assert [p["efficiency"] for p in detail["preemptions"]] == [1.0, 1.0]
        assert [a["efficiency"] for a in detail["attempts"]] == [1.0, 1.0, None]
        assert detail["preemption_cycle"] is None  # 2 within the default budget of 3 per 24 h

        stricter = POLICY.replace(
            "thrash: {min_efficiency: 0}", "thrash: {min_efficiency: 0, max_preemptions: {per: 24h, count: 1}}"
        )
        assert c.put("/v1/policy", json={"source": stricter}).status_code == 200
        cycle = c.get(f"/v1/jobs/{low}").json()["preemption_cycle"]
        assert cycle["kind"] == "over_budget" and (cycle["details"]["count"], cycle["details"]["limit"]) == (2, 1)
        assert summary(c, low)["preemption_cycle"] is True

    env = {k: v for k, v in os.environ.items() if not k.startswith("WARDEN_")}
    env.update(WARDEN_URL=server.url, WARDEN_CA=str(server.ca), WARDEN_TOKEN=ADMIN, COLUMNS="80")
    done = subprocess.run(
        [sys.executable, "-m", "warden.cli.main", "describe", low], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in done.stdout, done.stdout
    assert any(line.strip().startswith("warning: preemption cycle (over_budget): Preempted 2 times") for line in lines)
    table = lines[lines.index(next(line for line in lines if line.strip() == "preemptions")) :]
    for n, high in enumerate(highs, 1):  # one line a preemption: nothing wraps
        # AT: local time to the second and how long ago, e.g. "14:05:07 (12s ago)".
        at = r"\d\d:\d\d:\d\d \((?:now|[\d\s\w]+ ago)\)"
        assert any(re.match(rf"{n} +{at} +{high} \(language t1\) +preemption ", line) for line in table), done.stdout
