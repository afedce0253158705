"""A nominal reclaim takes exactly what is borrowed, on a real server (DESIGN §4.3: a reclaim
never leaves the victim's queue below its nominal).

8 fake GPUs; `team-a` and `team-b` have a nominal of 4 each. team-a runs a 2-GPU job; team-b
a gang of 2 × 2 GPUs, then, once the gang's lease is over, a 2-GPU job that borrows 2 (team-b
holds 6): the cluster is full. team-a's second 2-GPU job is within team-a's nominal, so it may
reclaim. Preempting the gang (past its lease) would leave team-b at 2 of its 4 and turn the two
spare GPUs into new borrowing for team-a, after which team-b would reclaim them back (a user
saw the two jobs preempt each other twice in two minutes). Instead team-a's job waits for the
lease of the job that borrows, says so, and then takes exactly that job: team-b keeps its 4 and
nothing is preempted again.
"""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from serverproc import Server, server_fixture, submit, until_state, wait_for

LEASE_S = 10.0

POLICY = f"""\
min_grace: 2s
thrash: {{min_efficiency: 0}}
preemption: {{restart_overhead: 0s, checkpoint_overhead: 0s}}
tiers:
  1: {{name: production-inference, preemptible: false, grace: 2s, requires_approval: true, scope: cluster}}
  3: {{name: experimentation, lease: {LEASE_S:g}s, grace: 2s}}
queues:
  name: root
  children:
    - {{name: team-a, nominal: {{gpu: 4}}}}
    - {{name: team-b, nominal: {{gpu: 4}}}}
"""

# Marks its start and its SIGTERM (each file whole when it appears), and exits 0 at SIGTERM.
JOB = """\
import os, signal, sys, time
out = sys.argv[1]
tag = "{}-{}-{}".format(os.environ["WARDEN_JOB_ID"], os.environ["WARDEN_ATTEMPT"], os.environ.get("RANK", "0"))
def mark(kind):
    tmp = os.path.join(out, "." + kind + "-" + tag)
    with open(tmp, "w") as f:
        f.write("%.6f\\n" % time.time())
    os.rename(tmp, os.path.join(out, kind + "-" + tag))
def stop(*_):
    mark("term")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
mark("up")
while True:
    time.sleep(0.05)
"""


server = server_fixture(POLICY, gpus=8)


def _job(c: httpx.Client, job_id: str) -> dict[str, Any]:
    return dict(c.get(f"/v1/jobs/{job_id}").json())


def _summary(c: httpx.Client, job_id: str) -> dict[str, Any]:
    [row] = [j for j in c.get("/v1/jobs").json() if j["id"] == job_id]
    return dict(row)


def _preempted(c: httpx.Client, ids: list[str]) -> dict[str, int]:
    """How often each of these jobs went PREEMPTING."""
    return {i: sum(e["to"] == "PREEMPTING" for e in _job(c, i)["events"]) for i in ids}


def _held(c: httpx.Client) -> dict[str, int]:
    return {q["name"]: q["gpus_in_use"] for q in c.get("/v1/queues").json() if q["leaf"]}


def _marks(out: Path, kind: str, job_id: str) -> list[str]:
    return sorted(p.name for p in out.glob(f"{kind}-{job_id}-*"))


def _passes(c: httpx.Client) -> float:
    for line in c.get("/metrics").text.splitlines():
        if line.startswith("warden_scheduling_pass_seconds_count"):
            return float(line.split()[-1])
    raise AssertionError("no pass count in /metrics")


