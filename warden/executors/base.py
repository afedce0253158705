"""The executor contract: what a server asks of the machinery that runs jobs.

An executor turns the engine's plan into processes and reports back what happened. The server
calls it with plain data (`LaunchSpec`) and gets back plain data (`Handle`, `Exit`), so the
same server drives the `local` executor, a Slurm cluster or Ray without knowing which.

The one stateful promise is restart safety: the server persists the `Handle` of every attempt it
starts, and after the server process dies and comes back, `Executor.adopt` finds the attempt
again. Jobs never die because the server did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from warden.engine.model import Node

_EMPTY_ENV: Mapping[str, str] = MappingProxyType({})
_EMPTY_COUNTS: Mapping[str, int] = MappingProxyType({})
_EMPTY_INDICES: Mapping[str, tuple[int, ...]] = MappingProxyType({})


class Fenced(RuntimeError):
    """This server may not act on the cluster now: it does not lead, or its lease ran out by
    its own clock (docs/control-plane.md, "Several servers"). Nothing was done."""


class UnknownAttempt(KeyError):
    """The executor does not track this (job, attempt): never started, not adopted, or its
    exit was already reported by `exits()`."""


@dataclass(frozen=True, slots=True)
class ReplicaLaunch:
    """One replica of a gang: where it runs and which GPUs it sees."""

    rank: int  # 0..world_size-1
    node: str  # node name from the engine's placement
    gpus: tuple[int, ...]  # GPU indices on that node -> CUDA_VISIBLE_DEVICES="0,3"
    local_rank: int = 0


@dataclass(frozen=True, slots=True)
class Bounds:
    """What one replica may use, where its executor bounds it (local: its cgroup and its
    resource limits; see docs/executors.md, "Containment"). 0: no bound of its own."""

    max_processes: int = 4096  # processes and threads at once (cgroup pids.max)
    memory_mib: int = 0  # its memory (cgroup memory bound); 0: the spec's `memory`, else none
    open_files: int = 4096  # RLIMIT_NOFILE's soft limit (the hard one: OPEN_FILES_HARD)


OPEN_FILES_HARD = 1 << 20
"""A job's RLIMIT_NOFILE hard limit: as far as it may raise its own (Linux's default nr_open)."""


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything needed to start one attempt of a job; the executor adds nothing of its own
    except the free port of a gang whose `master_port` is None."""

    job_id: str
    attempt: int
    command: tuple[str, ...]  # argv, run without a shell
    replicas: tuple[ReplicaLaunch, ...]
    grace_s: float  # WARDEN_GRACE_SECONDS
    workdir: Path  # cwd of every replica (must exist)
    log_dir: Path  # per-attempt logs: one stdout+stderr file per replica
    checkpoint_dir: Path  # WARDEN_CHECKPOINT_DIR (created if missing)
    env: Mapping[str, str] = field(default_factory=lambda: _EMPTY_ENV)  # extra environment from the submission
    master_port: int | None = None  # for gangs; a free port is picked if None
    user: str | None = None  # the submitting warden user: whose Unix account runs it, where mapped
    cpu: int = 0  # millicores per replica the engine counted (executors that reserve cores ask for them)
    memory: int = 0  # MiB per replica the engine counted
    bounds: Bounds = Bounds()
    time_limit_s: float | None = None  # the attempt's time limit: supervisors keep it while no server runs

    @property
    def world_size(self) -> int:
        return len(self.replicas)


