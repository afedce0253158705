"""Several servers on one PostgreSQL (docs/control-plane.md, "Several servers"): takeovers
after kill -9, and what a standby costs. One JSON object on stdout.

    python bench/takeover.py [--kills K] [--submissions N] [--clients C] [--rounds R] [--idle-seconds S]

- `takeover`: three servers (fake GPUs); the leader is killed with SIGKILL `--kills` times,
  each at a moment when another server stands by, and started again as a standby once
  another leads. `takeover_s`: from the kill to the new leader's first pass (its `passes` in
  `GET /v1/health`, polled every 50 ms, as tests/server/test_leader.py measures it): median,
  p99 (nearest rank) and max. Before each kill five jobs that ignore SIGTERM are cancelled
  with graces chosen so that their SIGKILL deadlines fall 0.3 s before the kill and 0.5, 1.5,
  2.5 and 3.5 s after it, most of them inside the takeover, where no server runs and the job's
  supervisor (the shim) must SIGKILL on time by itself. `sigkill_lateness_s`: from each
  recorded deadline (the attempt's `kill_at`) to the moment the job's last process was gone
  (its `ended_at`, from the supervisor's exit record), median and max, over all of them and
  split by where the deadline fell: before the kill, inside the takeover (kill to first
  pass), after it.
- `submissions`: `--submissions` submissions from `--clients` Python threads (the load of
  bench/server.py's Python clients) through the leader, then through a standby, `--rounds`
  times (the order alternating), to a queue that never runs, so that nothing else loads the
  servers: submissions per second, median per server, and the standby's over the leader's.
- `standby_cost`: what each server costs the database while nothing happens, each server
  connecting as a role of its own: statements per second and transactions per second of the
  leader alone, then of the leader and of a standby started next to it, over `--idle-seconds`
  each, from pg_stat_statements (per role: every statement's `calls`, transactions as the
  calls of COMMIT and ROLLBACK) and, for the whole database, pg_stat_database's `xact_commit
  + xact_rollback` (the standby's: the difference between the two windows).

A throwaway PostgreSQL is started for the run as the tests start theirs (tests/pg.py), with
pg_stat_statements loaded; the servers are real processes (tests/server/serverproc.py).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # pg.py: a throwaway PostgreSQL
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "server"))  # serverproc.py
sys.path.insert(0, str(Path(__file__).resolve().parent))  # server.py: its Python clients

from pg import FAST_SETTINGS, PostgresServer, find_bin_dir, start_server, stop_server
from server import POLICY as SERVER_POLICY
from server import _python_clients
from serverproc import Server, health, kill_jobs_of, leading, wait_for

GPUS = 5
POLICY = SERVER_POLICY.replace(
    "    - {name: team}\n", "    - {name: work}\n    - {name: team, nominal: {gpu: 0}, borrowing_limit: {gpu: 0}}\n"
)
"""bench/server.py's policy with two queues: `work` runs the jobs that ignore SIGTERM; `team`
never runs, so the submissions measured (bench/server.py's clients submit there) wait and cost
the leader no launch."""

STUBBORN = ["bash", "-c", "trap '' TERM; sleep 3600"]
DEADLINES = (-0.3, 0.5, 1.5, 2.5, 3.5)
"""Where the SIGKILL deadlines of the cancelled jobs fall, in seconds from the kill."""
CANCEL_BEFORE_S = 1.5
"""The jobs are cancelled this long before the kill (each grace: this plus its offset)."""


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least `q` of them at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summary(values: list[float], digits: int = 3) -> dict[str, Any]:
    if not values:
        return {"count": 0}
    return {
        "count": len(values),
        "median": round(statistics.median(values), digits),
        "p99": round(percentile(values, 0.99), digits),
        "max": round(max(values), digits),
    }


def running(server: Server) -> bool:
    return server.proc is not None and server.proc.poll() is None


def _database(pg: PostgresServer, name: str) -> str:
    pg.create_database(name)
    return pg.url(name)


def _start(root: Path, name: str, url: str, user: str | None = None) -> Server:
    """A server with a state directory of its own under `root` (jobs run as other uids when
    the bench runs as root: the directory must let them pass), connecting as `user`."""
    root.chmod(0o755)
    policy = root / "policy.yaml"
    policy.write_text(POLICY)
    if user is not None:
        url = url.replace("postgres@", f"{user}@")
    return Server(root / name, policy=policy, gpus=GPUS, db=url).start()


def _servers(root: Path, url: str, names: str) -> list[Server]:
    """Servers on one database started in turn: the first leads."""
    servers = [_start(root, names[0], url)]
    wait_for(lambda: leading(servers), 30, "the first server to lead")
    return servers + [_start(root, name, url) for name in names[1:]]


def _stop(servers: list[Server]) -> None:
    for server in servers:
        server.stop()
    for server in servers:
        kill_jobs_of(server.state_dir)


def takeover(pg: PostgresServer, kills: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    took: list[float] = []
    lateness: dict[str, list[float]] = {"before": [], "inside": [], "after": []}
    with tempfile.TemporaryDirectory() as d:
        servers = _servers(Path(d), _database(pg, "takeover"), "abc")
        restarts: list[threading.Thread] = []
        try:
            found = wait_for(lambda: leading(servers), 30, "a leader")
            for _ in range(kills):
                leader, epoch = found
                wait_for(
                    lambda leader=leader: any(health(s).get("role") == "standby" for s in servers if s is not leader),
                    120,
                    "a standby",
                    interval=0.1,
                )
                with leader.client() as c:
                    jobs = [
                        c.post(
                            "/v1/jobs",
                            json={
                                "queue": "work",
                                "tier": 3,
                                "gpus": 1,
                                "grace": f"{CANCEL_BEFORE_S + offset:g}s",
                                "command": STUBBORN,
                                "workdir": "/",
                            },
                        ).json()["id"]
                        for offset in DEADLINES
                    ]
                    wait_for(
                        lambda c=c, jobs=jobs: all(c.get(f"/v1/jobs/{j}").json()["state"] == "RUNNING" for j in jobs),
                        60,
                        "the jobs to run",
                    )
                    time.sleep(rng.uniform(0.0, 1.0))  # a varied moment of the leader's loop
                    for job in jobs:
                        c.post(f"/v1/jobs/{job}/cancel")
                time.sleep(CANCEL_BEFORE_S)
                leader.kill9()
                killed, killed_wall = time.monotonic(), time.time()
                others = [s for s in servers if s is not leader and running(s)]
                found = wait_for(
                    lambda others=others, epoch=epoch: leading(others, epoch), 30, "another leader", interval=0.05
                )
                took.append(time.monotonic() - killed)
                first_pass_wall = time.time()
                restarts.append(threading.Thread(target=leader.start))
                restarts[-1].start()
                with found[0].client() as c:
                    for job in jobs:
                        a = wait_for(
                            lambda c=c, job=job: (
                                (x := c.get(f"/v1/jobs/{job}").json())["state"] == "CANCELLED" and x["attempts"][0]
                            ),
                            60,
                            f"job {job} to end",
                        )
                        where = (
                            "before"
                            if a["kill_at"] < killed_wall
                            else "inside"
                            if a["kill_at"] <= first_pass_wall
                            else "after"
                        )
                        lateness[where].append(a["ended_at"] - a["kill_at"])
            for t in restarts:
                t.join(120)
        finally:
            _stop(servers)
    everything = [x for values in lateness.values() for x in values]
    return {
        "kills": kills,
        "servers": 3,
        "takeover_s": summary(took, 2),
        "takeover_s_all": [round(x, 2) for x in took],
        "sigkill_lateness_s": {
            "all": summary(everything),
            **{where: summary(values) for where, values in lateness.items()},
        },
    }


def submissions(pg: PostgresServer, n: int, clients: int, rounds: int) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"leader": [], "standby": []}
    with tempfile.TemporaryDirectory() as d:
        servers = _servers(Path(d), _database(pg, "submissions"), "ab")
        try:
            for round_ in range(rounds):
                order = ("leader", "standby") if round_ % 2 == 0 else ("standby", "leader")
                for role in order:
                    server = servers[0] if role == "leader" else servers[1]
                    result = _python_clients(server, d, n, clients)
                    if result["errors"]:
                        raise RuntimeError(f"{result['errors']} submissions through the {role} were refused")
                    rates[role].append(result["submit_per_s"])
            assert health(servers[0]).get("role") == "leader" and health(servers[1]).get("role") == "standby"
        finally:
            _stop(servers)
    leader, standby = statistics.median(rates["leader"]), statistics.median(rates["standby"])
    return {
        "load_generator": f"{clients} Python threads, {n} submissions each time",
        "rounds": rounds,
        "leader_per_s": round(leader, 1),
        "standby_per_s": round(standby, 1),
        "standby_over_leader": round(standby / leader, 2),
        "leader_per_s_all": rates["leader"],
        "standby_per_s_all": rates["standby"],
    }


def _counts(pg: PostgresServer, database: str) -> dict[str, Any]:
    """pg_stat_statements' calls per role (transactions: COMMIT and ROLLBACK), and the
    database's committed and rolled back transactions."""
    import psycopg

    with psycopg.connect(host="127.0.0.1", port=pg.port, user="postgres", dbname=database, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT r.rolname, s.query, s.calls FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid "
            "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s",
            (database,),
        ).fetchall()
        conn.execute("SELECT pg_stat_clear_snapshot()")
        (xacts,) = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", (database,)
        ).fetchone() or (0,)
    by_role: dict[str, dict[str, int]] = {}
    for role, query, calls in rows:
        by_role.setdefault(role, {})[query] = int(calls)
    return {"statements": by_role, "xacts": int(xacts)}


