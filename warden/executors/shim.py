"""The shim: a tiny supervisor between the local executor and one replica of a job.

Why it exists: the server must be able to die (even by SIGKILL) and come back without taking
its jobs along, and whoever comes back must still learn each job's exit status and the moment
its last process was gone. A process's exit status can only be collected by its parent, so the
parent of the job must be something that outlives the server and writes the status down: this
shim. It runs detached in its own session, is a child subreaper (orphaned descendants of the job
are re-parented to it, so it can tell when the very last one is gone), ignores the terminal
signals, and records everything in two small JSON files written atomically:

- the status file, as soon as the job has started: shim pid, job pid and process group, and
  the job's cgroup when it has one;
- the exit file, once no process of the job's group is left and whatever remained in its
  cgroup was killed: the main process's exit status (subprocess convention, -9 = killed by
  SIGKILL) and the time the last process was gone, by the shim's clock;
- the `seen` file, when something changes that the server should know while the job runs:
  its processes stopped (state T) or running again, the time limit it kept (below).

A launch may name a `cgroup` (`warden.executors.cgroups`): the shim makes it, with the job's
bounds, and the job enters it between fork and exec; the job's end is when it is empty, and
the shim then removes it. A launch may give the job's `open_files` limit (RLIMIT_NOFILE).

A launch may ask the shim to `forward_sigterm`: a SIGTERM that reaches the shim is then sent on
to the job's process group (and SIGCONT), not ignored. Slurm's proctrack/cgroup signals only a
step's tasks, this shim among them (`warden.executors.slurm_launch`), never their children.

A launch may ask for a `heartbeat_s`: the `seen` file is then written at least that often, so
that a supervisor stopped or frozen with its job is noticed by its silence (`StopWatch`).

A launch may name an `owner` process (pid and start ticks): the job then lives only as long as
that process does (the Ray executor's launcher actor, see `warden.executors.ray_launch`).

A launch may name the attempt's `control` file (`control.json`, the server's, in a directory the
job cannot write): once it records a SIGKILL deadline (`kill_at`, set when warden sent SIGTERM),
the shim keeps that deadline too, `KEEPER_SLACK_S` after the server's own timer would have. A
server that is killed, or a leader that dies and is replaced, so never leaves a job in its
grace unkilled past its deadline (`DeadlineKeeper`).
With the attempt's `time_limit_s`, the shim keeps the time limit too while no server has
signalled the attempt: SIGTERM `TIME_LIMIT_SLACK_S` after it, SIGKILL after `grace_s`.

Protocol (used by `warden.executors.local`): the launch description comes as JSON on stdin
(so the job's environment is never on a command line or in a file of the executor's). The
job runs as the launch's `identity` (uid, gid, groups) when there is one: only the job drops
its privileges, the shim keeps the server's to signal it and write the exit file. The first process
forks the real shim and exits with 0 once the status file exists (1 if the shim died first), so
the executor learns about success without polling and never has a zombie to reap.

Only the standard library is imported here: the shim starts fast and cannot break because of
the rest of warden.
"""

from __future__ import annotations

import ctypes
import errno
import json
import math
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from warden.executors import cgroups
from warden.executors.records import REVOKED, claim_launch, write_json_atomic

