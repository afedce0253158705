"""A leader stopped (SIGSTOP) in the middle of an act never acts after its lease ended: real
servers on a real PostgreSQL, real job processes, real signals (docs/control-plane.md, "What a
stalled leader can and cannot do").

Each test stops the leader at a step of a launch, a preemption or a cancel, found by waiting
for that step to begin (a file the step creates, a signal a job receives), lets the standby
take over, then continues the old leader. Throughout, a monitor reads every job process of
the test from /proc (every 20 ms) and records any moment where one job had processes of two attempts, or
two jobs had processes on the same GPU. Jobs record every SIGTERM with the pid that sent it,
so a signal from the old leader after it was stopped would show.
"""

from __future__ import annotations

import json
import os
import pwd
import random
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from clusterproc import Cluster, role
from pg import fresh_postgres_url, postgres_server  # noqa: F401  (fixtures)
from serverproc import Server, health, until_state, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="reading every job process's environment needs root")

POLICY = """\
min_grace: 2s
thrash: {min_efficiency: 0}
preemption: {restart_overhead: 0s, checkpoint_overhead: 0s}
tiers:
  3: {name: experimentation, lease: 1s, grace: 2s}
  4: {name: opportunistic, lease: 1s, grace: 2s}
queues:
  name: cluster
  children:
    - {name: team, nominal: {gpu: 4}}
"""

# Records its start and every SIGTERM with its sender's pid; "exit" ends on the first SIGTERM,
# "stay" waits for SIGKILL.
JOB = """\
import os, signal, sys, time
out, mode = sys.argv[1], sys.argv[2]
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
attempt = os.environ["WARDEN_ATTEMPT"]
with open(out + ".started", "a") as f:
    f.write(f"{attempt} {os.getpid()} {time.time()!r}\\n")
while True:
    info = signal.sigwaitinfo({signal.SIGTERM})
    with open(out + ".signals", "a") as f:
        f.write(f"{attempt} {info.si_pid} {time.time()!r}\\n")
    if mode == "exit":
        sys.exit(0)
"""

BULK = "x" * 100_000
"""An environment variable that makes each launch description larger than a pipe's buffer:
handing it to the shim lasts until the shim has started and reads it, a step wide enough to
stop the leader in."""


JOB_UID = pwd.getpwnam("nobody").pw_uid


class Monitor:
    """Reads the job processes under `root` from /proc every 20 ms, until `stop`."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.violations: list[str] = []
        self.last_seen: dict[str, float] = {}
        """Per job and attempt ("17/1"), when a process of it was last seen alive."""
        self.scans = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Monitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.scan()
            self._stop.wait(0.02)

    def scan(self) -> None:
        now = time.time()
        attempts: dict[str, set[str]] = {}
        gpus: dict[str, set[str]] = {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                if os.stat(f"/proc/{pid}").st_uid != JOB_UID:  # the servers run jobs as nobody
                    continue
                with open(f"/proc/{pid}/environ", "rb") as f:
                    raw = f.read()
                with open(f"/proc/{pid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if b"WARDEN_JOB_ID=" not in raw or state in ("Z", "X"):
                continue
            env = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
            if not env.get("WARDEN_CHECKPOINT_DIR", "").startswith(self.root):
                continue
            job, attempt = env["WARDEN_JOB_ID"], env["WARDEN_ATTEMPT"]
            attempts.setdefault(job, set()).add(attempt)
            gpus.setdefault(job, set()).update(g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g)
            self.last_seen[f"{job}/{attempt}"] = now
        for job, seen in attempts.items():
            if len(seen) > 1:
                self.violations.append(f"job {job} ran attempts {sorted(seen)} at once")
        held: dict[str, str] = {}
        for job, mine in gpus.items():
            for gpu in mine:
                if gpu in held:
                    self.violations.append(f"GPU {gpu} held by jobs {held[gpu]} and {job} at once")
                held[gpu] = job
        self.scans += 1


def signals(cluster: Cluster, name: str) -> list[tuple[str, int, float]]:
    """Each SIGTERM the job's attempts received: (attempt, sender pid, when)."""
    path = cluster.marks / f"{name}.signals"
    if not path.exists():
        return []
    return [(a, int(p), float(t)) for a, p, t in (line.split() for line in path.read_text().splitlines())]


