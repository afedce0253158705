"""warden governing a real Ray cluster: gang starts, SIGKILL on time, a node's death, admissions: one JSON object.

    python bench/ray_executor.py [--runs R] [--death-runs D] [--grace G] [--only start,sigkill,death,admissions]

Every section brings up its own real Ray cluster on this machine (scripts/ray-cluster: a head
with no CPUs or GPUs and 3 workers × 4 fake GPUs and 8 CPUs, two workers per topology block)
and tears it down after, also on error. `start`, `sigkill` and the first half of `admissions`
drive a `RayExecutor` in this process, as the server does; `death` and the second half of
`admissions` go through a real `warden server --executor ray`.

- `start`: per run and per gang shape (1 rank × 1 GPU; 4 ranks × 1 GPU on one node; 12 ranks
  × 1 GPU on 3 nodes), `started_s` from `start()` to `started()` reporting the attempt
  (polled every 10 ms), `status_s` from `start()` to the latest `started_at` in the ranks'
  status files (the shim writes it once the job's process runs). Where that time goes, per
  rank, read from /proc while the attempt runs (10 ms resolution): `launchers_forked_s`,
  from `start()` to the latest launcher actor's worker process born (Ray forks it);
  `shims_forked_s`, to the latest shim born (the worker is up, its actor created and
  `Launcher.start` called). `start_call_s`: how long `start()` itself took. Then the attempt
  is terminated, its exit awaited, and the cluster left to settle (every GPU free in Ray's
  view, then 2 s) before the next.
- `sigkill`: a 4-rank gang over 3 nodes whose ranks record SIGTERM and ignore it;
  `terminate(grace=G)`. `sigkill_lateness_s`: each rank's process gone (pidfd, exact) minus
  the deadline `terminate` returned; `sigterm_spread_s`: the latest minus the earliest SIGTERM
  the ranks recorded; `grace_kept`: every death at or after the last SIGTERM + G;
  `timer_late_s`: the SIGKILL sent (the exit's `killed_at`) minus the deadline;
  `terminate_call_s`: how long `terminate` blocked (it waits for the SIGTERMs to arrive).
- `death`: on a fresh cluster per run (a killed node breaks it), a server and a tier-3 gang
  of 2 × 4 GPUs whose ranks die at SIGTERM; once it runs, the raylet of rank 1's node gets
  SIGKILL (`RayCluster.kill_worker`). `node_death_to_evicted_s`: from the kill to the job's
  PREEMPTING event (its `at`); `node_death_to_requeued_s`: to its REQUEUED event (the
  survivor had its SIGTERM and is gone, the group is removed); `lost_rank_gone_s`: to the
  process of the rank on the dead node gone (its shim kills it when its launcher is gone);
  `survivor_gone_s`: to the process of rank 0, on a live node, gone (at its SIGTERM).
- `admissions`: through the executor, 12 one-GPU attempts (the whole cluster) started back
  to back: `handed_per_s`, 12 over the time the 12 `start()` calls took; `started_per_s`, 12
  over the time until `started()` reported all 12 (then they are terminated and the
  cluster settles). Through a server, 24 one-GPU jobs of `sleep 0.2` submitted back to back
  (two waves on 12 GPUs), at most 3 runs: `server_started_per_s`, 24 over
  the time from the first submission to the last job's process running (the `started_at` its
  shim wrote, in the attempt's `log_dir` as the API gives it); `server_done_s`, from the first
  submission to the last job's SUCCEEDED event (its `at`); `server_never_running`, how many
  jobs of all runs went STARTING → SUCCEEDED with no RUNNING event (the server reads the
  executor's starts and exits at its passes, exits first: a job that starts and ends between
  two passes is never seen running).

Defaults: 5 runs, 3 of `death`, a grace of 2 s (about 5 minutes on 2 cores). Medians over
the runs, every value in `*_all`. Ray's own output goes to stderr with the progress: stdout
holds the JSON object alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any, cast

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "server"))

import httpx  # noqa: E402
from raycluster import RayCluster, bring_up  # noqa: E402
from serverproc import Server, wait_for  # noqa: E402

from warden.executors.base import Exit, Handle, LaunchSpec, ReplicaLaunch  # noqa: E402
from warden.executors.ray import RayExecutor  # noqa: E402

NODES, GPUS, PER_BLOCK = 3, 4, 2
WORKERS = tuple(f"w{i}" for i in range(1, NODES + 1))
SHAPES: dict[str, list[tuple[str, tuple[int, ...]]]] = {
    "1_rank": [("w1", (0,))],
    "4_ranks_1_node": [("w1", (g,)) for g in range(GPUS)],
    "12_ranks_3_nodes": [(w, (g,)) for w in WORKERS for g in range(GPUS)],
}
SIGKILL_GANG: list[tuple[str, tuple[int, ...]]] = [("w1", (0,)), ("w1", (1,)), ("w2", (0,)), ("w3", (0,))]
SERVER_JOBS = 24
SERVER_RUNS = 3
POLL_S = 0.01
SETTLE_S = 2.0

# Records its pid, then every SIGTERM (and ignores it), until SIGKILL. Its files sit beside the
# rank's log (`WARDEN_LOG_FILE`).
STUBBORN = """\
import os, signal, time
out = os.environ["WARDEN_LOG_FILE"]
signal.signal(signal.SIGTERM, lambda *_: open(out + ".term", "a").write(f"{time.time():.6f}\\n"))
with open(out + ".up.tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(out + ".up.tmp", out + ".up")
while True:
    time.sleep(0.05)
"""

# A gang rank for the server: records its pid in the directory it is given and dies at SIGTERM.
SLEEPER = """\
import os, sys, time
out = os.path.join(sys.argv[1], f"pid-{os.environ['WARDEN_ATTEMPT']}-{os.environ['RANK']}")
with open(out + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(out + ".tmp", out)
time.sleep(3600)
"""

POLICY = """\
min_grace: 2s
thrash: {min_efficiency: 0}
preemption: {restart_overhead: 0s}
tiers:
  1: {name: production-inference, preemptible: false, grace: 2s, scope: cluster}
  3: {name: experimentation, lease: 0s, grace: 2s}
queues:
  name: cluster
  children:
    - {name: team, nominal: {gpu: 12}}
"""

_T0 = time.monotonic()


def say(message: str) -> None:
    print(f"[{time.monotonic() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def rounded(values: list[float], digits: int = 3) -> list[float]:
    return [round(v, digits) for v in values]


def figure(name: str, values: list[float], digits: int = 3) -> dict[str, Any]:
    return {name: median(values), f"{name}_all": rounded(values, digits)}


def ray() -> Any:
    """The Ray library, imported when a section first needs it."""
    import ray as library

    return library


def wait(predicate: Callable[[], Any], timeout: float, what: str, interval: float = POLL_S) -> Any:
    return wait_for(predicate, timeout, what, interval)


# -- clusters and executors ----------------------------------------------------------------


@contextlib.contextmanager
def cluster() -> Iterator[RayCluster]:
    """A fresh cluster (3 × 4 GPUs, two workers per block), torn down when the block ends."""
    say("bringing up a Ray cluster (3 workers × 4 GPUs)")
    began = time.monotonic()
    up = bring_up("--nodes", str(NODES), "--gpus-per-node", str(GPUS), "--nodes-per-block", str(PER_BLOCK))
    gen = cast(Generator[RayCluster, None, None], up)  # its `finally` tears the cluster down
    c = next(gen)
    say(f"cluster up at {c.address} in {time.monotonic() - began:.1f} s")
    try:
        yield c
    finally:
        began = time.monotonic()
        gen.close()
        say(f"cluster down in {time.monotonic() - began:.1f} s")


@contextlib.contextmanager
def executor(c: RayCluster) -> Iterator[RayExecutor]:
    """A RayExecutor in this process, as the server makes it; whatever it still runs at the end
    is killed, and this process leaves the cluster (`ray.shutdown`) before it is torn down."""
    ex = RayExecutor(address=c.address)
    try:
        yield ex
    finally:
        try:
            for job_id, attempt in ex.running():
                ex.kill(job_id, attempt)
            wait(lambda: ex.exits() is not None and not ex.running(), 60, "every attempt gone", 0.05)
        finally:
            ex.close()
            ray().shutdown()


@contextlib.contextmanager
def workdir() -> Iterator[Path]:
    work = Path(tempfile.mkdtemp(prefix="wbench-ray-"))
    os.chmod(work, 0o777)  # a server's jobs run as `nobody` (root server) and write there
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


class Jobs:
    """Launch specs with fresh job ids, all under one directory."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.next = 100

    def spec(self, placement: list[tuple[str, tuple[int, ...]]], command: tuple[str, ...]) -> LaunchSpec:
        self.next += 1
        job_id = str(self.next)
        replicas = tuple(
            ReplicaLaunch(rank, node, gpus, local_rank=sum(1 for n, _ in placement[:rank] if n == node))
            for rank, (node, gpus) in enumerate(placement)
        )
        return LaunchSpec(
            job_id=job_id,
            attempt=1,
            command=command,
            replicas=replicas,
            grace_s=1.0,
            workdir=self.work,
            log_dir=self.work / job_id / "attempt-1",
            checkpoint_dir=self.work / job_id / "checkpoints",
        )


def until_started(ex: RayExecutor, keys: set[tuple[str, int]], timeout: float = 180) -> dict[tuple[str, int], float]:
    """When `started()` first reported each of `keys` (polled every 10 ms)."""
    seen: dict[tuple[str, int], float] = {}

    def all_seen() -> bool:
        now = time.time()
        for key in ex.started():
            seen.setdefault(key, now)
        return keys <= seen.keys()

    wait(all_seen, timeout, f"{len(keys)} attempt(s) running")
    return seen


def until_exits(ex: RayExecutor, keys: set[tuple[str, int]], timeout: float = 60) -> dict[tuple[str, int], Exit]:
    found: dict[tuple[str, int], Exit] = {}

    def all_found() -> bool:
        for e in ex.exits():
            found[(e.job_id, e.attempt)] = e
        return keys <= found.keys()

    wait(all_found, timeout, f"the exits of {len(keys)} attempt(s)")
    return found


def settle() -> None:
    """Let the cluster come to rest after an attempt's exit: every GPU free again in Ray's view
    (it lags `exits()` by about 0.1 s), then SETTLE_S for the killed launchers' workers to
    exit (on 2 cores, a start right after a 12-rank teardown takes twice as long)."""
    wait(lambda: ray().available_resources().get("GPU", 0) >= NODES * GPUS, 30, "Ray's GPUs free", 0.05)
    time.sleep(SETTLE_S)


HZ = os.sysconf("SC_CLK_TCK")


def born(pid: int) -> float | None:
    """When process `pid` started, wall clock (10 ms resolution); None when it is gone."""
    try:
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        now = time.time()
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None
    return now - (uptime - ticks / HZ)


def deaths_later(pids: list[int], timeout: float) -> Callable[[], list[float]]:
    """Open a pidfd on each process now; the function returned waits (at most `timeout` s
    from now) until every one is gone and says when each was (exact: no polling)."""
    fds = [os.pidfd_open(p) for p in pids]
    end = time.monotonic() + timeout

    def gone() -> list[float]:
        at: dict[int, float] = {}
        try:
            while len(at) < len(fds) and time.monotonic() < end:
                ready, _, _ = select.select([f for f in fds if f not in at], [], [], max(0.0, end - time.monotonic()))
                for fd in ready:
                    at[fd] = time.time()
        finally:
            for fd in fds:
                os.close(fd)
        if len(at) < len(fds):
            raise AssertionError(f"processes {pids} not all gone after {timeout} s")
        return [at[f] for f in fds]

    return gone


def statuses(handle: Handle) -> list[dict[str, Any]]:
    return [json.loads(r.status_path.read_text()) for r in handle.replicas]


# -- start -----------------------------------------------------------------------------------


def gang_start(runs: int) -> dict[str, Any]:
    figures: dict[str, dict[str, list[float]]] = {
        shape: {"started_s": [], "status_s": [], "launchers_forked_s": [], "shims_forked_s": [], "start_call_s": []}
        for shape in SHAPES
    }
    with cluster() as c, workdir() as work, executor(c) as ex:
        jobs = Jobs(work)
        for run in range(runs):
            for shape, placement in SHAPES.items():
                spec = jobs.spec(placement, ("sleep", "600"))
                key = (spec.job_id, spec.attempt)
                asked = time.time()
                handle = ex.start(spec)
                called = time.time()
                started = until_started(ex, {key})[key]
                records = statuses(handle)
                launchers = [born(int(r["launcher_pid"])) for r in records]
                shims = [born(int(r["shim_pid"])) for r in records]
                ex.terminate(spec.job_id, spec.attempt, 1.0)
                until_exits(ex, {key})
                settle()
                got = figures[shape]
                got["started_s"].append(started - asked)
                got["status_s"].append(max(float(r["started_at"]) for r in records) - asked)
                got["start_call_s"].append(called - asked)
                if None not in launchers:
                    got["launchers_forked_s"].append(max(t for t in launchers if t is not None) - asked)
                if None not in shims:
                    got["shims_forked_s"].append(max(t for t in shims if t is not None) - asked)
                say(f"start run {run + 1}/{runs} {shape}: started() after {started - asked:.2f} s")
    out: dict[str, Any] = {}
    for shape, got in figures.items():
        placement = SHAPES[shape]
        entry: dict[str, Any] = {"ranks": len(placement), "nodes": len({n for n, _ in placement})}
        for name, values in got.items():
            entry.update(figure(name, values))
        out[shape] = entry
    return {"runs": runs, "gang_start_s": out}


# -- sigkill ---------------------------------------------------------------------------------


def sigkill(runs: int, grace: float) -> dict[str, Any]:
    lateness: list[float] = []
    spread: list[float] = []
    kept: list[bool] = []
    timer: list[float] = []
    calls: list[float] = []
    with cluster() as c, workdir() as work, executor(c) as ex:
        script = work / "stubborn.py"
        script.write_text(STUBBORN)
        jobs = Jobs(work)
        for run in range(runs):
            spec = jobs.spec(SIGKILL_GANG, (sys.executable, str(script)))
            key = (spec.job_id, spec.attempt)
            handle = ex.start(spec)
            until_started(ex, {key})
            ups = [Path(f"{r.log_path}.up") for r in handle.replicas]
            wait(lambda: all(u.exists() for u in ups), 30, "the ranks' pids")  # noqa: B023 (called at once)
            pids = [int(u.read_text()) for u in ups]
            gone = deaths_later(pids, grace + 30)  # pidfds open before the signals
            asked = time.time()
            deadline = ex.terminate(spec.job_id, spec.attempt, grace)
            calls.append(time.time() - asked)
            died = gone()
            ended = until_exits(ex, {key})[key]
            terms = []
            for r in handle.replicas:
                lines = Path(f"{r.log_path}.term").read_text().split()
                terms.append(float(lines[0]))
            late = [d - deadline for d in died]
            lateness.extend(late)
            spread.append(max(terms) - min(terms))
            kept.append(all(d >= max(terms) + grace for d in died))
            if ended.killed_at is not None:
                timer.append(ended.killed_at - deadline)
            say(
                f"sigkill run {run + 1}/{runs}: lateness {min(late):.3f}–{max(late):.3f} s, "
                f"SIGTERM spread {spread[-1] * 1000:.1f} ms, exit codes {list(ended.exit_codes)}"
            )
    return {
        "runs": runs,
        "grace_s": grace,
        "ranks": len(SIGKILL_GANG),
        **figure("sigkill_lateness_s", lateness, 4),
        **figure("sigterm_spread_s", spread, 4),
        "grace_kept": all(kept),
        "grace_kept_all": kept,
        **figure("timer_late_s", timer, 4),
        **figure("terminate_call_s", calls, 4),
    }


# -- a server --------------------------------------------------------------------------------


def ray_server(work: Path, c: RayCluster) -> Server:
    """`warden server --executor ray` on this cluster (as root, jobs run as `nobody`)."""
    policy = work / "policy.yaml"
    policy.write_text(POLICY)
    return Server(
        work / "state",
        policy=policy,
        gpus=None,
        args=("--executor", "ray"),
        env={"WARDEN_RAY_ADDRESS": c.address, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(REPO)},
    )


def submit(h: httpx.Client, body: dict[str, Any]) -> str:
    r = h.post("/v1/jobs", json=body)
    if r.status_code != 201:
        raise RuntimeError(f"POST /v1/jobs: {r.status_code} {r.text}")
    return str(r.json()["id"])


def detail(h: httpx.Client, job_id: str) -> dict[str, Any]:
    got: dict[str, Any] = h.get(f"/v1/jobs/{job_id}").json()
    return got


def event_at(h: httpx.Client, job_id: str, to: str) -> float | None:
    """When the job first went `to` (its event's `at`), None if it has not."""
    for e in detail(h, job_id)["events"]:
        if e["to"] == to:
            return float(e["at"])
    return None


def first_at(job: dict[str, Any], to: str) -> float | None:
    """When this job (as GET /v1/jobs/ID showed it) first went `to`, None if it never did."""
    return min((float(e["at"]) for e in job["events"] if e["to"] == to), default=None)


@contextlib.contextmanager
def running_server(work: Path, c: RayCluster) -> Iterator[Server]:
    server = ray_server(work, c)
    began = time.monotonic()
    server.start()
    say(f"server up on {server.url} in {time.monotonic() - began:.1f} s (log {server.log})")
    try:
        yield server
    finally:
        server.stop()
        for line in notable(log_lines(server))[:10]:
            say(f"server log: {line[:300]}")


def notable(lines: list[str]) -> list[str]:
    """A server log's lines past its banner, less the indented dumps Ray's driver relays."""
    banner = next((i for i, line in enumerate(lines) if line.startswith("warden serving on")), -1)
    return [line for line in lines[banner + 1 :] if line.strip() and not line[0].isspace()]


def log_lines(server: Server) -> list[str]:
    try:
        return server.log.read_text(errors="replace").splitlines() if server.log is not None else []
    except OSError:
        return []


# -- death -----------------------------------------------------------------------------------


def death(runs: int) -> dict[str, Any]:
    evicted: list[float] = []
    requeued: list[float] = []
    lost_gone: list[float] = []
    survivor_gone: list[float] = []
    reasons: list[str] = []
    for run in range(runs):
        got = death_run()
        evicted.append(got["evicted"])
        requeued.append(got["requeued"])
        lost_gone.append(got["lost_gone"])
        survivor_gone.append(got["survivor_gone"])
        reasons.append(got["reason"])
        say(
            f"death run {run + 1}/{runs}: {got['node']} killed; evicted after {evicted[-1]:.2f} s, "
            f"requeued after {requeued[-1]:.2f} s; its rank gone after {lost_gone[-1]:.2f} s, "
            f"the survivor after {survivor_gone[-1]:.2f} s"
        )
    return {
        "runs": runs,
        "gang": f"2 × {GPUS} GPUs, tier 3, grace 2 s, ranks that die at SIGTERM",
        **figure("node_death_to_evicted_s", evicted),
        **figure("node_death_to_requeued_s", requeued),
        **figure("lost_rank_gone_s", lost_gone),
        **figure("survivor_gone_s", survivor_gone),
        "evicted_reason": reasons[0] if reasons else None,
    }


def death_run() -> dict[str, Any]:
    """One gang, one node killed under it, on a cluster and a server of their own."""
    with cluster() as c, workdir() as work, running_server(work, c) as server, server.client() as h:
        script = work / "sleeper.py"
        script.write_text(SLEEPER)
        out = work / "out"
        out.mkdir()
        os.chmod(out, 0o777)
        body = {"queue": "team", "tier": 3, "gpus": GPUS, "replicas": 2, "workdir": str(work),
                "command": [sys.executable, str(script), str(out)]}  # fmt: skip
        job_id = submit(h, body)
        wait(lambda: detail(h, job_id)["state"] == "RUNNING", 120, f"job {job_id} running", 0.05)
        pid_files = [out / f"pid-1-{rank}" for rank in range(2)]
        wait(lambda: all(p.exists() for p in pid_files), 30, "the ranks' pids")
        pids = [int(p.read_text()) for p in pid_files]
        lost = detail(h, job_id)["attempts"][0]["placement"][1]["node"]
        gone = deaths_later(pids, 60)
        killed = time.time()
        c.kill_worker(lost)
        evicted = wait(lambda: event_at(h, job_id, "PREEMPTING"), 60, "the gang evicted", 0.05)
        survivor_gone, lost_gone = gone()
        requeued = wait(lambda: event_at(h, job_id, "REQUEUED"), 60, "the gang requeued", 0.05)
        reason = next(e["reason"] for e in detail(h, job_id)["events"] if e["to"] == "PREEMPTING")
        h.post(f"/v1/jobs/{job_id}/cancel")
        wait(lambda: detail(h, job_id)["state"] == "CANCELLED", 60, f"job {job_id} cancelled", 0.1)
    return {
        "node": lost,
        "evicted": evicted - killed,
        "requeued": requeued - killed,
        "lost_gone": lost_gone - killed,
        "survivor_gone": survivor_gone - killed,
        "reason": reason,
    }


# -- admissions ------------------------------------------------------------------------------


def admissions(runs: int) -> dict[str, Any]:
    handed: list[float] = []
    started: list[float] = []
    server_started: list[float] = []
    server_done: list[float] = []
    skipped = 0
    with cluster() as c, workdir() as work:
        with executor(c) as ex:
            jobs = Jobs(work)
            for run in range(runs):
                specs = [jobs.spec([(w, (g,))], ("sleep", "600")) for w in WORKERS for g in range(GPUS)]
                keys = {(s.job_id, s.attempt) for s in specs}
                asked = time.time()
                for s in specs:
                    ex.start(s)
                called = time.time()
                seen = until_started(ex, keys)
                last = max(seen.values())
                handed.append(len(specs) / (called - asked))
                started.append(len(specs) / (last - asked))
                for job_id, attempt in keys:
                    ex.terminate(job_id, attempt, 1.0)
                until_exits(ex, keys)
                settle()
                say(
                    f"admissions run {run + 1}/{runs}: 12 start() calls in {called - asked:.2f} s, "
                    f"all running after {last - asked:.2f} s"
                )
        with running_server(work, c) as server, server.client() as h:
            server_runs = min(runs, SERVER_RUNS)
            for run in range(server_runs):
                body = {"queue": "team", "tier": 3, "gpus": 1, "workdir": str(work), "command": ["sleep", "0.2"]}
                asked = time.time()
                ids = [submit(h, body) for _ in range(SERVER_JOBS)]

                def done(ids: list[str] = ids) -> bool:
                    states = [detail(h, i)["state"] for i in ids]
                    if any(s in ("FAILED", "CANCELLED") for s in states):
                        raise RuntimeError(f"a job did not succeed: {states}")
                    return all(s == "SUCCEEDED" for s in states)

                wait(done, 300, f"{SERVER_JOBS} jobs done", 0.2)
                details = [detail(h, i) for i in ids]
                ran = []  # when each job's process ran: its status file, in the log_dir the API gives
                for d in details:
                    record = json.loads((Path(d["attempts"][0]["log_dir"]) / "rank-0.status.json").read_text())
                    ran.append(float(record["started_at"]))
                    if first_at(d, "RUNNING") is None:  # it ended before a pass saw it run
                        skipped += 1
                last_ran = max(ran)
                last_done = max(first_at(d, "SUCCEEDED") or 0.0 for d in details)
                server_started.append(SERVER_JOBS / (last_ran - asked))
                server_done.append(last_done - asked)
                say(
                    f"admissions run {run + 1}/{server_runs} through the server: the last of {SERVER_JOBS} "
                    f"running after {last_ran - asked:.2f} s, done after {last_done - asked:.2f} s"
                )
    return {
        "runs": runs,
        "attempts": len(WORKERS) * GPUS,
        **figure("handed_per_s", handed, 1),
        **figure("started_per_s", started, 2),
        "server_runs": len(server_started),
        "server_jobs": SERVER_JOBS,
        **figure("server_started_per_s", server_started, 2),
        **figure("server_done_s", server_done, 2),
        "server_never_running": skipped,
    }


# -- main ------------------------------------------------------------------------------------

SECTIONS = ("start", "sigkill", "death", "admissions")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--runs", type=int, default=5, help="runs of each section but death (default 5)")
    p.add_argument("--death-runs", type=int, default=3, help="runs of death, each on a fresh cluster (default 3)")
    p.add_argument("--grace", type=float, default=2.0, help="seconds of grace after SIGTERM in sigkill (default 2)")
    p.add_argument("--only", default=",".join(SECTIONS))
    args = p.parse_args(argv)
    if not 1 <= args.runs <= 50:
        p.error(f"--runs: {args.runs} is out of range; allowed: 1 to 50")
    if not 1 <= args.death_runs <= 20:
        p.error(f"--death-runs: {args.death_runs} is out of range; allowed: 1 to 20")
    if not 0.5 <= args.grace <= 60:
        p.error(f"--grace: {args.grace} is out of range; allowed: 0.5 to 60")
    sections = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = sections - set(SECTIONS)
    if unknown:
        p.error(f"--only: unknown section(s) {', '.join(sorted(unknown))}; allowed: {', '.join(SECTIONS)}")
    # SIGTERM ends the run as Ctrl-C does: the clusters and servers are torn down on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # Ray prints messages of its own on stdout: it goes to stderr, the JSON to the real stdout.
    sys.stdout.flush()
    stdout = os.dup(1)
    os.dup2(2, 1)
    began = time.monotonic()
    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "ray": ray().__version__, "python": sys.version.split()[0]},
        "cluster": {"workers": NODES, "gpus_per_worker": GPUS, "workers_per_block": PER_BLOCK},
    }
    try:
        if "start" in sections:
            result["start"] = gang_start(args.runs)
        if "sigkill" in sections:
            result["sigkill"] = sigkill(args.runs, args.grace)
        if "death" in sections:
            result["death"] = death(args.death_runs)
        if "admissions" in sections:
            result["admissions"] = admissions(args.runs)
    finally:
        sys.stdout.flush()
        os.dup2(stdout, 1)
        os.close(stdout)
    result["elapsed_s"] = round(time.monotonic() - began, 1)
    print(json.dumps(result, indent=2), flush=True)
    return result


if __name__ == "__main__":
    main()
