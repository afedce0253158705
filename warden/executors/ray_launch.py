"""What runs on a Ray node for warden: the launcher actor of one replica.

The `ray` executor reserves an admitted gang as one placement group (a bundle per replica,
each pinned to the node warden placed it on) and creates one `Launcher` actor in each bundle,
detached and named `warden.<job>.<attempt>.<rank>` in the `warden` namespace, so that it
outlives the server that created it. The launcher runs its replica exactly as the local
executor does: under the shim (`warden.executors.shim`), detached, in a process group of its
own, with the environment of DESIGN §6 that the server built. The shim writes
`rank-N.status.json` once the job runs and `rank-N.exit.json` once its last process is gone.

The launcher is the job's owner: the shim kills the whole group when the launcher's process is
gone (the node's raylet died, the actor was killed, the group removed), because Ray has then
given the reservation back. Ray kills only an actor's direct children, which the detached shim
is not, so nothing else would.

Signals go through `signal`: a SIGTERM that comes before the job started is kept, and the
job is signalled the moment it has a process group (a preemption never misses a rank that
was still starting). The actor is threaded, so a `signal` never waits behind a `start`.

Only the standard library and the shim are imported at the top: `ray` is there when this runs
as an actor, and the executor makes the class one.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from warden.executors.records import SUPERVISOR_LOST, write_json_atomic
from warden.executors.shim import process_alive, read_json, start_ticks

NAMESPACE = "warden"
START_TIMEOUT_S = 60.0
"""How long a launcher waits for its shim to report the job running."""
SHIM_WATCH_S = 1.0
"""How often a launcher looks whether its shim is still there."""
SHIM_GONE_SETTLE_S = 0.5


def free_port() -> int:
    """A TCP port nobody on this node listens on now: rank 0's launcher picks the gang's."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