@dataclass(frozen=True, slots=True)
class ReplicaHandle:
    """Where to find one running replica again: its supervisor (the shim), the job's process
    group, and the files the shim writes. `pgid` is None when the command could not be started
    (the exit file then says why). `uid` is the uid the job runs as (None: the server's), so a
    restarted server knows which job uids are held."""

    rank: int
    shim_pid: int | None  # None where no shim of this machine supervises it (Slurm)
    pgid: int | None
    status_path: Path
    exit_path: Path
    log_path: Path
    uid: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "shim_pid": self.shim_pid,
            "pgid": self.pgid,
            "status_path": str(self.status_path),
            "exit_path": str(self.exit_path),
            "log_path": str(self.log_path),
            "uid": self.uid,
        }

    @classmethod
    def in_dir(cls, log_dir: Path, rank: int) -> ReplicaHandle:
        """A replica no shim of this machine supervises (Slurm, Ray): only its files in the
        attempt's directory, which its node's shim writes."""
        return cls(
            rank=rank,
            shim_pid=None,
            pgid=None,
            status_path=log_dir / f"rank-{rank}.status.json",
            exit_path=log_dir / f"rank-{rank}.exit.json",
            log_path=log_dir / f"rank-{rank}.log",
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReplicaHandle:
        pgid, uid = data.get("pgid"), data.get("uid")
        return cls(
            rank=int(data["rank"]),
            shim_pid=None if data.get("shim_pid") is None else int(data["shim_pid"]),
            pgid=None if pgid is None else int(pgid),
            status_path=Path(data["status_path"]),
            exit_path=Path(data["exit_path"]),
            log_path=Path(data["log_path"]),
            uid=None if uid is None else int(uid),
        )


@dataclass(frozen=True, slots=True)
class Handle:
    """What the server persists to find a running attempt again after it restarts.

    `to_dict`/`from_dict` give a JSON-ready form so the server can store it in any database.
    `control_path` is where the executor records a terminate/kill of this attempt (signal
    times, SIGKILL deadline), so a server that restarts mid-grace still kills on time.
    `external` names the attempt in the system that runs it (its Slurm job ids)."""

    job_id: str
    attempt: int
    replicas: tuple[ReplicaHandle, ...]
    control_path: Path | None = None
    external: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "replicas": [r.to_dict() for r in self.replicas],
            "control_path": None if self.control_path is None else str(self.control_path),
            "external": list(self.external),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Handle:
        control = data.get("control_path")
        return cls(
            job_id=str(data["job_id"]),
            attempt=int(data["attempt"]),
            replicas=tuple(ReplicaHandle.from_dict(r) for r in data["replicas"]),
            control_path=None if control is None else Path(control),
            external=tuple(str(e) for e in data.get("external") or ()),
        )


Devices = tuple[tuple[int, ...] | None, ...]
"""Per rank, the GPU indices a replica was bound to (None: not known yet): `Executor.devices`."""


class LaunchError(OSError):
    """The attempt could not be started (its workdir is missing, a shim failed); nothing of it is
    left running. An OSError, like the failures of `subprocess` it stands for."""


def validate_spec(spec: LaunchSpec) -> None:
    if not spec.command:
        raise ValueError(f"job {spec.job_id!r}: command is empty")
    if not spec.replicas:
        raise ValueError(f"job {spec.job_id!r}: no replicas")
    ranks = sorted(r.rank for r in spec.replicas)
    if ranks != list(range(len(ranks))):
        raise ValueError(f"job {spec.job_id!r}: replica ranks must be 0..{len(ranks) - 1}, got {ranks}")
    if spec.grace_s < 0:
        raise ValueError(f"job {spec.job_id!r}: grace_s must be >= 0, got {spec.grace_s!r}")
    for name in ("max_processes", "memory_mib", "open_files"):
        value = getattr(spec.bounds, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"job {spec.job_id!r}: bounds.{name} must be a whole number >= 0, got {value!r}")
    if spec.time_limit_s is not None and not 0 < spec.time_limit_s < float("inf"):
        raise ValueError(f"job {spec.job_id!r}: time_limit_s must be above 0 and finite, got {spec.time_limit_s!r}")


@dataclass(frozen=True, slots=True)
class Exit:
    """An attempt whose every process is gone. Resources may be released only now."""

    job_id: str
    attempt: int
    exit_codes: tuple[int | None, ...]  # per replica, subprocess convention (-9 = SIGKILL); None = unknown
    ended_at: float  # wall clock when the last process of the attempt was gone
    signalled_at: float | None  # when warden sent SIGTERM (None if never)
    killed: bool  # warden sent SIGKILL (at the grace deadline, or by kill())
    killed_at: float | None = None  # wall clock when that SIGKILL was sent
    error: str | None = None  # why a replica has no exit status (not started, supervisor lost)
    ended_by: str | None = None
    """What ended the attempt behind warden's back, in words (a Slurm job cancelled by another
    user, a placement group removed, its node lost): the attempt is evicted and its job requeued,
    never failed for it. None: the attempt's own processes ended (or warden ended them)."""
    timed_out_at: float | None = None
    """When the attempt's supervisors sent SIGTERM at its time limit because no server had
    (it was down): the attempt ran out its time limit, as if the server had stopped it."""

    @property
    def succeeded(self) -> bool:
        return all(code == 0 for code in self.exit_codes)


@dataclass(frozen=True, slots=True)
class Stopped:
    """An attempt some of whose processes are stopped (SIGSTOP from outside warden, SIGTSTP):
    since when (wall clock, the earliest of its replicas) and what, in words."""

    since: float
    what: str


@dataclass(frozen=True, slots=True)
class Inventory:
    """The nodes an executor runs jobs on, as it sees them now: every node (its capacity), and
    those that take no job now with why (Slurm's DOWN, DRAIN, not responding)."""

    nodes: tuple[Node, ...]
    down: Mapping[str, str] = field(default_factory=lambda: _EMPTY_ENV)
    foreign: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: _EMPTY_INDICES)
    """Per node, the GPU indices (sorted) held by work that is not warden's (a Slurm job an admin
    submitted): never free for warden's jobs."""
    foreign_unknown: Mapping[str, int] = field(default_factory=lambda: _EMPTY_COUNTS)
    """Per node, how many GPUs such work holds where the substrate cannot tell which (a Ray actor
    or placement group warden did not make): never free either, though which are is a guess."""

    @property
    def usable(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.name not in self.down)

    def foreign_count(self, node: str) -> int:
        """How many of the node's GPUs work that is not warden's holds, known by index or not."""
        return len(self.foreign.get(node, ())) + self.foreign_unknown.get(node, 0)

    def foreign_counts(self) -> dict[str, int]:
        """`foreign_count` of every node that has any."""
        names = sorted(self.foreign.keys() | self.foreign_unknown.keys())
        return {n: c for n in names if (c := self.foreign_count(n))}


