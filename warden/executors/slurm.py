"""The `slurm` executor: warden decides, an existing Slurm cluster runs the processes.

warden's engine chooses the nodes and GPU indices of every replica; this executor turns an
admitted gang into a Slurm batch job pinned there (`--nodelist`, per-node task and GPU counts),
submitted held and released at once, so that Slurm's own scheduler has nothing to decide. The
job's batch script is warden's batch supervisor (`warden.executors.slurm_launch`), which runs one
`srun` step with one task per replica; each task runs the job command with the environment of
DESIGN §6, exactly as the local executor builds it. Slurm cannot be asked for given GPU
indices, only for a count per node: each task runs on the GPUs Slurm bound, and `devices` reads
them back from Slurm (`IDX`) so that the server records where the attempt really runs.

Signals are warden's, timed by warden: `terminate` sends SIGTERM to the batch supervisor and to
every task (whose supervisor passes it on to its replica) in two concurrent `scancel` calls, and warden's own timer sends SIGKILL
at the deadline (`scancel --signal=KILL JOB.0`, the replicas' step), then ends the job. Slurm's `GraceTime` poll
and its preemption are never involved. The cluster must track processes by cgroup
(`proctrack/cgroup`, checked at start), so that nothing of an attempt outlives its Slurm job.

A gang whose nodes do not all run the same number of replicas becomes one Slurm job per
distinct count (Slurm's heterogeneous jobs are started only by its backfill pass, every 30 s
by default); the jobs of an attempt are signalled, killed and reported together.

Only warden submits to the partition or changes its jobs (warden's job_submit.lua, checked at
start); every job warden submits carries its mark (`AdminComment=warden`, which only root and
SlurmUser may set) before it is released, and a job without it is never taken for warden's.
What a job writes (its `job/` subdirectory of the attempt's) is believed only as far as Slurm's
own job states agree.

The nodes and their states come from `sinfo` (GRES types are flavors, the leaf switches of
`topology/tree` are blocks), polled with the jobs' states by one thread. See
docs/executors.md and docs/slurm.md.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from warden.engine.model import DEFAULT_FLAVOR, Node
from warden.executors.base import (
    Devices,
    Exit,
    Fenced,
    Handle,
    Inventory,
    LaunchError,
    LaunchSpec,
    ReplicaHandle,
    ReplicaLaunch,
)
from warden.executors.identity import Identities, Identity
from warden.executors.local import (
    identity_environment,
    inherited_environment,
    job_environment,
    make_dirs,
)
from warden.executors.outside import HEARTBEAT_S, ended_outside, kept_time_limit
from warden.executors.records import (
    CONTROL_FILE,
    read_job_json,
    record_ended_at,
    record_exit_code,
    record_killed_at,
    revoke_unstarted,
    write_json_atomic,
)
from warden.executors.slurm_launch import BATCH_SIGNALS, JOB_DIR, LAUNCH_FILE
from warden.executors.tracking import Key, RemoteAttemptTable

log = logging.getLogger("warden.executors.slurm")

JOB_PREFIX = "warden"
"""Every Slurm job warden submits is named `warden.<job>.<attempt>`: how a restarted server
finds its jobs, and how it tells them from anybody else's."""
NAME_RE = re.compile(r"warden\.([0-9]+)\.([0-9]+)")
MARK = "warden"
"""The AdminComment warden sets on every job it submits (`scontrol update`, before releasing
it): only root and SlurmUser may set one, so a job named like an attempt but submitted by anyone
else is never taken for warden's (never adopted, cancelled at restart)."""
JOB_SUBMIT_MARKER = "warden job_submit rules"
"""The line that identifies warden's job_submit.lua (deploy/slurm/job_submit.lua)."""
OUTSIDE_ENDS = frozenset({"BOOT_FAIL", "CANCELLED", "DEADLINE", "NODE_FAIL", "PREEMPTED", "REVOKED", "TIMEOUT"})
"""Slurm job states that only something other than the job's own processes brings about: when
warden did not signal the attempt, the attempt was ended behind its back (evicted, not failed)."""
HOLDING = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "CONFIGURING"})
"""Slurm job states in which a job holds its nodes' GPUs."""
ENDED = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
        "TIMEOUT",
    }
)
"""Slurm job states after which no process of the job is left (COMPLETING is not one)."""
USABLE_STATES = frozenset({"idle", "mixed", "allocated", "completing", "planned"})
UNUSABLE_FLAGS = "*~#!%$@^"
"""sinfo's state suffixes for a node that takes no job now: not responding, powered down,
powering up or down, in maintenance, rebooting."""
SLURM_TIMEOUT_S = 30.0
STEP = 0
"""The id of the one step the batch supervisor runs (its `srun`): the replicas' processes."""


class SlurmError(RuntimeError):
    """A Slurm command failed, or the cluster is set up so that Slurm would decide for warden."""


# -- Slurm's commands ------------------------------------------------------------------------


