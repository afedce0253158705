"""The `local` executor: runs each attempt as process groups on this machine.

Every replica runs under its own shim (`warden.executors.shim`), started detached in a new
session: the shim is the job's parent, so the job and its exit status outlive the server, even a
server killed with SIGKILL. The job runs in a process group of its own (a new session), which is
what warden signals: SIGTERM to every replica's group in one loop, then SIGKILL to every group
from a single timer thread at the deadline, never earlier. An attempt is reported as exited only
when the shims of all its replicas have written their exit files, i.e. when no process of any of
its groups is left, because only then may its GPUs be given to someone else. Where this
machine gives the server a cgroup hierarchy, each replica runs in a cgroup of its own, with
bounds of its own (`warden.executors.cgroups`), and is killed as a whole at its end.

Files per attempt, all under `LaunchSpec.log_dir`:
`rank-N.log` (the replica's stdout and stderr), `rank-N.status.json` (written by the shim once
the job runs), `rank-N.exit.json` (written by the shim once the group is gone),
`rank-N.seen.json` (what the shim saw meanwhile: a stop, the time limit it kept) and
`control.json` (written here on terminate/kill, so that an adopter re-arms the SIGKILL timer).
The job runs as the identity `Identities` picks (a uid of its own when the server is root); its
checkpoint directory and `home/` are its own while it runs, everything else stays the server's.
See docs/executors.md and docs/security.md.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warden import paths
from warden.executors import cgroups
from warden.executors.base import (
    OPEN_FILES_HARD,
    Exit,
    Handle,
    LaunchError,
    LaunchSpec,
    ReplicaHandle,
    ReplicaLaunch,
)
from warden.executors.deadlines import KillTimer, adopted_deadline, deadline_pair, due
from warden.executors.identity import Identities, Identity
from warden.executors.outside import (
    STOP_RECORDS_ENV,
    SUPERVISOR_LOST,
    TERMINATING,
    ended_outside,
    kept_time_limit,
    seen,
    seen_path,
    stop_records,
)
from warden.executors.records import (
    CONTROL_FILE,
    CONTROL_MODE,
    finite_time,
    record_killed_at,
    revoke_launch,
    write_json_atomic,
)
from warden.executors.shim import REFUSED, group_alive, process_alive, read_json, refusal, start_ticks
from warden.executors.tracking import AttemptTable

Key = tuple[str, int]

#: Inherited variables that would mislead a job: GPU visibility and the gang rendezvous are
#: warden's to set, and `WARDEN_*` belongs to the contract (DESIGN §6).
INHERITED_DROPPED = frozenset(
    {"CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"}
)
#: What a job inherits of the server's own environment (when no `base_env` is given): where
#: programs and libraries are, the locale and the NCCL/CUDA setup of the machine. Nothing else:
#: the server's environment may hold its secrets (WARDEN_BOOTSTRAP_TOKEN, PGPASSWORD, ...).
INHERITED_NAMES = frozenset(
    {"PATH", "LANG", "LANGUAGE", "TZ", "TERM", "PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "CUDA_HOME"}
)
INHERITED_PREFIXES = ("LC_", "NCCL_")
#: Of the server's environment, what the shim (which runs as the server) may see.
_SHIM_SECRETS = ("WARDEN_", "PGPASSWORD")
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def inherited_environment(server_env: Mapping[str, str]) -> dict[str, str]:
    """The part of the server's environment a job gets by default (INHERITED_NAMES)."""
    return {k: v for k, v in server_env.items() if k in INHERITED_NAMES or k.startswith(INHERITED_PREFIXES)}


def identity_environment(identity: Identity | None, home: Path) -> dict[str, str]:
    """HOME, USER and LOGNAME of the identity the job runs as (none for the server's own). A
    dynamic uid has no account: its HOME is the attempt's private `home`, and USER names the uid
    (libraries that ask for the user name would fail without one)."""
    if identity is None:
        return {}
    name = identity.name or f"warden-{identity.uid}"
    return {"HOME": identity.home or str(home), "USER": name, "LOGNAME": name}