class Launcher:
    """One replica of one attempt, on the node of its bundle."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pgid: int | None = None
        self._signal: int | None = None  # the strongest signal asked for so far

    def free_port(self) -> int:
        return free_port()

    def start(self, launch: dict[str, Any], master_port: int | None, extra: dict[str, Any]) -> dict[str, Any]:
        """Run the replica under a detached shim that dies with this actor; returns the shim's
        status record once the job runs (or why it could not start)."""
        with self._lock:
            stopped = self._signal
        if stopped is not None:  # preempted before it started: nothing runs, the exit says so
            error = f"signal {stopped} came before the job started"
            write_json_atomic(Path(launch["exit"]), {"exit_code": -stopped, "ended_at": time.time(), "error": error})
            return {"pgid": None, "error": error}
        launch = dict(launch)
        launch["env"] = dict(launch["env"])
        if master_port is not None:
            launch["env"]["MASTER_PORT"] = str(master_port)
        ray_gpus = _ray_gpus()
        gpus = bound_gpus(ray_gpus, launch["env"].get("CUDA_VISIBLE_DEVICES", ""))
        if gpus is not None:
            launch["env"]["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
        me = os.getpid()
        launch["owner"] = {"pid": me, "ticks": start_ticks(me)}
        launch["extra_status"] = {
            **launch.get("extra_status", {}),
            **extra,
            "launcher_pid": me,
            "ray_gpus": ray_gpus,
        }
        status = self._spawn(launch)
        with self._lock:
            self._pgid = status.get("pgid")
            late = self._signal
        if late is not None and self._pgid is not None:
            _deliver(self._pgid, late)
        threading.Thread(target=self._watch, args=(status, Path(launch["exit"])), daemon=True).start()
        return {**status, "gpus": None if gpus is None else list(gpus)}

    def _watch(self, status: dict[str, Any], exit_path: Path) -> None:
        """Outlive the shim: it runs as the job's account, which can kill it. Once it is gone
        without an exit record, SIGKILL what is left of the job's group and write the record
        the shim did not (`SUPERVISOR_LOST`), so that the attempt ends, and ends as evicted."""
        shim, ticks, pgid = status.get("shim_pid"), status.get("shim_start_ticks"), status.get("pgid")
        if not isinstance(shim, int):
            return
        while not exit_path.exists():
            if not process_alive(shim, ticks):
                time.sleep(SHIM_GONE_SETTLE_S)  # an exit record written just before it exited
                if exit_path.exists():
                    return
                if isinstance(pgid, int):
                    _killpg(pgid, signal.SIGKILL)
                record = {
                    "exit_code": None,
                    "ended_at": time.time(),
                    "error": f"its supervisor (pid {shim}) ended without an exit record",
                    SUPERVISOR_LOST: True,
                }
                write_json_atomic(exit_path, record)
                return
            time.sleep(SHIM_WATCH_S)

    def _spawn(self, launch: dict[str, Any]) -> dict[str, Any]:
        fd = os.open(str(launch["log"]), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with open(fd, "ab") as log:
            shim = subprocess.Popen(
                [sys.executable, "-m", "warden.executors.shim"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=log,
                cwd="/",
                env=shim_environment(os.environ),
                start_new_session=True,
                close_fds=True,
            )
        assert shim.stdin is not None
        try:
            shim.stdin.write(json.dumps(launch).encode())
            shim.stdin.close()
        except BrokenPipeError:
            pass
        try:
            code = shim.wait(timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _killpg(shim.pid, signal.SIGKILL)
            shim.wait()
            code = None
        status = read_json(Path(launch["status"]))
        if code != 0 or status is None:
            raise RuntimeError(
                f"the shim for {launch['log']} failed ({'timed out' if code is None else f'exit {code}'})"
            )
        return status

    def signal(self, signum: int) -> bool:
        """Signal the replica's process group (now, or the moment it has one); True when a
        group got it. SIGKILL is never downgraded by a later SIGTERM."""
        with self._lock:
            if self._signal != signal.SIGKILL:
                self._signal = signum
            pgid = self._pgid
        return pgid is not None and _deliver(pgid, signum)

    def ping(self) -> int:
        return os.getpid()


def shim_environment(worker_env: Mapping[str, str]) -> dict[str, str]:
    """The shim's environment: the Ray worker's, without Ray's own variables (the cluster's
    token, RAY_AUTH_TOKEN or its file, among them). The job gets none of it either way: its
    environment is the one the server built."""
    return {k: v for k, v in worker_env.items() if not k.startswith("RAY_")}


def bound_gpus(ray_gpus: list[str], planned: str) -> tuple[int, ...] | None:
    """The GPU indices Ray reserved for this replica, where they are what the replica must run
    on: as many as warden placed it on (`planned`, its CUDA_VISIBLE_DEVICES), each a number.
    Ray picks the indices of a bundle itself, whatever warden planned: the replica runs on
    Ray's, and the server records them (`RayExecutor.devices`). None: Ray named none of the
    right count (not inside a Ray worker, or ids that are not indices), and the plan stands."""
    want = len([g for g in planned.split(",") if g.strip()])
    if not want or len(ray_gpus) != want or not all(g.isdigit() for g in ray_gpus):
        return None
    return tuple(sorted(int(g) for g in ray_gpus))


def _ray_gpus() -> list[str]:
    """The GPU ids Ray assigned to this actor's bundle."""
    try:
        import ray

        return [str(g) for g in ray.get_gpu_ids()]
    except Exception:  # not inside a Ray worker
        return []


def _deliver(pgid: int, signum: int) -> bool:
    """Signal the replica's process group; SIGTERM with SIGCONT after it, since a stopped
    process handles SIGTERM only once it runs again."""
    sent = _killpg(pgid, signum)
    if sent and signum == signal.SIGTERM:
        _killpg(pgid, signal.SIGCONT)
    return sent


def _killpg(pgid: int, signum: int) -> bool:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    return True
