"""Issue 16 against a real server: a tier-1 job held by the efficiency floor of a tier-3 job
that reported no startup is told so, with the assumed startup and its knob, and with times in
local time and relative words (never epoch seconds) in the API, `queue` and `describe`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import httpx
from serverproc import ADMIN, Server, server_fixture, wait_for

POLICY = """\
min_grace: 2s
thrash: {min_efficiency: 0.9}
preemption: {restart_overhead: 60s}
tiers:
  1: {name: production-inference, preemptible: false, grace: 2s, requires_approval: true, scope: cluster}
  2: {name: pretraining, lease: 1h, grace: 2s, requires_approval: true}
  3: {name: experimentation, lease: 0s, grace: 2s}
  4: {name: opportunistic, lease: 0s, grace: 2s, charged: false}
queues:
  name: cluster
  children:
    - {name: vision, nominal: {gpu: 2}}
    - {name: language, nominal: {gpu: 2}}
"""
EPOCH = re.compile(r"\d{10}")


def warden(server: Server, *args: str, columns: int = 80) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARDEN_")}
    env.update(WARDEN_URL=server.url, WARDEN_CA=str(server.ca), WARDEN_TOKEN=ADMIN, COLUMNS=str(columns))
    done = subprocess.run(
        [sys.executable, "-m", "warden.cli.main", *args], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


server = server_fixture(POLICY)


def test_the_efficiency_floor_is_named_in_the_api_queue_and_describe(server: Server) -> None:
    victim = warden(server, "submit", "-q", "vision", "-t", "3", "--gpus", "4", "--", "sleep", "600").split()[-1]
    wait_for(lambda: json.loads(warden(server, "describe", victim, "--json"))["state"] == "RUNNING")
    # Within language's nominal, tier 2 may take a lower tier anywhere; the efficiency floor
    # holds it back (it never holds back tier 1: tests/server/test_production_first.py).
    urgent = warden(server, "submit", "-q", "language", "-t", "2", "--gpus", "2", "--", "true").split()[-1]
    job = wait_for(
        lambda: (j := json.loads(warden(server, "describe", urgent, "--json")))["reason"] and j,
        what="the tier-2 job's reason",
    )
    reason = job["reason"]
    assert reason["code"] == "WaitingForLease"
    d = reason["details"]
    assert (d["rule"], d["victim"], d["lease_s"]) == ("efficiency", victim, 0.0)
    assert (d["startup_s"], d["startup_measured"], d["min_efficiency"]) == (60.0, False, 0.9)
    assert (d["checkpoint_s"], d["checkpoint_measured"], d["save_measured"]) == (30.0, False, False)
    assert d["earliest_at"] > 1e9  # the details keep machine time
    m = reason["message"]
    assert "efficiency floor" in m and "assumed startup of 1m (`preemption.restart_overhead`" in m
    assert "an assumed save of 30s (`preemption.checkpoint_overhead`" in m
    # (60 s + 30 s) / (1 − 0.9) = 15 min after the victim started
    assert re.search(r"at \d\d:\d\d \(in (14m\d+s|15m)\)", m) and not EPOCH.search(m)

    headers = {"Authorization": f"Bearer {ADMIN}"}
    listed = httpx.get(f"{server.url}/v1/jobs", headers=headers, timeout=10, verify=server.tls()).json()
    row = next(r for r in listed if r["id"] == urgent)
    assert row["reason"]["details"] == d and "efficiency floor" in row["reason"]["message"]
    assert not EPOCH.search(row["reason"]["message"])

    listing = warden(server, "queue")
    assert "WaitingForLease" in listing and all(len(line) <= 80 for line in listing.splitlines())
    text = warden(server, "describe", urgent)
    assert all(len(line) <= 80 for line in text.splitlines())
    flat = " ".join(line.strip() for line in text.splitlines())
    assert "why pending:" in flat and "efficiency floor" in flat and "`thrash.min_efficiency`" in flat
    sentence = flat.split("why pending:")[1].split("(WaitingForLease")[0]
    assert "efficiency floor" in sentence and not EPOCH.search(sentence)
    warden(server, "cancel", urgent)
    warden(server, "cancel", victim)
