"""Capacity freed by a reclaim goes to the job that reclaimed it, on a real server.

8 fake GPUs; `research{vision, language}` has a nominal of 4 and may borrow 2, `platform` a
nominal of 4 and lends 2. `vision` borrows up to 6 GPUs; then three platform jobs and one
in-quota `language` job `l1`, of 2 GPUs each, arrive. Every victim is preempted once, `l1` starts as
soon as its victims have exited, and nothing is preempted again afterwards (without claims a
borrowing platform job was admitted into the GPUs `l1`'s victims freed, and reclaimed in turn,
until the victims' preemption budget ran out).
"""

from __future__ import annotations

import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serverproc import Server, kill_leftovers, started, submit, until_state, wait_for

POLICY = """\
min_grace: 3s
thrash: {{min_efficiency: 0, max_preemptions: {{per: 24h, count: 20}}}}
preemption: {{restart_overhead: 0s, checkpoint_overhead: 0s}}
tiers:
  1: {{name: production-inference, preemptible: false, grace: 3s, requires_approval: true, scope: cluster}}
  2: {{name: pretraining, lease: {lease}, grace: 3s, requires_approval: true}}
  3: {{name: experimentation, lease: {lease}, grace: 3s}}
  4: {{name: opportunistic, lease: 0s, grace: 3s, charged: false}}
queues:
  name: cluster
  children:
    - name: research
      nominal: {{gpu: 4}}
      borrowing_limit: {{gpu: 2}}
      children:
        - {{name: vision, nominal: {{gpu: 2}}}}
        - {{name: language, nominal: {{gpu: 2}}}}
    - {{name: platform, nominal: {{gpu: 4}}, lending_limit: {{gpu: 2}}}}
"""

# Saves on SIGTERM (a marker) and exits 0 after a short save; else sleeps an hour.
TRAINER = """\
import signal, sys, time
def stop(*_):
    time.sleep(0.5)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
time.sleep(3600)
"""


@pytest.fixture
def trainer(tmp_path: Path) -> list[str]:
    p = tmp_path / "trainer.py"
    p.write_text(textwrap.dedent(TRAINER))
    return [sys.executable, str(p)]


def _server(tmp_path: Path, lease: str) -> Server:
    return started(tmp_path, POLICY.format(lease=lease), gpus=8)


@pytest.fixture(params=["0s", "2s"], ids=["lease-0s", "lease-2s"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Server, float]]:
    lease = request.param
    s = _server(tmp_path, lease)
    yield s, float(lease.rstrip("s"))
    s.stop()
    kill_leftovers(tmp_path)


def _events(c: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    return list(c.get(f"/v1/jobs/{job_id}").json()["events"])


def test_reclaimed_gpus_go_to_the_reclaimer_and_nobody_is_preempted_twice(
    server: tuple[Server, float], trainer: list[str]
) -> None:
    s, lease = server
    with s.client() as c:
        vision = [submit(c, queue="vision", tier=3, gpus=1, command=trainer, name=f"v{i}") for i in range(6)]
        for v in vision:
            until_state(c, v, "RUNNING")
        started_at = max(e["at"] for v in vision for e in _events(c, v) if e["to"] == "RUNNING")
        wait_for(lambda: time.time() > started_at + lease, lease + 5, "the vision jobs' leases to end")
        platform = [submit(c, queue="platform", tier=3, gpus=2, command=trainer, name=f"p{i}") for i in (1, 2, 3)]
        l1 = submit(c, queue="language", tier=3, gpus=2, command=trainer, name="l1")
        running = until_state(c, l1, "RUNNING", timeout=60)
        for p in platform[:2]:
            until_state(c, p, "RUNNING", timeout=30)

        # Every victim is a borrowing vision job, preempted once; the minimal sets: two GPUs
        # reclaimed for the second platform job, and the two that leave l1 in-quota. The third
        # platform job would borrow: it waits, and is never admitted into l1's GPUs.
        preempted: Counter[str] = Counter()
        for job_id in vision + platform + [l1]:
            for e in _events(c, job_id):
                if e["to"] == "PREEMPTING":
                    preempted[job_id] += 1
        assert set(preempted) <= set(vision), preempted
        assert all(n == 1 for n in preempted.values()), preempted
        assert len(preempted) == 4, preempted
        assert c.get(f"/v1/jobs/{platform[2]}").json()["state"] == "PENDING"

        # l1 waited holding its claim, and started in the first pass after its last victim
        # exited (a pass runs at least once a second, and on every exit).
        l1_events = _events(c, l1)
        assert any(e["reason"].startswith("claims the capacity") for e in l1_events), l1_events
        for_l1 = []
        for v in vision:
            detail = c.get(f"/v1/jobs/{v}").json()
            for a in detail["attempts"]:
                if a.get("preempted_for") == l1:
                    for_l1.append(a)
        assert for_l1, "l1 preempted nothing"
        last_exit = max(
            a["ended_at"]
            for a in wait_for(lambda: all(a.get("ended_at") for a in for_l1) and for_l1, 10, "l1's victims' exits")
        )
        admitted_at = next(e["at"] for e in l1_events if e["to"] == "ADMITTED")
        assert last_exit <= admitted_at <= last_exit + 2.0, (last_exit, admitted_at)
        assert running["claim"] is False

        # The cluster is settled: several more passes, and nobody is preempted again.
        total = sum(preempted.values())
        passes = _passes(c)
        wait_for(lambda: _passes(c) >= passes + 5, 20, "five more passes")
        again = sum(1 for job_id in vision + platform + [l1] for e in _events(c, job_id) if e["to"] == "PREEMPTING")
        assert again == total


def _passes(c: httpx.Client) -> float:
    text = c.get("/metrics").text
    for line in text.splitlines():
        if line.startswith("warden_scheduling_pass_seconds_count"):
            return float(line.split()[-1])
    raise AssertionError("no pass count in /metrics")
