"""The records a replica's shim writes on its node (status and exit), as the server reads them.

The shim may run as the job's own account (Slurm, Ray): whatever it wrote may have been
replaced by the job. So a record is read never through a symbolic link, only from a regular
file, at most JOB_FILE_MAX bytes, and every field is checked before it is believed.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CONTROL_FILE = "control.json"
"""An attempt's signal state in its directory (`signalled_at`, `kill_at`, `killed_at`): written by
the server on SIGTERM and SIGKILL, read back by the next server that adopts the attempt and, for its
SIGKILL deadline, by the attempt's supervisors (`warden.executors.shim.DeadlineKeeper`)."""
CONTROL_MODE = 0o644
"""control.json is readable by the job's own account: on Slurm and Ray the supervisor runs as
it. It holds times only; the job can read it and never write it (the directory is the server's)."""

JOB_FILE_MAX = 1 << 16
"""The most of a file a job wrote (its status and exit records) that the server reads."""


def read_job_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from a file the job's own account may have written: never through a
    symbolic link, only a regular file, at most JOB_FILE_MAX bytes; None for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = f.read(JOB_FILE_MAX + 1)
    if len(raw) > JOB_FILE_MAX:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def record_exit_code(record: Mapping[str, Any]) -> int | None:
    """The exit code in a record, if it is one (subprocess convention)."""
    code = record.get("exit_code")
    return code if isinstance(code, int) and not isinstance(code, bool) and -256 < code < 256 else None


TERMINATING = "terminating_at"
"""The control file's key for when warden decided to SIGTERM the attempt, written before the
signal leaves: a SIGTERM the job gets later than that may be warden's."""

SUPERVISOR_LOST = "supervisor_lost"
"""The key of an exit record that someone other than the replica's supervisor wrote, because the
supervisor was gone without one (the Ray launcher, the local executor): the job's end is unknown."""

STOP_RECORDS_ENV = "WARDEN_STOP_RECORDS"
"""The job's environment variable naming the files (joined by `os.pathsep`) where warden marks
a SIGTERM of its own before sending it: the attempt's control file and the replica's `seen`
file (where its supervisor marks the SIGTERM it sends at a time limit)."""

STOP_MARKS = (TERMINATING, "signalled_at", "kill_at", "limit_sigterm_at")
"""The keys of those files whose time says warden asked the attempt to stop."""


def stop_asked(paths: str) -> bool:
    """Whether warden marked a SIGTERM of its own in any of the files `paths` names (the value
    of `STOP_RECORDS_ENV`), each read as a record a job may have written."""
    for path in paths.split(os.pathsep):
        record = read_job_json(Path(path)) if path else None
        if record is not None and any(finite_time(record.get(key)) is not None for key in STOP_MARKS):
            return True
    return False


def finite_time(value: Any) -> float | None:
    """A number a record holds, when it is a finite time; else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def record_ended_at(record: Mapping[str, Any], default: float) -> float:
    """When the record says the replica's last process was gone, else `default`."""
    value = finite_time(record.get("ended_at"))
    return default if value is None else value


def record_killed_at(record: Mapping[str, Any], deadline: float | None, now: float) -> float | None:
    """When the record's supervisor sent SIGKILL itself at the attempt's deadline (`killed_at`,
    `warden.executors.shim.DeadlineKeeper`), believed only between that deadline and `now`:
    None for no deadline, no such time, or one outside."""
    value = record.get("killed_at")
    if deadline is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if deadline <= value <= now else None


REVOKED = "revoked"
"""The key of a status record that no launch wrote: an adopter revoked the launch (`revoke_launch`)."""


def claim_launch(path: Path, record: Mapping[str, Any], mode: int = 0o600) -> bool:
    """Create the replica's status file `path` with `record`, only if no such file exists: the
    one step that makes a launch real. False (nothing written) when one exists already, which
    is an adopter's revocation (`revoke_launch`) or an earlier launch of the same replica.
    Exclusive and whole at once (a complete temporary file hard-linked to `path`), so a launch
    and a revocation that race, in two processes on two machines sharing the directory, never
    both succeed."""
    return _write_json(path, record, mode, exclusive=True)


def revoke_launch(path: Path, why: str) -> dict[str, Any] | None:
    """Make sure the replica whose status file is `path` never starts: create the file with a
    revocation, unless its launch claimed it first. Returns None when revoked (now or before),
    else the launch's status record (it started, or is starting: the shim writes its job's
    process group there a moment after the claim)."""
    for _ in range(3):
        if _write_json(path, {REVOKED: why}, 0o600, exclusive=True):
            return None
        record = read_job_json(path)
        if record is None:
            continue  # not a record the shim wrote: try once more, then leave it revoked
        return None if REVOKED in record else record
    return None


def revoke_unstarted(status_paths: list[Path], why: str) -> None:
    """Revoke the launch of every replica of an attempt that an executor found nothing of
    (`Executor.recover` returns None): a launch still on its way (a submission that lands
    late) then starts no job. Only where the attempt's directory exists: without it no launch
    of it can run."""
    for path in status_paths:
        if path.parent.is_dir() and not path.parent.is_symlink():
            revoke_launch(path, why)


def launched(record: Mapping[str, Any] | None) -> bool:
    """Whether a status record is a launch's (its replica started or is starting), not a
    revocation or nothing."""
    return record is not None and REVOKED not in record


def write_json_atomic(path: Path, data: Mapping[str, Any], mode: int = 0o600, *, durable: bool = True) -> None:
    """Write `data` so that a reader sees either nothing or the whole file, even after a crash
    or power loss (temp file, fsync, rename, fsync the directory; the file `mode` whatever the
    writer's umask; without `durable`, no fsync: whole for every reader, not across a power
    loss, for a record on a signal's path that must not wait on the disk), without
    following a symbolic link anywhere a job could have planted one: the directory is opened
    without following a link, the temp file is created in it by a fresh random name with
    O_EXCL|O_NOFOLLOW, and the rename replaces whatever `path` names (a link included) instead of
    writing through it. Safe even in a directory the job's account can write."""
    _write_json(path, data, mode, exclusive=False, durable=durable)


def _write_json(path: Path, data: Mapping[str, Any], mode: int, *, exclusive: bool, durable: bool = True) -> bool:
    """`write_json_atomic`, or with `exclusive` only where `path` does not exist (a hard link
    instead of the rename: False when `path` exists, and nothing is written)."""
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        raw = json.dumps(dict(data)).encode()
        for _ in range(8):
            tmp = f".{path.name}.{secrets.token_hex(8)}.tmp"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
            except FileExistsError:
                continue
            break
        else:
            raise FileExistsError(f"no free temporary name for {path}")
        try:
            with os.fdopen(fd, "wb") as out:
                os.fchmod(out.fileno(), mode)  # the umask took bits off at creation (a server's is 077)
                out.write(raw)
                out.flush()
                if durable:
                    os.fsync(out.fileno())
            if exclusive:
                try:
                    os.link(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
                except FileExistsError:
                    return False
                finally:
                    os.unlink(tmp, dir_fd=dir_fd)
            else:
                os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        if durable:
            os.fsync(dir_fd)
        return True
    finally:
        os.close(dir_fd)
