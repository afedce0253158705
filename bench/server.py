"""The control plane's benchmarks: one JSON object on stdout.

    python bench/server.py [--submissions N] [--clients C] [--latency-runs K] [--kill-runs K]

- `submit_per_s`: jobs accepted per second through `POST /v1/jobs` by C concurrent
  connections (each submission durable before its answer) for `--seconds`; the jobs wait
  behind one running job, so the reconcile loop works over a growing queue meanwhile.
  Target ≥ 500/s. The load comes from `wrk` (Debian's `wrk` package) when it is installed:
  a Python client on this 2-core machine saturates before the server does. Without `wrk`,
  C Python threads submit N jobs and `load_generator` says so.
- `submit_to_running_s`: on an idle cluster, from just before `POST /v1/jobs` to the moment
  the job's own process runs (it writes `time.time()` first thing). Target ≤ 0.5 s.
- `sigkill_lateness_s`: a job that ignores SIGTERM is cancelled; from its SIGKILL deadline to
  the moment its last process was gone (the attempt's `ended_at`). Target ≤ 0.2 s.

- `backlog`: the same with 8 connections while 2,000 jobs already wait (`submit_per_s`,
  `latency_p50_s`, `latency_p99_s`; targets ≥ 500/s, p99 < 100 ms), and `warden queue
  --json` there: the whole command (`queue_json_s`), its start-up alone against an
  unreachable server (`cli_startup_s`) and the API call alone (`list_api_s`). Target
  `queue_json_s` ≤ 0.5 s.
- `cancel_races`: a head-of-queue job cancelled at a random moment around its admission
  (1,500 jobs wait behind it in a queue that cannot run): every cancel answered 202 must end
  the job CANCELLED; `lost` counts those that did not within 10 s.
- `kill9`: submissions from 4 clients while the server is killed with SIGKILL, `--kill9-runs`
  times, each followed by a restart: `accepted` (answered 201), `lost` (accepted but not
  stored), `duplicated` (one request stored twice), `in_doubt` (no answer: stored or not).

- `flood`: for each count of `--flood-users` (default 1 and 4), that many users submit as fast as they can for `--flood-seconds` with their own
  tokens (Python threads), every accepted job waiting: `accepted`, `refused_rate` (429: the
  user's rate), `refused_pending` (429: the user's or the queue's waiting jobs) and the mean
  pass time during the flood and
  in the quiet second after it; with the policy's default `limits` (`limited`) and with them
  out of reach (`unlimited`).

Each runs against a real server process (SQLite, fake GPUs) in a temporary directory.
Medians over the runs; the whole list is in `*_all`. `--only` picks sections.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "server"))

import httpx
from serverproc import ADMIN, Server, wait_for

POLICY = """\
min_grace: 1s
thrash: {min_efficiency: 0}
preemption: {restart_overhead: 0s}
tiers:
  3: {name: experimentation, lease: 0s, grace: 1s}
queues:
  name: cluster
  children:
    - {name: team}