def job_environment(
    spec: LaunchSpec,
    replica: ReplicaLaunch,
    *,
    master_port: int | None,
    log_path: Path,
    base: Mapping[str, str],
    identity: Mapping[str, str] | None = None,
    master_addr: str = "127.0.0.1",
) -> dict[str, str]:
    """The environment of one replica: `base` without GPU, rendezvous and WARDEN_* variables,
    then `identity` (HOME, USER), then the submission's `env`, then warden's contract
    variables, which nothing overrides (a job must not widen its own CUDA_VISIBLE_DEVICES)."""
    env = {k: v for k, v in base.items() if k not in INHERITED_DROPPED and not k.startswith("WARDEN_")}
    env.update(identity or {})
    env.update(spec.env)
    env.update(
        {
            "WARDEN_JOB_ID": spec.job_id,
            "WARDEN_ATTEMPT": str(spec.attempt),
            "WARDEN_GRACE_SECONDS": _seconds(spec.grace_s),
            "WARDEN_CHECKPOINT_DIR": str(spec.checkpoint_dir),
            "WARDEN_LOG_FILE": str(log_path),
            STOP_RECORDS_ENV: stop_records(spec.log_dir / CONTROL_FILE, seen_path(log_path.parent, replica.rank)),
            "WARDEN_NODE": replica.node,
            "CUDA_VISIBLE_DEVICES": ",".join(str(gpu) for gpu in replica.gpus),
        }
    )
    if spec.world_size > 1:
        env.update(
            {
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port),
                "RANK": str(replica.rank),
                "WORLD_SIZE": str(spec.world_size),
                "LOCAL_RANK": str(replica.local_rank),
            }
        )
    else:
        for name in INHERITED_DROPPED - {"CUDA_VISIBLE_DEVICES"}:
            env.pop(name, None)  # the submission's env may not fake a gang either
    return env


def log_paths(handle: Handle) -> tuple[Path, ...]:
    """The log file of every replica, by rank."""
    return tuple(replica.log_path for replica in handle.replicas)


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


@dataclass(slots=True)
class _Tracked:
    """What this executor knows of one attempt besides its handle (mutable, under the lock)."""

    handle: Handle
    shim_ticks: tuple[int | None, ...]
    signalled_at: float | None = None
    kill_at: float | None = None  # wall clock deadline, as returned by terminate()
    kill_mono: float | None = None  # the same deadline on the monotonic clock
    killed_at: float | None = None
    terminating_at: float | None = None  # when warden decided to SIGTERM it (recorded before it did)
    private_dirs: tuple[Path, ...] = ()  # the job's own while it runs; the server's again after


