"""A leader stopped (SIGSTOP) in the middle of a launch on Ray never acts after its lease ended:
two real servers with `--executor ray` on one real PostgreSQL, the session's real Ray cluster
(tests/raycluster.py), real launchers, shims and job processes, real signals
(docs/control-plane.md, "What a stalled leader can and cannot do"; docs/ray.md, "Restart").

The leader is stopped at a step of its launch of a gang of two, found by waiting for that step
to begin (`STEPS`: its placement group in Ray, its handle in the database; a stop before its
group exists is tests/server/test_stalled_leader.py's case). The standby takes over once the
leader's watchdog has killed it, and the job then runs whole, once: one live attempt, each
rank's process started once, only that attempt's placement group and launchers in Ray (nothing
any attempt does not own). Of what the old leader had begun, each rank's launch was either
claimed by its shim before the takeover (adopted, or killed with a gang that could not run
whole) or revoked by the new leader, and then it never ran.

A gang's ranks are started by calls from the leader's own Ray driver, queued there until each
launcher exists: a call that had not left when the leader was stopped dies with it. So a gang
can be found with a rank started and another that never will be (a stop once a launcher opened
its rank's log finds it about one time in eight); the new leader then ends the gang and runs it
again, never a rank twice at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from clusterproc import Cluster, role
from pg import fresh_postgres_url, postgres_server  # noqa: F401  (fixtures)
from raycluster import RayCluster
from serverproc import Server, free_port, wait_for
from test_ray_e2e import clear, ray_query
from test_stalled_leader import taken_over

from warden.executors.ray import group_name, launcher_name
from warden.executors.records import launched, read_job_json
from warden.executors.shim import process_alive

# Real servers, a real PostgreSQL and the session's Ray cluster; one xdist worker runs every Ray test.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

POLICY = """\
min_grace: 2s
thrash: {min_efficiency: 0}
preemption: {restart_overhead: 0s, checkpoint_overhead: 0s}
tiers:
  3: {name: experimentation, lease: 1s, grace: 2s}
queues:
  name: cluster
  children:
    - {name: team, nominal: {gpu: 12}}
"""

# Records each start of a replica (its attempt, rank and pid), then runs until killed.
JOB = """\
import os, sys, time
with open(sys.argv[1] + ".started", "a") as f:
    f.write(f"{os.environ['WARDEN_ATTEMPT']} {os.environ['RANK']} {os.getpid()} {time.time()!r}\\n")
while True:
    time.sleep(1)
"""

RANKS = 2

# A driver of its own that stops the leader (SIGSTOP to argv[1]) the moment Ray shows a
# placement group, not removed, whose name matches argv[2] (the table keeps removed groups, of
# earlier tests too). Each look is a round trip to the GCS.
STOPPER = """
import os, re, signal, sys
pid, pattern = int(sys.argv[1]), re.compile(sys.argv[2])
print("ready", flush=True)
while not any(
    pattern.fullmatch(v["name"]) and v["state"] != "REMOVED" for v in placement_group_table().values()
):
    pass
