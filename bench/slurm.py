"""warden governing a Slurm cluster, side by side with Slurm's own preemption: one JSON object.

    python bench/slurm.py [--runs R] [--grace G] [--jobs N] [--only native,warden,admissions]

Every section brings up its own real cluster on this machine (scripts/slurm-cluster: 4 nodes
× 8 fake GPUs) and tears it down after.

- `native`: Slurm preempts by itself (`PreemptType=preempt/partition_prio`, `PreemptMode=REQUEUE`,
  `GraceTime=G`). Per run, four 8-GPU jobs in partition `low` fill the cluster, each a process
  that records SIGTERM and ignores it; then one 8-GPU job in partition `high` is submitted.
  `victims`: how many `low` jobs got SIGTERM (one is needed); `sigkill_lateness_s`: from
  SIGTERM + G to the moment the victim's process was gone (pidfd, exact);
  `preemptor_start_s`: from the `high` submission to its process running.
- `warden`: the same through `warden server --executor slurm`: four tier-3 8-GPU jobs with a
  grace of G, then one tier-1 8-GPU job. `sigkill_lateness_s` from the deadline warden
  recorded (SIGTERM + G) to the process gone; `victims` from the jobs that went PREEMPTING;
  `preemptor_start_s` likewise. Also `submit_to_running_s` on an idle cluster (a 1-GPU job,
  `POST /v1/jobs` to its process running).
- `admissions`: N CPU-only jobs (one core each; the cluster has 256). Through warden: they are
  submitted while every node is drained, then the nodes come back while the partition is
  down (Slurm queues what it is given and starts nothing): `admitted_per_s` is N over the time
  from then to every job handed to Slurm (`sbatch --hold`, batched `scontrol release`); then
  the partition comes up, and `started_per_s` is N over the time to every job's process
  running (Slurm's launches, which on 2 cores compete with each other for the CPU). Slurm
  alone: `sbatch` of the same jobs one after another into the down partition
  (`submitted_per_s`), then up (`started_per_s`).

Medians over the runs, every value in `*_all`.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "server"))

import httpx  # noqa: E402
from serverproc import Server, wait_for  # noqa: E402
from slurmcluster import Cluster, bring_up  # noqa: E402

# Records its start and every SIGTERM, ignores SIGTERM, runs until SIGKILL.
STUBBORN = """\
import os, signal, sys, time
out = sys.argv[1]
signal.signal(signal.SIGTERM, lambda *_: open(out + ".term", "a").write(f"{time.time():.6f}\\n"))
with open(out + ".pid", "w") as f:
    f.write(f"{os.getpid()} {time.time():.6f}")
while True:
    time.sleep(0.05)
"""

POLICY = """\
min_grace: 1s
thrash: {min_efficiency: 0}
preemption: {restart_overhead: 0s}
tiers:
  1: {name: production-inference, preemptible: false, grace: 1s, scope: cluster}
  3: {name: experimentation, lease: 0s, grace: 1s}
queues:
  name: cluster
  children:
    - {name: team, nominal: {gpu: 32}}
"""


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def cluster(*extra: str) -> Iterator[Cluster]:
    return bring_up(*extra)


def pid_of(out: Path, timeout: float = 120) -> tuple[int, float]:
    """The process's pid and the time it started, once its file is there."""
    path = out.with_suffix(".pid")
    wait_for(lambda: path.exists() and path.read_text().count(" ") == 1, timeout, f"{path}")
    pid, at = path.read_text().split()
    return int(pid), float(at)


class Deaths:
    """When each of these processes is gone: pidfds opened now, watched by a thread."""

    def __init__(self, pids: list[int]) -> None:
        self.fds = {os.pidfd_open(p): p for p in pids}
        self.at: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set() and len(self.at) < len(self.fds):
            ready, _, _ = select.select([f for f in self.fds if self.fds[f] not in self.at], [], [], 0.2)
            for fd in ready:
                self.at[self.fds[fd]] = time.time()

    def of(self, pids: list[int], timeout: float = 120) -> dict[int, float]:
        wait_for(lambda: all(p in self.at for p in pids), timeout, "the victims gone")
        self._stop.set()
        return {p: self.at[p] for p in pids}


def stubborn(root: Path) -> Path:
    script = root / "stubborn.py"
    script.write_text(STUBBORN)
    os.chmod(root, 0o777)
    return script


# -- Slurm's own preemption --------------------------------------------------------------------


