"""Several servers on one PostgreSQL database (docs/control-plane.md, "Several servers"): real
server processes, each with a state directory of its own, a real PostgreSQL, real jobs and real
signals. One leads; the others stand by, answer from the database and take users' writes
through it; when the leader is killed with SIGKILL a standby takes over within 5 s, adopts what
runs and schedules what was submitted meanwhile. On SQLite a second server is refused.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest
from clusterproc import POLICY, Cluster, cluster, health, role  # noqa: F401  (cluster: a fixture)
from pg import fresh_postgres_url, postgres_server  # noqa: F401  (fixtures)
from serverproc import Server, until_state, wait_for


def leader_gauge(server: Server) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=5, verify=server.tls()).text
    line = next(x for x in text.splitlines() if x.startswith("warden_leader "))
    return float(line.split()[1])


def test_one_server_leads_and_a_standby_takes_writes_through_the_database(cluster: Cluster) -> None:
    """The first server leads, the second stands by; both answer, say who they are (health,
    headers, `warden_leader`), and a submission, a cancel and a policy sent to the standby
    are carried out by the leader."""
    a = cluster.start("a")
    wait_for(lambda: role(a) == "leader", 10, "a to lead")
    b = cluster.start("b")
    assert role(b) == "standby" and role(a) == "leader"
    assert health(b)["leader"] == a.url and health(b)["scheduling"] == "standby"
    assert health(a)["epoch"] == 1 and health(b)["epoch"] is None
    assert leader_gauge(a) == 1.0 and leader_gauge(b) == 0.0
    with a.client() as ca, b.client() as cb:
        r = cb.get("/v1/jobs")
        assert r.headers["x-warden-role"] == "standby" and r.headers["x-warden-leader"] == a.url
        assert ca.get("/v1/jobs").headers["x-warden-role"] == "leader"

        first = cluster.job(cb, "first")  # submitted to the standby, run by the leader
        until_state(ca, first, "RUNNING")
        wait_for(lambda: cluster.started("first"), 10, "the first job's process")
        second = cluster.job(ca, "second")
        until_state(cb, second, "RUNNING")

        r = cb.post(f"/v1/jobs/{first}/cancel")  # a cancel sent to the standby
        assert r.status_code == 202, r.text
        done = until_state(ca, first, "CANCELLED")
        assert (cluster.marks / "first.sigterm").exists()
        assert any("cancel requested by admin" in e["reason"] for e in done["events"])

        # A policy applied on the standby is the leader's within a pass, and one applied on
        # the leader is the standby's within its poll.
        other = POLICY + "    - {name: other}\n"
        r = cb.put("/v1/policy", json={"source": other})
        assert r.status_code == 200, r.text
        third = wait_for(lambda: cluster.submitted(ca, "third", "other"), 10, "the leader to know queue other")
        until_state(ca, third, "RUNNING")
        r = ca.put("/v1/policy", json={"source": other + "    - {name: late}\n"})
        assert r.status_code == 200, r.text
        wait_for(lambda: cluster.submitted(cb, "fourth", "late"), 10, "the standby to know queue late")
        assert cb.get("/v1/policy").json()["version"] == ca.get("/v1/policy").json()["version"] == r.json()["version"]
    assert role(a) == "leader" and role(b) == "standby"


def test_a_submission_to_a_standby_wakes_the_leader(cluster: Cluster) -> None:
    """The leader is told (PostgreSQL NOTIFY) of what a standby stored, and admits it at once
    rather than at its next pass a second later: measured from the job's own events, the
    submission to its admission, five times at varied moments of the leader's interval."""
    a = cluster.start("a")
    wait_for(lambda: role(a) == "leader", 10, "a to lead")
    b = cluster.start("b")
    waits = []
    with b.client() as cb:
        for i in range(5):
            time.sleep(0.15 + 0.17 * i)  # land at different moments of the leader's 1 s interval
            job_id = cluster.job(cb, f"woken-{i}")
            job = until_state(cb, job_id, "RUNNING")
            submitted = job["events"][0]["at"]
            admitted = next(e["at"] for e in job["events"] if e["from"] == "PENDING")
            waits.append(admitted - submitted)
            r = cb.post(f"/v1/jobs/{job_id}/cancel")
            assert r.status_code == 202, r.text
            until_state(cb, job_id, "CANCELLED")
    print("submission to admission through the standby:", [f"{w:.3f}" for w in waits])
    assert max(waits) < 0.35, waits


