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

Each runs against a real server process (SQLite, fake GPUs) in a temporary directory.
Medians over the runs; the whole list is in `*_all`.
"""

from __future__ import annotations

import argparse
import json
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
        '  io.write(string.format("RESULT %d %d %d %d %d\\n", summary.requests, summary.duration,'
        " summary.errors.status, latency:percentile(50), latency:percentile(95)))\nend\n"
    )
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "-s", str(script), f"{s.url}/v1/jobs"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("RESULT"))
    requests, duration_us, bad, p50_us, p95_us = map(int, line.split()[1:])
    return {
        "load_generator": "wrk",
        "connections": connections,
        "submissions": requests,
        "wall_s": round(duration_us / 1e6, 3),
        "submit_per_s": round(requests / (duration_us / 1e6), 1),
        "errors": bad,
        "latency_p50_s": p50_us / 1e6,
        "latency_p95_s": p95_us / 1e6,
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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--submissions", type=int, default=2000)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--latency-runs", type=int, default=20)
    p.add_argument("--kill-runs", type=int, default=10)
    args = p.parse_args(argv)
    result = {
        "submit": submissions(args.submissions, args.clients, args.seconds),
        "latency": submit_to_running(args.latency_runs),
        "sigkill": sigkill_lateness(args.kill_runs),
        "python": sys.version.split()[0],
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