def test_a_reclaim_waits_for_the_lease_of_the_borrowing_job_and_takes_exactly_what_was_borrowed(
    server: Server, tmp_path: Path
) -> None:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(JOB))
    out = tmp_path / "marks"
    out.mkdir()
    os.chmod(out, 0o777)  # the job's account writes there
    command = [sys.executable, str(script), str(out)]

    with server.client() as c:
        a1 = submit(c, queue="team-a", tier=3, gpus=2, command=command, name="a1")
        gang = submit(c, queue="team-b", tier=3, gpus=2, replicas=2, command=command, name="b-gang")
        for j in (a1, gang):
            until_state(c, j, "RUNNING")
        wait_for(lambda: len(_marks(out, "up", gang)) == 2, 20, "the gang's two replicas up")

        # The gang's lease ends; only then does team-b borrow, with a job whose lease is fresh.
        gang_lease_end = _summary(c, gang)["lease_end_at"]
        assert gang_lease_end is not None
        wait_for(lambda: time.time() > gang_lease_end + 0.2, LEASE_S + 5, "the gang's lease to end")
        borrower = submit(c, queue="team-b", tier=3, gpus=2, command=command, name="b-borrow")
        until_state(c, borrower, "RUNNING")
        wait_for(lambda: _marks(out, "up", borrower), 20, "the borrowing job up")
        assert _held(c) == {"team-a": 2, "team-b": 6}  # 8 of 8: the cluster is full
        borrower_lease_end = _summary(c, borrower)["lease_end_at"]
        assert borrower_lease_end is not None

        # team-a's second job is within team-a's nominal (2 + 2 of 4) and may reclaim. The gang is
        # past its lease, but taking it would leave team-b at 2 of 4: it waits for the borrower.
        a2 = submit(c, queue="team-a", tier=3, gpus=2, command=command, name="a2")
        submitted_at = time.time()
        assert submitted_at < borrower_lease_end - 2.0, "the borrower's lease must still have a while to run"
        wait_for(lambda: _summary(c, a2)["reason"], 10, "a2's reason")

        # While it waits, nobody is signalled: the gang's lease is long over, yet it is no victim.
        reasons: list[dict[str, Any]] = []
        while time.time() < borrower_lease_end - 0.5:
            assert _job(c, a2)["state"] == "PENDING"
            assert _preempted(c, [a1, gang, borrower]) == {a1: 0, gang: 0, borrower: 0}
            reason = _summary(c, a2)["reason"]
            assert reason["code"] == "WaitingForLease", reason
            reasons.append(reason)
            time.sleep(0.25)
        assert not list(out.glob("term-*"))

        # The borrower's lease ends: exactly it is preempted (SIGTERM seen, an event, a reclaim).
        until_state(c, a2, "RUNNING", timeout=LEASE_S + 10)
        term = wait_for(lambda: _marks(out, "term", borrower), 10, "the borrower's SIGTERM")
        assert sorted(p.name for p in out.glob("term-*")) == term and len(term) == 1
        sigterm_at = float((out / term[0]).read_text())
        assert sigterm_at >= borrower_lease_end - 0.05, (sigterm_at, borrower_lease_end)
        [attempt] = [a for a in _job(c, borrower)["attempts"] if a.get("sigterm_at")]
        assert attempt["preempted_for"] == a2
        [preemption] = c.get("/v1/preemptions").json()
        assert (preemption["victim"], preemption["preemptor"]) == (borrower, a2), preemption
        assert (preemption["victim_queue"], preemption["preemptor_queue"]) == ("team-b", "team-a"), preemption
        assert preemption["kind"] == "reclaim", preemption
        until_state(c, borrower, "PENDING")
        assert _held(c) == {"team-a": 4, "team-b": 4}

        # Settled: many more passes and some seconds, and nobody is preempted again; the
        # borrower waits (the cluster is full and team-b is at its nominal), the gang runs on.
        passes = _passes(c)
        settle_until = time.monotonic() + 4.0
        while time.monotonic() < settle_until or _passes(c) < passes + 5:
            assert _preempted(c, [a1, gang, borrower, a2]) == {a1: 0, gang: 0, borrower: 1, a2: 0}
            assert _held(c) == {"team-a": 4, "team-b": 4}
            assert time.monotonic() < settle_until + 20, "the scheduler made no passes"
            time.sleep(0.25)
        assert [_job(c, j)["state"] for j in (a1, gang, a2, borrower)] == ["RUNNING"] * 3 + ["PENDING"]
        assert len(c.get("/v1/preemptions").json()) == 1
        assert sorted(p.name for p in out.glob("term-*")) == term
        assert all(len(_job(c, j)["attempts"]) == 1 for j in (a1, gang, a2))

        # What a2 said while it waited: the lease of the job it took, and when that lease ends.
        _check_waiting_reasons(reasons, borrower, gang, borrower_lease_end)


def _check_waiting_reasons(reasons: list[dict[str, Any]], borrower: str, gang: str, borrower_lease_end: float) -> None:
    """Every reason a2 showed while it waited names the borrower, its lease and when it ends:
    never the gang, which a reclaim may not take (it would leave team-b below its nominal)."""
    assert reasons
    for r in reasons:
        d = r["details"]
        assert gang not in d["victims"], r
        assert d["victims"] == [borrower] and d["victim"] == borrower, r
        assert d["rule"] == "lease" and d["lease_s"] == LEASE_S, r
        assert d["earliest_at"] == pytest.approx(borrower_lease_end, abs=0.01), r