PR_SET_CHILD_SUBREAPER = 36
# How often the shim looks at the job's process group when no child exited (a member whose
# parent is not the shim can leave the group without the shim being told). Normal exits are
# seen at once through SIGCHLD.
POLL_S = 0.2
_SUPERVISOR_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def read_json(path: Path) -> dict[str, Any] | None:
    """The file's JSON object, or None if it does not exist (yet)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return None
    return data if isinstance(data, dict) else None


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (index 0 = state), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since boot: with the pid it names a process
    uniquely, so a recycled pid is not mistaken for the shim. None if unknown."""
    fields = _proc_stat(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def process_alive(pid: int, ticks: int | None = None) -> bool:
    """Is `pid` a live process (not a zombie) and, when `ticks` is given, the same one?"""
    fields = _proc_stat(pid)
    if fields is None:
        if os.path.isdir("/proc/self"):
            return False
        try:  # no /proc: all we can ask is whether the pid exists
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if fields[0] in ("Z", "X"):
        return False
    return ticks is None or len(fields) <= 19 or int(fields[19]) == ticks


def group_alive(pgid: int) -> bool:
    """Does any process (zombies included) still belong to process group `pgid`?"""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _children(parent: int) -> list[int]:
    """Pids whose parent is `parent`, from /proc (empty where there is no /proc)."""
    found: list[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if name.isdigit():
            fields = _proc_stat(int(name))
            if fields and len(fields) > 1 and int(fields[1]) == parent:
                found.append(int(name))
    return found


def _become_subreaper() -> bool:
    """Orphaned descendants of the job are re-parented to the shim rather than to init, so the
    shim can reap them and knows when the last one is gone. Linux only; elsewhere the shim
    falls back to watching the process group."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _reset_signals_in_child() -> None:
    """The job must start with default signal handling: the shim ignores SIGTERM and blocks
    SIGCHLD, and both would otherwise survive exec into the job."""
    for sig in _SUPERVISOR_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def _reap_ready(leader: int) -> int | None:
    """Reap every child that has exited; returns the leader's wait status if it was among them."""
    leader_status = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return leader_status
        if pid == 0:
            return leader_status
        if pid == leader:
            leader_status = status


def _kill_escaped() -> int:
    """SIGKILL the descendants that left the job's process group (setsid daemons and the like)
    once the group itself is gone, and reap them: the attempt's resources are freed when the
    exit file appears, so nothing of the job may outlive it (Slurm's proctrack does the same).
    Returns how many were killed."""
    me = os.getpid()
    killed: set[int] = set()
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return len(killed)
        if pid:
            continue
        for child in _children(me):
            try:
                os.kill(child, signal.SIGKILL)
                killed.add(child)
            except ProcessLookupError:
                pass
        signal.sigtimedwait([signal.SIGCHLD], POLL_S)


KEEPER_SLACK_S = 0.2
"""How long after a recorded SIGKILL deadline the shim sends SIGKILL itself. The server's timer
fires at the deadline; the shim's SIGKILL is the one that counts only when no server did (it was
killed, or a leader died and its successor has not yet taken over)."""

TIME_LIMIT_SLACK_S = 3.0
"""How long after the attempt's time limit (counted from the job's start here) the shim sends
SIGTERM itself, when no server has signalled the attempt by then: the server counts from when it
saw the job running and acts at its next pass, both a moment later (the launch's
`time_limit_slack_s` may say otherwise)."""


def _kill_group(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _terminate_group(group: int) -> None:
    """SIGTERM the job's process group, then SIGCONT: a stopped process handles SIGTERM only
    once it runs again."""
    for sig in (signal.SIGTERM, signal.SIGCONT):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            pass


class DeadlineKeeper:
    """The SIGKILL deadline of the attempt, as the server recorded it in `control`, kept by the
    shim. The file is read again whenever it changed (by inode and modification time), at most
    every `POLL_S`. A deadline is kept on both clocks, like the server's timer: the wall-clock
    time recorded plus `KEEPER_SLACK_S`, and the monotonic time that was as far away when it
    was read, so a step of the wall clock after reading never brings SIGKILL earlier. A
    recorded value that is not a finite time is ignored here (the server's adopter deals with
    it).

    With a time limit (`limit_at`, wall clock, and `limit_mono`, the same on the monotonic
    clock), the attempt's time limit is kept too while the server has not signalled the
    attempt: SIGTERM (and SIGCONT) at it, SIGKILL `grace_s` later, as the server would have
    done (`limit_sigterm_at`, `limit_kill_at`). `kill` ends the whole attempt (default: SIGKILL
    to its process group); `changed` is called when the time limit was acted on."""

    def __init__(
        self,
        control: Path | None,
        *,
        limit_at: float | None = None,
        limit_mono: float | None = None,
        grace_s: float = 0.0,
        kill: Callable[[int], None] = _kill_group,
        changed: Callable[[], None] | None = None,
    ) -> None:
        self.control = control
        self._seen: tuple[int, int] | None = None
        self._wall: float | None = None
        self._mono: float | None = None
        self._limit = (
            None
            if limit_at is None
            else (limit_at, limit_mono if limit_mono is not None else time.monotonic() + limit_at - time.time())
        )
        self._grace_s = grace_s
        self._kill = kill
        self._changed = changed
        self.killed_at: float | None = None
        """When the shim sent SIGKILL at the deadline (wall clock); None if it did not."""
        self.limit_sigterm_at: float | None = None
        """When the shim sent SIGTERM at the attempt's time limit (wall clock); None if it did not."""
        self.limit_kill_at: float | None = None
        """The SIGKILL deadline that SIGTERM set (wall clock)."""

    def _refresh(self) -> None:
        if self.control is None:
            return
        try:
            stat = os.stat(self.control)
        except OSError:
            return
        seen = (stat.st_ino, stat.st_mtime_ns)
        if seen == self._seen:
            return
        self._seen = seen
        try:
            record = read_json(self.control)
        except (OSError, ValueError):
            return
        kill_at = None if record is None else record.get("kill_at")
        if isinstance(kill_at, bool) or not isinstance(kill_at, int | float) or not math.isfinite(kill_at):
            return
        self._wall = float(kill_at) + KEEPER_SLACK_S
        self._mono = time.monotonic() + (self._wall - time.time())

    def _time_limit(self, group: int) -> float | None:
        """Seconds until the time limit is due, or None once acted on, or not to be (the
        server signalled the attempt first, or there is none). SIGTERM it when it is due."""
        if self._limit is None or self.limit_sigterm_at is not None or self._wall is not None:
            return None
        wall, mono = self._limit
        left = max(mono - time.monotonic(), wall - time.time())
        if left > 0:
            return left
        self.limit_sigterm_at = time.time()
        self._wall = self.limit_kill_at = self.limit_sigterm_at + self._grace_s
        self._mono = time.monotonic() + self._grace_s
        if self._changed is not None:  # recorded before it leaves: the job can tell it is warden's
            self._changed()
        _terminate_group(group)
        return None

    def until_due(self, group: int) -> float | None:
        """SIGKILL `group` if its deadline has come (once); else the seconds until it does, or
        None when there is no deadline (yet) or it was kept already. SIGTERM it at its time
        limit first, where there is one to keep."""
        if self.killed_at is not None:
            return None
        self._refresh()
        limit_left = self._time_limit(group)
        if limit_left is not None:
            return limit_left
        if self._wall is None or self._mono is None:
            return None
        left = max(self._mono - time.monotonic(), self._wall - time.time())
        if left > 0:
            return left
        self._kill(group)
        self.killed_at = time.time()
        return None


STOPPED_POLL_S = 0.5
"""How often the shim looks for stopped processes of the job."""
SEEN_MODE = 0o644
"""The `seen` file is the job's to read (pids and times only), as the control file is."""


class StopWatch:
    """Notices a job whose processes are stopped (state T: a SIGSTOP from another process of
    its account, a SIGTSTP) and records it in the replica's `seen` file, with the time-limit
    acts of the keeper, so that the server shows it and, past its policy's bound, evicts it.

    With `heartbeat_s`, it also writes the file at least that often (`beat`, a count): a
    supervisor that runs as the job's account can be stopped or frozen with its job (Slurm's
    `scancel --signal=STOP` freezes the step's cgroup, supervisor included), and then writes
    nothing; the executor tells that from the count standing still (`executors.outside.Beats`)."""

    def __init__(
        self,
        path: Path | None,
        leader: int,
        group: cgroups.Group | None,
        keeper: DeadlineKeeper,
        heartbeat_s: float | None = None,
    ) -> None:
        self.path = path
        self.leader = leader
        self.group = group
        self.keeper = keeper
        self.heartbeat_s = heartbeat_s
        self.stopped_since: float | None = None
        self.stopped_pids: list[int] = []
        self.beat = 0
        self._next = 0.0
        self._beat_due = 0.0

    def look(self) -> None:
        """Look again (at most every `STOPPED_POLL_S`); write the file when something changed,
        or when a heartbeat is due."""
        now = time.monotonic()
        if self.path is None or now < self._next:
            return
        self._next = now + STOPPED_POLL_S
        if self.group is not None:
            pids = cgroups.stopped(self.group)
        else:
            fields = _proc_stat(self.leader)
            pids = [self.leader] if fields and fields[0] == "T" else []
        if bool(pids) != (self.stopped_since is not None):
            self.stopped_since = time.time() if pids else None
            self.stopped_pids = sorted(pids)
            self.write()
        elif self.heartbeat_s is not None and now >= self._beat_due:
            self.write()

    def write(self) -> None:
        if self.path is None:
            return
        self.beat += 1
        if self.heartbeat_s is not None:
            self._beat_due = time.monotonic() + self.heartbeat_s
        record = {
            "stopped_since": self.stopped_since,
            "stopped_pids": self.stopped_pids,
            "limit_sigterm_at": self.keeper.limit_sigterm_at,
            "limit_kill_at": self.keeper.limit_kill_at,
            "beat": self.beat,
        }
        try:  # readable by the job: its guard tells warden's SIGTERM at the time limit by it
            write_json_atomic(self.path, record, SEEN_MODE)
        except OSError:
            pass


def wait_for_group(
    leader: int,
    owner: tuple[int, int | None] | None = None,
    keeper: DeadlineKeeper | None = None,
    group: cgroups.Group | None = None,
    watch: StopWatch | None = None,
) -> tuple[int, float, int, bool]:
    """Wait until the main process has exited and no process of its group is left, then kill
    whatever of the job is left elsewhere (its cgroup `group`, the shim's orphaned children),
    and wait until it is gone.

    With `owner` (pid, start ticks), the job lives only as long as that process: once it is
    gone, the whole job gets SIGKILL (the Ray executor's launcher, whose death means Ray has
    taken the job's reservation back). With `keeper`, the job gets SIGKILL at the deadline
    the server recorded, even when no server is there to send it. `watch` looks for stopped
    processes meanwhile.

    Returns (main exit status in subprocess convention, wall time the last one was gone,
    number of escaped descendants killed, whether the owner's death killed it). SIGCHLD must
    be blocked by the caller so that `sigtimedwait` wakes on every child exit without a race
    against the reaping."""
    leader_code: int | None = None
    orphaned = False
    while True:
        status = _reap_ready(leader)
        if status is not None:
            leader_code = os.waitstatus_to_exitcode(status)
        if leader_code is not None and not group_alive(leader):
            break
        if owner is not None and not orphaned and not process_alive(*owner):
            orphaned = True
            kill_whole(leader, group)
        left = None if keeper is None else keeper.until_due(leader)
        if watch is not None:
            watch.look()
        signal.sigtimedwait([signal.SIGCHLD], POLL_S if left is None else min(POLL_S, left))
    escaped = 0
    if group is not None:
        escaped = _empty_cgroup(group)
    escaped += _kill_escaped()
    return leader_code, time.time(), escaped, orphaned


def kill_whole(leader: int, group: cgroups.Group | None) -> None:
    """SIGKILL the whole job: its process group, and every process in its cgroup."""
    _kill_group(leader)
    if group is not None:
        try:
            cgroups.kill(group)
        except OSError:
            pass


def _empty_cgroup(group: cgroups.Group) -> int:
    """Kill what is left in the job's cgroup and wait until it is empty, reaping the shim's
    children meanwhile (the killed are re-parented to the shim, a subreaper). Returns how many
    processes were killed."""
    killed = 0
    wait = 0.005
    while True:
        try:
            found = cgroups.kill(group)
        except OSError:
            found = 0
        killed += found
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        if not cgroups.procs(group):
            return killed
        # A process that does not die at once (in the kernel, on a stuck device) is waited for,
        # killed again less and less often: the attempt ends only once it is gone.
        signal.sigtimedwait([signal.SIGCHLD], wait)
        wait = min(wait * 2, POLL_S)


JOB_UMASK = 0o022
"""The job's umask: the usual default, not the server's 077 (the job's own directories are
private anyway; files it shares on purpose, in a place it may write to, stay readable)."""


def _in_child(launch: dict[str, Any], group: cgroups.Group | None) -> Callable[[], None]:
    """What the job's process does between fork and exec, in this order: default signal
    handling, its cgroup (while it is still privileged: a process that dropped them cannot
    move itself), its own resource limits, then the identity it runs as (`identity` in the
    launch: uid, gid and supplementary groups; the shim itself stays privileged, it must
    signal the job and write the exit file)."""
    identity = launch.get("identity")
    nofile = launch.get("open_files")

    def child() -> None:
        _reset_signals_in_child()
        if group is not None:
            cgroups.join(group)
        if nofile:
            _set_nofile(int(nofile[0]), int(nofile[1]))
        if identity:
            os.setgroups([int(g) for g in identity["groups"]])
            os.setregid(int(identity["gid"]), int(identity["gid"]))
            os.setreuid(int(identity["uid"]), int(identity["uid"]))

    return child


def _set_nofile(soft: int, hard: int) -> None:
    """The job's own RLIMIT_NOFILE, not the server's: `hard` where this process may raise its
    own that far (root), else as far as it may; `soft` at most the hard limit."""
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, hard), hard))
    except (ValueError, OSError):
        current = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        hard = hard if current == resource.RLIM_INFINITY else min(hard, current)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, hard), hard))