def submit(
    cluster: Cluster, c: httpx.Client, name: str, *, tier: int = 3, gpus: int = 1, mode: str = "exit", **kw: Any
) -> str:
    r = c.post(
        "/v1/jobs",
        json={
            "queue": "team",
            "tier": tier,
            "gpus": gpus,
            "name": name,
            "workdir": os.getcwd(),
            "command": [sys.executable, "-c", JOB, str(cluster.marks / name), mode],
            **kw,
        },
    )
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


@pytest.fixture
def cluster(tmp_path: Path, fresh_postgres_url: str) -> Iterator[Cluster]:
    made = Cluster(tmp_path, fresh_postgres_url, policy=POLICY, gpus=4)
    try:
        yield made
    finally:
        made.cleanup()


def stop_leader_at(a: Server, step: Any, what: str) -> float:
    """SIGSTOP the leader the moment `step()` holds (polled tightly); when that was."""
    assert a.proc is not None
    wait_for(step, 30, what, interval=0.001)
    a.proc.send_signal(signal.SIGSTOP)
    return time.time()


def taken_over(a: Server, b: Server) -> None:
    """The standby leads and has made a pass, and the stopped leader is dead: its watchdog
    killed it before the lease could pass to b."""
    assert a.proc is not None
    wait_for(lambda: role(b) == "leader", 20, "b to take over")
    assert a.proc.poll() == -signal.SIGKILL, "the stopped leader was not dead when b took over"
    wait_for(lambda: health(b)["passes"] >= 1, 15, "b's first pass")
    a.proc.send_signal(signal.SIGCONT)  # nothing left to continue
    assert a.log is not None and "warden watchdog: killed the server" in a.log.read_text()


def nothing_signalled_after(cluster: Cluster, names: list[str], a: Server, stopped_at: float) -> None:
    assert a.proc is not None
    late = [(n, s) for n in names for s in signals(cluster, n) if s[1] == a.proc.pid and s[2] >= stopped_at]
    assert not late, f"the old leader signalled after it was stopped: {late}"


def test_a_leader_stopped_while_it_launches_starts_nothing_after_the_takeover(cluster: Cluster) -> None:
    """Four jobs are admitted at once; the leader is stopped as it forks the first shim (the
    launch descriptions, each larger than a pipe's buffer, are on their way). The standby
    takes over, revokes what was not claimed, requeues it and starts it again: every job runs,
    never two attempts at once, no GPU is held twice, and no launch of the old leader starts
    after the takeover."""
    a = cluster.start("a")
    wait_for(lambda: role(a) == "leader", 10, "a to lead")
    b = cluster.start("b")
    with Monitor(cluster.root) as monitor, b.client() as cb:
        ids = [submit(cluster, cb, f"launch-{i}", env={"BULK": BULK}) for i in range(4)]
        logs = [a.state_dir / "jobs" / i / "attempt-1" / "rank-0.log" for i in ids]
        stop_leader_at(a, lambda: any(p.exists() for p in logs), "a to fork the first shim")
        taken_over(a, b)
        took_over_at = time.time()
        outcomes: list[str] = []
        jobs = [until_state(cb, i, "RUNNING", timeout=30) for i in ids]
        for name in (f"launch-{i}" for i in range(4)):
            wait_for(lambda name=name: cluster.started(name), 15, f"{name} to start")
        # Every running attempt was started once, by whichever leader launched it: a launch of
        # the old leader's either ran (claimed before the takeover, and adopted) or never did.
        for job, name in zip(jobs, (f"launch-{i}" for i in range(4))):
            live = [x for x in job["attempts"] if x["ended_at"] is None]
            assert len(live) == 1, job["attempts"]
            starts = [line.split() for line in cluster.started(name)]
            assert [s[0] for s in starts] == [str(live[0]["number"])], (name, starts, job["attempts"])
            # What a's launch of attempt 1 became: claimed by its shim before b led (and adopted:
            # attempt 1 runs), revoked by b (a requeued attempt runs), or never begun.
            path = a.state_dir / "jobs" / job["id"] / "attempt-1" / "rank-0.status.json"
            status = json.loads(path.read_text()) if path.exists() else None
            if status is not None and "revoked" not in status:
                assert live[0]["number"] == 1 and status["claimed_at"] < took_over_at, status
                outcomes.append("claimed")
            elif status is not None:
                assert live[0]["number"] > 1, (status, job["attempts"])
                outcomes.append("revoked")
    print("a's launches:", outcomes)
    assert "revoked" in outcomes or "claimed" in outcomes  # a was stopped with a launch under way
    assert monitor.scans > 10 and monitor.violations == [], monitor.violations[:5]