def test_the_standby_takes_over_within_5s_of_a_kill_9_and_runs_what_was_submitted_meanwhile(
    cluster: Cluster,
) -> None:
    a = cluster.start("a")
    wait_for(lambda: role(a) == "leader", 10, "a to lead")
    b = cluster.start("b")
    with b.client() as cb:
        running = cluster.job(cb, "running")
        until_state(cb, running, "RUNNING")
        wait_for(lambda: cluster.started("running"), 10, "the running job's process")
        assert health(b)["passes"] == 0  # a standby runs no pass

        a.kill9()
        killed = time.monotonic()
        meanwhile = cluster.job(cb, "meanwhile")  # taken while nobody leads
        wait_for(lambda: role(b) == "leader" and health(b)["passes"] >= 1, 15, "b to lead and make a pass")
        took = time.monotonic() - killed
        print(f"first pass of the new leader {took:.2f} s after the SIGKILL")
        assert took < 5.0, f"the standby's first pass came {took:.2f} s after the leader's SIGKILL"
        assert health(b)["epoch"] == 2

        until_state(cb, meanwhile, "RUNNING")
        wait_for(lambda: cluster.started("meanwhile"), 10, "the job submitted meanwhile to start")
        # The running job was adopted, not started again.
        job = cb.get(f"/v1/jobs/{running}").json()
        assert job["state"] == "RUNNING" and len(job["attempts"]) == 1
        assert cluster.started("running") == [cluster.started("running")[0]]
        r = cb.post(f"/v1/jobs/{running}/cancel")
        assert r.status_code == 202, r.text
        until_state(cb, running, "CANCELLED")
        assert (cluster.marks / "running.sigterm").exists()


def test_a_second_server_on_one_sqlite_database_is_refused(tmp_path: Path) -> None:
    """SQLite serves one server: a second one, from a state directory of its own (no lock file
    of the first's is in its way), is refused at start by the lease, with a message that names
    the first and points to PostgreSQL."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    first = Server(tmp_path / "a", policy=policy).start()  # its database in its state directory
    try:
        wait_for(lambda: role(first) == "leader", 10, "the first server to lead")
        second = Server(tmp_path / "b", policy=policy, db=f"sqlite:///{tmp_path / 'a' / 'warden.db'}")
        with pytest.raises(AssertionError, match="server exited 2") as refused:
            second.start()
        message = str(refused.value)
        assert f"pid {first.proc.pid if first.proc else '?'}" in message and "PostgreSQL" in message
        assert "SQLite serves one server at a time" in message
        assert role(first) == "leader"
    finally:
        first.stop()


def test_a_leader_stopped_past_its_lease_is_killed_before_the_standby_takes_over(cluster: Cluster) -> None:
    """SIGSTOP the leader past its lease: its watchdog kills it before the lease can run out in
    the database, the standby takes over and schedules; SIGCONT finds nothing to resume, and
    nothing was started or signalled by the old leader."""
    a = cluster.start("a")
    wait_for(lambda: role(a) == "leader", 10, "a to lead")
    b = cluster.start("b")
    assert a.proc is not None
    with a.client() as ca, b.client() as cb:
        held = cluster.job(ca, "held")
        until_state(ca, held, "RUNNING")
        wait_for(lambda: cluster.started("held"), 10, "the held job's process")

        a.proc.send_signal(signal.SIGSTOP)
        try:
            wait_for(lambda: role(b) == "leader", 15, "b to take over")
            assert a.proc.poll() == -signal.SIGKILL  # dead before b could lead
            wait_for(lambda: health(b)["passes"] >= 1, 15, "b's first pass")
            assert health(b)["epoch"] == 2
            fresh = cluster.job(cb, "fresh")
            until_state(cb, fresh, "RUNNING")
            assert cb.post(f"/v1/jobs/{held}/cancel").status_code == 202
            until_state(cb, held, "CANCELLED")
        finally:
            a.proc.send_signal(signal.SIGCONT)
        assert a.log is not None
        log = a.log.read_text()
        assert "warden watchdog: killed the server (pid" in log, log[-3000:]
        assert health(b)["leader"] == b.url and role(b) == "leader" and health(b)["epoch"] == 2
        # Nothing was started or signalled twice: each job's process began once, the cancelled
        # one got one SIGTERM (b's), the new one runs on.
        assert len(cluster.started("held")) == 1 and len(cluster.started("fresh")) == 1
        assert len((cluster.marks / "held.sigterm").read_text().splitlines()) == 1
        assert not (cluster.marks / "fresh.sigterm").exists()
        job = cb.get(f"/v1/jobs/{fresh}").json()
        assert job["state"] == "RUNNING" and len(job["attempts"]) == 1
