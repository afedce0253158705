"""A leader and a standby on one PostgreSQL, both on a real Slurm cluster (tests/slurmcluster.py),
the leader killed with SIGKILL while a preempted gang is in its grace (docs/control-plane.md,
"Several servers"; docs/slurm.md, "Preemption, cancel, SIGKILL"). The gang's ranks ignore
SIGTERM, so SIGKILL must come, on time, whoever leads at the deadline:

- a deadline in the takeover gap (the leader killed a second before it, the standby leading 2
  to 3 s after the kill): each rank's supervisor keeps it, 0.2 s after it;
- a deadline after the takeover: the new leader's own timer, re-armed from the database.

Either way the standby takes over, the preemptor runs, the gang is requeued (not failed), and
no Slurm job is left that no attempt owns.

And a leader stopped with SIGSTOP in the middle of a launch (docs/control-plane.md, "What a
stalled leader can and cannot do"): its watchdog kills it before the standby takes over, and no
Slurm job of its launch appears, is released or runs after the takeover; the job runs once."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from clusterproc import health, role
from gangjobs import deaths_later, job, running_pids
from pg import fresh_postgres_url, postgres_server  # noqa: F401  (fixtures)
from serverproc import Server, kill_jobs_of, submit, until_state, wait_for
from slurmcluster import Cluster
from sqlalchemy import create_engine, text

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]  # the session's one Slurm cluster

POLICY = """\
min_grace: 2s
thrash: {min_efficiency: 0}
preemption: {restart_overhead: 0s, checkpoint_overhead: 0s}
tiers:
  1: {name: production-inference, preemptible: false, grace: 2s, scope: cluster}
  2: {name: pretraining, lease: 1h, grace: 2s}
  3: {name: experimentation, lease: 1s, grace: 2s}
queues:
  name: cluster
  children:
    - {name: vision, nominal: {gpu: 16}}
    - {name: language, nominal: {gpu: 16}}
"""

# Records each start of a rank (attempt, rank, pid, when), then runs until it is killed.
STARTS = """\
import os, sys, time
with open(os.path.join(sys.argv[1], "started"), "a") as f:
    f.write(f"{os.environ['WARDEN_ATTEMPT']} {os.environ.get('RANK', '0')} {os.getpid()} {time.time()!r}\\n")
while True:
    time.sleep(0.05)
"""

# Records each SIGTERM (and ignores it) and its pid, then runs until SIGKILL.
STUBBORN = """\
import os, signal, sys, time
out = sys.argv[1]
name = f"{os.environ['WARDEN_ATTEMPT']}-{os.environ.get('RANK', '0')}"
def on_term(*_):
    with open(f"{out}/term-{name}", "a") as f:
        f.write(f"{time.time():.6f}\\n")
signal.signal(signal.SIGTERM, on_term)
with open(f"{out}/.pid-{name}", "w") as f:
    f.write(str(os.getpid()))
os.rename(f"{out}/.pid-{name}", f"{out}/pid-{name}")  # whole when it appears
while True:
    time.sleep(0.02)
"""

LATE_S = 0.5
"""The most a rank's SIGKILL may come after its deadline."""
LIVE = ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED")