os.kill(pid, signal.SIGSTOP)
"""


class RayServers(Cluster):
    """Servers on one database, each with `--executor ray` on `ray`'s cluster and a state
    directory of its own under `root`."""

    def __init__(self, root: Path, db: str, ray: RayCluster) -> None:
        super().__init__(root, db, policy=POLICY)
        self.ray = ray

    def start(self, name: str, *args: str, port: int | None = None, timeout: float = 60) -> Server:
        server = Server(
            self.root / name,
            policy=self.policy,
            gpus=None,  # Ray's nodes; as root, jobs run as `nobody` (serverproc.AS_NOBODY)
            db=self.db,
            args=("--executor", "ray", *args),
            env={k: v for k, v in self.ray.env.items() if k.startswith(("WARDEN_RAY_", "RAY_"))},
            port=port or free_port(),
        )
        server.start(timeout)
        self.servers.append(server)
        return server

    def gang(self, c: httpx.Client, name: str) -> str:
        r = c.post(
            "/v1/jobs",
            json={
                "queue": "team",
                "tier": 3,
                "gpus": 2,
                "replicas": RANKS,
                "name": name,
                "workdir": os.getcwd(),
                "command": [sys.executable, "-c", JOB, str(self.marks / name)],
            },
        )
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def starts(self, name: str) -> list[tuple[int, int, int, float]]:
        """Each start of a replica of the job: its attempt, rank, pid and time."""
        return [(int(a), int(r), int(p), float(t)) for a, r, p, t in (line.split() for line in self.started(name))]


@pytest.fixture
def servers(tmp_path: Path, fresh_postgres_url: str, ray_cluster: RayCluster) -> Iterator[RayServers]:
    clear(ray_cluster)  # what an earlier test left would read as this one's strays
    made = RayServers(tmp_path, fresh_postgres_url, ray_cluster)
    try:
        yield made
    finally:
        made.cleanup()
        clear(ray_cluster)


def in_ray(cluster: RayCluster) -> tuple[dict[str, list[str]], list[str]]:
    """warden's placement groups in Ray (name -> the state of each group of that name, REMOVED
    ones included) and warden's live named launchers."""
    found = ray_query(
        cluster,
        "groups = {}\n"
        "for v in placement_group_table().values():\n"
        "    if v['name'].startswith('warden.'): groups.setdefault(v['name'], []).append(v['state'])\n"
        "actors = sorted(a for a in ray.util.list_named_actors() if a.startswith('warden.'))\n"
        "print(json.dumps([groups, actors]))",
    )
    return found[0], found[1]


def stopper(cluster: RayCluster, a: Server, pattern: str) -> subprocess.Popen[str]:
    """Start the driver that SIGSTOPs `a` once Ray shows a placement group named as `pattern`
    matches (`STOPPER`); returns once it watches."""
    assert a.proc is not None
    prelude = (
        "import json, ray, warden\n"
        "code = ray.job_config.JobConfig(code_search_path=[warden.__path__[0].rsplit('/', 1)[0]])\n"
        f"ray.init(address={cluster.address!r}, namespace='warden', log_to_driver=False, logging_level='ERROR', "
        "job_config=code)\n"
        "from ray.util.placement_group import placement_group_table\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", prelude + STOPPER, str(a.proc.pid), pattern],
        stdout=subprocess.PIPE,
        text=True,
        env=cluster.env,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


STEPS = {
    "group": "its placement group appears in Ray",
    "starting": "the job is STARTING (its handle stored: every launcher asked to start)",
}
"""Where the leader is stopped: once its placement group exists (b finds it unclaimed: revoked,
requeued, the group and launchers removed as no attempt's), once the launch is recorded (b
adopts it, revokes what no shim claimed, and ends it as evicted)."""


def running_whole(c: httpx.Client, servers: RayServers, job_id: str) -> dict[str, Any] | None:
    """The job once it runs an attempt every rank of which has started, else None."""
    job: dict[str, Any] = c.get(f"/v1/jobs/{job_id}").json()
    live = [x for x in job["attempts"] if x["ended_at"] is None]
    if job["state"] != "RUNNING" or len(live) != 1:
        return None
    ranks = {rank for attempt, rank, _, _ in servers.starts("gang") if attempt == live[0]["number"]}
    return job if ranks == set(range(RANKS)) else None