def _rates(before: dict[str, Any], after: dict[str, Any], role: str, seconds: float) -> dict[str, Any]:
    was, now = before["statements"].get(role, {}), after["statements"].get(role, {})
    calls = {q: now[q] - was.get(q, 0) for q in now if now[q] - was.get(q, 0) > 0}
    ends = sum(n for q, n in calls.items() if q.strip().upper() in ("COMMIT", "ROLLBACK"))
    top = sorted(calls.items(), key=lambda kv: -kv[1])[:6]
    return {
        "statements_per_s": round(sum(calls.values()) / seconds, 1),
        "transactions_per_s": round(ends / seconds, 1),
        "top_statements_per_s": {" ".join(q.split())[:90]: round(n / seconds, 1) for q, n in top},
    }


def standby_cost(pg: PostgresServer, seconds: float) -> dict[str, Any]:
    database = "idle"
    roles = ("warden_leader", "warden_standby")
    for role in roles:
        pg.execute(f"CREATE ROLE {role} LOGIN SUPERUSER")
    with tempfile.TemporaryDirectory() as d:
        url = _database(pg, database)
        servers = [_start(Path(d), "a", url, roles[0])]
        wait_for(lambda: leading(servers), 30, "the first server to lead")
        try:
            pg.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements", database)
            time.sleep(2.0)  # past the start's own work
            t0, before = time.monotonic(), _counts(pg, database)
            time.sleep(seconds)
            alone_s, alone = time.monotonic() - t0, _counts(pg, database)
            servers.append(_start(Path(d), "b", url, roles[1]))
            time.sleep(2.0)
            t1, start = time.monotonic(), _counts(pg, database)
            time.sleep(seconds)
            both_s, both = time.monotonic() - t1, _counts(pg, database)
            assert health(servers[1]).get("role") == "standby"
        finally:
            _stop(servers)
    leader_alone = _rates(before, alone, roles[0], alone_s)
    leader_next = _rates(start, both, roles[0], both_s)
    standby = _rates(start, both, roles[1], both_s)
    db_alone = (alone["xacts"] - before["xacts"]) / alone_s
    db_both = (both["xacts"] - start["xacts"]) / both_s
    return {
        "idle_seconds": seconds,
        "source": "pg_stat_statements per role (calls; transactions = COMMIT + ROLLBACK calls); "
        "pg_stat_database xact_commit + xact_rollback for the database",
        "leader_alone": leader_alone,
        "leader_with_a_standby": leader_next,
        "standby": standby,
        "database_xacts_per_s": {
            "leader_alone": round(db_alone, 1),
            "leader_and_standby": round(db_both, 1),
            "standby": round(db_both - db_alone, 1),
        },
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--submissions", type=int, default=500)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--idle-seconds", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=33)
    p.add_argument("--only", default="takeover,submissions,standby_cost")
    args = p.parse_args(argv)
    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise SystemExit("PostgreSQL's server binaries are needed: apt-get install postgresql")
    pg = start_server(bin_dir, FAST_SETTINGS + " -c shared_preload_libraries=pg_stat_statements")
    sections = {
        "takeover": lambda: takeover(pg, args.kills, args.seed),
        "submissions": lambda: submissions(pg, args.submissions, args.clients, args.rounds),
        "standby_cost": lambda: standby_cost(pg, args.idle_seconds),
    }
    result: dict[str, Any] = {}
    try:
        for name in args.only.split(","):
            try:
                result[name] = sections[name]()
            except Exception as err:  # one failed section must not hide the others' figures
                result[name] = {"error": repr(err)}
    finally:
        stop_server(pg)
    result["python"] = sys.version.split()[0]
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
