"""The server under a greedy and a hostile client at once: one JSON object on stdout.

    python bench/load.py [--jobs N] [--job-bytes B] [--half-open H] [--policy-queues Q] [--seconds S]

Before the server starts, `--jobs` finished jobs of `--job-bytes` each (command and env, half
and half) are written straight into its database through warden's `Store`. Then, for
`--seconds`, against a real server process (SQLite, fake GPUs):

- one user pages through `GET /v1/jobs?all=true` (`--page` jobs a page) as fast as it can,
  and submits jobs of `--job-bytes` each (they await approval, so none runs);
- another client holds `--half-open` connections, each with half a request head sent,
  opening a new one whenever the server closes one;
- a third user sends `POST /v1/policy/diff` with a flat policy of `--policy-queues` queues,
  again as soon as the last one is answered (refused or not).

Throughout, `/v1/health` is timed every `--probe-interval` s (`health_p50_s`, `health_p99_s`,
`health_max_s`, `health_failures`) and the server's resident memory is read every 0.1 s
(`rss_max_mib`; `rss_peak_mib` is the kernel's high-water mark, VmHWM; `rss_workers_max_mib`
the most its worker processes held together). `terms_led` counts the terms the server led: 1
unless the load made it step down. Each client's counts
say what it got; `--skip` leaves some out. `limits` names the bounds in force.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "server"))

import httpx
from serverproc import Server

from warden.engine.lifecycle import Event
from warden.engine.model import JobState
from warden.engine.policy import Limits
from warden.paths import make_dirs
from warden.server import connections, offload
from warden.store.db import default_url
from warden.store.repo import Store

POLICY = """\
tiers:
  3: {requires_approval: true}
queues:
  name: cluster
  children:
    - {name: team}
"""
"""The policy's default `limits`: the flood of submissions meets the user's rate and its
waiting jobs' cap (the seeded jobs, finished, count against neither)."""
HALF_HEAD = b"GET /v1/jobs HTTP/1.1\r\nHost: warden\r\nAuthorization: Bearer "
HALF_HELLO = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"
"""The first bytes of a TLS ClientHello announcing 512: a handshake that never ends (HTTPS)."""