def native(runs: int, grace: int) -> dict[str, Any]:
    gen = cluster("--slurm-preemption", str(grace))
    c = next(gen)
    work = Path(tempfile.mkdtemp(prefix="wbench-"))
    script = stubborn(work)
    lateness: list[float] = []
    victims: list[int] = []
    starts: list[float] = []
    try:
        for run in range(runs):
            lows = [work / f"r{run}-low{i}" for i in range(4)]
            for node, out in zip(("n0", "n1", "n2", "n3"), lows):
                c.run("sbatch", "-p", "low", "-w", node, "--gres=gpu:8", "-o", "/dev/null",
                      f"--wrap=srun {sys.executable} {script} {out}")  # fmt: skip
            pids = {out: pid_of(out)[0] for out in lows}
            watch = Deaths(list(pids.values()))
            high = work / f"r{run}-high"
            asked = time.time()
            c.run(
                "sbatch",
                "-p",
                "high",
                "--gres=gpu:8",
                "-o",
                "/dev/null",
                f"--wrap=srun {sys.executable} {script} {high}",
            )
            _, started = pid_of(high, timeout=300)
            starts.append(started - asked)
            time.sleep(2 * grace + 35)  # Slurm may still pick a second victim meanwhile
            hit = [out for out in lows if out.with_suffix(".term").exists()]
            victims.append(len(hit))
            deaths = watch.of([pids[out] for out in hit])
            for out in hit:
                term = float(out.with_suffix(".term").read_text().split()[0])
                lateness.append(deaths[pids[out]] - (term + grace))
            c.cancel_all()
            wait_for(lambda: not [v for v in c.jobs().values() if v[1] in ("RUNNING", "COMPLETING")], 60, "idle")
    finally:
        gen.close()
        shutil.rmtree(work, ignore_errors=True)
    return {
        "grace_s": grace,
        "sigkill_lateness_s": median(lateness),
        "sigkill_lateness_s_all": [round(x, 3) for x in lateness],
        "victims": median([float(v) for v in victims]),
        "victims_all": victims,
        "preemptor_start_s": median(starts),
        "preemptor_start_s_all": [round(x, 3) for x in starts],
    }


# -- warden ----------------------------------------------------------------------------------


def warden_server(work: Path, c: Cluster) -> Server:
    policy = work / "policy.yaml"
    policy.write_text(POLICY)
    return Server(
        work / "state",
        policy=policy,
        gpus=None,
        args=("--executor", "slurm"),
        env={"SLURM_CONF": str(c.conf), "PYTHONPATH": str(REPO)},
    ).start()


def submit(h: httpx.Client, body: dict[str, Any]) -> str:
    r = h.post("/v1/jobs", json=body)
    if r.status_code != 201:
        raise RuntimeError(r.text)
    return str(r.json()["id"])


def cancel_all(h: httpx.Client, ids: list[str]) -> None:
    for i in ids:
        h.post(f"/v1/jobs/{i}/cancel")
    wait_for(lambda: all(h.get(f"/v1/jobs/{i}").json()["state"] == "CANCELLED" for i in ids), 120, "cancelled")


def warden(runs: int, grace: int) -> dict[str, Any]:
    gen = cluster()
    c = next(gen)
    work = Path(tempfile.mkdtemp(prefix="wbench-"))
    script = stubborn(work)
    server = warden_server(work, c)
    lateness: list[float] = []
    victims: list[int] = []
    starts: list[float] = []
    idle: list[float] = []
    try:
        with server.client() as h:

            def job(out: Path, tier: int, gpus: int) -> str:
                body = {"queue": "team", "tier": tier, "gpus": gpus, "grace": f"{grace}s", "workdir": str(work),
                        "command": [sys.executable, str(script), str(out)]}  # fmt: skip
                return submit(h, body)

            for run in range(runs):
                one = work / f"r{run}-idle"
                asked = time.time()
                single = job(one, 3, 1)
                idle.append(pid_of(one)[1] - asked)
                cancel_all(h, [single])
                lows = [work / f"r{run}-low{i}" for i in range(4)]
                ids = [job(out, 3, 8) for out in lows]
                pids = {i: pid_of(out)[0] for i, out in zip(ids, lows)}
                watch = Deaths(list(pids.values()))
                high = work / f"r{run}-high"
                asked = time.time()
                top = job(high, 1, 8)
                _, started = pid_of(high)
                starts.append(started - asked)
                time.sleep(2 * grace + 2)  # room for a needless second victim, were there one
                hit = [i for i in ids if any(e["to"] == "PREEMPTING" for e in h.get(f"/v1/jobs/{i}").json()["events"])]
                victims.append(len(hit))
                deaths = watch.of([pids[i] for i in hit])
                for i in hit:
                    kill_at = h.get(f"/v1/jobs/{i}").json()["attempts"][0]["kill_at"]
                    lateness.append(deaths[pids[i]] - kill_at)
                cancel_all(h, [*ids, top])
    finally:
        server.stop()
        gen.close()
        shutil.rmtree(work, ignore_errors=True)
    return {
        "grace_s": grace,
        "sigkill_lateness_s": median(lateness),
        "sigkill_lateness_s_all": [round(x, 4) for x in lateness],
        "victims": median([float(v) for v in victims]),
        "victims_all": victims,
        "preemptor_start_s": median(starts),
        "preemptor_start_s_all": [round(x, 3) for x in starts],
        "submit_to_running_s": median(idle),
        "submit_to_running_s_all": [round(x, 3) for x in idle],
    }


