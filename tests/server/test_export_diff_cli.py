"""`warden history export` and `warden policy diff [--replay]` against a real server, at 80
columns: the export loads in `warden sim run` as it is, and the diff's tables fit the
terminal; a replay of jobs without the SDK, preempted and cancelled, preempts as often and uses
the GPUs as much as the run did. (Bad input, refused before any request:
tests/cli/test_history_diff_cli.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from plaintrainer import PATH as TRAINER
from plaintrainer import attempts_started
from serverproc import ADMIN, Server, kill_leftovers, server_fixture, started, submit, until_state, wait_for

POLICY = """\
min_grace: 2s
thrash: {min_efficiency: 0}
preemption: {restart_overhead: 0s, checkpoint_overhead: 0s}
tiers:
  3: {name: experimentation, lease: 1h, grace: 2s}
  4: {name: opportunistic, lease: 0s, grace: 2s, charged: false}
queues:
  name: cluster
  children:
    - {name: vision}
    - {name: language}
    - {name: speech}
"""


def warden(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARDEN_")}
    env.update(WARDEN_URL=server.url, WARDEN_CA=str(server.ca), WARDEN_TOKEN=ADMIN, COLUMNS="80", TERM="dumb")
    return subprocess.run(
        [sys.executable, "-m", "warden.cli.main", *args], capture_output=True, text=True, env=env, timeout=120
    )


def fits(text: str) -> bool:
    """Every line within 80 columns, and no cell cut to "…"."""
    return all(len(line) <= 80 for line in text.splitlines()) and "…" not in text


server = server_fixture(POLICY)


@pytest.mark.slow
def test_export_then_sim_run_and_diff_with_replay_at_80_columns(server: Server, tmp_path: Path) -> None:
    new = yaml.safe_load(POLICY)
    new["scheduling"] = {"order": "fifo"}  # vision's job, submitted first, goes first
    new_file = tmp_path / "new.yaml"
    new_file.write_text(yaml.safe_dump(new))

    empty = warden(server, "policy", "diff", str(new_file), "--replay", "1d")
    assert empty.returncode == 2
    assert "nothing to replay" in empty.stderr

    with server.client() as c:
        for queue in ("vision", "language"):
            until_state(c, submit(c, queue=queue, tier=3, gpus=1, command=["true"]), "SUCCEEDED")
        big = submit(c, queue="vision", tier=3, gpus=4, command=["sleep", "600"])
        until_state(c, big, "RUNNING")
        waiting = [submit(c, queue=q, tier=3, gpus=2, command=["true"]) for q in ("vision", "language", "speech")]
        for job in waiting:
            until_state(c, job, "PENDING")

    out = warden(server, "history", "export", "--since", "1d")
    assert out.returncode == 0, out.stderr
    trace = tmp_path / "exported.csv"
    trace.write_text(out.stdout)
    assert len(out.stdout.splitlines()) == 4  # the header, two finished jobs and the running one
    sim = warden(server, "sim", "run", "--trace", str(trace), "--policy", str(server.policy), "--gpus", "4", "--json")
    assert sim.returncode == 0, sim.stderr
    assert json.loads(sim.stdout)["jobs"] == 3

    parquet = tmp_path / "exported.parquet"
    done = warden(server, "history", "export", "--format", "parquet", "-o", str(parquet))
    assert done.returncode == 0, done.stderr
    assert (
        warden(server, "sim", "run", "--trace", str(parquet), "--policy", str(server.policy), "--gpus", "4").returncode
        == 0
    )

    diff = warden(server, "policy", "diff", str(new_file))
    assert diff.returncode == 0, diff.stderr
    assert "scheduling.order" in diff.stdout and "waiting jobs" in diff.stdout
    assert fits(diff.stdout), diff.stdout
    as_json = json.loads(warden(server, "policy", "diff", str(new_file), "--json").stdout)
    assert as_json["settings"] == [{"path": "scheduling.order", "before": "governed", "after": "fifo"}]
    assert [p["after"]["position"] for p in as_json["pending"] if p["id"] == waiting[0]] == [1]

    replayed = warden(server, "policy", "diff", str(new_file), "--replay", "1d")
    assert replayed.returncode == 0, replayed.stderr
    assert "replay: 3 jobs" in replayed.stdout and "delivered GPU-h" in replayed.stdout
    assert fits(replayed.stdout), replayed.stdout
    rows = json.loads(warden(server, "policy", "diff", str(new_file), "--replay", "1d", "--json").stdout)["replay"]
    assert {r["scope"] for r in rows["rows"]} == {"cluster", "queue", "tier"}
    assert all(r["difference"] == 0 for r in rows["rows"] if r["metric"] == "finished")


@pytest.mark.slow
def test_a_replay_of_jobs_preempted_and_cancelled_without_the_sdk_preempts_and_uses_the_gpus_alike(
    tmp_path: Path,
) -> None:
    """Two tier-4 trainers without the SDK (tests/server/plaintrainer.py), one declared
    `saves_on_sigterm` and done after 400 steps, the other never done, are preempted twice each
    by a tier-3 job of the whole node; the second is then cancelled. Replayed, the export
    preempts four times too, at about the utilization the run had.

    The replay restarts a victim as soon as its preemptor ends, where the run waits for a pass
    and a process start (seconds on a loaded machine): the work both trainers have left after
    the second preemption (~14 s) outlasts that head start, so both still run when it comes."""
    policy = yaml.safe_load(POLICY)
    policy["tiers"][3]["scope"] = "cluster"  # its jobs preempt tier 4 in every queue
    source = yaml.safe_dump(policy)
    server = started(tmp_path, source)
    marks = {name: tmp_path / name for name in ("declared", "plain")}

    try:
        with server.client() as c:
            declared = submit(
                c,
                queue="vision",
                tier=4,
                gpus=2,
                saves_on_sigterm=True,
                command=[sys.executable, str(TRAINER), str(marks["declared"]), "400"],
            )
            plain = submit(
                c, queue="language", tier=4, gpus=2, command=[sys.executable, str(TRAINER), str(marks["plain"])]
            )
            highs = []
            for n in (1, 2):
                wait_for(lambda n=n: all(attempts_started(m) == n for m in marks.values()), 30, f"attempt {n} to start")
                time.sleep(3)
                highs.append(submit(c, queue="vision", tier=3, gpus=4, command=["sleep", "3"]))
                until_state(c, highs[-1], "SUCCEEDED", timeout=30)
            until_state(c, declared, "SUCCEEDED", timeout=60)
            c.post(f"/v1/jobs/{plain}/cancel")
            until_state(c, plain, "CANCELLED")
            jobs = [c.get(f"/v1/jobs/{j}").json() for j in (declared, plain, *highs)]
            preempted = len(c.get("/v1/preemptions").json())
        assert preempted == 4
        spans = [(a["started_at"], a["ended_at"], j["gpus"]) for j in jobs for a in j["attempts"]]
        begin, end = min(j["submit_at"] for j in jobs), max(e for _, e, _ in spans)
        used = sum(gpus * (e - s) for s, e, gpus in spans) / (4 * (end - begin))

        same = tmp_path / "same.yaml"
        same.write_text(source)
        out = warden(server, "policy", "diff", str(same), "--replay", "1d", "--json")
        assert out.returncode == 0, out.stderr
        replay = json.loads(out.stdout)["replay"]
        assert replay["warning"].startswith("1 of 4 durations rest on an assumption: 1 never finished")
        assert "warning: 1 of 4 durations rest on an assumption" in " ".join(out.stderr.split())
        rows = warden(server, "history", "export", "--since", "1d").stdout  # what the replay ran, if it differs
        assert replay["current"]["preemptions"] == preempted, (replay, spans, rows)
        # the run has a pass between each exit and the next start, the replay none: a few GPU-seconds
        assert replay["current"]["utilization"] == pytest.approx(used, abs=0.15)
        exported = warden(server, "history", "export", "--since", "1d")
        assert "warning: 1 of 4 durations rest on an assumption" in " ".join(exported.stderr.split())
    finally:
        server.stop()
        kill_leftovers(tmp_path)