@runtime_checkable
class Executor(Protocol):
    """Makes a plan real. Every method is safe to call from the server's threads."""

    def start(self, spec: LaunchSpec) -> Handle:
        """Start every replica of the attempt; returns once each has a process (or failed to)."""
        ...

    def terminate(self, job_id: str, attempt: int, grace_s: float) -> float:
        """SIGTERM every replica's whole process group now, SIGKILL every group at now + grace
        (a timer, not a polling tick). Returns the SIGKILL deadline (time.time() based).
        Idempotent: a second call changes nothing and returns the first deadline."""
        ...

    def kill(self, job_id: str, attempt: int) -> None:
        """SIGKILL every group now."""
        ...

    def started(self) -> list[tuple[str, int]]:
        """(job_id, attempt) of the attempts `start` handed over whose every replica's process
        has begun since the last call, each reported once (the job is RUNNING from then on)."""
        ...

    def exits(self) -> list[Exit]:
        """Attempts whose every process is gone since the last call, each reported once."""
        ...

    def devices(self, job_id: str, attempt: int) -> Devices | None:
        """Per rank, the GPU indices the substrate bound the replica to, as read back from it
        once it runs (None for a rank not known yet); None when this executor binds exactly the
        GPUs of the launch (local). Where Slurm or Ray chose other indices than the plan's, the
        server corrects the attempt's recorded assignment (`warden.server.apply`). An attempt
        it does not track reads as not known yet."""
        ...

    def stopped(self) -> dict[tuple[str, int], Stopped]:
        """The tracked attempts some of whose processes are stopped now (state T), with since
        when; an executor that cannot see it returns {}."""
        ...

    def adopt(self, handle: Handle, kill_at: float | None = None) -> None:
        """After a restart: track this attempt again; re-arm its SIGKILL if it was terminating."""
        ...

    def recover(self, job_id: str, attempt: int, log_dir: Path, replicas: int) -> Handle | None:
        """The handle of an attempt whose `start` the server may not have seen return (it
        stopped in between), rebuilt from what the executor left on its side; None when no
        replica had started."""
        ...

    def cancel_unowned(self, owned: Iterable[tuple[str, int]]) -> list[str]:
        """After recovery, with every attempt the server owns adopted: end whatever this
        executor finds running for an attempt not in `owned`; returns what it ended."""
        ...

    def running(self) -> list[tuple[str, int]]:
        """(job_id, attempt) of every tracked attempt not yet reported by `exits()`."""
        ...

    def watch(self, wake: Callable[[], None]) -> None:
        """Call `wake` (from any thread) when `started()`, `exits()` or the nodes may have
        something new, so the server looks at once rather than at its next pass. An executor
        that learns of changes only when asked never calls it."""
        ...

    def fence(self, may_act: Callable[[], bool]) -> None:
        """From now on, act on the cluster (start, signal, kill, cancel, release, remove) only
        while `may_act()` holds, and raise `Fenced` otherwise; a SIGKILL deadline that comes
        while it does not is retried shortly, and dropped with the executor at `close` (the
        next leader re-arms it from the database). Reads (`started`, `exits`, `running`) are
        never fenced."""
        ...

    def close(self) -> None:
        """Stop timers and threads. Never kills jobs: they must survive a server restart."""
        ...