class Slurm:
    """Slurm's client commands, each with a time limit; `conf` points them at a cluster
    (`SLURM_CONF`), else the environment's."""

    def __init__(self, conf: Path | None = None, timeout_s: float = SLURM_TIMEOUT_S) -> None:
        self.env = {**os.environ, **({"SLURM_CONF": str(conf)} if conf is not None else {})}
        self.timeout_s = timeout_s
        self.guard: Callable[[str], None] | None = None
        """Called with the command line before every command that changes the cluster
        (`sbatch`, `scancel`, `scontrol update|release|…`): raises to refuse it (a fenced
        executor, `Executor.fence`). Queries are never refused."""

    def _check(self, argv: tuple[str, ...]) -> None:
        if self.guard is not None and _changes_cluster(argv):
            self.guard(shlex.join(argv))

    def run(self, *argv: str, check: bool = True, stdin: str | None = None) -> str:
        self._check(argv)
        try:
            done = subprocess.run(
                list(argv),
                input=stdin,
                capture_output=True,
                text=True,
                env=self.env,
                timeout=self.timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise SlurmError(f"{argv[0]}: {err}") from err
        if check and done.returncode != 0:
            raise SlurmError(
                f"{shlex.join(argv)} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}"
            )
        return done.stdout

    def start(self, *argv: str) -> subprocess.Popen[str]:
        """Start a command without waiting (signals that must leave together)."""
        self._check(argv)
        return subprocess.Popen(list(argv), env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


_CHANGING = frozenset({"sbatch", "scancel", "srun", "salloc"})
_SCONTROL_READS = frozenset({"show", "ping", "listpids", "version", "-o"})


def _changes_cluster(argv: tuple[str, ...]) -> bool:
    """Whether a Slurm command line changes the cluster (everything but queries)."""
    command = os.path.basename(argv[0]) if argv else ""
    if command == "scontrol":
        words = [a for a in argv[1:] if a != "-o"]
        return not words or words[0] not in _SCONTROL_READS
    return command in _CHANGING


# -- the cluster -----------------------------------------------------------------------------


def expand_hostlist(text: str) -> list[str]:
    """Slurm's hostlist syntax: `n[0-3,7],gpu[01-02]-a` -> every name, in order."""
    names: list[str] = []
    for part in _split_top(text):
        names.extend(_expand_one(part))
    return names


def _split_top(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text.strip():
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        depth += ch == "["
        depth -= ch == "]"
        current.append(ch)
    if current:
        parts.append("".join(current))
    return [p for p in parts if p]


def _expand_one(part: str) -> list[str]:
    open_at = part.find("[")
    if open_at < 0:
        return [part]
    close_at = part.find("]", open_at)
    if close_at < 0:
        raise ValueError(f"hostlist {part!r}: '[' without ']'")
    head, body, tail = part[:open_at], part[open_at + 1 : close_at], part[close_at + 1 :]
    out: list[str] = []
    for item in body.split(","):
        lo, _, hi = item.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"hostlist {part!r}: {item!r} is not a number or range")
        width = len(lo)
        for n in range(int(lo), int(hi or lo) + 1):
            out.extend(head + str(n).zfill(width) + rest for rest in _expand_one(tail))
    return out


@dataclass(frozen=True, slots=True)
class SlurmNode:
    """One node as sinfo shows it."""

    node: Node
    addr: str
    state: str
    reason: str

    @property
    def usable(self) -> bool:
        base = self.state.rstrip("+-" + UNUSABLE_FLAGS)
        return base in USABLE_STATES and not any(flag in self.state for flag in UNUSABLE_FLAGS)


SINFO_FORMAT = "%N|%o|%T|%G|%c|%m|%E"


def parse_gres(gres: str) -> tuple[int, str | None]:
    """GPUs and their type from sinfo's GRES (`gpu:8`, `gpu:a100:8(S:0-1)`, `(null)`).
    ValueError for a node with GPUs of two types (a node is one flavor to warden)."""
    count, kinds = 0, set()
    for entry in _split_top(gres):
        entry = re.sub(r"\(.*\)$", "", entry.strip())
        fields = entry.split(":")
        if fields[0] != "gpu" or len(fields) < 2:
            continue
        number = fields[-1]
        if not number.isdigit():
            raise ValueError(f"GRES {gres!r}: GPU count {number!r} is not a number")
        count += int(number)
        kinds.add(fields[1] if len(fields) >= 3 else None)
    if len(kinds) > 1:
        raise ValueError(f"GRES {gres!r}: GPUs of several types on one node")
    return count, next(iter(kinds), None)


def parse_sinfo(text: str, blocks: Mapping[str, str]) -> list[SlurmNode]:
    """`sinfo -h -N -o SINFO_FORMAT` lines as nodes (a node listed once per partition is kept once)."""
    nodes: dict[str, SlurmNode] = {}
    for line in text.splitlines():
        fields = line.split("|", 6)
        if len(fields) != 7 or fields[0] in nodes:
            continue
        name, addr, state, gres, cpus, memory, reason = fields
        try:
            gpus, kind = parse_gres(gres)
        except ValueError as err:
            log.warning("node %s is left out: %s", name, err)
            continue
        node = Node(
            name,
            gpus,
            cpu=int(cpus) * 1000 if cpus.isdigit() else 0,
            memory=int(memory) if memory.isdigit() else 0,
            flavor=kind or DEFAULT_FLAVOR,
            block=blocks.get(name),
        )
        nodes[name] = SlurmNode(node, addr, state, "" if reason in ("none", "(null)") else reason)
    return sorted(nodes.values(), key=lambda n: n.node.name)


def parse_topology(text: str) -> dict[str, str]:
    """Node -> the leaf switch it hangs off (`scontrol show topology`, topology/tree): a block."""
    blocks: dict[str, str] = {}
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("Level") == "0" and fields.get("Nodes") and "SwitchName" in fields:
            for name in expand_hostlist(fields["Nodes"]):
                blocks.setdefault(name, fields["SwitchName"])
    return blocks


def parse_squeue(text: str) -> dict[str, tuple[str, str, str]]:
    """`squeue -h -t all -o '%A|%j|%T|%r'` -> Slurm job id -> (name, state, reason)."""
    jobs = {}
    for line in text.splitlines():
        fields = line.split("|", 3)
        if len(fields) == 4 and fields[0].strip():
            jobs[fields[0].strip()] = (fields[1], fields[2], fields[3])
    return jobs


class SlurmJob(NamedTuple):
    """One job as `squeue --json` shows it."""

    name: str
    state: str
    reason: str
    marked: bool  # its AdminComment is warden's mark
    gpus: Mapping[str, int]  # GPUs allocated per node (empty until it runs)
    partition: str = ""
    indices: Mapping[str, tuple[int, ...]] = {}  # which GPUs per node, where Slurm says (`IDX:`)
    ended_at: float | None = None  # when it ended, as Slurm recorded it (whole seconds); None while it runs


def parse_squeue_json(text: str, partition: str) -> dict[str, SlurmJob]:
    """`squeue --json` (22.05's, which ignores squeue's filters) -> the jobs of `partition` by
    Slurm id, with warden's mark and the GPUs each holds per node (`gres_detail`, one entry per
    allocated node in `job_resources`' order)."""
    jobs: dict[str, SlurmJob] = {}
    for job in json.loads(text).get("jobs", []):
        if partition not in str(job.get("partition", "")).split(","):
            continue
        state = job.get("job_state", "")
        state = str(state[0] if isinstance(state, list) and state else state)
        nodes = [n.get("nodename", "") for n in (job.get("job_resources") or {}).get("allocated_nodes", []) or []]
        gpus: dict[str, int] = {}
        indices: dict[str, tuple[int, ...]] = {}
        for node, gres in zip(nodes, job.get("gres_detail") or []):
            count, _ = _gres_count(str(gres))
            if count:
                gpus[node] = gpus.get(node, 0) + count
                which = gres_indices(str(gres))
                if which is not None and len(which) == count:
                    indices[node] = which
        jobs[str(job.get("job_id", ""))] = SlurmJob(
            str(job.get("name", "")),
            state,
            str(job.get("state_reason", "")),
            job.get("admin_comment") == MARK,
            gpus,
            str(job.get("partition", "")),
            indices,
            _slurm_time(job.get("end_time")) if state in ENDED else None,
        )
    return jobs


def _slurm_time(value: Any) -> float | None:
    """A time `squeue --json` gives (seconds since the epoch: a number in 22.05, `{"set": true,
    "number": N}` later); None when unset or not a positive finite number."""
    if isinstance(value, Mapping):
        value = value.get("number") if value.get("set", True) and not value.get("infinite") else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        return None
    return float(value)


_GPU_IDX = re.compile(r"(?:^|,)gpu(?::[^:(,]+)?:\d+\(IDX:([^)]*)\)")


def gres_indices(gres: str) -> tuple[int, ...] | None:
    """Which GPUs a job holds on a node, from its `gres_detail` entry (`gpu:2(IDX:0-1)`,
    `gpu:a100:3(IDX:0,2-3)`), sorted; None where Slurm does not say (`IDX:N/A`, no IDX)."""
    found: set[int] = set()
    matches = _GPU_IDX.findall(gres)
    if not matches:
        return None
    for spec in matches:
        for part in spec.split(","):
            low, _, high = part.partition("-")
            if not low.isdigit() or (high and not high.isdigit()):
                return None
            found.update(range(int(low), int(high or low) + 1))
    return tuple(sorted(found))


def _gres_count(gres: str) -> tuple[int, str | None]:
    try:
        return parse_gres(re.sub(r"\(IDX:[^)]*\)", "", gres))
    except ValueError:
        return 0, None


def parse_keyvalues(line: str) -> dict[str, str]:
    """`scontrol -o show ...` output: `Key=Value` words (a value holds no blank)."""
    return dict(word.split("=", 1) for word in line.split() if "=" in word)


# -- the executor ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Tracked:
    handle: Handle
    slurm_ids: tuple[str, ...]
    submitted_mono: float
    signalled_at: float | None = None
    kill_at: float | None = None
    kill_mono: float | None = None
    killed_at: float | None = None
    terminating_at: float | None = None
    ran: bool = False  # Slurm showed a job of it running (or its tasks wrote a status file)
    started: bool = False  # every replica's status file is written: reported by `started()`
    warned: bool = False  # the log said it is still pending in Slurm
    ended_mono: float | None = None
    floor: float = 0.0  # the earliest an exit of it can be: its submission (wall clock)
    running_at: float | None = None  # the latest poll (wall clock) that saw a job of it running
    nodes: tuple[str, ...] = ()  # per rank, its node (empty for an adopted attempt)
    gpus: tuple[int, ...] = ()  # per rank, how many GPUs


@dataclass(slots=True)
class _Poll:
    """What the poller saw last: job states and nodes, and when the poll began."""

    began: float = 0.0
    jobs: dict[str, SlurmJob] = field(default_factory=dict)
    nodes: tuple[SlurmNode, ...] = ()

    def foreign(self) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
        """The GPUs per node held by the partition's jobs that do not carry warden's mark: by
        index where Slurm says which (`IDX:`), else how many."""
        known: dict[str, set[int]] = {}
        unknown: dict[str, int] = {}
        for job in self.jobs.values():
            if not job.marked and job.state in HOLDING:
                for node, count in job.gpus.items():
                    which = job.indices.get(node)
                    if which is not None:
                        known.setdefault(node, set()).update(which)
                    else:
                        unknown[node] = unknown.get(node, 0) + count
        return {n: tuple(sorted(g)) for n, g in known.items()}, unknown

    def devices(self, slurm_ids: Sequence[str], nodes: Sequence[str], gpus: Sequence[int]) -> Devices:
        """Per rank, the GPUs Slurm bound the replica to (None: not known yet): each node's
        indices of the attempt's jobs, handed to the replicas there in rank order, `gpus` each,
        as the batch supervisor's tasks take them (`warden.executors.slurm_launch.task`)."""
        on: dict[str, tuple[int, ...]] = {}
        for i in slurm_ids:
            job = self.jobs.get(i)
            if job is not None and job.state in HOLDING:
                on.update(job.indices)
        taken: dict[str, int] = {}
        out: list[tuple[int, ...] | None] = []
        for node, count in zip(nodes, gpus):
            first = taken.get(node, 0)
            taken[node] = first + count
            which = on.get(node)
            out.append(None if which is None or len(which) < first + count else which[first : first + count])
        return tuple(out)


def job_name(job_id: str, attempt: int) -> str:
    return f"{JOB_PREFIX}.{job_id}.{attempt}"


class SlurmExecutor(RemoteAttemptTable[_Tracked]):
    """Runs attempts as Slurm batch jobs in one partition that warden governs alone.

    `partition` is the Slurm partition (default: the cluster's default one); `conf` a
    `slurm.conf` for the client commands (default: `SLURM_CONF` or Slurm's own default);
    `poll_s` how often job and node states are read; `pending_warning_s` how long a released
    job may stay pending before the log says so, with Slurm's reason (it is left to start: under
    a burst Slurm starts at most `default_queue_depth` jobs per scheduling pass; a node that
    goes down evicts what waits for it)."""

    def __init__(
        self,
        *,
        partition: str | None = None,
        conf: Path | None = None,
        base_env: Mapping[str, str] | None = None,
        python: str = sys.executable,
        poll_s: float = 0.5,
        pending_warning_s: float = 60.0,
        check: bool = True,
        identities: Identities | None = None,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        if identities is not None and identities.mode == "dynamic":
            raise SlurmError(
                "Slurm runs jobs only as accounts its nodes know, not as warden's dynamic uids: run jobs as their "
                "users' accounts (--run-as user, with --user-map USER=ACCOUNT or '*=ACCOUNT')"
            )
        self.identities = identities
        self.slurm = Slurm(conf)
        self.partition = partition or self._default_partition()
        self.unconstrained: list[str] | None = None
        """What the cluster leaves a job free to do beyond its plan (`unconstrained`), from the
        start check; None where it was not checked."""
        if check:
            run_as_user = identities is not None and identities.mode == "user"
            self.unconstrained = check_cluster(self.slurm, self.partition, run_as_user=run_as_user)
        self._base_env = base_env
        self._python = python
        self._poll_s = poll_s
        self._pending_warning_s = pending_warning_s
        super().__init__(heartbeat_s)
        self._poll = _Poll()
        self._polled = threading.Condition(self._lock)
        self._blocks: dict[str, str] = {}
        self._refresh_topology()
        self._poll_once()
        self._to_release: list[str] = []
        self._release_due = threading.Condition(self._lock)
        self._poller = threading.Thread(target=self._poll_loop, name="warden-slurm-poll", daemon=True)
        self._poller.start()
        self._releaser = threading.Thread(target=self._release_loop, name="warden-slurm-release", daemon=True)
        self._releaser.start()

    # -- the cluster -----------------------------------------------------------------------

    def containment(self) -> str:
        """How Slurm contains this executor's jobs, in one line (the server says it at start)."""
        if self.unconstrained is None:
            return "not checked: Slurm's configuration was not read"
        line = "Slurm's cgroups (proctrack/cgroup): no process of an attempt outlives it"
        if self.unconstrained:
            return line + "; not bounded: " + "; ".join(self.unconstrained)
        return line + "; each job opens only the GPU devices Slurm allocated it (ConstrainDevices)"

    def _default_partition(self) -> str:
        for line in self.slurm.run("scontrol", "-o", "show", "partition").splitlines():
            fields = parse_keyvalues(line)
            if fields.get("Default") == "YES":
                return fields["PartitionName"]
        raise SlurmError("the cluster has no default partition: name one (--slurm-partition)")

    def _refresh_topology(self) -> None:
        out = self.slurm.run("scontrol", "show", "topology", check=False)
        self._blocks = parse_topology(out)

    def inventory(self) -> Inventory:
        """The partition's nodes as last polled; a node that is down, drained, draining, not
        responding or powered off is in `down` with its state and Slurm's reason; GPUs that jobs
        without warden's mark hold (an admin's) are in `foreign`."""
        with self._lock:
            nodes = self._poll.nodes
            foreign, unknown = self._poll.foreign()
        down = {
            n.node.name: f"{n.state.upper()}" + (f" ({n.reason})" if n.reason else "") for n in nodes if not n.usable
        }
        return Inventory(tuple(n.node for n in nodes), down, foreign=foreign, foreign_unknown=unknown)

    def _addresses(self) -> dict[str, str]:
        with self._lock:
            return {n.node.name: n.addr for n in self._poll.nodes}

    # -- polling ---------------------------------------------------------------------------

    def _poll_loop(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
            try:
                self._poll_once()
            except Exception:  # a failed poll is retried; the states stay as last read
                log.exception("reading Slurm's job and node states failed")
            time.sleep(self._poll_s)

    def _poll_once(self) -> None:
        began = time.monotonic()
        jobs = self._read_jobs()
        nodes = parse_sinfo(self.slurm.run("sinfo", "-h", "-N", "-p", self.partition, "-o", SINFO_FORMAT), self._blocks)
        with self._lock:
            changed = (jobs, tuple(nodes)) != (self._poll.jobs, self._poll.nodes)
            self._poll = _Poll(began, jobs, tuple(nodes))
            self._polled.notify_all()
        if changed:  # a job started or ended, a node changed state
            self._woken()

    def _read_jobs(self) -> dict[str, SlurmJob]:
        try:
            return parse_squeue_json(self.slurm.run("squeue", "--json"), self.partition)
        except (ValueError, AttributeError, TypeError) as err:
            raise SlurmError(f"squeue --json: unreadable output: {err}") from err

    def wait_poll(self, timeout_s: float = 10.0) -> None:
        """Block until a poll that began after this call has finished (tests, and `recover`)."""
        asked = time.monotonic()
        with self._polled:
            self._polled.wait_for(lambda: self._poll.began >= asked or self._closed, timeout=timeout_s)

    # -- start -----------------------------------------------------------------------------

    def _hand_over(self, spec: LaunchSpec, key: Key) -> Handle:
        """Submit the attempt held, pinned where warden placed it; a thread releases it at once
        (with whatever else was submitted meanwhile)."""
        identity = self._identity(spec)
        make_dirs(spec.log_dir)  # the server's: 0711, the job passes through it and reads launch.json
        make_dirs(spec.checkpoint_dir)
        if spec.log_dir.is_symlink() or spec.log_dir.stat().st_uid != os.getuid():
            raise LaunchError(f"job {spec.job_id!r}: {spec.log_dir} is not the server's own directory")
        os.chmod(spec.log_dir, 0o711)
        out = spec.log_dir / JOB_DIR
        for stale in [spec.log_dir / LAUNCH_FILE, spec.log_dir / CONTROL_FILE]:
            stale.unlink(missing_ok=True)
        if out.is_dir() and not out.is_symlink():  # an earlier try of this attempt: its records are stale
            for stale in [*out.glob("*.json"), out / BATCH_SIGNALS]:
                stale.unlink(missing_ok=True)  # unlink never follows a link
        else:
            out.unlink(missing_ok=True)
            out.mkdir(0o700)
        launch = spec.log_dir / LAUNCH_FILE
        write_json_atomic(launch, self._launch(spec, identity))  # 0600: the submission's environment
        if identity is not None:  # its tasks read launch.json and write their logs and records in out
            for path in (out, launch, spec.checkpoint_dir):
                os.chown(path, identity.uid, identity.gid, follow_symlinks=False)
            os.chmod(out, 0o700)
            os.chmod(spec.checkpoint_dir, 0o700)
        ids: list[str] = []
        submitted = time.time()
        try:
            for nodes, per_node in _groups(spec.replicas):
                ids.append(self._submit(spec, nodes, per_node, identity))
        except SlurmError as err:
            if ids:
                self.slurm.run("scancel", *ids, check=False)
            raise LaunchError(f"job {spec.job_id!r} attempt {spec.attempt}: {err}") from err
        handle = Handle(
            spec.job_id,
            spec.attempt,
            tuple(ReplicaHandle.in_dir(out, r.rank) for r in sorted(spec.replicas, key=lambda r: r.rank)),
            control_path=spec.log_dir / CONTROL_FILE,
            external=tuple(ids),
        )
        with self._lock:
            self._tracked[key] = _Tracked(
                handle,
                tuple(ids),
                time.monotonic(),
                floor=submitted,
                nodes=tuple(r.node for r in sorted(spec.replicas, key=lambda r: r.rank)),
                gpus=tuple(len(r.gpus) for r in sorted(spec.replicas, key=lambda r: r.rank)),
            )
            self._to_release.extend(ids)
            self._release_due.notify()
        return handle

    def _release_loop(self) -> None:
        """Release the held jobs `start` submitted, all that queued up meanwhile in one
        `scontrol release`: under a burst of admissions one call releases dozens."""
        while True:
            with self._release_due:
                self._release_due.wait_for(lambda: bool(self._to_release) or self._closed)
                if self._closed:
                    return
                ids, self._to_release = self._to_release, []
            try:
                self._mark_and_release(ids)
            except Fenced as err:  # the lead was lost between submission and release
                log.warning("Slurm jobs %s stay held: %s; the next leader releases them", ",".join(ids), err)

    def _mark_and_release(self, ids: Sequence[str]) -> None:
        """Set warden's mark on held jobs warden submitted, then release them (a job is never
        running without the mark)."""
        try:
            self.slurm.run("scontrol", "update", f"JobId={','.join(ids)}", f"AdminComment={MARK}")
            self.slurm.run("scontrol", "release", ",".join(ids))
        except SlurmError:
            log.exception("releasing Slurm jobs %s failed; they are released one by one", ",".join(ids))
            for one in ids:  # one that was cancelled meanwhile must not keep the others held
                try:
                    self.slurm.run("scontrol", "update", f"JobId={one}", f"AdminComment={MARK}")
                except SlurmError:
                    continue  # never released unmarked: it stays held, its attempt pending in Slurm
                self.slurm.run("scontrol", "release", one, check=False)

    def _identity(self, spec: LaunchSpec) -> Identity | None:
        """The account the attempt runs as (None: the server's); LaunchError when the
        submitting user has none."""
        if self.identities is None or self.identities.mode != "user":
            return None
        identity = self.identities.account(spec.user or "")
        if identity is None:
            raise LaunchError(
                f"job {spec.job_id!r}: warden user {spec.user!r} has no Unix account Slurm may run it as "
                "(map one with --user-map USER=ACCOUNT, or '*=ACCOUNT' for every user)"
            )
        return identity

    def _launch(self, spec: LaunchSpec, identity: Identity | None) -> dict[str, Any]:
        """launch.json: what every task needs to run its replica."""
        base = inherited_environment(os.environ) if self._base_env is None else dict(self._base_env)
        who = identity_environment(identity, spec.log_dir / JOB_DIR / "home")
        ordered = sorted(spec.replicas, key=lambda r: r.rank)
        master = self._addresses().get(ordered[0].node, ordered[0].node)
        replicas = []
        for r in ordered:
            env = job_environment(
                spec,
                r,
                master_port=spec.master_port,
                log_path=spec.log_dir / JOB_DIR / f"rank-{r.rank}.log",
                base=base,
                identity=who,
                master_addr=master,
            )
            if spec.master_port is None:
                env.pop("MASTER_PORT", None)  # rank 0 picks one on its node (slurm_launch)
            replicas.append({"rank": r.rank, "node": r.node, "gpus": list(r.gpus), "env": env})
        return {
            "argv": list(spec.command),
            "cwd": str(spec.workdir),
            "world_size": spec.world_size,
            "replicas": replicas,
            "grace_s": spec.grace_s,  # the supervisors keep the time limit while no server does
            "time_limit_s": spec.time_limit_s,
            "heartbeat_s": self.heartbeat_s,
        }

    def _submit(self, spec: LaunchSpec, nodes: Sequence[str], per_node: int, identity: Identity | None) -> str:
        first = next(r for r in spec.replicas if r.node == nodes[0])
        gpus = len(first.gpus) * per_node
        package = str(Path(__file__).resolve().parents[2])
        script = (
            f"#!/bin/sh\nPYTHONPATH={shlex.quote(package)}${{PYTHONPATH:+:$PYTHONPATH}} exec "
            f"{shlex.quote(self._python)} -m warden.executors.slurm_launch batch {shlex.quote(str(spec.log_dir))}\n"
        )
        argv = [
            "sbatch",
            "--parsable",
            "--hold",
            f"--job-name={job_name(spec.job_id, spec.attempt)}",
            f"--partition={self.partition}",
            "--no-requeue",
            "--no-kill",
            "--export=NONE",
            "--time=UNLIMITED",
            f"--chdir={spec.log_dir / JOB_DIR}",
            f"--output={spec.log_dir / JOB_DIR / 'batch.log'}",
            f"--nodes={len(nodes)}",
            f"--nodelist={','.join(nodes)}",
            f"--ntasks-per-node={per_node}",
            f"--cpus-per-task={max(1, math.ceil(spec.cpu / 1000))}",
        ]
        if gpus:
            argv.append(f"--gres=gpu:{gpus}")
        if spec.memory:
            argv.append(f"--mem={spec.memory * per_node}M")
        if identity is not None:
            argv += [f"--uid={identity.name or identity.uid}", f"--gid={identity.gid}"]
        out = self.slurm.run(*argv, stdin=script)
        return out.strip().split(";")[0]

    # -- signals ---------------------------------------------------------------------------

    def terminate(self, job_id: str, attempt: int, grace_s: float) -> float:
        """SIGTERM the batch supervisors and every task's processes at once (two `scancel`
        calls started together), and SIGKILL at the returned deadline by warden's own timer.
        An attempt Slurm has not started yet is cancelled instead (nothing to signal)."""
        if grace_s < 0:
            raise ValueError(f"grace_s must be >= 0, got {grace_s!r}")
        key = (job_id, attempt)
        with self._lock:
            tracked = self._get(key)
            if tracked.kill_at is not None:
                return tracked.kill_at
            ids, ran = tracked.slurm_ids, self._ran(tracked)
        if not ran:  # the last poll may be half a second old: ask Slurm now
            states = {job.state for job in self._jobs(ids).values()}
            ran = bool(states - {"PENDING"} - ENDED)
        if not ran:
            self.slurm.run("scancel", *ids, check=False)
            now = time.time()
            with self._lock:
                tracked.kill_at = now
            self._persist(tracked)
            return now
        self._announce(tracked)
        calls = [
            self.slurm.start("scancel", "--signal=TERM", "--batch", *ids),
            self.slurm.start("scancel", "--signal=TERM", *ids),
        ]
        for call in calls:
            call.wait()
        sent = time.time()
        self.slurm.run("scancel", "--signal=CONT", *ids, check=False)  # a stopped process handles SIGTERM once it runs
        return self._arm(key, tracked, sent, grace_s)

    def _kill(self, tracked: _Tracked) -> None:
        with self._lock:
            if tracked.killed_at is not None or not self._killing(tracked):
                return
        # SIGKILL to a step is sent at once; to a job, Slurm makes it a cancel (SIGTERM, KillWait, SIGKILL).
        self.slurm.run("scancel", "--signal=KILL", *(f"{i}.{STEP}" for i in tracked.slurm_ids), check=False)
        self.slurm.run("scancel", *tracked.slurm_ids, check=False)
        self._persist(tracked)

    def _ran(self, tracked: _Tracked) -> bool:
        """Did any job of the attempt start (under the lock)?"""
        if not tracked.ran:
            states = [job.state for job in (self._poll.jobs.get(i) for i in tracked.slurm_ids) if job is not None]
            tracked.ran = any(s in HOLDING for s in states) or any(
                r.status_path.exists() for r in tracked.handle.replicas
            )
        return tracked.ran

    # -- exits -----------------------------------------------------------------------------

    def exits(self) -> list[Exit]:
        """Attempts all of whose Slurm jobs have ended (Slurm's COMPLETING is not ended: its
        processes may still run), each reported once."""
        with self._lock:
            poll = self._poll
            candidates = list(self._tracked.items())
        done = []
        for key, tracked in candidates:
            if poll.began < tracked.submitted_mono:
                continue  # that poll may not show its jobs yet
            seen = {i: poll.jobs.get(i) for i in tracked.slurm_ids}
            if any(s is not None and s.state == "RUNNING" for s in seen.values()):
                tracked.running_at = max(tracked.running_at or 0.0, time.time() - (time.monotonic() - poll.began))
            if all(s is None or s.state in ENDED for s in seen.values()):
                done.append((key, tracked, seen))
                continue
            with self._lock:
                ran = self._ran(tracked)
            if not ran and not tracked.warned and time.monotonic() - tracked.submitted_mono > self._pending_warning_s:
                tracked.warned = True
                reasons = ", ".join(sorted({s.reason for s in seen.values() if s is not None}))
                log.warning(
                    "attempt %s of job %s is still pending in Slurm after %g s (reason: %s)",
                    tracked.handle.attempt,
                    tracked.handle.job_id,
                    self._pending_warning_s,
                    reasons,
                )
        reported = []
        with self._lock:
            for key, tracked, seen in done:
                if self._tracked.pop(key, None) is not None:
                    tracked.ended_mono = time.monotonic()
                    reported.append(_exit(tracked, seen))
        return reported

    def replica_exit_codes(self, job_id: str, attempt: int) -> tuple[int | None, ...]:
        with self._lock:
            tracked = self._get((job_id, attempt))
        return tuple(
            None if record is None else record_exit_code(record)
            for record in (read_job_json(r.exit_path) for r in tracked.handle.replicas)
        )

    # -- restart ---------------------------------------------------------------------------

    def devices(self, job_id: str, attempt: int) -> Devices | None:
        """Per rank, the GPUs Slurm allocated to the replica, from the last poll (`IDX:` of the
        attempt's jobs while they hold their nodes): Slurm is never asked for given indices,
        only for a count per node. Not known for an attempt adopted from an earlier server (it
        keeps the assignment that server recorded)."""
        with self._lock:
            tracked = self._tracked.get((job_id, attempt))
            if tracked is None or not tracked.nodes:
                n = 0 if tracked is None else len(tracked.handle.replicas)
                return tuple(None for _ in range(n))
            return self._poll.devices(tracked.slurm_ids, tracked.nodes, tracked.gpus)

    def adopt(self, handle: Handle, kill_at: float | None = None) -> None:
        """Track an attempt an earlier server process submitted; release it if that server
        stopped between submitting and releasing; re-arm its SIGKILL."""
        key = (handle.job_id, handle.attempt)
        control = self._control(handle)
        with self._lock:
            tracked = self._tracked.get(key)
            if tracked is None:
                tracked = _Tracked(
                    handle,
                    tuple(handle.external),
                    submitted_mono=time.monotonic(),
                    signalled_at=control.get("signalled_at"),
                    kill_at=control.get("kill_at"),
                    killed_at=control.get("killed_at"),
                    started=True,  # the server recovered its state itself
                    floor=_submitted_at(handle),
                )
                self._tracked[key] = tracked
            deadline = self._rearm(key, tracked, kill_at)
        held = [i for i, job in self._jobs(handle.external).items() if job.reason == "JobHeldUser"]
        if held and deadline is None:  # the ids are the server's own record: mark them if it could not
            self._mark_and_release(held)

    def _jobs(self, ids: Iterable[str]) -> dict[str, SlurmJob]:
        wanted = set(ids)
        if not wanted:
            return {}
        try:
            jobs = self._read_jobs()
        except SlurmError:
            return {}
        return {i: v for i, v in jobs.items() if i in wanted}

    def recover(self, job_id: str, attempt: int, log_dir: Path, replicas: int) -> Handle | None:
        """The handle of an attempt whose submission the server may not have seen return: its
        Slurm jobs, found by name and warden's mark (a job that only looks like one is never
        taken). None when Slurm has none (it was never submitted, or never marked: the restart's
        clean-up cancels it)."""
        name = job_name(job_id, attempt)
        ids = tuple(sorted(i for i, job in self._read_jobs().items() if job.name == name and job.marked))
        ranks = tuple(ReplicaHandle.in_dir(Path(log_dir) / JOB_DIR, rank) for rank in range(replicas))
        if not ids:
            revoke_unstarted(
                [r.status_path for r in ranks], f"attempt {attempt} of job {job_id} was recovered unstarted"
            )
            return None
        return Handle(
            job_id,
            attempt,
            ranks,
            control_path=Path(log_dir) / CONTROL_FILE,
            external=ids,
        )

    def cancel_unowned(self, owned: Iterable[tuple[str, int]]) -> list[str]:
        """Cancel the live Slurm jobs named as warden's whose attempt is not in `owned` (a
        submission the server never recorded, a database restored from a backup), and those
        named like an attempt without warden's mark (not warden's: only warden may use its
        partition), unless they are a tracked attempt's own jobs. Returns their Slurm ids."""
        keep = set(owned)
        with self._lock:
            keep |= set(self._tracked)
            mine = {i for t in self._tracked.values() for i in t.slurm_ids}
        orphans = []
        for slurm_id, job in self._read_jobs().items():
            match = NAME_RE.fullmatch(job.name)
            if not match or job.state in ENDED or slurm_id in mine:
                continue
            if not job.marked or (match[1], int(match[2])) not in keep:
                orphans.append(slurm_id)
        if orphans:
            log.warning("cancelling Slurm jobs no attempt owns: %s", ", ".join(orphans))
            self.slurm.run("scancel", *orphans, check=False)
        return orphans

    def fence(self, may_act: Callable[[], bool]) -> None:
        """Every Slurm command that changes the cluster goes through `Slurm.guard`."""
        super().fence(may_act)
        self.slurm.guard = self._acting

    def close(self) -> None:
        """Stop the poller and the timer. Jobs keep running (an adopter re-arms SIGKILL)."""
        with self._lock:
            self._closed = True
            self._polled.notify_all()
            self._release_due.notify_all()
        self._timer.close()
        self._releaser.join(timeout=SLURM_TIMEOUT_S)
        self._poller.join(timeout=self._poll_s + SLURM_TIMEOUT_S)


def _groups(replicas: Sequence[ReplicaLaunch]) -> list[tuple[list[str], int]]:
    """Nodes grouped by how many replicas each runs, in the order of their first rank: one
    Slurm job per group."""
    per_node: dict[str, int] = {}
    for r in sorted(replicas, key=lambda r: r.rank):
        per_node[r.node] = per_node.get(r.node, 0) + 1
    groups: dict[int, list[str]] = {}
    for node, count in per_node.items():
        groups.setdefault(count, []).append(node)
    return [(nodes, count) for count, nodes in groups.items()]


def _submitted_at(handle: Handle) -> float:
    """When an adopted attempt was submitted, at the latest: its launch file's change time (the
    server wrote and chowned it in its own directory; its owner, the job's account, may set its
    mtime but only ever move its ctime later), else 0."""
    if handle.control_path is None:
        return 0.0
    try:
        return os.stat(handle.control_path.parent / LAUNCH_FILE, follow_symlinks=False).st_ctime
    except OSError:
        return 0.0


def _exit(tracked: _Tracked, seen: Mapping[str, SlurmJob | None]) -> Exit:
    """The attempt's exit from its ranks' records, believed only as far as Slurm agrees: the
    records are the job's to write. An end time is kept inside what Slurm saw (`_end_bounds`);
    an exit code 0 of a Slurm job that did not end COMPLETED is not believed; a Slurm job ended
    by someone else (cancelled while warden never signalled it, timed out, its node failed) sets
    `ended_by`. The kill is the earliest SIGKILL at the deadline, the server's or one the ranks'
    supervisors sent themselves while no server could (a takeover's adopter sends its own later)."""
    codes: list[int | None] = []
    ended = []
    kills = [] if tracked.killed_at is None else [tracked.killed_at]
    errors: list[str] = []
    now = time.time()
    earliest, latest = _end_bounds(tracked, seen, now)
    states = {i: job.state for i, job in seen.items() if job is not None}
    completed = bool(states) and all(state == "COMPLETED" for state in states.values())
    records = [read_job_json(replica.exit_path) for replica in tracked.handle.replicas]
    lost: list[int] = []  # ranks whose supervisor wrote no exit record
    # A time limit the supervisors kept while no server did: SIGTERM at it, SIGKILL after the grace.
    timed_out_at, limit_deadline = kept_time_limit([r for r in records if r], tracked.signalled_at, now)
    deadline = tracked.kill_at if timed_out_at is None else limit_deadline
    for replica, record in zip(tracked.handle.replicas, records):
        if record is not None:
            code = record_exit_code(record)
            if code == 0 and states and not completed:
                code = None
                errors.append(f"rank {replica.rank}: its record says exit code 0, Slurm says {_describe(seen)}")
            codes.append(code)
            ended.append(min(max(record_ended_at(record, latest), earliest), latest))
            killed_at = record_killed_at(record, deadline, now)
            if killed_at is not None:
                kills.append(killed_at)
            if record.get("error"):
                errors.append(f"rank {replica.rank}: {str(record['error'])[:500]}")
        elif tracked.killed_at is not None:
            codes.append(-9)
        else:
            codes.append(None)
            lost.append(replica.rank)
            errors.append(f"rank {replica.rank}: no exit record; Slurm: {_describe(seen)}")
    ended_by = None
    if tracked.signalled_at is None and tracked.kill_at is None and timed_out_at is None:
        outside = sorted((i, state) for i, state in states.items() if state in OUTSIDE_ENDS)
        if outside:
            ended_by = "; ".join(
                f"Slurm job {i} {_ENDED_BY.get(state, state.lower())}"
                + (f" ({seen[i].reason})" if seen[i] is not None and seen[i].reason not in ("", "None") else "")  # type: ignore[union-attr]
                for i, state in outside
            )
        else:  # `scancel --signal=TERM` by someone else, a `kill` of a replica: Slurm still says COMPLETED
            ended_by = ended_outside(tracked.handle.replicas, codes, lost)
    return Exit(
        job_id=tracked.handle.job_id,
        attempt=tracked.handle.attempt,
        exit_codes=tuple(codes),
        ended_at=max(ended) if len(ended) == len(codes) else latest,
        signalled_at=tracked.signalled_at if timed_out_at is None else timed_out_at,
        killed=bool(kills),
        killed_at=min(kills, default=None),
        error="; ".join(errors) or None,
        ended_by=ended_by,
        timed_out_at=timed_out_at,
    )


def _end_bounds(tracked: _Tracked, seen: Mapping[str, SlurmJob | None], now: float) -> tuple[float, float]:
    """Between which times the attempt ended, as Slurm saw it: not before the last poll that
    saw it running (nor its submission), not after Slurm's own end time of its last job (whole
    seconds: up to one later), nor now. A rank's record, which its job's account can write, is
    believed only inside these bounds."""
    ends = [job.ended_at for job in seen.values() if job is not None]
    latest = now
    if ends and len(ends) == len(seen) and all(e is not None for e in ends):
        latest = min(now, max(e for e in ends if e is not None) + 1.0)
    earliest = min(max(tracked.floor, tracked.running_at or 0.0), latest)
    return earliest, latest


_ENDED_BY = {
    "CANCELLED": "cancelled by someone other than warden",
    "TIMEOUT": "ended by Slurm at its time limit",
    "DEADLINE": "ended by Slurm at its deadline",
    "NODE_FAIL": "ended by Slurm: a node of it failed",
    "BOOT_FAIL": "ended by Slurm: a node of it failed to boot",
    "PREEMPTED": "preempted by Slurm",
    "REVOKED": "revoked by Slurm",
}


def _describe(seen: Mapping[str, SlurmJob | None]) -> str:
    return ", ".join(f"{s.state} ({s.reason})" for s in seen.values() if s is not None) or "gone from squeue"


# -- the start check -------------------------------------------------------------------------


def check_cluster(slurm: Slurm, partition: str, *, run_as_user: bool = False) -> list[str]:
    """Refuse (SlurmError naming the setting) a partition where Slurm would decide behind
    warden's back: preemption, a time limit, forced or exclusive node sharing, nodes shared
    with another partition, a partition open to direct submission (no job_submit.lua with
    warden's rules for it, or jobs listed to every account), RootOnly with jobs run as their
    users' accounts (Slurm would never start them), processes not tracked by cgroup (an ended
    attempt's could live on). Jobs an admin runs there are no reason to refuse: their GPUs are
    reported as foreign (`Inventory.foreign`) and never offered. Returns what the cluster does
    not bound (`unconstrained`), for the server to say at start."""
    config = parse_config(slurm.run("scontrol", "show", "config"))
    lines = slurm.run("scontrol", "-o", "show", "partition", partition, check=False).strip().splitlines()
    if not lines or not lines[0].startswith("PartitionName="):
        raise SlurmError(f"partition {partition!r} does not exist in this Slurm cluster")
    p = parse_keyvalues(lines[0])
    problems = []
    if p.get("PreemptMode", "OFF") != "OFF":
        problems.append(f"PreemptMode={p['PreemptMode']}: Slurm could preempt warden's jobs (set PreemptMode=OFF)")
    if p.get("MaxTime", "UNLIMITED") != "UNLIMITED":
        problems.append(f"MaxTime={p['MaxTime']}: Slurm would end warden's jobs at that limit (set MaxTime=UNLIMITED)")
    sharing = p.get("OverSubscribe", "NO").split(":")[0]
    if sharing in ("FORCE", "EXCLUSIVE"):
        problems.append(
            f"OverSubscribe={p['OverSubscribe']}: Slurm would "
            + ("stack jobs on the same cores" if sharing == "FORCE" else "give each job whole nodes")
            + " (set OverSubscribe=NO)"
        )
    if run_as_user and p.get("RootOnly") == "YES":
        problems.append(
            "RootOnly=YES: Slurm never starts a job of another account there, and warden runs jobs as their "
            "users' accounts (--run-as user); set RootOnly=NO (warden's job_submit.lua keeps the partition warden's)"
        )
    problems += _closed_problems(config, partition)
    problems += _tracking_problems(config)
    mine = set(expand_hostlist(p.get("Nodes", "")))
    for line in slurm.run("scontrol", "-o", "show", "partition").splitlines():
        other = parse_keyvalues(line)
        if other.get("PartitionName") == partition:
            continue
        shared = mine & set(expand_hostlist(other.get("Nodes", "") if other.get("Nodes") != "(null)" else ""))
        if shared:
            problems.append(
                f"its nodes {','.join(sorted(shared))} are also in partition {other['PartitionName']!r}: "
                "jobs there would take GPUs warden counts as free"
            )
    if problems:
        raise SlurmError(f"Slurm partition {partition!r} is not warden's to govern: " + "; ".join(problems))
    return unconstrained(config)


def parse_config(text: str) -> dict[str, str]:
    """`scontrol show config`: `Key = Value` lines, cgroup.conf's section among them."""
    config = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            config[key.strip()] = value.strip()
    return config


def _plugins(config: Mapping[str, str], key: str) -> list[str]:
    return [p.strip() for p in config.get(key, "").split(",") if p.strip()]


def _tracking_problems(config: Mapping[str, str]) -> list[str]:
    """Processes an ended attempt leaves behind: without proctrack/cgroup, Slurm finds a job's
    processes by their parents or process group, and loses any that a job's account moves out
    of them (a double fork, killing its own task's supervisor, a step of its own started with
    `srun --jobid --overlap` that forks): they outlive the attempt, on GPUs warden then gives
    another job."""
    track = config.get("ProctrackType") or "(null)"
    if track == "proctrack/cgroup":
        return []
    return [
        f"ProctrackType={track}: processes of an ended attempt can outlive it, on GPUs warden gives the next job "
        "(set ProctrackType=proctrack/cgroup in slurm.conf, with a cgroup.conf; see docs/slurm.md)"
    ]


def unconstrained(config: Mapping[str, str]) -> list[str]:
    """What the cluster's configuration leaves a job free to do that warden's plan does not
    give it: open the device of a GPU it was not given, without task/cgroup and
    ConstrainDevices=yes in cgroup.conf. Said at start, not refused: what Slurm allocates and
    warden reads back stays true, only a job that reaches past `CUDA_VISIBLE_DEVICES` on
    purpose can use another's GPU."""
    missing = []
    if "task/cgroup" not in _plugins(config, "TaskPlugin"):
        missing.append(f"TaskPlugin={config.get('TaskPlugin') or '(null)'} has no task/cgroup")
    if config.get("ConstrainDevices", "no").lower() != "yes":
        missing.append(f"ConstrainDevices={config.get('ConstrainDevices') or 'no'} in cgroup.conf")
    if not missing:
        return []
    return [
        "GPU devices: " + " and ".join(missing) + ": a job can open every GPU of its nodes, not only those Slurm "
        "allocated it (set TaskPlugin=task/cgroup in slurm.conf and ConstrainDevices=yes in cgroup.conf)"
    ]


def _closed_problems(config: Mapping[str, str], partition: str) -> list[str]:
    """What leaves the partition open to anyone but warden: job_submit/lua not loaded, no
    job_submit.lua next to slurm.conf with warden's rules naming the partition, or jobs listed
    to every account (PrivateData without jobs)."""
    problems = []
    plugins = [p.removeprefix("job_submit/") for p in _plugins(config, "JobSubmitPlugins")]
    script = Path(config.get("SLURM_CONF", "/etc/slurm/slurm.conf")).parent / "job_submit.lua"
    fix = f"install deploy/slurm/job_submit.lua as {script} with {partition!r} in its GOVERNED list"
    if "lua" not in plugins:
        problems.append(
            f"JobSubmitPlugins={config.get('JobSubmitPlugins') or '(null)'} has no lua: any account may submit to it "
            f"or change warden's jobs there (set JobSubmitPlugins=lua and {fix})"
        )
    else:
        try:
            text = script.read_text(errors="replace")
        except OSError as err:
            problems.append(f"{script} cannot be read ({err.strerror}): {fix}")
        else:
            governed = re.search(r"^local GOVERNED = \{(.*?)\}", text, re.M)
            names = re.findall(r'"([^"]*)"', governed[1]) if governed else []
            if JOB_SUBMIT_MARKER not in text or partition not in names:
                problems.append(f"{script} has no job_submit rules of warden's for partition {partition!r}: {fix}")
    if "jobs" not in config.get("PrivateData", "").split(","):
        problems.append(
            f"PrivateData={config.get('PrivateData') or 'none'}: every account sees warden's jobs "
            "(add jobs to PrivateData)"
        )
    return problems
