"""What happened to an attempt outside warden, read the same way by every executor: a replica
killed by a signal warden did not send, and processes something stopped.

Whoever sends it (another job of the same account, an admin, `scancel --signal=TERM`), a
signal that ends a replica while warden sent none is no end of the job's own: the attempt is
evicted and its job requeued with what happened (`ended_outside`), never SUCCEEDED or FAILED.
A stop is what each replica's supervisor saw and wrote in its `seen` file
(`warden.executors.shim.StopWatch`), which the job's account may write on Slurm and Ray: it is
read as any record a job wrote (`read_job_json`).

warden marks its own SIGTERM before it sends it (`TERMINATING` in the attempt's control file;
the supervisor's `limit_sigterm_at` in the `seen` file at a time limit it keeps), and hands the
job both paths in `STOP_RECORDS_ENV`, so that a job that catches SIGTERM can tell warden's from
another's (`warden.workload.guard`).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from warden.executors.base import Handle, ReplicaHandle, Stopped
from warden.executors.records import (
    STOP_RECORDS_ENV,
    SUPERVISOR_LOST,
    TERMINATING,
    finite_time,
    launched,
    read_job_json,
)

__all__ = [
    "HEARTBEAT_S",
    "OUTSIDE_SIGNALS",
    "STOP_RECORDS_ENV",
    "SUPERVISOR_LOST",
    "TERMINATING",
    "Beats",
    "ended_outside",
    "kept_time_limit",
    "seen",
    "seen_path",
    "stop_records",
    "stopped_of",
]

OUTSIDE_SIGNALS = frozenset({signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})
"""Signals that end a process when another one sends them: a main process they killed when
warden had sent none was ended outside warden (a crash's own signals, SIGSEGV, SIGABRT, SIGBUS,
are the job's failure)."""


def ended_outside(
    replicas: Sequence[ReplicaHandle], codes: Sequence[int | None], lost: Collection[int] = ()
) -> str | None:
    """Why an attempt warden sent no signal to ended outside it, in words: the supervisor of a
    replica (ranks `lost`) ended without recording the job's end — killed by the job's account,
    which it runs as on Slurm and Ray, or by anyone else: whatever happened, the job's own end
    is unknown and not its failure —, or a main process killed by a signal another process
    sends (`OUTSIDE_SIGNALS`); None for any other end. A job that catches the signal and exits
    by itself cannot be told from one that finished, unless it asks (`warden.workload.guard`
    does)."""
    for rank in sorted(lost):
        return f"rank {rank}: its supervisor ended without recording how the job ended (killed outside warden)"
    for replica, code in zip(replicas, codes):
        if code is not None and code < 0 and -code in OUTSIDE_SIGNALS:
            name = signal.Signals(-code).name
            return f"rank {replica.rank} was killed by {name}, which warden did not send"
    return None


def kept_time_limit(
    records: Sequence[Mapping[str, Any]], signalled_at: float | None, now: float
) -> tuple[float | None, float | None]:
    """When the attempt's supervisors sent SIGTERM at its time limit because no server had
    signalled it first (`limit_sigterm_at` in their exit records, the earliest), and the
    SIGKILL deadline that SIGTERM set (`limit_kill_at`); (None, None) when none did, or when a
    server's SIGTERM (`signalled_at`) came first. The attempt then ran out its time limit, as if
    a server had stopped it: no end outside warden."""
    terms = [t for rec in records if (t := finite_time(rec.get("limit_sigterm_at"))) is not None and t <= now]
    timed_out_at = min(terms, default=None)
    if timed_out_at is None or (signalled_at is not None and signalled_at < timed_out_at):
        return None, None
    kills = [t for rec in records if (t := finite_time(rec.get("limit_kill_at"))) is not None]
    return timed_out_at, min(kills, default=None)


def seen_path(directory: Path, rank: int) -> Path:
    """A replica's `seen` file, beside its status and exit records."""
    return directory / f"rank-{rank}.seen.json"


def seen(replica: ReplicaHandle) -> dict[str, Any]:
    """What a replica's supervisor saw of it (stopped processes, a time limit it kept), read as
    a record its job's account may have written."""
    return read_job_json(seen_path(replica.status_path.parent, replica.rank)) or {}


def stopped_of(handle: Handle, beats: Beats | None = None) -> Stopped | None:
    """The attempt's stop, as its replicas' supervisors saw it: the earliest time one was seen
    stopped and which processes, or (with `beats`) since when a supervisor has been silent;
    None when none of its running replicas is stopped."""
    since: list[float] = []
    what: list[str] = []
    for replica in handle.replicas:
        if replica.exit_path.exists():
            continue
        record = seen(replica)
        at = finite_time(record.get("stopped_since"))
        if at is not None:
            pids = [p for p in record.get("stopped_pids") or () if isinstance(p, int) and not isinstance(p, bool)]
            since.append(at)
            what.append(f"rank {replica.rank}: pid {', '.join(map(str, pids[:8]))}" + (" …" if len(pids) > 8 else ""))
        elif beats is not None and (quiet := beats.silent(handle, replica, record)) is not None:
            since.append(quiet)
            what.append(f"rank {replica.rank}: its supervisor, frozen or stopped with it, writes nothing")
    return Stopped(min(since), "; ".join(what)) if since else None


HEARTBEAT_S = 5.0
"""How often a supervisor that runs as its job's account (Slurm, Ray) writes its `seen` file
when nothing changed (`shim.StopWatch`)."""
SILENT_BEATS = 4
"""A supervisor is silent once its count has stood still for this many heartbeats."""


class Beats:
    """The heartbeats of supervisors that run as their job's account: a job's account can stop
    or freeze the supervisor with the job (Slurm's `scancel --signal=STOP` freezes the whole
    step), and then nothing writes that the job is stopped. A count that stands still says so.
    Only this process's clocks are compared (when it saw the count change), never a node's."""

    def __init__(self, every_s: float = HEARTBEAT_S) -> None:
        self.every_s = every_s
        self._seen: dict[tuple[str, int, int], tuple[Any, float, float]] = {}
        """(job, attempt, rank) → (the count, when it was first seen: monotonic, wall clock)."""

    def silent(self, handle: Handle, replica: ReplicaHandle, record: Mapping[str, Any]) -> float | None:
        """Since when (wall clock, first seen) the replica's count has stood still, once that is
        `SILENT_BEATS` heartbeats or more and its supervisor has started it; else None."""
        key = (handle.job_id, handle.attempt, replica.rank)
        beat, now = record.get("beat"), time.monotonic()
        known = self._seen.get(key)
        if known is None or known[0] != beat:
            self._seen[key] = (beat, now, time.time())
            return None
        if now - known[1] < SILENT_BEATS * self.every_s or not launched(read_job_json(replica.status_path)):
            return None
        return known[2]

    def keep(self, attempts: Iterable[tuple[str, int]]) -> None:
        """Forget the replicas of every attempt but these."""
        live = set(attempts)
        for key in [k for k in self._seen if k[:2] not in live]:
            del self._seen[key]


def stop_records(control: Path, seen_file: Path) -> str:
    """The value of `STOP_RECORDS_ENV` for a replica."""
    return os.pathsep.join((str(control), str(seen_file)))
