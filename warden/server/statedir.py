"""The server's state directory: one server at a time on it (and on a SQLite database), bound
to the one database whose jobs it holds, and reachable by the uids jobs run as.

Each refusal is a `StateDirError` whose message names the directory, what is wrong with it and
the fix; the server prints it and exits 2 before it changes anything.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url

from warden.executors.identity import Identities, Identity

LOCK_FILE = "server.lock"
"""In the state directory: held (flock) by the server using it, with its pid and address."""
DATABASE_FILE = "database.json"
"""In the state directory: the identity of the database it belongs to, written at first start."""


class StateDirError(Exception):
    """The state directory (or the database) cannot be used by this server; the message says
    why and what to do."""


# -- one server ---------------------------------------------------------------------------------


@dataclass
class ServerLock:
    """An exclusive `flock` on a file, held while the server lives. The kernel drops it when the
    process dies, however it dies, so a `kill -9` never leaves a stale lock; the descriptor is
    not inherited by the processes the server starts (Python's descriptors are close-on-exec)."""

    path: Path
    fd: int

    @classmethod
    def take(cls, path: Path, what: str, holder: dict[str, object]) -> ServerLock:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = _read_holder(fd)
            os.close(fd)
            raise StateDirError(
                f"{what}: another warden server is running on it ({_describe_holder(other)}); one server "
                "uses a state directory and a SQLite database at a time: stop that one, or start this one "
                "with another --state-dir (and --db). Several servers share only a PostgreSQL database."
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        os.fchmod(fd, 0o600)
        return cls(path, fd)

    def release(self) -> None:
        os.close(self.fd)


def _read_holder(fd: int) -> dict[str, object]:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _describe_holder(holder: dict[str, object]) -> str:
    parts = []
    if holder.get("pid") is not None:
        parts.append(f"pid {holder['pid']}")
    if holder.get("host") is not None:
        parts.append(f"on {holder['host']}")
    if holder.get("port") is not None:
        parts.append(f"port {holder['port']}")
    return ", ".join(parts) or "its pid is not recorded"


def lock_server(state: Path, db_url: str, port: int) -> list[ServerLock]:
    """Take the state directory's lock, and a SQLite database's own (`<file>.lock` beside it)
    when the database lies elsewhere; refuse naming the server that holds either."""
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "port": port, "started_at": time.time()}
    locks = [ServerLock.take(state / LOCK_FILE, f"state directory {state}", holder)]
    url = make_url(db_url)
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        database = Path(url.database).resolve()
        if database.parent != state.resolve():
            try:
                locks.append(ServerLock.take(Path(f"{database}.lock"), f"SQLite database {database}", holder))
            except BaseException:
                locks[0].release()
                raise
    return locks


# -- one database -------------------------------------------------------------------------------


def bind_database(state: Path, database_id: str, db_url: str) -> None:
    """Record which database the state directory belongs to, at its first start; refuse a
    server started on another one. Its attempt directories, logs and checkpoints are named by
    that database's job ids: with another database, job 1 would read another job 1's output
    and resume from its checkpoint."""
    url = make_url(db_url).render_as_string(hide_password=True)
    path = state / DATABASE_FILE
    try:
        recorded = json.loads(path.read_text())
    except FileNotFoundError:
        recorded = None
    except (OSError, ValueError) as err:
        raise StateDirError(f"state directory {state}: cannot read {path}: {err}") from None
    if recorded is None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"database_id": database_id, "url": url, "bound_at": time.time()}, f)
            f.write("\n")
        return
    if not isinstance(recorded, dict) or recorded.get("database_id") != database_id:
        theirs = recorded.get("url", "?") if isinstance(recorded, dict) else "?"
        their_id = recorded.get("database_id", "?") if isinstance(recorded, dict) else "?"
        raise StateDirError(
            f"state directory {state} belongs to the database {theirs} (id {their_id}), not to {url} "
            f"(id {database_id}): its jobs' logs and checkpoints are that database's. Start this server "
            "with a --state-dir of its own, or on the database the directory belongs to."
        )


# -- reachable by jobs --------------------------------------------------------------------------


