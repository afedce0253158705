"""Takeovers under load, and elections among servers started together (docs/control-plane.md,
"Several servers"): real server processes on a real PostgreSQL, real jobs, real signals.

The load test kills the leader with SIGKILL a dozen times while a client submits through every
server (with idempotency keys, retrying on another server after a connection error as a
client would), cancels jobs, and submits urgent jobs that preempt others, whose victims ignore
their SIGTERM and are in their grace when the leader dies. Afterwards, from the database and
from what the jobs and their supervisors recorded: every accepted submission is stored once, no
GPU was held by two attempts at once, every ignored SIGTERM was followed by SIGKILL at its
deadline (never before, at most 0.5 s after, the deadlines inside a takeover included), every
cancel answered 2xx ended CANCELLED, each epoch had one holder, and each new leader made its
first pass within 5 s of the kill.
"""

from __future__ import annotations

import random
import re
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from clusterproc import Cluster
from pg import fresh_postgres_url, postgres_server  # noqa: F401  (fixtures)
from serverproc import ADMIN, Server, health, leading, wait_for
from sqlalchemy import Engine, select, text

from warden.executors.shim import read_json
from warden.store import connect
from warden.store.schema import AttemptRow, JobRow

TRIALS = 12
GPUS = 4
GRACE_S = 3.0
"""The grace of the jobs that are preempted or cancelled: about a takeover's length, so that
the deadlines of the jobs in their grace when the leader dies fall inside the takeover."""
URGENT_GRACE_S = 2.0
LATE_S = 0.5
"""SIGKILL at most this long after the recorded deadline."""
TAKEOVER_S = 5.0
"""From the kill to the new leader's first pass."""
SIGNAL_SLACK_S = 0.25
"""How much later than its SIGTERM was sent a loaded machine may run the job's trap that
records it: the job's reading of the clock comes after the signal, never before."""

POLICY = f"""\
min_grace: 2s
thrash: {{min_efficiency: 0, max_preemptions: {{per: 1d, count: 1000}}}}
preemption: {{restart_overhead: 0s, checkpoint_overhead: 0s}}
tiers:
  1: {{name: urgent, preemptible: false, grace: {URGENT_GRACE_S:g}s, scope: cluster}}
  3: {{name: experimentation, lease: 0s, grace: {GRACE_S:g}s}}
queues:
  name: cluster
  children:
    - {{name: team, nominal: {{gpu: {GPUS}}}}}
    - {{name: parked, nominal: {{gpu: 0}}, borrowing_limit: {{gpu: 0}}}}
limits: {{max_pending_per_user: 100000, max_pending_per_queue: 100000}}
"""
"""Tier 1 (the admin's, so without approval) preempts tier 3 anywhere; `parked` never runs
(the submissions sent while the leader dies wait there)."""

# Records each start and each SIGTERM (its attempt and the time) and ignores SIGTERM: only
# SIGKILL ends it. bash, not Python: a hundred of these start on two cores.
STUBBORN = """\
out=$1
trap 'echo "$WARDEN_ATTEMPT $EPOCHREALTIME" >> "$out.sigterm"' TERM
echo "$WARDEN_ATTEMPT $EPOCHREALTIME" >> "$out.started"
while :; do sleep 60 & wait $!; done
"""

LEADS = re.compile(r"this server leads now \(epoch (\d+)\)")
AUTH = {"Authorization": f"Bearer {ADMIN}"}


def live(cluster: Cluster) -> list[Server]:
    return [s for s in cluster.servers if s.proc is not None and s.proc.poll() is None]


def standing_by(cluster: Cluster) -> list[Server]:
    return [s for s in live(cluster) if health(s).get("role") == "standby"]


def epochs_led(root: Path) -> list[int]:
    """Every epoch a server began to lead, from all the servers' logs under `root`."""
    return sorted(int(m) for log in root.glob("*/server-*.log") for m in LEADS.findall(log.read_text()))