# -- admissions ------------------------------------------------------------------------------


def admissions(n: int) -> dict[str, Any]:
    gen = cluster()
    c = next(gen)
    work = Path(tempfile.mkdtemp(prefix="wbench-"))
    script = stubborn(work)
    out: dict[str, Any] = {"jobs": n}
    nodes = [f"n{i}" for i in range(4)]

    def partition(state: str) -> None:
        c.run("scontrol", "update", "PartitionName=main", f"State={state}")

    def all_running(prefix: str) -> None:
        wait_for(lambda: all((work / f"{prefix}{k}.pid").exists() for k in range(n)), 600, "all running", 0.1)

    try:
        server = warden_server(work, c)
        try:
            with server.client() as h:
                # The queue fills while every node is drained (warden admits nothing); the
                # partition is down (Slurm starts nothing it is given) when the nodes come back.
                for node in nodes:
                    c.set_node(node, "drain", "bench: the queue fills first")
                wait_for(lambda: all(n["down"] for n in h.get("/v1/nodes").json()), 60, "the nodes down for warden")
                command = [sys.executable, str(script)]
                body = {"queue": "team", "tier": 3, "gpus": 0, "cpu": 1000, "workdir": str(work)}
                ids = [submit(h, {**body, "command": [*command, str(work / f"w{k}")]}) for k in range(n)]
                partition("DOWN")
                t0 = time.time()
                for node in nodes:
                    c.set_node(node, "resume")

                def handed() -> bool:
                    return len(h.get("/v1/jobs", params={"state": ["STARTING", "RUNNING"]}).json()) >= n

                def begun() -> bool:
                    return bool(h.get("/v1/jobs", params={"state": ["ADMITTED", "STARTING", "RUNNING"]}).json())

                # The first admission comes once the server has seen the nodes back (its poll):
                # the rate after it is the rate of admissions alone.
                wait_for(begun, 60, "a first admission", 0.02)
                t_first = time.time()
                wait_for(handed, 300, "all handed to Slurm", 0.05)
                t1 = time.time()
                partition("UP")
                all_running("w")
                t2 = time.time()
                out["warden"] = {
                    "admitted_per_s": round(n / (t1 - t0), 1),
                    "admitted_per_s_after_the_first": round(n / (t1 - t_first), 1),
                    "first_admitted_after_s": round(t_first - t0, 2),
                    "started_per_s": round(n / (t2 - t1), 1),
                }
                for i in ids:
                    h.post(f"/v1/jobs/{i}/cancel")
        finally:
            server.stop()
        c.cancel_all()
        wait_for(lambda: not [v for v in c.jobs().values() if v[1] in ("RUNNING", "COMPLETING")], 120, "idle")
        partition("DOWN")
        t0 = time.time()
        for k in range(n):
            wrap = f"--wrap=exec {sys.executable} {script} {work / f's{k}'}"  # exec: no shell to orphan it
            c.run("sbatch", "-p", "main", "-n1", "-o", "/dev/null", wrap)
        t1 = time.time()
        partition("UP")
        all_running("s")
        t2 = time.time()
        out["slurm"] = {"submitted_per_s": round(n / (t1 - t0), 1), "started_per_s": round(n / (t2 - t1), 1)}
        c.cancel_all()
    finally:
        gen.close()
        shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--grace", type=int, default=5, help="seconds of grace after SIGTERM")
    p.add_argument("--jobs", type=int, default=200, help="jobs in the admissions section (at most 256)")
    p.add_argument("--only", default="native,warden,admissions")
    args = p.parse_args(argv)
    if not 1 <= args.runs <= 100:
        p.error(f"--runs: {args.runs} is out of range; allowed: 1 to 100")
    if not 1 <= args.grace <= 300:
        p.error(f"--grace: {args.grace} is out of range; allowed: 1 to 300")
    if not 1 <= args.jobs <= 256:
        p.error(f"--jobs: {args.jobs} is out of range; allowed: 1 to 256")
    sections = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = sections - {"native", "warden", "admissions"}
    if unknown:
        p.error(f"--only: unknown section(s) {', '.join(sorted(unknown))}; allowed: native, warden, admissions")
    result: dict[str, Any] = {}
    if "warden" in sections:
        result["warden"] = warden(args.runs, args.grace)
    if "native" in sections:
        result["native"] = native(args.runs, args.grace)
    if "admissions" in sections:
        result["admissions"] = admissions(args.jobs)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
