"""Several warden servers on one PostgreSQL database, as real processes (docs/control-plane.md,
"Several servers"): `Cluster` starts servers, each with a state directory of its own, and
submits jobs that record their starts and SIGTERMs; `health` and `role` read a server's
`/v1/health`. Import the `cluster` fixture with the `pg` fixtures it needs:

    from pg import fresh_postgres_url, postgres_server  # noqa: F401  (fixtures)
    from clusterproc import Cluster, cluster  # noqa: F401  (cluster: a fixture)
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from serverproc import Server, free_port, health, kill_jobs_of, submit

POLICY = """\
min_grace: 2s
thrash: {min_efficiency: 0}
preemption: {restart_overhead: 0s, checkpoint_overhead: 0s}
tiers:
  3: {name: experimentation, lease: 1s, grace: 2s}
queues:
  name: cluster
  children:
    - {name: team, nominal: {gpu: 2}}
"""

# Records its SIGTERM and exits 0; records each start (with its attempt) first.
SLEEPER = """\
import os, signal, sys, time
out = sys.argv[1]
def stop(*_):
    with open(out + ".sigterm", "a") as f:
        f.write(f"{time.time()}\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
with open(out + ".started", "a") as f:
    f.write(f"{os.environ['WARDEN_ATTEMPT']} {os.getpid()}\\n")
while True:
    time.sleep(0.05)
"""


def role(server: Server) -> str | None:
    return health(server).get("role")


class Cluster:
    """Servers on one database, each with its own state directory under `root`, each with
    `gpus` fake GPUs and the policy `policy`."""

    def __init__(self, root: Path, db: str, policy: str = POLICY, gpus: int = 2) -> None:
        self.root = root
        self.db = db
        self.gpus = gpus
        self.policy = root / "policy.yaml"
        self.policy.write_text(policy)
        self.script = root / "sleeper.py"
        self.script.write_text(SLEEPER)
        self.marks = root / "marks"
        self.marks.mkdir(mode=0o777)
        self.marks.chmod(0o777)  # jobs run as nobody under root
        self.servers: list[Server] = []

    def start(self, name: str, *args: str, port: int | None = None, timeout: float = 30) -> Server:
        """Start server `name` (on `port`, else a free one; waiting for it at most `timeout`);
        `args` are more options of `warden server`."""
        server = Server(
            self.root / name, policy=self.policy, gpus=self.gpus, db=self.db, args=args, port=port or free_port()
        )
        server.start(timeout)
        self.servers.append(server)
        return server

    def start_together(self, names: list[str], timeout: float = 60) -> list[Server]:
        """A server for each name, their processes started at the same instant (one thread
        each, released together), each then waited for; in the order of `names`."""
        gate = threading.Barrier(len(names))
        started: dict[str, Server] = {}
        failed: list[str] = []

        def start(name: str) -> None:
            gate.wait()
            try:
                started[name] = self.start(name, timeout=timeout)
            except Exception as err:
                failed.append(f"{name}: {err}")

        threads = [threading.Thread(target=start, args=(name,)) for name in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failed, failed
        return [started[name] for name in names]

    def job(self, c: httpx.Client, name: str) -> str:
        return submit(
            c,
            queue="team",
            tier=3,
            gpus=1,
            name=name,
            command=[sys.executable, str(self.script), str(self.marks / name)],
        )

    def submitted(self, c: httpx.Client, name: str, queue: str) -> str | None:
        """The id of a job submitted to `queue`, or None while the server refuses that queue."""
        r = c.post(
            "/v1/jobs",
            json={
                "queue": queue,
                "tier": 3,
                "gpus": 1,
                "name": name,
                "workdir": os.getcwd(),
                "command": [sys.executable, str(self.script), str(self.marks / name)],
            },
        )
        if r.status_code == 422 and r.json()["error"]["field"] == "queue":
            return None
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def started(self, name: str) -> list[str]:
        path = self.marks / f"{name}.started"
        return path.read_text().splitlines() if path.exists() else []

    def cleanup(self) -> None:
        for server in self.servers:
            if server.proc is not None and server.proc.poll() is None:
                server.proc.send_signal(signal.SIGCONT)
                server.stop()
        for server in self.servers:
            kill_jobs_of(server.state_dir)


@pytest.fixture
def cluster(tmp_path: Path, fresh_postgres_url: str) -> Iterator[Cluster]:
    made = Cluster(tmp_path, fresh_postgres_url)
    try:
        yield made
    finally:
        made.cleanup()
