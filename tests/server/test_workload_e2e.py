"""Checkpoint-aware preemption end to end: real training processes using the SDK, a real
server with fake GPUs, real signals. The victim saves within its grace, exits 0, is requeued
and resumes from exactly the saved step; it is chosen because it loses least, not because it
is newest; the metrics count zero lost work; the thrash guard keeps η above its floor."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from serverproc import Server, kill_jobs_of, server_fixture, submit, until_state, wait_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

POLICY = """\
min_grace: 2s
thrash: {min_efficiency: 0, max_preemptions: {per: 24h, count: 100}}
preemption: {restart_overhead: 1s}
tiers:
  1: {name: production-inference, preemptible: false, grace: 10s, requires_approval: true, scope: cluster}
  3: {name: experimentation, lease: 0s, grace: 10s}
queues:
  name: cluster
  children:
    - {name: vision}
    - {name: serving}
"""


def log_of(c: httpx.Client, job: str, attempt: int) -> str:
    return c.get(f"/v1/jobs/{job}/logs", params={"attempt": attempt}).json()["text"]


def attempt(c: httpx.Client, job: str, number: int) -> dict[str, Any]:
    return c.get(f"/v1/jobs/{job}").json()["attempts"][number - 1]


server = server_fixture(POLICY, gpus=4)


def test_the_cheapest_victim_saves_exits_and_resumes_from_the_saved_step(server: Server) -> None:
    with server.client() as c:
        trainer = submit(
            c,
            queue="vision",
            tier=3,
            gpus=2,
            command=[
                sys.executable,
                str(EXAMPLES / "train_plain.py"),
                "--steps",
                "1000000",
                "--step-seconds",
                "0.02",
                "--checkpoint-every",
                "25",
            ],
        )
        until_state(c, trainer, "RUNNING")
        wait_for(lambda: attempt(c, trainer, 1)["checkpoints"] >= 1, 30, "the trainer's first checkpoint")
        # The newest job, which would lose everything it did: a job ignoring SIGTERM.
        stubborn = submit(
            c,
            queue="vision",
            tier=3,
            gpus=2,
            command=[sys.executable, str(EXAMPLES / "ignore_sigterm.py"), "--step-seconds", "0.05"],
        )
        until_state(c, stubborn, "RUNNING")
        wait_for(lambda: attempt(c, stubborn, 1)["progress_step"] is not None, 30, "the newest job's progress")
        serve = submit(c, queue="serving", tier=1, gpus=2, command=[sys.executable, "-c", "pass"])
        until_state(c, serve, "SUCCEEDED", timeout=60)

        first = wait_for(lambda: (a := attempt(c, trainer, 1))["state"] == "exited" and a, 30)
        assert first["reason"] == "preempted" and first["preempted_for"] == serve
        assert first["exit_codes"] == [0] and first["lost_work_gpu_s"] == 0.0
        assert first["ended_at"] - first["sigterm_at"] < 10.0  # saved within its grace
        assert c.get(f"/v1/jobs/{stubborn}").json()["state"] == "RUNNING"  # the newest was spared
        assert len(c.get(f"/v1/jobs/{stubborn}").json()["attempts"]) == 1

        saved = int(re.search(r"SIGTERM: saved step (\d+)", log_of(c, trainer, 1)).group(1))  # type: ignore[union-attr]
        done_steps = [int(s) for s in re.findall(r"^step (\d+) ", log_of(c, trainer, 1), re.M)]
        assert max(done_steps) == saved  # no step was done after the one saved: nothing lost
        until_state(c, trainer, "RUNNING")
        resumed = wait_for(
            lambda: re.search(r"resumed from step (\d+)", log_of(c, trainer, 2)), 30, "the second attempt to resume"
        )
        assert int(resumed.group(1)) == saved

        metrics = httpx.get(f"{server.url}/metrics", verify=server.tls()).text
        assert 'warden_lost_work_gpu_seconds_total{queue="vision"} 0.0' in metrics
        assert 'warden_preemptions_total{kind="downward",queue="vision",tier="3"} 1.0' in metrics
        c.post(f"/v1/jobs/{trainer}/cancel")
        c.post(f"/v1/jobs/{stubborn}/cancel")
        until_state(c, stubborn, "CANCELLED", timeout=30)


def floor_wait(c: httpx.Client, job: str) -> float:
    """How long a preemptor may wait for `job` under `min_efficiency: 0.9`: its lease is nine
    times its measured startup and checkpoint time, which a loaded machine stretches, then the
    10 s grace, with a minute to spare."""
    attempts = c.get(f"/v1/jobs/{job}").json()["attempts"]
    overhead = max((a["startup_s"] or 0.0) + a["checkpoint_s"] for a in attempts)
    return max(120.0, 10 * overhead + 10 + 60)


@pytest.mark.slow
def test_the_thrash_guard_keeps_a_long_jobs_efficiency_above_its_floor(tmp_path: Path) -> None:
    """Short tier-2 jobs keep arriving for the GPUs of one long tier-3 job. With
    `min_efficiency: 0.9` every attempt of the long job must run at least ten times its
    startup and one save before a tier 2–4 job may preempt it again (the thrash guard never
    holds back tier 1: tests/server/test_production_first.py)."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.replace("min_efficiency: 0,", "min_efficiency: 0.9,"))
    s = Server(tmp_path / "state", policy=policy, gpus=2).start()
    try:
        with s.client() as c:
            # A startup of a second or more (the trainer's loading), measured and reported, as its saves.
            long = submit(
                c,
                queue="vision",
                tier=3,
                gpus=2,
                command=[
                    sys.executable,
                    str(EXAMPLES / "train_plain.py"),
                    "--steps",
                    "1000000",
                    "--step-seconds",
                    "0.02",
                    "--startup-seconds",
                    "1",
                    "--checkpoint-every",
                    "200",
                ],
            )
            until_state(c, long, "RUNNING")
            wait_for(lambda: attempt(c, long, 1)["startup_s"] is not None, 60, "the long job's startup report")
            shorts = []
            while len(c.get(f"/v1/jobs/{long}").json()["attempts"]) < 3 and len(shorts) < 40:
                shorts.append(
                    submit(
                        c,
                        queue="serving",
                        tier=2,
                        gpus=2,
                        command=[sys.executable, "-c", "import time; time.sleep(0.5)"],
                    )
                )
                until_state(c, shorts[-1], "SUCCEEDED", timeout=floor_wait(c, long))
            attempts = c.get(f"/v1/jobs/{long}").json()["attempts"]
            ended = [a for a in attempts if a["state"] == "exited"]
            assert len(ended) >= 2, "the long job was never preempted twice"
            for a in ended:
                run = a["ended_at"] - a["started_at"]
                overhead = (a["startup_s"] or 0.0) + a["checkpoint_s"]
                assert (run - overhead) / run >= 0.9 - 0.02, a  # η, with slack for the save on SIGTERM
            c.post(f"/v1/jobs/{long}/cancel")
            until_state(c, long, "CANCELLED", timeout=60)
    finally:
        s.stop()
        kill_jobs_of(s.state_dir)  # the long job, if the test failed before cancelling it