class Pair:
    """A leader and a standby on `db`, each with a state directory of its own under `root`,
    running jobs on `slurm`."""

    def __init__(self, root: Path, db: str, slurm: Cluster) -> None:
        self.root, self.db, self.slurm = root, db, slurm
        self.policy = root / "policy.yaml"
        self.policy.write_text(POLICY)
        self.script = root / "stubborn.py"
        self.script.write_text(STUBBORN)
        self.servers: list[Server] = []

    def start(self) -> tuple[Server, Server]:
        """Both servers, started together (a server takes seconds to start on a loaded machine):
        the one that took the lease, and the one that stands by."""
        self.servers = [
            Server(
                self.root / name,
                policy=self.policy,
                gpus=None,  # Slurm's nodes; as root, jobs run as `nobody` (serverproc.AS_NOBODY)
                db=self.db,
                args=("--executor", "slurm"),
                env={"SLURM_CONF": str(self.slurm.conf), "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
            )
            for name in ("a", "b")
        ]
        with ThreadPoolExecutor(len(self.servers)) as pool:
            list(pool.map(Server.start, self.servers))
        leader = wait_for(lambda: next((s for s in self.servers if role(s) == "leader"), None), 15, "a leader")
        standby = next(s for s in self.servers if s is not leader)
        assert role(standby) == "standby" and health(leader)["epoch"] == 1
        return leader, standby

    def run(self, c: httpx.Client, name: str, **body: Any) -> str:
        """Submit the stubborn script as job `name` (its records in `root/name`)."""
        out = self.root / name
        out.mkdir()
        os.chmod(out, 0o777)  # the job's account writes there
        return submit(c, command=[sys.executable, str(self.script), str(out)], workdir=str(out), name=name, **body)

    def owned(self) -> set[str]:
        """The Slurm job ids of every attempt the database has running (its stored handle)."""
        engine = create_engine(self.db)
        try:
            with engine.connect() as conn:
                rows = conn.execute(text("SELECT handle FROM attempts WHERE ended_at IS NULL")).all()
        finally:
            engine.dispose()
        return {str(i) for (handle,) in rows if handle for i in handle["external"]}

    def number_jobs_after(self, jobs: dict[str, tuple[str, str, str]]) -> None:
        """Make the database number its next jobs after every warden job among `jobs`
        (`Cluster.jobs`). The session's tests share one Slurm cluster, each with a fresh
        database that numbers its jobs from 1, and squeue lists ended jobs for MinJobAge (300 s):
        a recovering server looks an attempt's Slurm jobs up by name, and would take an earlier
        test's ended ones, named like its attempt and marked, for its own."""
        names = (re.fullmatch(r"warden\.([0-9]+)\.[0-9]+", name) for name, _, _ in jobs.values())
        used = max((int(m[1]) for m in names if m), default=1)
        engine = create_engine(self.db)
        try:
            with engine.begin() as conn:
                conn.execute(text("SELECT setval(pg_get_serial_sequence('jobs', 'id'), :n)"), {"n": used})
        finally:
            engine.dispose()

    def live(self) -> set[str]:
        return {i for i, (_, state, _) in self.slurm.jobs().items() if state in LIVE}

    def cleanup(self) -> None:
        for server in self.servers:
            server.stop()
        for server in self.servers:
            kill_jobs_of(server.state_dir)
        self.slurm.cancel_all()
        wait_for(lambda: not self.live(), 30, "the cluster's jobs gone")


@pytest.fixture
def pair(tmp_path: Path, slurm_cluster: Cluster, fresh_postgres_url: str) -> Iterator[Pair]:
    made = Pair(tmp_path, fresh_postgres_url, slurm_cluster)
    try:
        yield made
    finally:
        made.cleanup()


@dataclass(frozen=True)
class Takeover:
    """What a test saw: the new leader, the jobs, the gang's deadline, when the new leader said
    it leads, and when each rank of the gang was gone."""

    leader: Server
    gang: str
    fillers: list[str]
    high: str
    kill_at: float
    led: float
    deaths: list[float]


def preempt_then_kill_the_leader(pair: Pair, grace_s: float, kill_before_s: float) -> Takeover:
    """A tier-3 gang (2 ranks on 2 nodes, grace `grace_s`) is preempted by a tier-1 job; the
    leader is killed with SIGKILL `kill_before_s` before the gang's deadline (at once when that
    time has passed). What happened, once the standby leads and every rank is gone."""
    leader, standby = pair.start()
    with leader.client() as c:
        # The gang holds two whole nodes, tier-2 fillers inside their lease the other two: the
        # gang is the one possible victim.
        gang = pair.run(c, "gang", queue="vision", tier=3, gpus=8, replicas=2, grace=f"{grace_s}s")
        fillers = [pair.run(c, f"filler{i}", queue="language", tier=2, gpus=8) for i in range(2)]
        for job_id in (gang, *fillers):
            until_state(c, job_id, "RUNNING", timeout=30)
        pids = running_pids(pair.root / "gang", 1, 2)
        assert len({p["node"] for p in job(c, gang)["attempts"][0]["placement"]}) == 2
        time.sleep(1.2)  # past the tier-3 lease of 1 s
        high = pair.run(c, "high", queue="vision", tier=1, gpus=8, replicas=2)
        kill_at = wait_for(lambda: job(c, gang)["attempts"][0]["kill_at"], 30, "the gang's SIGKILL deadline")
    gone = deaths_later(pids)
    time.sleep(max(0.0, kill_at - kill_before_s - time.time()))
    leader.kill9()
    killed = time.time()
    led = wait_for(lambda: role(standby) == "leader" and time.time(), 15, "the standby to take over")
    print(
        f"leader killed {kill_at - killed:.2f} s before the deadline; the standby led {led - kill_at:+.2f} s after it"
    )
    assert health(standby)["epoch"] == 2
    return Takeover(standby, gang, fillers, high, kill_at, led, gone())


def settled(pair: Pair, run: Takeover, grace_s: float) -> dict[str, Any]:
    """The checks both cases share, once the standby leads: one SIGTERM per rank a grace before
    the deadline, SIGKILL on time, the preemptor runs, the gang is requeued as a preemption
    is, and every live Slurm job is a running attempt's. Returns the gang's first attempt."""
    for rank in range(2):
        terms = (pair.root / "gang" / f"term-1-{rank}").read_text().split()
        assert len(terms) == 1, terms  # the new leader sent no second SIGTERM
        assert grace_s - 0.3 <= run.kill_at - float(terms[0]) <= grace_s + 0.1, (run.kill_at, terms)
    lateness = [t - run.kill_at for t in run.deaths]
    print("ranks gone after the deadline:", ", ".join(f"{late:.3f} s" for late in lateness))
    assert all(0.0 <= late <= LATE_S for late in lateness), lateness
    with run.leader.client() as c:
        until_state(c, run.high, "RUNNING", timeout=30)
        running_pids(pair.root / "high", 1, 2)
        detail = until_state(c, run.gang, "PENDING", timeout=30)
        (first,) = detail["attempts"]
        assert first["state"] == "exited" and first["preempted_for"] == run.high, first
        assert first["reason"] == "killed" and first["exit_codes"] == [-9, -9], first
        requeued = [e["reason"] for e in detail["events"] if e["to"] == "REQUEUED"]
        assert requeued == ["exited -9,-9 after SIGTERM and SIGKILL at the deadline"], detail["events"]
        for filler in run.fillers:
            assert job(c, filler)["state"] == "RUNNING" and len(job(c, filler)["attempts"]) == 1
    wait_for(lambda: pair.live() == pair.owned(), 30, "every live Slurm job owned by a running attempt")
    assert len(pair.owned()) == 3  # the preemptor and the two fillers
    return dict(first)


def rank_exits(first: dict[str, Any]) -> list[dict[str, Any] | None]:
    """The gang's supervisors' exit records (`job/rank-N.exit.json`, slurm_launch); None for a
    supervisor that had none to write (the server's SIGKILL to the step ends it with its rank)."""
    paths = [Path(first["log_dir"]) / "job" / f"rank-{rank}.exit.json" for rank in range(2)]
    return [json.loads(path.read_text()) if path.exists() else None for path in paths]


def test_a_deadline_in_the_takeover_gap_is_kept_by_the_ranks_supervisors(pair: Pair) -> None:
    """The leader dies a second before the gang's deadline: nobody leads at it (the standby
    takes over 2 to 3 s after the kill), so each rank's supervisor sends SIGKILL itself, 0.2 s
    after the deadline and never before it."""
    run = preempt_then_kill_the_leader(pair, grace_s=3.0, kill_before_s=1.0)
    kill_at = run.kill_at
    assert run.led > kill_at  # the deadline fell in the gap
    first = settled(pair, run, grace_s=3.0)
    exits = rank_exits(first)
    assert all(record is not None and record["exit_code"] == -9 for record in exits), exits
    kept = [record["killed_at"] for record in exits if record is not None]
    print("supervisors' SIGKILL after the deadline:", ", ".join(f"{at - kill_at:.3f} s" for at in kept))
    assert len(kept) == 2 and all(kill_at <= at <= kill_at + LATE_S for at in kept), (kill_at, exits)


def test_a_deadline_after_the_takeover_is_kept_by_the_new_leaders_timer(pair: Pair) -> None:
    """The leader dies well before the gang's deadline: the standby takes over first and its
    own timer, re-armed from the database, sends SIGKILL at the deadline; the supervisors never
    have to."""
    run = preempt_then_kill_the_leader(pair, grace_s=7.0, kill_before_s=7.0)
    kill_at = run.kill_at
    assert run.led < kill_at - 1.0  # the new leader led well before the deadline
    first = settled(pair, run, grace_s=7.0)
    exits = rank_exits(first)
    assert all(record is None or record["killed_at"] is None for record in exits), exits
    control = json.loads((Path(first["log_dir"]) / "control.json").read_text())
    print(f"the new leader's SIGKILL {control['killed_at'] - kill_at:.3f} s after the deadline")
    assert kill_at <= control["killed_at"] <= kill_at + LATE_S, (kill_at, control)


# -- a leader stopped in a launch ----------------------------------------------------------------


def attempt_jobs(pair: Pair, job_id: str, before: set[str]) -> dict[int, dict[str, tuple[str, str]]]:
    """The Slurm jobs named for the job's attempts, but those in `before` (earlier tests' jobs,
    whose warden ids may be the same): attempt -> Slurm id -> (state, nodes it ran on, '' for
    none)."""
    found: dict[int, dict[str, tuple[str, str]]] = {}
    for slurm_id, (name, state, nodes) in pair.slurm.jobs().items():
        match = re.fullmatch(rf"warden\.{job_id}\.([0-9]+)", name)
        if match and slurm_id not in before:
            found.setdefault(int(match[1]), {})[slurm_id] = (state, nodes)
    return found


def children(pid: int) -> dict[int, list[str]]:
    """A process's children (every thread's) and their command lines."""
    found = {}
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    for thread in threads:
        try:
            kids = Path(f"/proc/{pid}/task/{thread}/children").read_text().split()
        except OSError:
            continue
        for kid in kids:
            try:
                found[int(kid)] = Path(f"/proc/{kid}/cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
    return found


def running(a: Server, command: str, marker: str) -> list[int]:
    """The leader's children that run `command` now with an argument that begins with `marker`."""
    assert a.proc is not None
    return [
        pid
        for pid, argv in children(a.proc.pid).items()
        if os.path.basename(argv[0]) == command and any(arg.startswith(marker) for arg in argv[1:])
    ]


def open_files(pid: int) -> set[str]:
    """What a process has open, as /proc names it (a pipe: `pipe:[INODE]`, either end)."""
    found = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return set()
    for fd in fds:
        try:
            found.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return found


def submitting(a: Server) -> bool:
    """Whether the leader runs `sbatch --hold` now, having handed it the whole batch script (the
    pipe to its stdin closed on the leader's side): the submission lands whatever becomes of the
    leader."""
    assert a.proc is not None
    for pid in running(a, "sbatch", "--hold"):
        try:
            stdin = os.readlink(f"/proc/{pid}/fd/0")
        except OSError:
            continue
        if stdin.startswith("pipe:") and stdin not in open_files(a.proc.pid):
            return True
    return False


def launch_stopped(
    pair: Pair, step: Callable[[Server], bool], what: str, *, replicas: int, gpus: int
) -> tuple[str, dict[str, tuple[str, str]]]:
    """A gang of `replicas` ranks of `gpus` GPUs each (a file in its directory records each
    rank's start) is submitted to the standby; the leader is stopped (SIGSTOP) the moment
    `step(leader)` holds, polled every millisecond from before the submission. The leader's
    watchdog has killed it when the standby leads; the job then runs under the new leader
    exactly once: one live attempt, each rank started once, only that attempt's Slurm jobs
    live, every other attempt's never ran (its ranks' launches revoked), none of attempt 1
    submitted after the takeover, and none that no attempt owns. What became of the stopped
    leader's launch, "adopted" (attempt 1 runs) or "revoked", and attempt 1's Slurm jobs when
    the standby led."""
    a, b = pair.start()
    assert a.proc is not None and a.log is not None
    earlier = pair.slurm.jobs()
    pair.number_jobs_after(earlier)
    before = set(earlier)
    out = pair.root / "gang"
    out.mkdir()
    os.chmod(out, 0o777)  # the job's account writes there
    script = pair.root / "starts.py"
    script.write_text(STARTS)

    def stop() -> float:
        assert a.proc is not None
        wait_for(lambda: step(a), 30, what, interval=0.001)
        a.proc.send_signal(signal.SIGSTOP)
        return time.time()

    with ThreadPoolExecutor(1) as pool, b.client() as cb:
        stopping = pool.submit(stop)  # watching from before the submission: the launch follows at once
        job_id = submit(
            cb,
            command=[sys.executable, str(script), str(out)],
            workdir=str(out),
            name="gang",
            queue="vision",
            tier=3,
            gpus=gpus,
            replicas=replicas,
        )
        assert not any(name.startswith(f"warden.{job_id}.") for name, _, _ in earlier.values()), job_id
        stopped_at = stopping.result()
        wait_for(lambda: role(b) == "leader", 20, "b to take over")
        assert a.proc.poll() == -signal.SIGKILL, "the stopped leader was not dead when b took over"
        led = time.time()
        at_takeover = attempt_jobs(pair, job_id, before).get(1, {})
        a.proc.send_signal(signal.SIGCONT)  # nothing left to continue
        assert "warden watchdog: killed the server" in a.log.read_text()
        assert health(b)["epoch"] == 2
        print(f"a stopped; b led {led - stopped_at:.2f} s later; attempt 1's Slurm jobs then: {at_takeover}")
        detail = until_state(cb, job_id, "RUNNING", timeout=30)
        live = [x for x in detail["attempts"] if x["ended_at"] is None]
        assert len(live) == 1, detail["attempts"]
        number = live[0]["number"]
        started = out / "started"
        wait_for(lambda: started.exists() and len(started.read_text().splitlines()) >= replicas, 30, "every rank")
    wait_for(lambda: pair.live() == pair.owned(), 30, "every live Slurm job owned by a running attempt")
    jobs = attempt_jobs(pair, job_id, before)
    print("the job's Slurm jobs, by attempt:", jobs)
    assert set(pair.owned()) == set(jobs[number]), (pair.owned(), jobs)
    assert all(state == "RUNNING" for state, _ in jobs[number].values()), jobs
    for n, others in jobs.items():
        assert n <= number, jobs
        if n != number:  # ended without running (cancelled held, or never released)
            assert all(state not in LIVE and not nodes for state, nodes in others.values()), jobs
    assert set(jobs.get(1, {})) <= set(at_takeover), f"a Slurm job of attempt 1 appeared after the takeover: {jobs}"
    first = detail["attempts"][0]
    assert first["number"] == 1 and Path(first["log_dir"]).is_relative_to(a.state_dir), first
    paths = [Path(first["log_dir"]) / "job" / f"rank-{rank}.status.json" for rank in range(replicas)]
    statuses = [json.loads(path.read_text()) if path.exists() else None for path in paths]
    if number == 1:  # a's launch was marked before a stopped: b adopted it (and released it if a had not)
        assert all(s is not None and "revoked" not in s for s in statuses), statuses
        outcome = "adopted"
    else:  # b found no marked Slurm job of attempt 1: it revoked every rank's launch and ran attempt 2
        assert number == 2 and all(s is not None and "revoked" in s for s in statuses), (number, statuses)
        outcome = "revoked"
    starts = sorted((int(x[0]), int(x[1])) for x in (line.split() for line in started.read_text().splitlines()))
    assert starts == [(number, rank) for rank in range(replicas)], starts  # each rank once, of the live attempt
    print(f"a's launch was {outcome}; attempt {number} runs")
    return outcome, at_takeover


def test_a_leader_stopped_as_it_submits_a_launch_gets_no_slurm_job_run_after_the_takeover(pair: Pair) -> None:
    """The leader is stopped as it submits a gang of 3 ranks of 4 GPUs (two Slurm jobs: 2 ranks
    on one node, 1 on another), the moment its first `sbatch --hold` has the batch script:
    that submission lands while the leader is stopped, held and unmarked, and the second is
    never made. The new leader finds no marked Slurm job of attempt 1, revokes its ranks'
    launches, cancels the held job unreleased, and runs attempt 2, once."""
    outcome, submitted = launch_stopped(pair, submitting, "a to submit the attempt", replicas=3, gpus=4)
    assert outcome == "revoked"
    assert 1 <= len(submitted) <= 2 and all(not nodes for _, nodes in submitted.values()), submitted


def test_a_leader_stopped_as_it_releases_a_launch_has_it_run_once(pair: Pair) -> None:
    """The leader is stopped as it marks a gang's held Slurm job (its `scontrol update
    AdminComment=warden` under way), before it could release it. The new leader adopts the
    marked job and releases it: attempt 1 runs, once, and no other attempt is made."""
    outcome, submitted = launch_stopped(
        pair,
        lambda a: bool(running(a, "scontrol", "AdminComment=")),
        "a to mark the attempt's Slurm job",
        replicas=2,
        gpus=8,
    )
    assert outcome == "adopted" and len(submitted) == 1, submitted