limits: {max_pending_per_user: 1000000, max_pending_per_queue: 1000000}
"""

STUBBORN = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nopen('{mark}', 'w').write('up')\ntime.sleep(3600)\n"


def _server(tmp: Path, gpus: int) -> Server:
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY)
    return Server(tmp / "state", policy=policy, gpus=gpus).start()


def submissions(n: int, clients: int, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        s = _server(Path(d), 1)
        try:
            with s.client() as c:
                holder = c.post(
                    "/v1/jobs", json={"queue": "team", "tier": 3, "gpus": 1, "command": ["sleep", "600"], "workdir": d}
                ).json()["id"]
                wait_for(lambda: c.get(f"/v1/jobs/{holder}").json()["state"] == "RUNNING")
            if shutil.which("wrk"):
                result = _wrk(s, Path(d), clients, seconds)
            else:
                result = _python_clients(s, d, n, clients)
            with s.client() as c:
                result["jobs_stored"] = len(c.get("/v1/jobs").json()) - 1
                c.post(f"/v1/jobs/{holder}/cancel")
            return result
        finally:
            s.stop()


def _wrk(s: Server, d: Path, connections: int, seconds: float) -> dict[str, Any]:
    body = json.dumps({"queue": "team", "tier": 3, "gpus": 1, "command": ["true"], "workdir": str(d)})
    script = d / "post.lua"
    script.write_text(
        f'wrk.method = "POST"\nwrk.body = {json.dumps(body)}\n'
        f'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "Bearer {ADMIN}"\n'
        "done = function(summary, latency, requests)\n"
        '  io.write(string.format("RESULT %d %d %d %d %d %d\\n", summary.requests, summary.duration,'
        " summary.errors.status, latency:percentile(50), latency:percentile(95), latency:percentile(99)))\nend\n"
    )
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "-s", str(script), f"{s.url}/v1/jobs"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("RESULT"))
    requests, duration_us, bad, p50_us, p95_us, p99_us = map(int, line.split()[1:])
    return {
        "load_generator": "wrk",
        "connections": connections,
        "submissions": requests,
        "wall_s": round(duration_us / 1e6, 3),
        "submit_per_s": round(requests / (duration_us / 1e6), 1),
        "errors": bad,
        "latency_p50_s": p50_us / 1e6,
        "latency_p95_s": p95_us / 1e6,
        "latency_p99_s": p99_us / 1e6,
    }


def _python_clients(s: Server, d: str, n: int, clients: int) -> dict[str, Any]:
    per_client = n // clients
    errors: list[str] = []

    def work() -> None:
        with s.client() as c:
            for _ in range(per_client):
                r = c.post("/v1/jobs", json={"queue": "team", "tier": 3, "gpus": 1, "command": ["true"], "workdir": d})
                if r.status_code != 201:
                    errors.append(r.text)

    threads = [threading.Thread(target=work) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {
        "load_generator": "python threads (wrk not installed)",
        "connections": clients,
        "submissions": per_client * clients,
        "wall_s": round(wall, 3),
        "submit_per_s": round(per_client * clients / wall, 1),
        "errors": len(errors),
    }


def submit_to_running(runs: int) -> dict[str, Any]:
    out = []
    with tempfile.TemporaryDirectory() as d:
        s = _server(Path(d), 1)
        try:
            with s.client() as c:
                for i in range(runs):
                    mark = Path(d) / f"started-{i}"
                    code = f"import time; open({str(mark)!r}, 'w').write(repr(time.time()))"
                    t0 = time.time()
                    job = c.post(
                        "/v1/jobs",
                        json={
                            "queue": "team",
                            "tier": 3,
                            "gpus": 1,
                            "workdir": d,
                            "command": [sys.executable, "-c", code],
                        },
                    ).json()["id"]
                    wait_for(lambda mark=mark: mark.exists() and mark.read_text(), 30)
                    out.append(float(mark.read_text()) - t0)
                    wait_for(lambda job=job: c.get(f"/v1/jobs/{job}").json()["state"] == "SUCCEEDED", 30)
        finally:
            s.stop()
    return {
        "runs": runs,
        "submit_to_running_s": round(statistics.median(out), 4),
        "submit_to_running_s_all": [round(x, 4) for x in out],
    }


def sigkill_lateness(runs: int) -> dict[str, Any]:
    out = []
    with tempfile.TemporaryDirectory() as d:
        s = _server(Path(d), 1)
        try:
            with s.client() as c:
                for i in range(runs):
                    mark = Path(d) / f"up-{i}"
                    script = Path(d) / f"stubborn-{i}.py"
                    script.write_text(STUBBORN.format(mark=mark))
                    job = c.post(
                        "/v1/jobs",
                        json={
                            "queue": "team",
                            "tier": 3,
                            "gpus": 1,
                            "workdir": d,
                            "command": [sys.executable, str(script)],
                        },
                    ).json()["id"]
                    wait_for(mark.exists, 30)
                    c.post(f"/v1/jobs/{job}/cancel")
                    a = wait_for(
                        lambda job=job: (
                            (x := c.get(f"/v1/jobs/{job}").json())["state"] == "CANCELLED" and x["attempts"][0]
                        ),
                        30,
                    )
                    out.append(a["ended_at"] - a["kill_at"])
        finally:
            s.stop()
    return {
        "runs": runs,
        "sigkill_lateness_s": round(statistics.median(out), 4),
        "sigkill_lateness_s_all": [round(x, 4) for x in out],
    }


RACE_POLICY = POLICY + "    - {name: parked, nominal: {gpu: 0}, borrowing_limit: {gpu: 0}}\n"
"""`POLICY` with a queue that can never run, where the backlog waits."""


def _job(d: str, command: list[str], queue: str = "team", **extra: Any) -> dict[str, Any]:
    return {"queue": queue, "tier": 3, "gpus": 1, "command": command, "workdir": d, **extra}


def _fill(s: Server, body: dict[str, Any], count: int, clients: int = 8) -> None:
    """`count` submissions of `body` from `clients` threads."""

    def work(n: int) -> None:
        with s.client() as c:
            for _ in range(n):
                assert c.post("/v1/jobs", json=body).status_code == 201

    threads = [threading.Thread(target=work, args=(count // clients + (i < count % clients),)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=False)
    return time.perf_counter() - t0


def backlog(pending: int, clients: int, seconds: float, runs: int) -> dict[str, Any]:
    """Submissions and `warden queue --json` while `pending` jobs wait behind a running one."""
    with tempfile.TemporaryDirectory() as d:
        s = _server(Path(d), 1)
        try:
            with s.client() as c:
                holder = c.post("/v1/jobs", json=_job(d, ["sleep", "600"])).json()["id"]
                wait_for(lambda: c.get(f"/v1/jobs/{holder}").json()["state"] == "RUNNING")
                _fill(s, _job(d, ["true"]), pending)
                cli = [sys.executable, "-m", "warden.cli.main", "queue", "--json", "--token", ADMIN]
                queue = [_timed([*cli, "--url", s.url, "--ca", str(s.ca)]) for _ in range(runs)]
                startup = [_timed([*cli, "--url", "http://127.0.0.1:9"]) for _ in range(runs)]
                api = []
                for _ in range(runs):
                    t0 = time.perf_counter()
                    listed = len(c.get("/v1/jobs").json())
                    api.append(time.perf_counter() - t0)
                result: dict[str, Any] = {
                    "pending": listed - 1,
                    "queue_json_s": round(statistics.median(queue), 3),
                    "queue_json_s_all": [round(x, 3) for x in queue],
                    "cli_startup_s": round(statistics.median(startup), 3),
                    "list_api_s": round(statistics.median(api), 3),
                }
            if shutil.which("wrk"):
                result.update(_wrk(s, Path(d), clients, seconds))
            else:
                result.update(_python_clients(s, d, int(seconds * 300), clients))
            with s.client() as c:
                c.post(f"/v1/jobs/{holder}/cancel")
            return result
        finally:
            s.stop()


def cancel_races(trials: int, backlog_jobs: int) -> dict[str, Any]:
    """The head of the queue cancelled at a random moment around its admission (the job
    ahead of it ends after 0.1 s), with `backlog_jobs` waiting in a queue that cannot run."""
    rng = random.Random(0)
    answered = lost = 0
    admitted = 0
    with tempfile.TemporaryDirectory() as d:
        policy = Path(d) / "policy.yaml"
        policy.write_text(RACE_POLICY)
        s = Server(Path(d) / "state", policy=policy, gpus=1).start()
        try:
            _fill(s, _job(d, ["true"], queue="parked"), backlog_jobs)
            with s.client() as c:
                for _ in range(trials):
                    ahead = c.post("/v1/jobs", json=_job(d, ["sleep", "0.1"])).json()["id"]
                    head = c.post("/v1/jobs", json=_job(d, ["sleep", "600"])).json()["id"]
                    time.sleep(rng.uniform(0.0, 0.4))
                    if c.post(f"/v1/jobs/{head}/cancel").status_code != 202:
                        continue
                    answered += 1
                    try:
                        job = wait_for(
                            lambda head=head: (j := c.get(f"/v1/jobs/{head}").json())["state"] == "CANCELLED" and j, 10
                        )
                        admitted += job["attempt"] > 0
                    except AssertionError:
                        lost += 1
                        c.post(f"/v1/jobs/{head}/cancel")
                    c.post(f"/v1/jobs/{ahead}/cancel")  # not measured: only its GPU matters
        finally:
            s.stop()
    return {"trials": trials, "backlog": backlog_jobs, "answered": answered, "admitted_first": admitted, "lost": lost}


def kill9(runs: int, clients: int) -> dict[str, Any]:
    """Submissions under load while the server is killed with SIGKILL and started again."""
    accepted: dict[str, str] = {}  # request name -> id
    in_doubt: set[str] = set()
    with tempfile.TemporaryDirectory() as d:
        s = _server(Path(d), 1)
        try:
            for run in range(runs):
                stop = threading.Event()

                def work(client: int, run: int = run, stop: threading.Event = stop) -> None:
                    with s.client() as c:
                        n = 0
                        while not stop.is_set():
                            name = f"r{run}-c{client}-{n}"
                            n += 1
                            try:
                                r = c.post("/v1/jobs", json=_job(d, ["true"], queue="team", name=name))
                            except httpx.TransportError:
                                in_doubt.add(name)
                                return
                            if r.status_code == 201:
                                accepted[name] = r.json()["id"]

                threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
                for t in threads:
                    t.start()
                time.sleep(random.uniform(0.3, 1.0))
                s.kill9()
                stop.set()
                for t in threads:
                    t.join()
                s.start()
            with s.client() as c:
                stored: dict[str, list[str]] = {}
                for j in c.get("/v1/jobs", params={"all": "true"}).json():
                    stored.setdefault(j["name"], []).append(j["id"])
        finally:
            s.stop()
    lost = [n for n, i in accepted.items() if i not in stored.get(n, [])]
    return {
        "runs": runs,
        "accepted": len(accepted),
        "lost": len(lost),
        "duplicated": sum(len(ids) - 1 for ids in stored.values() if len(ids) > 1),
        "in_doubt": len(in_doubt),
        "in_doubt_stored": sum(1 for n in in_doubt if n in stored),
    }


def _pass_totals(c: httpx.Client) -> tuple[float, float]:
    """(seconds, count) of every reconcile pass so far, from `/metrics`."""
    total = count = 0.0
    for line in c.get("/metrics").text.splitlines():
        if line.startswith("warden_scheduling_pass_seconds_sum "):
            total = float(line.split()[1])
        elif line.startswith("warden_scheduling_pass_seconds_count "):
            count = float(line.split()[1])
    return total, count


def _mean_pass(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    passes = after[1] - before[1]
    return round((after[0] - before[0]) / passes, 4) if passes > 0 else None


def flood(users: int, seconds: float, limited: bool) -> dict[str, Any]:
    """`users` users (user tokens, one thread each) submit as fast as they can for `seconds`
    while one running job holds the only GPU, so every accepted job waits. With the policy's
    default `limits` (`limited`), or with every fair-use limit out of reach. The mean pass time
    is over the flood, then over a quiet second after it (the backlog it left)."""
    text = (
        POLICY
        if not limited
        else POLICY.replace("limits: {max_pending_per_user: 1000000, max_pending_per_queue: 1000000}\n", "")
    )
    if not limited:
        text = text.replace(
            "max_pending_per_queue: 1000000}",
            "max_pending_per_queue: 1000000, "
            "submissions_per_second_per_user: 1000000, submission_burst_per_user: 1000000}",
        )
    with tempfile.TemporaryDirectory() as d:
        Path(d).chmod(0o755)  # jobs run as other uids when the server runs as root
        policy = Path(d) / "policy.yaml"
        policy.write_text(text)
        s = Server(Path(d) / "state", policy=policy, gpus=1).start()
        try:
            with s.client() as admin:
                admin.post("/v1/jobs", json=_job(d, ["sleep", "600"]))
                tokens = [
                    admin.post("/v1/tokens", json={"user": f"user{i}", "role": "user"}).json()["token"]
                    for i in range(users)
                ]
                counts: dict[str, int] = {}
                lock = threading.Lock()
                stop = time.perf_counter() + seconds

                def work(token: str) -> None:
                    mine: dict[str, int] = {}
                    with s.client(token) as c:
                        while time.perf_counter() < stop:
                            r = c.post("/v1/jobs", json=_job(d, ["true"]))
                            key = str(r.status_code)
                            if r.status_code == 429:
                                key = "rate" if "per second" in r.json()["error"]["message"] else "pending"
                            mine[key] = mine.get(key, 0) + 1
                    with lock:
                        for k, v in mine.items():
                            counts[k] = counts.get(k, 0) + v

                threads = [threading.Thread(target=work, args=(t,)) for t in tokens]
                before = _pass_totals(admin)
                t0 = time.perf_counter()
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                wall = time.perf_counter() - t0
                during = _pass_totals(admin)
                time.sleep(1.0)
                quiet = _pass_totals(admin)
                return {
                    "users": users,
                    "wall_s": round(wall, 2),
                    "accepted": counts.get("201", 0),
                    "refused_rate": counts.get("rate", 0),
                    "refused_pending": counts.get("pending", 0),
                    "answers": counts,
                    "pass_s_during": _mean_pass(before, during),
                    "pass_s_after": _mean_pass(during, quiet),
                }
        finally:
            s.stop()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--submissions", type=int, default=2000)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--latency-runs", type=int, default=20)
    p.add_argument("--kill-runs", type=int, default=10)
    p.add_argument("--pending", type=int, default=2000)
    p.add_argument("--backlog-clients", type=int, default=8)
    p.add_argument("--queue-runs", type=int, default=5)
    p.add_argument("--race-trials", type=int, default=100)
    p.add_argument("--kill9-runs", type=int, default=20)
    p.add_argument("--flood-users", default="1,4", help="comma-separated: one flood per count")
    p.add_argument("--flood-seconds", type=float, default=4.3)
    p.add_argument("--only", default="submit,latency,sigkill,backlog,cancel_races,kill9,flood")
    args = p.parse_args(argv)
    sections = {
        "submit": lambda: submissions(args.submissions, args.clients, args.seconds),
        "latency": lambda: submit_to_running(args.latency_runs),
        "sigkill": lambda: sigkill_lateness(args.kill_runs),
        "backlog": lambda: backlog(args.pending, args.backlog_clients, args.seconds, args.queue_runs),
        "cancel_races": lambda: cancel_races(args.race_trials, 1500),
        "kill9": lambda: kill9(args.kill9_runs, 4),
        "flood": lambda: {
            f"{n}_users": {
                "limited": flood(n, args.flood_seconds, True),
                "unlimited": flood(n, args.flood_seconds, False),
            }
            for n in (int(u) for u in args.flood_users.split(","))
        },
    }
    result: dict[str, Any] = {}
    for name in args.only.split(","):
        try:
            result[name] = sections[name]()
        except Exception as err:  # one failed section must not hide the others' figures
            result[name] = {"error": repr(err)}
    result["python"] = sys.version.split()[0]
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