class Load:
    """A client of the cluster on threads of its own, through whichever servers run, leader and
    standbys alike: submissions (each with an idempotency key, retried on another server after
    a connection error), replays of earlier ones, cancels, and urgent jobs that preempt."""

    def __init__(self, cluster: Cluster, seed: int) -> None:
        self.cluster = cluster
        self.rng = random.Random(seed)
        self.script = cluster.root / "stubborn.sh"
        self.script.write_text(STUBBORN)
        self.lock = threading.Lock()
        self.n = 0
        self.bodies: dict[str, dict[str, Any]] = {}
        self.accepted: dict[str, str] = {}
        """Idempotency key (also the job's name) -> the id it was answered with."""
        self.in_doubt: set[str] = set()
        """Keys no server answered."""
        self.retried = 0
        """Submissions sent again after a connection error ..."""
        self.retried_replays = 0
        """... and of those, the ones answered as a replay: the first try had been stored."""
        self.replays: list[tuple[str, str, int, str | None]] = []
        """(key, first id, status, replayed id) of submissions sent again on purpose."""
        self.cancels: dict[str, int] = {}
        """Job id -> the 2xx status its cancel was answered with."""
        self.problems: list[str] = []
        self.clients: dict[str, httpx.Client] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="load", daemon=True)

    def client(self, server: Server) -> httpx.Client:
        """A client of its own per server, kept (a new one costs ~20 ms of CPU)."""
        with self.lock:
            if server.url not in self.clients:
                self.clients[server.url] = httpx.Client(
                    base_url=server.url, headers=AUTH, timeout=10, verify=server.tls()
                )
            return self.clients[server.url]

    def send(self, method: str, path: str, **kw: Any) -> httpx.Response | None:
        """The answer of a running server, tried in turn at random (None: none answered)."""
        return self.sent(method, path, **kw)[0]

    def sent(self, method: str, path: str, **kw: Any) -> tuple[httpx.Response | None, bool]:
        """`send`, and whether the request went out again after a connection was lost (the
        server killed as it answered: what it stored may come back as a replay)."""
        lost = False
        for _ in range(40):
            servers = live(self.cluster)
            if servers:
                try:
                    return self.client(self.rng.choice(servers)).request(method, path, **kw), lost
                except httpx.TransportError:
                    lost = True
            time.sleep(0.05)
        return None, lost

    def body(self, tier: int, queue: str = "team") -> tuple[str, dict[str, Any]]:
        with self.lock:
            self.n += 1
            key = f"t{tier}-{queue}-{self.n}"
        command = ["bash", str(self.script), str(self.cluster.marks / key)] if tier == 3 else ["sleep", "1.5"]
        body = {"queue": queue, "tier": tier, "gpus": 1, "name": key, "workdir": "/", "command": command}
        self.bodies[key] = body
        return key, body

    def answered(self, key: str, r: httpx.Response | None, retried: bool) -> None:
        with self.lock:
            self.retried += retried
            if r is None:
                self.in_doubt.add(key)
            elif r.status_code in (200, 201):
                self.accepted[key] = str(r.json()["id"])
                self.retried_replays += retried and r.status_code == 200
                if r.status_code == 200 and not retried:
                    self.problems.append(f"{key}: its first try was answered as a replay")
            else:
                self.problems.append(f"{key}: {r.status_code} {r.text}")

    def submit(self, tier: int) -> None:
        key, body = self.body(tier)
        self.answered(key, *self.sent("POST", "/v1/jobs", json=body, headers={"Idempotency-Key": key}))

    def burst(self, server: Server, seconds: float) -> None:
        """Submissions one after another to `server` (the leader about to die) for `seconds`;
        the one its death cuts off is sent again to another server with its key."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            key, body = self.body(3, "parked")
            try:
                r = self.client(server).post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
            except httpx.TransportError:
                self.answered(key, self.send("POST", "/v1/jobs", json=body, headers={"Idempotency-Key": key}), True)
                return
            self.answered(key, r, False)

    def replay(self) -> None:
        with self.lock:
            key = self.rng.choice(sorted(self.accepted))
            first = self.accepted[key]
        r = self.send("POST", "/v1/jobs", json=self.bodies[key], headers={"Idempotency-Key": key})
        if r is not None:
            self.replays.append((key, first, r.status_code, r.json().get("id")))

    def cancel(self, job_id: str) -> None:
        r = self.send("POST", f"/v1/jobs/{job_id}/cancel")
        if r is not None and 200 <= r.status_code < 300:
            self.cancels[job_id] = r.status_code

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                self._step()
                self.stop.wait(0.2)
        except Exception as err:  # reported by the test, not lost in a thread
            self.problems.append(f"the load thread failed: {err!r}")

    def close(self) -> None:
        for c in self.clients.values():
            c.close()

    def _step(self) -> None:
        r = self.send("GET", "/v1/jobs", params={"queue": "team"})
        if r is None or r.status_code != 200:
            return
        jobs = r.json()
        waiting = [j for j in jobs if j["tier"] == 3 and j["state"] in ("PENDING", "REQUEUED")]
        running = [j for j in jobs if j["tier"] == 3 and j["state"] == "RUNNING" and j["id"] not in self.cancels]
        urgent = [j for j in jobs if j["tier"] == 1]
        if len(waiting) < 2:
            self.submit(3)
        if len(urgent) < 2 and self.rng.random() < 0.5:
            self.submit(1)  # preempts a tier-3 job, which ignores its SIGTERM: in its grace for 3 s
        if running and self.rng.random() < 0.12:
            self.cancel(self.rng.choice(running)["id"])
        elif waiting and self.rng.random() < 0.05:
            self.cancel(self.rng.choice(waiting)["id"])
        if self.accepted and self.rng.random() < 0.15:
            self.replay()


def stored(db: str) -> tuple[list[Any], list[Any]]:
    """Every job row and every attempt row."""
    engine = connect(db)
    try:
        with engine.connect() as conn:
            jobs = [j._mapping for j in conn.execute(select(JobRow.__table__))]
            attempts = [a._mapping for a in conn.execute(select(AttemptRow.__table__))]
    finally:
        engine.dispose()
    return jobs, attempts


def first_marks(path: Path) -> dict[int, float]:
    """Attempt -> the first time a job recorded in this marks file."""
    first: dict[int, float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            attempt, at = line.split()
            first.setdefault(int(attempt), float(at))
    return first


def overlaps(attempts: list[Any]) -> list[str]:
    """Two attempts holding one GPU at once: an attempt holds its GPUs from its start to the
    end of its last process, one that has not ended holds them still."""
    held: dict[tuple[str, int], list[tuple[float, float, str]]] = defaultdict(list)
    for a in attempts:
        end = a["ended_at"] if a["ended_at"] is not None else float("inf")
        for replica in a["assignment"]:
            for gpu in replica["gpus"]:
                held[(replica["node"], gpu)].append((a["started_at"], end, f"job {a['job_id']} attempt {a['number']}"))
    found = []
    for gpu, spans in held.items():
        spans.sort()
        for (_, end, who), (start, _, other) in zip(spans, spans[1:]):
            if start < end:
                found.append(f"GPU {gpu}: {who} until {end:.3f}, {other} from {start:.3f}")
    return found


@pytest.fixture
def loaded(tmp_path: Path, fresh_postgres_url: str) -> Iterator[Cluster]:
    made = Cluster(tmp_path, fresh_postgres_url, policy=POLICY, gpus=GPUS)
    try:
        yield made
    finally:
        made.cleanup()


def test_kill_9s_of_the_leader_under_load_lose_double_and_delay_nothing(loaded: Cluster) -> None:
    """Three servers; `TRIALS` times, at a varied moment, while jobs are in their grace and a
    submission may be in flight to it, the leader is killed with SIGKILL; once another leads
    it is started again as a standby. Then the checks of this module's docstring."""
    cluster = loaded
    cluster.start_together(["a", "b", "c"])
    found = wait_for(lambda: leading(live(cluster)), 15, "a leader's first pass")
    load = Load(cluster, seed=33)
    load.thread.start()
    rng = random.Random(33)
    restarts: list[threading.Thread] = []
    failed: list[str] = []
    takeovers: list[float] = []
    gaps: list[tuple[float, float]] = []
    try:
        wait_for(lambda: len(load.accepted) >= 8, 30, "the load to start jobs")
        for _ in range(TRIALS):
            leader, epoch = found
            wait_for(lambda leader=leader: any(s is not leader for s in standing_by(cluster)), 120, "a standby")
            time.sleep(rng.uniform(0.1, 1.6))  # a varied moment of the leader's loop and the load's
            burst = threading.Thread(target=load.burst, args=(leader, 1.0))
            burst.start()
            time.sleep(rng.uniform(0.0, 0.2))
            leader.kill9()
            killed, killed_wall = time.monotonic(), time.time()
            others = [s for s in live(cluster) if s is not leader]
            found = wait_for(
                lambda others=others, epoch=epoch: leading(others, epoch), 30, "another leader's pass", interval=0.05
            )
            takeovers.append(time.monotonic() - killed)
            gaps.append((killed_wall, time.time()))
            burst.join(30)

            def restart(server: Server = leader) -> None:
                try:
                    server.start(timeout=120)
                except Exception as err:
                    failed.append(repr(err))

            restarts.append(threading.Thread(target=restart))
            restarts[-1].start()
    finally:
        load.stop.set()
        load.thread.join(30)
        load.close()
        for t in restarts:
            t.join(120)
    print(
        f"\ntakeovers (kill -9 to the new leader's first pass), {len(takeovers)}: "
        + " ".join(f"{t:.2f}" for t in takeovers)
        + f"; median {statistics.median(takeovers):.2f} s, max {max(takeovers):.2f} s"
    )
    assert not failed, failed
    assert not load.problems, load.problems

    # Every SIGTERM's deadline and every cancel is carried out by now; wait for their ends.
    def settled() -> bool:
        jobs, attempts = stored(cluster.db)
        state = {str(j["id"]): j["state"] for j in jobs}
        in_grace = [a for a in attempts if a["sigterm_at"] is not None and a["ended_at"] is None]
        return not in_grace and all(state[j] in ("CANCELLED", "SUCCEEDED", "FAILED") for j in load.cancels)

    wait_for(settled, GRACE_S + 20, "the attempts in their grace and the cancelled jobs to end", interval=0.5)
    jobs, attempts = stored(cluster.db)

    # Submissions: each accepted one stored once, with the id it was answered with; each replay
    # answered with the first job; nothing stored that was not sent.
    by_key: dict[str, list[str]] = defaultdict(list)
    for j in jobs:
        by_key[j["idempotency_key"]].append(str(j["id"]))
    assert not {k: ids for k, ids in by_key.items() if len(ids) > 1}
    assert {k: by_key.get(k) for k in load.accepted} == {k: [i] for k, i in load.accepted.items()}
    assert set(by_key) <= set(load.accepted) | load.in_doubt
    assert all(status == 200 and again == first for _, first, status, again in load.replays), load.replays

    # No GPU held by two attempts at once.
    assert not overlaps(attempts)

    # Each ignored SIGTERM: SIGKILL at the recorded deadline (the database's, or the
    # supervisor's control.json where the leader died before it stored it), never earlier than
    # the grace after the SIGTERM the job saw, at most LATE_S later.
    name_of = {j["id"]: j["name"] for j in jobs}
    late, early, lateness, in_gap = [], [], [], 0
    for a in attempts:
        name = name_of[a["job_id"]]
        told = first_marks(cluster.marks / f"{name}.sigterm").get(a["number"])
        if told is None:
            continue
        who = f"job {a['job_id']} ({name}) attempt {a['number']}"
        assert a["ended_at"] is not None and a["exit_codes"] == [-9], (who, dict(a))
        kill_at = a["kill_at"]
        if kill_at is None and a["handle"]:
            kill_at = (read_json(Path(a["handle"]["control_path"])) or {}).get("kill_at")
        assert kill_at is not None, (who, dict(a))
        lateness.append(a["ended_at"] - kill_at)
        in_gap += any(start <= kill_at <= end for start, end in gaps)
        if a["ended_at"] - kill_at > LATE_S:
            late.append(f"{who}: killed {a['ended_at'] - kill_at:.3f} s after its deadline")
        if a["ended_at"] < kill_at or a["ended_at"] < told + GRACE_S - SIGNAL_SLACK_S:
            early.append(f"{who}: killed {a['ended_at'] - told:.3f} s after the SIGTERM it recorded")
    print(
        f"SIGKILLs after an ignored SIGTERM: {len(lateness)}, {in_gap} with the deadline inside a takeover; "
        f"lateness median {statistics.median(lateness):.3f} s, max {max(lateness):.3f} s"
    )
    assert not early, early
    assert not late, late
    assert len(lateness) >= TRIALS and in_gap >= 3, (len(lateness), in_gap)

    # Every cancel answered 2xx ended the job CANCELLED.
    state = {str(j["id"]): j["state"] for j in jobs}
    assert not {job: state[job] for job in load.cancels if state[job] != "CANCELLED"}
    assert len(load.cancels) >= 10

    # One holder per epoch and one epoch more per kill; each first pass within 5 s of the kill.
    assert epochs_led(cluster.root) == list(range(1, TRIALS + 2))
    print(
        f"submissions accepted {len(load.accepted)} (in doubt {len(load.in_doubt)}), sent again after a "
        f"connection error {load.retried} (of which {load.retried_replays} had been stored: answered as replays), "
        f"replayed on purpose {len(load.replays)}; cancels answered 2xx {len(load.cancels)}"
    )
    assert max(takeovers) < TAKEOVER_S, takeovers