def test_a_leader_stopped_while_it_preempts_signals_nothing_after_the_takeover(cluster: Cluster) -> None:
    """Four tier-4 jobs that wait for SIGKILL fill the GPUs; a tier-3 job for all four
    preempts them. The leader is stopped the moment the first victim gets its SIGTERM. The new
    leader finishes the preemption from the database (each SIGKILL at its recorded deadline,
    within 0.5 s), the preemptor starts only once the victims are gone, and the old leader
    sends nothing after it was stopped."""
    a = cluster.start("a")
    wait_for(lambda: role(a) == "leader", 10, "a to lead")
    b = cluster.start("b")
    names = [f"victim-{i}" for i in range(4)]
    with Monitor(cluster.root) as monitor, b.client() as cb:
        victims = [submit(cluster, cb, n, tier=4, mode="stay") for n in names]
        starts = [until_state(cb, v, "RUNNING")["attempts"][0]["started_at"] for v in victims]
        wait_for(lambda: time.time() > max(starts) + 1.5, 5, "the victims' leases to pass")
        preemptor = submit(cluster, cb, "preemptor", gpus=4)
        stopped_at = stop_leader_at(a, lambda: any(signals(cluster, n) for n in names), "a victim's SIGTERM")
        taken_over(a, b)
        until_state(cb, preemptor, "RUNNING", timeout=30)
        for v in victims:
            job = until_state(cb, v, "PENDING", "REQUEUED", "RUNNING", timeout=30)
            first = job["attempts"][0]
            assert first["ended_at"] is not None
            seen = monitor.last_seen.get(f"{v}/1")
            kill_at = first.get("kill_at")
            if seen is not None and kill_at is not None:
                assert seen <= kill_at + 0.5, f"victim {v} outlived its SIGKILL deadline by {seen - kill_at:.2f} s"
    nothing_signalled_after(cluster, names, a, stopped_at)
    assert monitor.scans > 10 and monitor.violations == [], monitor.violations[:5]


def test_a_leader_stopped_in_a_cancels_grace_signals_nothing_after_the_takeover(cluster: Cluster) -> None:
    """A job that waits for SIGKILL is cancelled on the leader; the leader is stopped the
    moment the job gets its SIGTERM. The SIGKILL comes at the recorded deadline (the new
    leader's timer or the job's supervisor), within 0.5 s, the job ends CANCELLED, and the old
    leader sends nothing after it was stopped."""
    a = cluster.start("a")
    wait_for(lambda: role(a) == "leader", 10, "a to lead")
    b = cluster.start("b")
    with Monitor(cluster.root) as monitor, a.client() as ca, b.client() as cb:
        job_id = submit(cluster, cb, "cancelled", mode="stay")
        until_state(cb, job_id, "RUNNING")
        wait_for(lambda: cluster.started("cancelled"), 10, "the job's process")
        assert ca.post(f"/v1/jobs/{job_id}/cancel").status_code == 202
        stopped_at = stop_leader_at(a, lambda: signals(cluster, "cancelled"), "the job's SIGTERM")
        taken_over(a, b)
        job = until_state(cb, job_id, "CANCELLED", timeout=30)
        attempt = job["attempts"][0]
        seen = monitor.last_seen.get(f"{job_id}/1")
        assert attempt["kill_at"] is not None and seen is not None
        assert seen <= attempt["kill_at"] + 0.5, (
            f"it outlived its SIGKILL deadline by {seen - attempt['kill_at']:.2f} s"
        )
        assert len(job["attempts"]) == 1
    nothing_signalled_after(cluster, ["cancelled"], a, stopped_at)
    assert monitor.violations == [], monitor.violations[:5]