class LocalExecutor(AttemptTable[_Tracked]):
    """Runs attempts as process groups on this machine (Linux). Thread-safe.

    `base_env` is the environment jobs inherit (default: INHERITED_NAMES of this process's,
    read at each start); `identities` picks the Unix identity of each attempt (default: a uid of
    its own when this process is root, else this process's); `python` runs the shim;
    `start_timeout_s` bounds how long `start` waits for every shim to report its job running.
    `cgroup_parent` is where each replica's cgroup goes, under this process's own cgroup (a
    name of this server's; None: no cgroups); `gpu_nodes` lists the GPU device nodes of this
    machine by index (default: `/dev/nvidiaN`), those a replica was not given are denied to it.
    `time_limit_slack_s`: how long after an attempt's time limit its shims send SIGTERM
    themselves when no server did (default: the shim's `TIME_LIMIT_SLACK_S`)."""

    def __init__(
        self,
        *,
        base_env: Mapping[str, str] | None = None,
        identities: Identities | None = None,
        python: str = sys.executable,
        start_timeout_s: float = 30.0,
        cgroup_parent: str | None = "warden/local",
        gpu_nodes: Callable[[], Mapping[int, tuple[str, int, int]]] = cgroups.gpu_device_nodes,
        time_limit_slack_s: float | None = None,
    ) -> None:
        self._base_env = base_env
        self._time_limit_slack_s = time_limit_slack_s
        self.cgroup_parent = cgroup_parent or ""
        found = cgroups.find_layout(cgroup_parent) if cgroup_parent else "no cgroup parent was given"
        self.layout: cgroups.Layout | None = found if isinstance(found, cgroups.Layout) else None
        """Where each replica's cgroup goes; None: jobs run without one (`uncontained` says why)."""
        self.uncontained: str | None = found if isinstance(found, str) else None
        self._gpu_nodes = gpu_nodes
        self.identities = identities if identities is not None else Identities.default()
        self._python = python
        self._start_timeout_s = start_timeout_s
        super().__init__()
        self._control_lock = threading.Lock()  # orders control.json writes; taken before _lock
        self._terminating = threading.Lock()  # one terminate at a time: its mark, then its SIGTERM, once
        self._started: list[Key] = []
        self._unreaped: dict[int, int | None] = {}  # shim pid -> start ticks
        self._timer = KillTimer(self._deadlines_reached)

    def containment(self) -> str:
        """How this executor contains its jobs, in one line (the server says it at start)."""
        if self.layout is None:
            return (
                f"no cgroups ({self.uncontained}): a job's processes, memory and GPU device nodes are not "
                "bounded, and a process that leaves its process group is found only among its "
                "supervisor's orphans"
            )
        unenforced = self.layout.unenforced
        return f"each replica in a cgroup of its own, in {self.cgroup_parent}/ under: {self.layout.describe()}" + (
            "; not bounded: " + "; ".join(unenforced) if unenforced else ""
        )

    # -- start -----------------------------------------------------------------------------

    def start(self, spec: LaunchSpec) -> Handle:
        """Start every replica under its shim; returns once each job process exists (or failed
        to exec, which `exits()` then reports with exit code 127/126). Raises ValueError for a
        malformed spec, LaunchError (an OSError) when the workdir is missing or a shim fails
        (the rest of the gang is killed)."""
        key = self._begin_start(spec)
        try:
            identity = self.identities.acquire(key, spec.user)
            try:
                others = {uid for held, uid in self.identities.pool.held().items() if held != key}
                private = _prepare_dirs(spec, identity, others)
                handle = self._launch(spec, identity)
            except BaseException:
                _reclaim_dirs(_private_dirs(spec, identity))
                self.identities.release(key)  # a process of it still dying keeps the uid busy
                raise
            tracked = _Tracked(handle, tuple(_shim_ticks(r) for r in handle.replicas), private_dirs=private)
            with self._lock:
                self._tracked[key] = tracked
                self._started.append(key)
            return handle
        finally:
            self._end_start(key)

    def _launch(self, spec: LaunchSpec, identity: Identity | None) -> Handle:
        port = (spec.master_port or free_port()) if spec.world_size > 1 else None
        base = inherited_environment(os.environ) if self._base_env is None else dict(self._base_env)
        who = identity_environment(identity, spec.log_dir / "home")
        private = [str(p) for p in _private_dirs(spec, identity)]
        ordered = sorted(spec.replicas, key=lambda r: r.rank)
        replicas = [_replica_paths(spec.log_dir, r.rank) for r in ordered]
        launches: list[dict[str, Any]] = []
        control = spec.log_dir / CONTROL_FILE
        control.unlink(missing_ok=True)  # leftovers of an earlier start in the same directory
        nodes = self._gpu_nodes() if self.layout is not None else {}
        memory_mib = spec.bounds.memory_mib or spec.memory
        for replica, (log, status, exit_path) in zip(ordered, replicas):
            # A status file that exists is never removed: it is a revocation (`recover`) or an
            # earlier launch of this replica, and the shim refuses to start over it.
            env = job_environment(spec, replica, master_port=port, log_path=log, base=base, identity=who)
            if not status.exists():
                seen_path(spec.log_dir, replica.rank).unlink(missing_ok=True)  # an earlier start's
            launch: dict[str, Any] = {
                "argv": list(spec.command),
                "cwd": str(spec.workdir),
                "env": env,
                "log": str(log),
                "status": str(status),
                "exit": str(exit_path),
                "seen": str(seen_path(spec.log_dir, replica.rank)),
                "identity": _identity_record(identity),
                "private_dirs": private,
                "control": str(control),
                "grace_s": spec.grace_s,
                "time_limit_s": spec.time_limit_s,
                "time_limit_slack_s": self._time_limit_slack_s,
                "open_files": [spec.bounds.open_files, max(spec.bounds.open_files, OPEN_FILES_HARD)]
                if spec.bounds.open_files
                else None,
            }
            if self.layout is not None:
                launch["cgroup"] = {
                    "parent": self.cgroup_parent,
                    "name": cgroup_name(spec.job_id, spec.attempt, replica.rank, spec.log_dir),
                    "max_processes": spec.bounds.max_processes,
                    "memory_bytes": memory_mib << 20,
                    "deny_devices": [list(node) for index, node in sorted(nodes.items()) if index not in replica.gpus],
                }
            launches.append(launch)
        shims = [self._spawn_shim(launch) for launch in launches]
        failures = self._await_shims(shims, launches)
        handles = []
        for replica, (log, status, exit_path) in zip(ordered, replicas):
            record = read_json(status)
            if record is None or "shim_pid" not in record:
                continue  # not started, or its launch was revoked
            handles.append(
                ReplicaHandle(
                    rank=replica.rank,
                    shim_pid=int(record["shim_pid"]),
                    pgid=record.get("pgid"),
                    status_path=status,
                    exit_path=exit_path,
                    log_path=log,
                    uid=record.get("uid"),
                )
            )
        if failures:
            _signal_groups([h.pgid for h in handles], signal.SIGKILL)
            raise LaunchError(f"job {spec.job_id!r} attempt {spec.attempt}: " + "; ".join(failures))
        return Handle(spec.job_id, spec.attempt, tuple(handles), control_path=control)

    def _spawn_shim(self, launch: dict[str, Any]) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_SHIM_SECRETS)}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        fd = os.open(str(launch["log"]), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with open(fd, "ab") as log:
            return subprocess.Popen(
                [self._python, "-m", "warden.executors.shim"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=log,
                cwd="/",
                env=env,
                start_new_session=True,
                close_fds=True,
            )

    def _await_shims(self, shims: list[subprocess.Popen[bytes]], launches: list[dict[str, Any]]) -> list[str]:
        """Hand each shim its launch description, then wait until each has reported its job
        running (the first shim process exits 0 then). Returns what went wrong, per replica."""
        for shim, launch in zip(shims, launches):
            assert shim.stdin is not None
            try:
                shim.stdin.write(json.dumps(launch).encode())
                shim.stdin.close()
            except BrokenPipeError:
                pass
        deadline = time.monotonic() + self._start_timeout_s
        failures = []
        for shim, launch in zip(shims, launches):
            try:
                code = shim.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_groups([shim.pid], signal.SIGKILL)  # the first process and the forked shim
                shim.wait()
                code = None
            if code == REFUSED:
                failures.append(f"the launch of {launch['log']} was refused: {refusal(Path(launch['status']))}")
            elif code != 0:
                failures.append(f"shim for {launch['log']} failed ({'timed out' if code is None else f'exit {code}'})")
        return failures

    # -- signals ---------------------------------------------------------------------------

    def terminate(self, job_id: str, attempt: int, grace_s: float) -> float:
        """SIGTERM every replica's process group in one loop, and arm a single SIGKILL for all
        of them at the returned deadline (`time.time()` based). The deadline is taken after the
        last SIGTERM went out, so no group gets less than `grace_s`. Idempotent: a second call
        returns the first deadline and sends nothing; so does a call after the attempt's shims
        sent SIGTERM at its time limit (its deadline is theirs)."""
        if grace_s < 0:
            raise ValueError(f"grace_s must be >= 0, got {grace_s!r}")
        self._acting(f"SIGTERM attempt {attempt} of job {job_id}")
        with self._terminating:
            return self._terminate((job_id, attempt), grace_s)

    def _terminate(self, key: Key, grace_s: float) -> float:
        with self._lock:
            tracked = self._get(key)
            if tracked.kill_at is not None:
                return tracked.kill_at
            tracked.terminating_at = time.time()
        self._persist(tracked, durable=False)  # before the SIGTERM: the job can tell warden's from another's
        with self._lock:
            if tracked.kill_at is not None:  # a kill() came meanwhile
                return tracked.kill_at
            if kept := _shims_time_limit(tracked.handle):
                # its shims ran out its time limit first (the server's pass was late): their
                # SIGTERM stands, and so does their SIGKILL deadline
                tracked.signalled_at, tracked.kill_at = kept["signalled_at"], kept["kill_at"]
                tracked.kill_mono = time.monotonic() + (tracked.kill_at - time.time())
                self._timer.arm(tracked.kill_mono, key)
            else:
                groups = _live_groups(tracked.handle)
                sent = _signal_groups(groups, signal.SIGTERM)
                _signal_groups(groups, signal.SIGCONT)  # a stopped process handles SIGTERM once it runs
                tracked.kill_at, tracked.kill_mono = deadline_pair(grace_s)
                if sent:  # else every group was gone already: it ended by itself, no SIGTERM
                    tracked.signalled_at = tracked.kill_at - grace_s
                    self._timer.arm(tracked.kill_mono, key)
            deadline = tracked.kill_at
        self._persist(tracked)
        return deadline

    def kill(self, job_id: str, attempt: int) -> None:
        """SIGKILL every replica's process group now."""
        self._acting(f"SIGKILL attempt {attempt} of job {job_id}")
        key = (job_id, attempt)
        with self._lock:
            tracked = self._get(key)
            killed = self._kill_locked(tracked)
        if killed:
            self._persist(tracked)

    def _deadlines_reached(self, keys: list[Key]) -> None:
        """The timer's callback: SIGKILL every due attempt first, then record it on disk."""
        if self._fenced_deadlines(self._timer, keys):
            return
        killed = []
        with self._lock:
            for key in keys:
                tracked = self._tracked.get(key)
                if tracked is None or not due(self._timer, key, tracked.kill_at, tracked.kill_mono):
                    continue  # reported, re-armed later at adoption, or the wall clock not there yet
                if self._kill_locked(tracked):
                    killed.append(tracked)
        for tracked in killed:
            self._persist(tracked)

    def _kill_locked(self, tracked: _Tracked) -> bool:
        if tracked.killed_at is not None:
            return False
        if not _signal_groups(_live_groups(tracked.handle), signal.SIGKILL):
            return False
        tracked.killed_at = time.time()
        if tracked.kill_at is None:
            tracked.kill_at = tracked.killed_at
        return True

    def _persist(self, tracked: _Tracked, durable: bool = True) -> None:
        """Write the attempt's signal state to control.json for a future adopter. Outside the
        main lock (fsync is slow); the latest state is read under it, so writes never regress."""
        if tracked.handle.control_path is None:
            return
        with self._control_lock:
            with self._lock:
                record = {
                    "signalled_at": tracked.signalled_at,
                    "kill_at": tracked.kill_at,
                    "killed_at": tracked.killed_at,
                    TERMINATING: tracked.terminating_at,
                }
            write_json_atomic(tracked.handle.control_path, record, mode=CONTROL_MODE, durable=durable)

    # -- exits -----------------------------------------------------------------------------

    def started(self) -> list[Key]:
        """The attempts `start` returned since the last call: each had its processes then."""
        with self._lock:
            started, self._started = self._started, []
        return started

    def exits(self) -> list[Exit]:
        """Attempts whose every process is gone, each reported exactly once (then forgotten)."""
        with self._lock:
            candidates = list(self._tracked.items())
        done: list[tuple[Key, list[dict[str, Any]]]] = []
        for key, tracked in candidates:
            records = []
            for replica, ticks in zip(tracked.handle.replicas, tracked.shim_ticks):
                record = _replica_exit(replica, ticks, self._group_of)
                if record is None:
                    break
                records.append(record)
            else:
                done.append((key, records))
        reported = []
        with self._lock:
            for key, records in done:
                if key in self._tracked:
                    tracked = self._tracked.pop(key)
                    _reclaim_dirs(tracked.private_dirs)
                    self.identities.release(key)
                    reported.append(_exit(tracked, records))
                    self._unreaped.update(
                        (r.shim_pid, ticks)
                        for r, ticks in zip(tracked.handle.replicas, tracked.shim_ticks)
                        if r.shim_pid is not None
                    )
            self._reap_shims()
        return reported

    def _reap_shims(self) -> None:
        """Shims are re-parented to init, which reaps them. Where this process is init (the
        server as PID 1 of a container) or a subreaper, they are re-parented here instead and
        would stay zombies: reap exactly those, by pid, once they are done (never waitpid(-1),
        which would steal the exit status of the server's own subprocesses)."""
        for pid, ticks in list(self._unreaped.items()):
            if start_ticks(pid) != ticks:
                del self._unreaped[pid]  # gone, or the pid names someone else now
                continue
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue  # our child, still finishing: next call
            except ChildProcessError:
                pass  # not our child: init reaps it
            del self._unreaped[pid]

    def _group_of(self, replica: ReplicaHandle) -> cgroups.Group | None:
        """The replica's cgroup, as its shim recorded it, when it is one of this executor's."""
        record = read_json(replica.status_path) or {}
        return cgroups.Group.from_record(record.get("cgroup"), self.layout, self.cgroup_parent)

    def replica_exit_codes(self, job_id: str, attempt: int) -> tuple[int | None, ...]:
        """Per replica, its exit code if its group is already gone, else None. For a server's
        gang policy: a gang with a failed replica is not ended by the executor by itself."""
        with self._lock:
            tracked = self._get((job_id, attempt))
        return tuple(
            None if record is None else record.get("exit_code")
            for record in (read_json(r.exit_path) for r in tracked.handle.replicas)
        )

    # -- restart ---------------------------------------------------------------------------

    def adopt(self, handle: Handle, kill_at: float | None = None) -> None:
        """Track an attempt started by an earlier server process. Its terminate record (if
        any) is read back; the SIGKILL timer is re-armed at `kill_at`, else at the recorded
        deadline, and fires at once if that is past. Adopting a tracked attempt only re-arms."""
        key = (handle.job_id, handle.attempt)
        control = read_json(handle.control_path) if handle.control_path is not None else None
        control = control or {}
        status = [read_json(r.status_path) or {} for r in handle.replicas]
        if control.get("signalled_at") is None:  # no SIGTERM of a server: perhaps one of its shims'
            control = {**control, **_shims_time_limit(handle)}
        with self._lock:
            tracked = self._tracked.get(key)
            if tracked is None:
                tracked = _Tracked(
                    handle,
                    tuple(record.get("shim_start_ticks") for record in status),
                    signalled_at=control.get("signalled_at"),
                    kill_at=control.get("kill_at"),
                    killed_at=control.get("killed_at"),
                    private_dirs=tuple(Path(p) for p in (status[0].get("private_dirs") if status else None) or ()),
                )
                self._tracked[key] = tracked
                for replica, record in zip(handle.replicas, status):
                    self.identities.claim(key, replica.uid if replica.uid is not None else record.get("uid"))
            deadline = adopted_deadline(kill_at if kill_at is not None else tracked.kill_at)
            if deadline is not None and tracked.killed_at is None:
                tracked.kill_at = deadline
                tracked.kill_mono = time.monotonic() + (deadline - time.time())
                self._timer.arm(tracked.kill_mono, key)

    def recover(self, job_id: str, attempt: int, log_dir: Path, replicas: int) -> Handle | None:
        """Rebuild the handle of an attempt from the shims' status files in its `log_dir`.
        A replica whose shim has not claimed its launch is revoked first (`revoke_launch`), so
        it never starts, however late its launch arrives (a leader stalled while it launched);
        one whose shim claimed it is waited for until its job's process group is recorded
        (`CLAIM_WAIT_S`). None when no replica started, and then none ever will."""
        handles = []
        for rank in range(replicas):
            log, status, exit_path = _replica_paths(Path(log_dir), rank)
            record = _claimed_record(status, f"attempt {attempt} of job {job_id} was recovered unstarted")
            if record is None or "shim_pid" not in record:
                continue
            handles.append(
                ReplicaHandle(
                    rank=rank,
                    shim_pid=int(record["shim_pid"]),
                    pgid=record.get("pgid"),
                    status_path=status,
                    exit_path=exit_path,
                    log_path=log,
                    uid=record.get("uid"),
                )
            )
        if not handles:
            return None
        return Handle(job_id, attempt, tuple(handles), control_path=Path(log_dir) / CONTROL_FILE)

    def cancel_unowned(self, owned: Iterable[tuple[str, int]]) -> list[str]:
        """Nothing of this executor can run unowned: every attempt has its row (and log
        directory) before its first shim exists, so `recover` finds each one. Returns []."""
        return []

    def close(self) -> None:
        """Stop the timer thread. Jobs keep running; pending SIGKILLs are left to an adopter
        (they are recorded in each attempt's control.json). The cgroup parent is removed where
        no job's cgroup is left in it (a shim remakes it)."""
        with self._lock:
            self._closed = True
        self._timer.close()
        if self.layout is not None:
            cgroups.remove_parent(self.layout, self.cgroup_parent)


# -- helpers --------------------------------------------------------------------------------


def _identity_record(identity: Identity | None) -> dict[str, Any] | None:
    if identity is None:
        return None
    return {"uid": identity.uid, "gid": identity.gid, "groups": list(identity.groups)}


def _private_dirs(spec: LaunchSpec, identity: Identity | None) -> tuple[Path, ...]:
    """The directories a job with a dynamic uid owns only while it runs: its checkpoints and
    its HOME. Given back to the server at exit, so the next attempt that gets the same uid
    cannot reach them."""
    if identity is None or not identity.dynamic:
        return ()
    return (spec.checkpoint_dir, spec.log_dir / "home")


def _prepare_dirs(spec: LaunchSpec, identity: Identity | None, others: set[int]) -> tuple[Path, ...]:
    """Create the attempt's directories. Under another identity, the log directory stays the
    server's (0711: the job reaches its `home` through it, but cannot list it, nor replace the
    status and exit files the server trusts), and the checkpoint directory and `home` become
    the job's own (0700). `others` are the uids other attempts hold now. Returns the
    directories to give back to the server at exit."""
    make_dirs(spec.log_dir)
    make_dirs(spec.checkpoint_dir)
    if identity is None:
        return ()
    os.chmod(spec.log_dir, 0o711)
    owned = [spec.checkpoint_dir]
    if identity.dynamic:
        home = spec.log_dir / "home"
        home.mkdir(exist_ok=True)
        owned.append(home)
    for path in owned:
        _give(path, identity, others)
    return _private_dirs(spec, identity)


def make_dirs(path: Path) -> None:
    """`mkdir -p`, the directories it creates 0711 (not the umask's 0700): a job that runs as
    another uid must be able to pass through them to its own directories."""
    paths.make_dirs(path, 0o711)


def _give(directory: Path, identity: Identity, others: set[int]) -> None:
    """Make `directory` the job's: the directory itself, and whatever in it a previous attempt
    of the job left under its own job uid (a checkpoint persists across attempts, each with a
    uid of its own). Symbolic links are never followed, and files of any other owner are left
    alone (accounts, and the uids other attempts run as now), so a link or hard link planted
    there cannot hand the job someone else's file."""
    os.chown(directory, identity.uid, identity.gid, follow_symlinks=False)
    os.chmod(directory, 0o700)
    pool = _job_uid_owners(directory) - others
    for root, dirs, files in os.walk(directory):
        for name in (*dirs, *files):
            path = os.path.join(root, name)
            try:
                owner = os.lstat(path).st_uid
                if owner != identity.uid and owner in pool:
                    os.chown(path, identity.uid, identity.gid, follow_symlinks=False)
            except FileNotFoundError:
                continue


def _job_uid_owners(directory: Path) -> set[int]:
    """The owners in `directory` that are uids of no account: earlier job uids, which a new
    attempt of the same job may take over."""
    owners: set[int] = set()
    for root, dirs, files in os.walk(directory):
        for name in (*dirs, *files):
            try:
                owners.add(os.lstat(os.path.join(root, name)).st_uid)
            except FileNotFoundError:
                continue
    return {uid for uid in owners if uid != 0 and not _has_account(uid)}


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def _reclaim_dirs(dirs: Iterable[Path]) -> None:
    """The attempt is over: its private directories become the server's again (0700), so that
    nobody (a later job with the same uid included) can reach what is inside."""
    for directory in dirs:
        try:
            os.chown(directory, os.geteuid(), os.getegid(), follow_symlinks=False)
            os.chmod(directory, 0o700)  # its parent is the server's: the job cannot swap it for a link
        except FileNotFoundError:
            continue


CLAIM_WAIT_S = 5.0
"""How long `recover` waits for a shim that claimed its launch to record its job's process
group (a moment: it starts the job right after the claim), while that shim lives."""


def _claimed_record(status: Path, why: str) -> dict[str, Any] | None:
    """The status record of a replica whose launch its shim claimed, once it names the job's
    process group (or why the job could not start, or the shim is gone); None, and the launch
    revoked, when no shim had claimed it."""
    make_dirs(status.parent)  # where the launch has not got as far as its directory yet
    record = revoke_launch(status, why)
    deadline = time.monotonic() + CLAIM_WAIT_S
    while record is not None and "pgid" not in record and time.monotonic() < deadline:
        if not process_alive(int(record.get("shim_pid") or 0), record.get("shim_start_ticks")):
            break
        time.sleep(0.01)
        record = read_json(status) or record
    return record


def _replica_paths(log_dir: Path, rank: int) -> tuple[Path, Path, Path]:
    return (log_dir / f"rank-{rank}.log", log_dir / f"rank-{rank}.status.json", log_dir / f"rank-{rank}.exit.json")


def _shim_ticks(replica: ReplicaHandle) -> int | None:
    status = read_json(replica.status_path)
    return None if status is None else status.get("shim_start_ticks")


def _live_groups(handle: Handle) -> list[int]:
    """Process groups that may still hold processes. A group whose exit file exists is gone,
    and its id may already name someone else's group: it is never signalled."""
    return [r.pgid for r in handle.replicas if r.pgid is not None and not r.exit_path.exists()]


def _signal_groups(pgids: Iterable[int | None], sig: signal.Signals) -> int:
    """Send `sig` to every group in one loop (no I/O in between); returns how many got it."""
    sent = 0
    for pgid in pgids:
        if pgid is None:
            continue
        try:
            os.killpg(pgid, sig)
            sent += 1
        except ProcessLookupError:
            pass
    return sent


def _replica_exit(
    replica: ReplicaHandle,
    shim_ticks: int | None,
    group_of: Callable[[ReplicaHandle], cgroups.Group | None] | None = None,
) -> dict[str, Any] | None:
    """The replica's exit record, or None while any of its processes may live. A shim that
    died without writing one (killed by hand, OOM, reboot) is survived: once its group is gone
    too, whatever is left in its cgroup (`group_of`) is killed and, once that is empty too, an
    exit with an unknown status is recorded in its place."""
    record = read_json(replica.exit_path)
    if record is not None or (replica.shim_pid is not None and process_alive(replica.shim_pid, shim_ticks)):
        return record
    record = read_json(replica.exit_path)  # it may have written it just before exiting
    if record is not None:
        return record
    if replica.pgid is not None and group_alive(replica.pgid):
        return None
    group = None if group_of is None else group_of(replica)
    if group is not None:  # what its supervisor would have done: nothing of the job outlives it
        try:
            if cgroups.kill(group) or cgroups.procs(group):
                return None  # killed now; gone once their parents (or init) reaped them
        except OSError:
            pass
        cgroups.remove(group, wait_s=0)
    record = {
        "exit_code": None,
        "ended_at": time.time(),
        "error": f"supervisor (pid {replica.shim_pid}) is gone without an exit record",
        SUPERVISOR_LOST: True,
    }
    write_json_atomic(replica.exit_path, record)
    return record


def _exit(tracked: _Tracked, records: list[dict[str, Any]]) -> Exit:
    replicas = tracked.handle.replicas
    errors = [f"rank {r.rank}: {rec['error']}" for r, rec in zip(replicas, records) if rec.get("error")]
    now = time.time()
    # A time limit its shims kept while no server did: SIGTERM at it, SIGKILL after the grace.
    timed_out_at, limit_deadline = kept_time_limit(records, tracked.signalled_at, now)
    deadline = tracked.kill_at if timed_out_at is None else limit_deadline
    # The earliest SIGKILL at the deadline: the server's, or one the shims sent while no server could.
    kills = [k for k in (tracked.killed_at, *(record_killed_at(r, deadline, now) for r in records)) if k is not None]
    killed_at = min(kills, default=None)
    codes = tuple(_optional_int(rec.get("exit_code")) for rec in records)
    for replica, rec in zip(replicas, records):
        oom = rec.get("oom_kills")
        if isinstance(oom, int) and not isinstance(oom, bool) and oom > 0:
            errors.append(
                f"rank {replica.rank}: the kernel's OOM killer killed {oom} of its processes at its memory bound"
            )
    ended_by = None
    lost = [r.rank for r, rec in zip(replicas, records) if rec.get(SUPERVISOR_LOST) is True]
    if tracked.signalled_at is None and timed_out_at is None and killed_at is None and (lost or not errors):
        ended_by = ended_outside(replicas, codes, lost)
    return Exit(
        job_id=tracked.handle.job_id,
        attempt=tracked.handle.attempt,
        exit_codes=codes,
        ended_at=max(float(rec["ended_at"]) for rec in records),
        signalled_at=tracked.signalled_at if timed_out_at is None else timed_out_at,
        killed=killed_at is not None,
        killed_at=killed_at,
        error="; ".join(errors) or None,
        ended_by=ended_by,
        timed_out_at=timed_out_at,
    )


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def cgroup_name(job_id: str, attempt: int, rank: int, log_dir: Path) -> str:
    """The name of a replica's cgroup: `<job>-<attempt>-<rank>-<an id of the attempt's
    directory>` (two executors sharing a parent, each with its own job 1, never share one), the
    job id's characters that a cgroup name may not hold replaced by `_`."""
    import hashlib

    where = hashlib.sha256(str(Path(log_dir).resolve()).encode()).hexdigest()[:8]
    return f"{re.sub(r'^[.]|[^A-Za-z0-9_.-]', '_', job_id)[:80]}-{attempt}-{rank}-{where}"


def _shims_time_limit(handle: Handle) -> dict[str, Any]:
    """The SIGTERM the attempt's shims sent at its time limit while no server did, as
    control.json records a server's: `signalled_at`, `kill_at` (the earliest); {} for none."""
    terms, kills = [], []
    for replica in handle.replicas:
        record = seen(replica)
        term, kill = finite_time(record.get("limit_sigterm_at")), finite_time(record.get("limit_kill_at"))
        if term is not None and kill is not None:
            terms.append(term)
            kills.append(kill)
    return {"signalled_at": min(terms), "kill_at": min(kills)} if terms else {}