ROUNDS = 2
TOGETHER = 4


def lease_row(engine: Engine) -> tuple[int | None, int]:
    """The pid of the lease's holder while the lease is live by the database's clock (else
    None), and its epoch."""
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT pid, epoch, expires_at > extract(epoch from now()) AS live FROM leader_lease")
        ).one()
    return (row.pid if row.live else None), int(row.epoch)


def look(engine: Engine, servers: list[Server]) -> tuple[Server, int] | None:
    """One look at every server and at the lease row: never two leaders. Once exactly one
    leads, the row names it with its epoch and every other names it as the leader: that
    server and its epoch."""
    seen = {s.url: health(s) for s in servers}
    leaders = [s for s in servers if seen[s.url].get("role") == "leader"]
    assert len(leaders) <= 1, {url: h.get("role") for url, h in seen.items()}
    pid, epoch = lease_row(engine)
    if not leaders or leaders[0].proc is None or pid != leaders[0].proc.pid or seen[leaders[0].url]["epoch"] != epoch:
        return None
    others = [seen[s.url] for s in servers if s is not leaders[0]]
    if not all(h.get("role") == "standby" and h.get("leader") == leaders[0].url for h in others):
        return None
    return leaders[0], epoch


def observe(engine: Engine, servers: list[Server], times: int) -> tuple[Server, int]:
    """The one server that leads: waited for, then the same at each of `times` more looks."""
    first = wait_for(lambda: look(engine, servers), 30, "one server to lead and the others to name it")
    for _ in range(times):
        assert look(engine, servers) == first
    return first