@pytest.mark.slow
def test_leaders_stopped_at_random_moments_never_run_a_job_twice(cluster: Cluster) -> None:
    """Property: under a steady workload (launches, exits, cancels, preemptions), the leader
    is stopped at a random moment, a standby takes over and a fresh standby replaces the dead
    leader, three times. No job ever has two live attempts, no GPU is held twice, no old leader
    signals anything after it was stopped, and every job submitted ends or runs."""
    rng = random.Random(1207)
    servers = [cluster.start("s0")]
    wait_for(lambda: role(servers[0]) == "leader", 10, "s0 to lead")
    servers.append(cluster.start("s1"))
    names: list[str] = []
    stops: list[tuple[Server, float]] = []
    done = threading.Event()

    def workload() -> None:
        i = 0
        while not done.is_set():
            live = [s for s in servers if s.proc is not None and s.proc.poll() is None]
            try:
                with live[-1].client() as c:
                    name = f"w{i}"
                    tier, gpus = (4, 1) if rng.random() < 0.7 else (3, rng.choice((1, 2, 4)))
                    submit(cluster, c, name, tier=tier, gpus=gpus, mode=rng.choice(("exit", "stay")))
                    names.append(name)
                    running = c.get("/v1/jobs", params={"state": "RUNNING"}).json()
                    if i % 3 == 2 and running:
                        c.post(f"/v1/jobs/{rng.choice(running)['id']}/cancel")
            except (httpx.TransportError, AssertionError):
                pass  # the server asked was the one just stopped: the next one is asked next time
            i += 1
            done.wait(rng.uniform(0.1, 0.4))

    with Monitor(cluster.root) as monitor:
        thread = threading.Thread(target=workload, daemon=True)
        thread.start()
        for round_ in range(3):
            leader = next(s for s in servers if s.proc is not None and s.proc.poll() is None and role(s) == "leader")
            standby = next(s for s in servers if s is not leader and s.proc is not None and s.proc.poll() is None)
            time.sleep(rng.uniform(0.2, 2.0))  # the random moment
            assert leader.proc is not None
            leader.proc.send_signal(signal.SIGSTOP)
            stops.append((leader, time.time()))
            taken_over(leader, standby)
            servers.append(cluster.start(f"s{round_ + 2}"))
        done.set()
        thread.join(10)
        last = servers[-2]  # the leader of the last round's takeover
        with last.client() as c:
            wait_for(
                lambda: not c.get("/v1/jobs", params={"state": ["ADMITTED", "STARTING", "PREEMPTING"]}).json(),
                30,
                "every launch and preemption under way to be carried out",
            )
        with last.client() as c:
            failed = [(j["id"], j["name"]) for j in c.get("/v1/jobs", params={"all": "true", "state": "FAILED"}).json()]
        assert failed == [], f"jobs failed (a preemption or cancel recorded as a failure): {failed}"
    for leader, stopped_at in stops:
        nothing_signalled_after(cluster, names, leader, stopped_at)
    assert monitor.scans > 100 and monitor.violations == [], monitor.violations[:5]
    assert len(names) > 10