def _start_job(launch: dict[str, Any], log_fd: int, group: cgroups.Group | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        launch["argv"],
        cwd=launch["cwd"],
        env=launch["env"],
        stdin=subprocess.DEVNULL,
        stdout=log_fd,
        stderr=log_fd,
        start_new_session=True,
        close_fds=True,
        preexec_fn=_in_child(launch, group),
        umask=JOB_UMASK,
    )


def _make_cgroup(spec: dict[str, Any]) -> cgroups.Group:
    """The replica's cgroup as the launch's `cgroup` describes it (parent, name, bounds)."""
    parent = str(spec["parent"])
    layout = cgroups.find_layout(parent)
    if isinstance(layout, str):
        raise cgroups.CgroupError(errno.EPERM, f"no cgroup to contain it: {layout}")
    return cgroups.create(
        layout,
        parent,
        str(spec["name"]),
        max_processes=int(spec.get("max_processes") or 0),
        memory_bytes=int(spec.get("memory_bytes") or 0),
        deny_devices=tuple((str(k), int(a), int(b)) for k, a, b in spec.get("deny_devices") or ()),
    )


REFUSED = 75
"""The shim's exit status when its launch was refused (EX_TEMPFAIL): the status file existed,
an adopter having revoked the launch (the attempt was requeued while this launch was on its way)."""