def check_reachable(state: Path, identities: Identities, say: object = None) -> None:
    """Refuse to start when a uid jobs run as cannot pass through to `state/jobs` (where their
    attempt directory, checkpoint directory and, for job uids, HOME lie): each is tried by a
    real process under that identity, so ACLs, mounts and modes all count. Warn (`say`) when an
    account's own HOME cannot be entered."""
    if not identities.switching:
        return
    target = state / "jobs"
    for label, identity in _probes(identities):
        if _can_enter(target, identity):
            continue
        blocker = _first_closed(target, identity)
        where = (
            f"{blocker} is {stat.filemode(blocker.stat().st_mode)} {_owner(blocker)}"
            if blocker is not None
            else f"{target} cannot be entered"
        )
        fix = (
            f"chmod o+x {blocker}"
            if blocker is not None and blocker.stat().st_uid == os.geteuid()
            else "give that identity search (x) permission on it"
        )
        raise StateDirError(
            f"state directory {state}: jobs cannot reach their directories under it: {where}, and jobs run as "
            f"{label}, which may not pass through it. Fix: start the server with --state-dir on a path every "
            f"job uid can pass through (the default for root is /var/lib/warden), or {fix}."
        )
    if callable(say):
        for label, identity in _probes(identities):
            home = identity.home
            if home and not identity.dynamic and not _can_enter(Path(home), identity):
                say(f"WARNING: jobs run as {label} get HOME={home}, which that account cannot enter")


def _probes(identities: Identities) -> Iterable[tuple[str, Identity]]:
    """The identities jobs may run as: a job uid (it has only "other" permissions), and with
    `--run-as user` each account the user map names."""
    uids = identities.pool.uids
    yield f"job uids {uids.start}-{uids.stop - 1} (permissions of 'other')", Identity(uids.start, uids.start)
    if identities.mode == "user":
        for user, account in sorted(identities.user_map.items()):
            identity = identities.account(user)
            if identity is not None:
                yield f"account {account!r} (--user-map {user}={account})", identity


def _can_enter(directory: Path, identity: Identity) -> bool:
    """Whether a process of `identity` can `cd` into `directory`."""
    result = subprocess.run(
        ["/bin/sh", "-c", 'cd -- "$1"', "sh", str(directory)],
        user=identity.uid,
        group=identity.gid,
        extra_groups=list(identity.groups),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        check=False,
        timeout=30,
    )
    return result.returncode == 0


def _first_closed(target: Path, identity: Identity) -> Path | None:
    """The first directory on the way to `target` that `identity` may not search, by its mode."""
    for directory in reversed((target, *target.parents)):
        try:
            st = directory.stat()
        except OSError:
            return directory
        if st.st_uid == identity.uid:
            allowed = st.st_mode & stat.S_IXUSR
        elif st.st_gid == identity.gid or st.st_gid in identity.groups:
            allowed = st.st_mode & stat.S_IXGRP
        else:
            allowed = st.st_mode & stat.S_IXOTH
        if not allowed:
            return directory
    return None


def _owner(path: Path) -> str:
    import grp
    import pwd

    st = path.stat()
    try:
        user = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        user = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return f"{user}:{group}"


def interpreter_warning(identities: Identities) -> str | None:
    """A warning when a job uid cannot run this server's Python (the SDK's `python3` resolves
    here when jobs inherit the server's PATH): the interpreter is the job's business, but a
    server that knows its jobs will fail to start them says so."""
    if not identities.switching:
        return None
    uids = identities.pool.uids
    probe = Identity(uids.start, uids.start)
    executable = Path(sys.executable)
    if _can_enter(executable.parent, probe):
        return None
    blocker = _first_closed(executable.parent, probe)
    where = f"{blocker} is {stat.filemode(blocker.stat().st_mode)}" if blocker is not None else "it is closed"
    return (
        f"WARNING: job uids cannot run this server's Python {executable} ({where}): a job that runs python3 "
        "from this PATH fails. Make it passable (chmod o+x on each directory above it), or give jobs an "
        "interpreter of their own (docs/security.md, 'Setting it up')."
    )


# -- directories of one database's jobs ---------------------------------------------------------

STALE_DIR = "stale"
"""In the state directory (0700): directories found where a new attempt's had to be made."""


def set_aside_stale(state: Path, job_id: int, number: int) -> Path | None:
    """A new attempt's directory, and before a job's first attempt the job's own directory
    (its checkpoints), must not exist yet: one that does was left by a job of another database
    or a hand-made copy, and is moved to `state/stale/` rather than shown to, or resumed by, a
    job it does not belong to. Returns where it went, or None."""
    job_dir = state / "jobs" / str(job_id)
    found = job_dir if number == 1 else job_dir / f"attempt-{number}"
    if not os.path.lexists(found):
        return None
    aside = state / STALE_DIR
    aside.mkdir(mode=0o700, exist_ok=True)
    target = aside / f"{'-'.join(found.relative_to(state / 'jobs').parts)}.{time.time_ns()}"
    os.rename(found, target)
    return target