def test_servers_started_together_elect_one_leader_and_each_handover_the_next_epoch(
    tmp_path: Path, fresh_postgres_url: str
) -> None:
    """Four server processes started at the same instant, twice over: at every look
    exactly one leads, the lease row names it, and the others stand by naming it. Each round
    the leader is stopped (it gives the lease back and the others contend at once) until two
    are left: each time exactly one other leads, with the next epoch. Over all rounds each
    epoch had one holder."""
    cluster = Cluster(tmp_path, fresh_postgres_url)
    engine = connect(fresh_postgres_url)
    epochs: list[int] = []
    try:
        for round_ in range(ROUNDS):
            servers = cluster.start_together([f"r{round_}-{i}" for i in range(TOGETHER)], timeout=120)
            leader, epoch = observe(engine, servers, 5)
            epochs.append(epoch)
            while len(servers) > 2:
                leader.stop()
                servers.remove(leader)
                leader, next_epoch = observe(engine, servers, 3)
                assert next_epoch == epoch + 1
                epoch = next_epoch
                epochs.append(epoch)
            for s in sorted(servers, key=lambda s: s is leader):  # the leader last: no handover
                s.stop()
    finally:
        cluster.cleanup()
        engine.dispose()
    assert epochs == list(range(1, ROUNDS * (TOGETHER - 1) + 1))
    assert epochs_led(tmp_path) == epochs
