"""A job's reports are bounded by what warden saw: a startup claimed longer than the attempt
has run buys no protection from preemption, and the clamp is in the job's events. A real
server process with fake GPUs."""

from __future__ import annotations

import sys

import httpx
import pytest
from serverproc import Server, server_fixture, submit, until_state, wait_for

POLICY = """\
min_grace: 1s
thrash: {min_efficiency: 0}
preemption: {restart_overhead: 0s, checkpoint_overhead: 0s, victim_order: cost}
tiers:
  1: {name: production, preemptible: false, grace: 1s, scope: cluster}
  3: {name: experimentation, lease: 0s, grace: 1s}
queues:
  name: cluster
  children:
    - {name: vision, nominal: {gpu: 2}}
    - {name: language, nominal: {gpu: 2}}
"""
SLEEP = [sys.executable, "-c", "import time; time.sleep(3600)"]


server = server_fixture(POLICY)


def token(c: httpx.Client, user: str, queue: str) -> str:
    r = c.post("/v1/tokens", json={"user": user, "role": "user", "queues": [queue]})
    assert r.status_code in (200, 201), r.text
    return str(r.json()["token"])


def test_a_startup_claimed_longer_than_the_attempt_has_run_buys_no_protection(server: Server) -> None:
    with server.client() as admin:
        alice, bob = token(admin, "alice", "vision"), token(admin, "bob", "language")
        with server.client(alice) as a, server.client(bob) as b:
            honest = submit(a, queue="vision", tier=3, gpus=2, command=SLEEP)
            until_state(a, honest, "RUNNING")
            liar = submit(b, queue="language", tier=3, gpus=2, command=SLEEP)
            until_state(b, liar, "RUNNING")
            r = a.post(f"/v1/jobs/{honest}/reports", json={"attempt": 1, "kind": "startup"})
            assert r.status_code == 202, r.text
            r = b.post(f"/v1/jobs/{liar}/reports", json={"attempt": 1, "kind": "startup", "startup_s": 1e9})
            assert r.status_code == 202, r.text

            [clamp] = [e for e in b.get(f"/v1/jobs/{liar}").json()["events"] if "clamped" in e["reason"]]
            assert clamp["reason"].startswith("startup report of 11574d2h clamped to "), clamp
            assert clamp["details"]["reported_s"] == 1e9
            assert 0 <= clamp["details"]["kept_s"] < 60
            assert clamp["from"] == clamp["to"] == "RUNNING"
            [liar_attempt] = b.get(f"/v1/jobs/{liar}").json()["attempts"]
            assert liar_attempt["startup_s"] == clamp["details"]["kept_s"]
            honest_events = a.get(f"/v1/jobs/{honest}").json()["events"]
            assert not [e for e in honest_events if "clamped" in e["reason"]]

        # Both cost their GPUs × their age (work since startup + the restart): the younger,
        # the liar, is the cheaper victim. Believed, its startup would protect it for 1e9 s
        # (the efficiency floor) and the honest job would go instead. The urgent job runs in the
        # liar's queue, so the requeued liar has nothing to reclaim from the honest one.
        urgent = submit(admin, queue="language", tier=1, gpus=2, command=SLEEP)
        [preemption] = wait_for(lambda: admin.get("/v1/preemptions").json(), what="a preemption")
        assert preemption["victim"] == liar, preemption
        assert preemption["preemptor"] == urgent
        until_state(admin, urgent, "RUNNING")
        assert admin.get(f"/v1/jobs/{honest}").json()["state"] == "RUNNING"


def test_a_checkpoint_claimed_longer_than_the_time_since_the_last_one_is_clamped(server: Server) -> None:
    with server.client() as c:
        job = submit(c, queue="vision", tier=3, gpus=1, command=SLEEP)
        until_state(c, job, "RUNNING")
        for _ in range(2):
            r = c.post(f"/v1/jobs/{job}/reports", json={"attempt": 1, "kind": "checkpoint_finished", "duration_s": 1e9})
            assert r.status_code == 202, r.text
        detail = c.get(f"/v1/jobs/{job}").json()
        [attempt] = detail["attempts"]
        first, second = [e for e in detail["events"] if "clamped" in e["reason"]]
        assert first["reason"].startswith("checkpoint report of 11574d2h clamped to ")
        assert first["reason"].endswith("the time the attempt has run")
        assert second["reason"].endswith("the time since its previous checkpoint")
        kept = first["details"]["kept_s"] + second["details"]["kept_s"]
        assert attempt["checkpoint_s"] == pytest.approx(kept)
        assert kept <= attempt["last_checkpoint_at"] - attempt["started_at"] + 1e-6