def bulky(job_bytes: int, i: int) -> tuple[list[str], dict[str, str]]:
    """A command and an env of `job_bytes` together."""
    half = max(job_bytes // 2, 1)
    return ["true", f"{i:08d}" + "c" * max(half - 8, 0)], {"PAYLOAD": "e" * max(job_bytes - half - 7, 0)}


def seed(state: Path, jobs: int, job_bytes: int) -> float:
    """`jobs` finished jobs in the server's database; the seconds it took."""
    t0 = time.perf_counter()
    make_dirs(state)
    store = Store.open(default_url(state))
    now = time.time() - 86400
    try:
        for i in range(jobs):
            command, env = bulky(job_bytes, i)
            job_id = store.submit(
                name=f"seeded-{i}",
                user="flooder",
                queue="team",
                tier=4,
                command=command,
                env=env,
                actor="flooder",
                now=now + i * 1e-3,
                workdir="/",
            )
            store.transition(
                job_id, JobState.CANCELLED, event=Event.CANCELLED, reason="seeded", actor="bench", now=now + i * 1e-3
            )
    finally:
        store.close()
    return time.perf_counter() - t0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0  # it has exited
    for line in status.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def children(pid: int) -> list[int]:
    """The server's child processes: its workers (`warden.server.offload`), no job here."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


class Load:
    """The clients, each in its thread until `stop` is set."""

    def __init__(self, server: Server, args: argparse.Namespace, tokens: dict[str, str]) -> None:
        self.server, self.args, self.tokens = server, args, tokens
        self.stop = threading.Event()
        self.counts: dict[str, Counter[str]] = {k: Counter() for k in ("list", "submit", "half_open", "diff")}
        self.listing_s: list[float] = []
        self.health_s: list[float] = []
        self.health_failures = 0
        self.rss: list[float] = []
        self.rss_workers: list[float] = []

    def lister(self) -> None:
        with self.server.client(self.tokens["flooder"]) as c:
            c.timeout = 120
            offset = 0
            while not self.stop.is_set():
                t = time.perf_counter()
                try:
                    r = c.get("/v1/jobs", params={"all": "true", "limit": self.args.page, "offset": offset})
                except httpx.HTTPError as err:
                    self.counts["list"][type(err).__name__] += 1
                    continue
                self.listing_s.append(time.perf_counter() - t)
                self.counts["list"][str(r.status_code)] += 1
                total = int(r.headers.get("x-total-count", "0") or 0)
                offset = offset + self.args.page if offset + self.args.page < total else 0

    def submitter(self) -> None:
        with self.server.client(self.tokens["flooder"]) as c:
            c.timeout = 120
            i = 0
            while not self.stop.is_set():
                command, env = bulky(self.args.job_bytes, i)
                body = {"queue": "team", "tier": 3, "gpus": 1, "command": command, "env": env, "workdir": "/"}
                try:
                    r = c.post("/v1/jobs", json=body)
                    self.counts["submit"][str(r.status_code)] += 1
                except httpx.HTTPError as err:
                    self.counts["submit"][type(err).__name__] += 1
                i += 1

    def half_open(self) -> None:
        url = urlsplit(self.server.url)
        assert url.hostname is not None and url.port is not None
        half = HALF_HELLO if url.scheme == "https" else HALF_HEAD
        held: list[socket.socket] = []
        try:
            while not self.stop.is_set():
                alive = []
                for sock in held:  # the ones the server closed (408) make room for new ones
                    try:
                        closed = sock.recv(65536, socket.MSG_DONTWAIT) is not None
                    except BlockingIOError:
                        closed = False
                    except OSError:
                        closed = True
                    if closed:
                        sock.close()
                        self.counts["half_open"]["closed_by_server"] += 1
                    else:
                        alive.append(sock)
                held = alive
                while len(held) < self.args.half_open and not self.stop.is_set():
                    try:
                        sock = socket.create_connection((url.hostname, url.port), timeout=5)
                        sock.sendall(half)
                    except OSError as err:
                        self.counts["half_open"][type(err).__name__] += 1
                        break
                    held.append(sock)
                    self.counts["half_open"]["opened"] += 1
                self.stop.wait(0.2)
        finally:
            for sock in held:
                sock.close()

    def differ(self) -> None:
        source = "queues:\n  name: cluster\n  children:\n" + "".join(
            f"    - {{name: q{i}}}\n" for i in range(self.args.policy_queues)
        )
        with self.server.client(self.tokens["planner"]) as c:
            c.timeout = 300
            while not self.stop.is_set():
                try:
                    status = str(c.post("/v1/policy/diff", json={"source": source}).status_code)
                except httpx.HTTPError as err:
                    status = type(err).__name__
                self.counts["diff"][status] += 1
                if status != "200":
                    self.stop.wait(1.0)

    def prober(self) -> None:
        with httpx.Client(timeout=30, verify=self.server.tls()) as probe:
            while not self.stop.is_set():
                t = time.perf_counter()
                try:
                    ok = probe.get(f"{self.server.url}/v1/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    self.health_s.append(time.perf_counter() - t)
                else:
                    self.health_failures += 1
                self.stop.wait(self.args.probe_interval)

    def memory(self) -> None:
        assert self.server.proc is not None
        pid = self.server.proc.pid
        while not self.stop.is_set():
            self.rss.append(rss_mib(pid))
            self.rss_workers.append(sum(rss_mib(child) for child in children(pid)))
            self.stop.wait(0.1)


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o711)  # jobs' uids pass through to their directories
        policy = Path(d) / "policy.yaml"
        policy.write_text(POLICY)
        state = Path(d) / "state"
        seed_s = seed(state, args.jobs, args.job_bytes)
        server = Server(state, policy=policy).start(timeout=300)
        assert server.proc is not None
        try:
            rss_idle = rss_mib(server.proc.pid)
            with server.client() as admin:
                tokens = {
                    u: admin.post("/v1/tokens", json={"user": u, "role": "user"}).json()["token"]
                    for u in ("flooder", "planner")
                }
            load = Load(server, args, tokens)
            clients = {"list": load.lister, "submit": load.submitter, "half_open": load.half_open, "diff": load.differ}
            workers = [w for k, w in clients.items() if k not in args.skip] + [load.prober, load.memory]
            threads = [threading.Thread(target=w, name=w.__name__) for w in workers]
            for t in threads:
                t.start()
            load.stop.wait(args.seconds)
            load.stop.set()
            for t in threads:
                t.join(300)
            rss_peak = rss_mib(server.proc.pid, "VmHWM")
            log = server.log.read_text() if server.log else ""
            if "Traceback" in log:  # shown whole: a traceback under load is a finding
                print(log, file=sys.stderr)
        finally:
            server.stop()
    h = load.health_s
    return {
        "sizes": {
            "jobs": args.jobs,
            "job_bytes": args.job_bytes,
            "half_open": args.half_open,
            "policy_queues": args.policy_queues,
            "seconds": args.seconds,
            "page": args.page,
            "skipped": sorted(args.skip),
        },
        "limits": {
            "head_timeout_s": connections.HEAD_TIMEOUT_S,
            "body_timeout_s": connections.BODY_TIMEOUT_S,
            "min_body_bytes_per_s": connections.MIN_BODY_BYTES_PER_S,
            "max_connections": connections.connection_cap(_fd_limit()),
            "expensive_requests_at_once": Limits().expensive_requests_at_once,
            "worker_processes": offload.WORKERS,
            "max_body_bytes": Limits().max_body_bytes,
            "submissions_per_second_per_user": Limits().submissions_per_second_per_user,
            "submission_burst_per_user": Limits().submission_burst_per_user,
            "max_pending_per_user": Limits().max_pending_per_user,
        },
        "seed_s": round(seed_s, 1),
        "health_probes": len(h),
        "health_failures": load.health_failures,
        "health_p50_s": round(statistics.median(h), 4) if h else None,
        "health_p99_s": round(percentile(h, 0.99), 4),
        "health_max_s": round(max(h), 4) if h else None,
        "rss_idle_mib": round(rss_idle, 1),
        "rss_max_mib": round(max(load.rss), 1) if load.rss else None,
        "rss_peak_mib": round(rss_peak, 1),
        "rss_workers_max_mib": round(max(load.rss_workers), 1) if load.rss_workers else None,
        "listing_p50_s": round(statistics.median(load.listing_s), 4) if load.listing_s else None,
        "listing_max_s": round(max(load.listing_s), 4) if load.listing_s else None,
        "counts": {k: dict(v) for k, v in load.counts.items()},
        "log_lines": len(log.splitlines()),
        "log_tracebacks": log.count("Traceback"),
        "terms_led": log.count("this server leads now"),
    }


def _fd_limit() -> int:
    """The descriptor limit the server will raise itself to (the hard limit it inherits)."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return hard if hard != resource.RLIM_INFINITY else 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=10_000, help="finished jobs seeded into the database")
    p.add_argument("--job-bytes", type=int, default=500_000, help="command and env bytes of each job")
    p.add_argument("--half-open", type=int, default=1000, help="half-open connections held at once")
    p.add_argument("--policy-queues", type=int, default=20_000, help="queues of the policy sent to diff")
    p.add_argument("--seconds", type=float, default=60.0, help="how long the load lasts")
    p.add_argument("--page", type=int, default=100, help="jobs a listing page asks for")
    p.add_argument("--probe-interval", type=float, default=0.05, help="seconds between two health probes")
    p.add_argument(
        "--skip", type=lambda v: set(v.split(",")), default=set(), help="clients left out: list,submit,half_open,diff"
    )
    print(json.dumps(run(p.parse_args()), indent=2))


if __name__ == "__main__":
    main()