@pytest.mark.parametrize("step", list(STEPS))
def test_a_leader_stopped_in_a_ray_launch_never_places_or_runs_anything_after_the_takeover(
    servers: RayServers, ray_cluster: RayCluster, step: str
) -> None:
    """The leader `a` admits a gang of two submitted to the standby `b` and is stopped as its
    launch on Ray is under way (when `step` begins). `b` leads only once `a` is dead (its
    watchdog's SIGKILL). The job then runs whole under `b`, and exactly once: one live attempt,
    each of its ranks started once, in Ray only its placement group (any other of the job's
    REMOVED) and its launchers; of attempt 1, if requeued, each rank's launch was revoked
    (never ran) or claimed by its shim before `b` led (ran, and is gone); nothing of it started
    or placed after the takeover."""
    a = servers.start("a")
    wait_for(lambda: role(a) == "leader", 20, "a to lead")
    b = servers.start("b")
    assert role(b) == "standby" and a.proc is not None
    with b.client() as cb:
        if step == "group":
            stop = stopper(ray_cluster, a, r"warden\.[0-9]+\.1")
            try:
                job_id = servers.gang(cb, "gang")
                assert stop.wait(30) == 0, f"the stopper failed waiting until {STEPS[step]}"
            except subprocess.TimeoutExpired:
                pytest.fail(f"timed out after 30s waiting until {STEPS[step]}")
            finally:
                if stop.poll() is None:
                    stop.kill()
                    stop.wait()
        else:  # "starting"
            job_id = servers.gang(cb, "gang")
            wait_for(
                lambda: cb.get(f"/v1/jobs/{job_id}").json()["state"] in ("STARTING", "RUNNING"),
                30,
                STEPS[step],
                interval=0.001,
            )
            a.proc.send_signal(signal.SIGSTOP)
        wait_for(lambda: role(b) == "leader", 20, "b to take over")
        led_at = time.time()
        taken_over(a, b)  # and a was dead by then
        job = wait_for(lambda: running_whole(cb, servers, job_id), 60, "the job running whole under b")
        live = [x for x in job["attempts"] if x["ended_at"] is None]
        assert len(live) == 1, job["attempts"]
        number = int(live[0]["number"])
        assert "FAILED" not in [e["to"] for e in job["events"]], job["events"]
        first_dir = a.state_dir / "jobs" / job_id / "attempt-1"
        statuses = [read_job_json(first_dir / f"rank-{r}.status.json") for r in range(RANKS)]
        firsts = {rank: (pid, at) for attempt, rank, pid, at in servers.starts("gang") if attempt == 1}
        lives = {rank: (pid, at) for attempt, rank, pid, at in servers.starts("gang") if attempt == number}
        if number == 1:  # every rank claimed by its shim before b led, and adopted
            assert all(launched(s) for s in statuses), statuses
            outcome = "adopted"
        else:  # each rank revoked (never ran), or claimed before b led and killed with its gang
            for rank, status in enumerate(statuses):
                if launched(status):
                    assert rank in firsts and not process_alive(firsts[rank][0]), (rank, status, firsts)
                    gone = read_job_json(first_dir / f"rank-{rank}.exit.json")
                    assert gone is not None and gone["ended_at"] <= min(at for _, at in lives.values()), (gone, lives)
                else:
                    assert rank not in firsts, (rank, status, firsts)
            outcome = "partly run, evicted" if firsts else "revoked"
        assert all(s is None or not launched(s) or s["claimed_at"] < led_at for s in statuses), (statuses, led_at)
        assert all(at < led_at for _, at in firsts.values()), (firsts, led_at)
        groups, launchers = in_ray(ray_cluster)
        live_group = group_name(job_id, number)
        assert {n for n, states in groups.items() if set(states) != {"REMOVED"}} == {live_group}, groups
        assert [s for s in groups[live_group] if s != "REMOVED"] == ["CREATED"], groups
        assert launchers == [launcher_name(job_id, number, r) for r in range(RANKS)], launchers
        # Each rank of the live attempt started once, and nothing more meanwhile (the Ray query
        # took seconds).
        starts = [(attempt, rank) for attempt, rank, _, _ in servers.starts("gang")]
        assert sorted(x for x in starts if x[0] == number) == [(number, r) for r in range(RANKS)], starts
        assert all(attempt in (1, number) for attempt, _ in starts), starts
    ends = [e["reason"] for e in job["events"] if e["to"] in ("PENDING", "REQUEUED") and e["actor"] == "warden"]
    print(f"stopped when {STEPS[step]}: attempt 1 {outcome}, attempt {number} runs; {ends}")