def refusal(status_path: Path) -> str:
    """Why a launch was refused, from the status file that was there before it."""
    record = read_json(status_path) or {}
    why = record.get(REVOKED)
    return f"the launch was revoked ({why})" if why else f"{status_path} exists: this replica was launched before"


def supervise(launch: dict[str, Any], ready_fd: int | None = None) -> int:
    """Claim the launch (its status file, `claim_launch`), start the job, record it, wait for
    its whole process group, record the exit. A launch whose status file exists already (an
    adopter revoked it: `revoke_launch`) starts nothing and returns `REFUSED`."""
    status_path, exit_path = Path(launch["status"]), Path(launch["exit"])
    subreaper = _become_subreaper()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    for sig in _SUPERVISOR_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    uid = (launch.get("identity") or {}).get("uid", os.geteuid())
    me = {
        "shim_pid": os.getpid(),
        "shim_start_ticks": start_ticks(os.getpid()),
        "subreaper": subreaper,
        "uid": uid,
        "private_dirs": launch.get("private_dirs", []),
        **launch.get("extra_status", {}),
    }
    log_fd = os.open(launch["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    group: cgroups.Group | None = None
    try:
        me["claimed_at"] = time.time()
        if not claim_launch(status_path, me):
            os.write(log_fd, f"warden-shim: not started: {refusal(status_path)}\n".encode())
            _signal_ready(ready_fd, b"no")
            return REFUSED
        if launch.get("cgroup"):
            group = _make_cgroup(launch["cgroup"])
            me["cgroup"] = group.record()
        proc = _start_job(launch, log_fd, group)
    except (OSError, subprocess.SubprocessError) as exc:
        if isinstance(exc, cgroups.CgroupError):
            code, error = 126, f"cannot start {launch['argv'][0]!r}: {exc.strerror or exc}"
        elif isinstance(exc, OSError):
            code = 127 if exc.errno in (errno.ENOENT, errno.ENOTDIR) else 126
            error = f"cannot start {launch['argv'][0]!r}: {exc.strerror or exc}"
        else:  # the child failed before exec: its cgroup, its limits or its identity
            code, error = 126, f"cannot start {launch['argv'][0]!r}: its process could not be set up ({exc})"
        os.write(log_fd, f"warden-shim: {error}\n".encode())
        now = time.time()
        if group is not None:
            _empty_cgroup(group)
            cgroups.remove(group)
        write_json_atomic(status_path, {**me, "pid": None, "pgid": None, "started_at": now, "error": error})
        _signal_ready(ready_fd)
        write_json_atomic(exit_path, {"exit_code": code, "ended_at": now, "error": error, "escaped_killed": 0})
        return 0
    finally:
        os.close(log_fd)
    if launch.get("forward_sigterm"):
        signal.signal(signal.SIGTERM, lambda _sig, _frame: _terminate_group(proc.pid))
    started_at, started_mono = time.time(), time.monotonic()
    write_json_atomic(
        status_path,
        {**me, "pid": proc.pid, "pgid": proc.pid, "started_at": started_at, "job_start_ticks": start_ticks(proc.pid)},
    )
    _signal_ready(ready_fd)
    owner = launch.get("owner")
    limit = launch.get("time_limit_s")
    slack = launch.get("time_limit_slack_s")
    limit_s = float(limit) + (TIME_LIMIT_SLACK_S if slack is None else float(slack)) if limit is not None else None
    watch_ref: list[StopWatch] = []
    keeper = DeadlineKeeper(
        Path(launch["control"]) if launch.get("control") else None,
        limit_at=None if limit_s is None else started_at + limit_s,
        limit_mono=None if limit_s is None else started_mono + limit_s,
        grace_s=float(launch.get("grace_s") or 0.0),
        kill=lambda leader: kill_whole(leader, group),
        changed=lambda: watch_ref[0].write() if watch_ref else None,
    )
    heartbeat = launch.get("heartbeat_s")
    watch = StopWatch(
        Path(launch["seen"]) if launch.get("seen") else None,
        proc.pid,
        group,
        keeper,
        None if heartbeat is None else float(heartbeat),
    )
    watch_ref.append(watch)
    code, ended_at, escaped, orphaned = wait_for_group(
        proc.pid, None if owner is None else (int(owner["pid"]), owner.get("ticks")), keeper, group, watch
    )
    proc.returncode = code  # reaped by wait_for_group; keeps Popen from waiting again
    why = f"its owner (pid {owner['pid']}) was gone, so it was killed" if orphaned and owner else None
    record = {
        "exit_code": code,
        "ended_at": ended_at,
        "error": why,
        "escaped_killed": escaped,
        "orphaned": orphaned,
        "killed_at": keeper.killed_at,
        "limit_sigterm_at": keeper.limit_sigterm_at,
        "limit_kill_at": keeper.limit_kill_at,
        "stopped_since": watch.stopped_since,
    }
    if group is not None:
        record["oom_kills"] = cgroups.oom_kills(group)
        record["cgroup_removed"] = cgroups.remove(group)
    write_json_atomic(exit_path, record)
    return 0


def _signal_ready(ready_fd: int | None, answer: bytes = b"ok") -> None:
    if ready_fd is not None:
        os.write(ready_fd, answer)
        os.close(ready_fd)


def _detach() -> int:
    """Fork; the first process waits until the shim has written its status file (or died, or
    was refused its launch: `REFUSED`) and exits, so the shim is re-parented away from the server and never becomes its zombie.
    Returns, in the shim, the write end of the readiness pipe."""
    read_fd, write_fd = os.pipe()
    if os.fork() > 0:
        os.close(write_fd)
        answer = os.read(read_fd, 2)
        os._exit(0 if answer == b"ok" else REFUSED if answer == b"no" else 1)
    os.close(read_fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # stdout and stderr stay where the executor pointed them (the log)
    os.close(devnull)
    return write_fd


def main() -> int:
    launch = json.loads(sys.stdin.buffer.read())
    ready_fd = _detach()
    return supervise(launch, ready_fd)


if __name__ == "__main__":
    sys.exit(main())
