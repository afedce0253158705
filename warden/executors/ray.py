"""The `ray` executor: warden decides, an existing Ray cluster runs the processes.

Ray reserves and starts; warden admits, places and preempts (Ray has no priorities and no
preemption of its own, and its queue of placement groups is not FIFO, so a group is created
only for a gang warden has admitted). An admitted gang becomes one placement group, detached
and named `warden.<job>.<attempt>`, with one bundle per replica pinned to the node warden
placed it on (`bundle_label_selector` on `ray.io/node-id`), and one threaded launcher actor
per bundle (`warden.executors.ray_launch`) that runs the replica under warden's shim, with the
environment of DESIGN §6 built here, exactly as the local executor builds it.

Signals are warden's, timed by warden: `terminate` asks every launcher to SIGTERM its
replica's process group (the calls leave together), and warden's own timer sends SIGKILL at
the deadline. The group is removed only once every replica is gone: removing it first would
kill the replicas with no grace.

A node Ray declares dead is `down` in the inventory while an attempt still holds it, so the
server evicts the rest of the gang (DESIGN §5.4); the bundles are pinned to that node's id,
so Ray cannot re-place them anywhere behind warden's back, and the group is removed once the
survivors are gone.

The cluster must run with Ray's token authentication (`RAY_AUTH_MODE=token`, the token in the
file `RAY_AUTH_TOKEN_PATH` names, read by Ray from this process's environment): a cluster
whose GCS answers a client without a token is refused (`refuses_unauthenticated`) unless
`trust_unauthenticated`, since any job could then govern it and replace the code root's
workers run. The launcher is imported from the installed package on the nodes (a code search
path), never exported to the GCS's function table.

An attempt ended behind warden's back (its node died, its placement group was removed, a
launcher killed by someone else) exits with `ended_by` saying so. GPUs held by actors and
placement groups that are not warden's are the inventory's `foreign_unknown`: Ray says how
many a node has left, not which. Ray also picks the GPU ids of each bundle itself: the
launcher gives the job Ray's ids as CUDA_VISIBLE_DEVICES and reports them, and the server
records them as the attempt's assignment (`devices`).

The nodes come from `ray.nodes()`: GPUs, CPUs and memory from their resources, the flavor
from an `accelerator_type:<X>` resource, the topology block from the `warden.io/block`
label. The attempt's directory (logs, status and exit records, checkpoints) must be on a
filesystem every Ray node shares with the server, at the same path, as with Slurm. See
docs/ray.md.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from warden.engine.durations import format_duration
from warden.engine.model import DEFAULT_FLAVOR, Node
from warden.executors.base import Devices, Exit, Handle, Inventory, LaunchError, LaunchSpec, ReplicaHandle
from warden.executors.identity import Identities, Identity
from warden.executors.local import (
    identity_environment,
    inherited_environment,
    job_environment,
    make_dirs,
)
from warden.executors.outside import HEARTBEAT_S, SUPERVISOR_LOST, ended_outside, kept_time_limit, seen_path
from warden.executors.ray_launch import NAMESPACE, Launcher
from warden.executors.records import (
    CONTROL_FILE,
    launched,
    read_job_json,
    record_ended_at,
    record_exit_code,
    record_killed_at,
    revoke_unstarted,
)
from warden.executors.tracking import Key, RemoteAttemptTable

log = logging.getLogger("warden.executors.ray")

BLOCK_LABEL = "warden.io/block"
"""The node label whose value is the node's topology block (its leaf switch, rack or NVLink
domain): gangs are placed on whole blocks."""
ACCELERATOR_PREFIX = "accelerator_type:"
NODE_ID_LABEL = "ray.io/node-id"
NAME_RE = re.compile(r"warden\.([0-9]+)\.([0-9]+)(?:\.([0-9]+))?")
"""Placement groups `warden.<job>.<attempt>` and launchers `warden.<job>.<attempt>.<rank>`:
how a restarted server finds them, and tells them from anybody else's."""
CPU_FLOOR = 0.001
"""Ray refuses an empty bundle: a replica that asks for nothing reserves this much CPU."""
CALL_TIMEOUT_S = 10.0
ORPHAN_SETTLE_S = 90.0
"""How long an attempt whose replica was killed with its lost launcher waits for Ray to say
why (its node declared dead: about 14 s with Ray's default health checks, 64 s for a hung
node), before it is reported as ended by a lost launcher."""
_UNSETTLED = "unsettled"
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
"""The directory warden's package is imported from (Ray's code search path)."""


class RayError(RuntimeError):
    """Ray cannot be reached, or is not fit to be governed."""


def probe(address: str, timeout_s: float = 5.0) -> None:
    """Refuse (RayError naming it) an address that is not HOST:PORT or where nothing listens:
    `ray.init` would retry it for minutes."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RayError(f"address {address!r} is not HOST:PORT (the head node's GCS, as `ray start --head` prints it)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise RayError(f"cannot connect to the Ray cluster at {address!r}: {err.strerror or err}") from err


UNAUTHENTICATED = (
    "the Ray cluster at {address} accepts clients without a token (Ray's token authentication is off): "
    "any job that reaches its GCS port can drain nodes, kill warden's jobs and replace the launcher code that "
    "runs as root on every node (Ray's function table). Start every node of the cluster, and this server, with "
    "RAY_AUTH_MODE=token and the cluster's token (RAY_AUTH_TOKEN_PATH; docs/ray.md), or pass "
    "--ray-trust-unauthenticated to govern it anyway, trusting every process that can reach it"
)
AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
"""Ray's token authentication (Ray >= 2.52): the mode, and the token itself or its file
(else ~/.ray/auth_token). The server's own; never a job's (its environment is an allow-list)."""
PROBE = """
import sys
from ray._raylet import GcsClient
from ray.exceptions import AuthenticationError
try:
    GcsClient(address=sys.argv[1]).internal_kv_get(b"warden-probe", b"warden", timeout=10)
except AuthenticationError:
    print("refused")
else:
    print("open")
"""
"""A client without a token: the GCS of a cluster with token authentication refuses it."""
PROBE_TIMEOUT_S = 60.0


def refuses_unauthenticated(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the cluster's GCS refuses a client that presents no token, asked by a process
    of its own with Ray's token authentication disabled and no token anywhere it looks (this
    process's Ray keeps its own configuration)."""
    env = {k: v for k, v in os.environ.items() if k not in AUTH_VARS}
    with tempfile.TemporaryDirectory(prefix="warden-ray-probe-") as home:
        env.update({"RAY_AUTH_MODE": "disabled", "HOME": home, "RAY_USAGE_STATS_ENABLED": "0"})
        try:
            done = subprocess.run(
                [sys.executable, "-c", PROBE, address],
                capture_output=True,
                text=True,
                env=env,
                cwd=home,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired as err:
            raise RayError(f"cannot tell whether the Ray cluster at {address!r} authenticates its clients") from err
    answer = done.stdout.strip().splitlines()[-1:] if done.returncode == 0 else []
    if answer not in (["refused"], ["open"]):
        tail = " ".join(done.stderr.strip().splitlines()[-1:])
        raise RayError(f"cannot tell whether the Ray cluster at {address!r} authenticates its clients: {tail}")
    return answer == ["refused"]


def group_name(job_id: str, attempt: int) -> str:
    return f"warden.{job_id}.{attempt}"


def launcher_name(job_id: str, attempt: int, rank: int) -> str:
    return f"{group_name(job_id, attempt)}.{rank}"


# -- the cluster -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RayNode:
    """One node as `ray.nodes()` shows it."""

    node: Node
    node_id: str
    addr: str
    alive: bool
    reason: str = ""
    port: int = 0  # its raylet's (NodeManagerPort)


def parse_nodes(raw: Iterable[Mapping[str, Any]], known: Mapping[str, Node] | None = None) -> list[RayNode]:
    """`ray.nodes()` entries as nodes, by name (Ray's NodeName, `ray start --node-name`). A
    live node with neither GPUs nor CPUs (a head node kept for Ray's own services) is left
    out; a dead one has no resources left in Ray's table, so `known` (node id -> the node as
    it was alive) gives its capacity. Of
    two entries with one name, the live one wins (a node that came back has a new id); two
    live nodes with one name are told apart by their ids' first 8 characters."""
    entries = []
    for n in raw:
        res = n.get("Resources") or {}
        gpus, cpus = int(res.get("GPU", 0)), float(res.get("CPU", 0))
        alive = bool(n.get("Alive"))
        if alive and gpus <= 0 and cpus <= 0:
            continue
        flavors = sorted(k[len(ACCELERATOR_PREFIX) :] for k in res if k.startswith(ACCELERATOR_PREFIX))
        labels = n.get("Labels") or {}
        entries.append(
            (
                str(n.get("NodeName") or n.get("NodeManagerAddress") or n["NodeID"]),
                str(n["NodeID"]),
                str(n.get("NodeManagerAddress") or ""),
                alive,
                Node(
                    "",
                    gpus,
                    cpu=int(cpus * 1000),
                    memory=int(float(res.get("memory", 0)) // (1 << 20)),
                    flavor=flavors[0] if flavors else DEFAULT_FLAVOR,
                    block=labels.get(BLOCK_LABEL) or None,
                ),
                "" if alive else str(n.get("DeathReasonMessage") or "dead"),
                int(n.get("NodeManagerPort") or 0),
            )
        )
    live_names: dict[str, int] = {}
    for name, _, _, alive, _, _, _ in entries:
        if alive:
            live_names[name] = live_names.get(name, 0) + 1
    nodes: dict[str, RayNode] = {}
    for name, node_id, addr, alive, node, reason, port in sorted(entries, key=lambda e: (not e[3], e[1])):
        if alive and live_names[name] > 1:
            name = f"{name}-{node_id[:8]}"
        if name in nodes:
            continue  # a dead incarnation of a node that is alive (or dead) under another id
        if not alive and known and node_id in known:
            node = known[node_id]
        nodes[name] = RayNode(_named(node, name), node_id, addr, alive, reason, port)
    return sorted(nodes.values(), key=lambda n: n.node.name)


def inventory_of(nodes: Sequence[RayNode], held: Iterable[tuple[str, str]], known: Mapping[str, Node]) -> Inventory:
    """The live nodes, and in `down` every node a replica is still pinned to (`held`: node
    name, Ray node id) that is not alive under that id: dead, no longer listed by Ray at all
    (with its capacity from `known`), or alive again as a new Ray node (it died and came back
    while the attempt ran). A dead node nobody holds is left out: it is simply gone."""
    pinned: dict[str, set[str]] = {}
    for name, node_id in held:
        pinned.setdefault(name, set()).add(node_id)
    out: list[Node] = []
    down: dict[str, str] = {}
    for n in nodes:
        ids = pinned.pop(n.node.name, set())
        if not n.alive:
            if ids:
                out.append(n.node)
                down[n.node.name] = f"DEAD (Ray: {n.reason})"
            continue
        out.append(n.node)
        if ids - {n.node_id}:
            down[n.node.name] = "RESTARTED (its earlier Ray node died under a running attempt)"
    for name, ids in sorted(pinned.items()):
        node = next((known[i] for i in sorted(ids) if i in known), Node(name, 0))
        out.append(_named(node, name))
        down[name] = "GONE (Ray no longer lists it)"
    return Inventory(tuple(sorted(out, key=lambda n: n.name)), down)


def _named(node: Node, name: str) -> Node:
    return Node(name, node.gpus, cpu=node.cpu, memory=node.memory, flavor=node.flavor, block=node.block)


# -- the executor ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Tracked:
    handle: Handle
    node_ids: tuple[str, ...]  # per rank: the Ray node its bundle is pinned to
    node_names: tuple[str, ...]
    group: Any  # ray.util.placement_group.PlacementGroup, None once removed
    launchers: list[Any]  # per rank: the actor handle (None where Ray no longer has it)
    submitted_mono: float
    starts: dict[int, Any] = field(default_factory=dict)  # rank -> ObjectRef of Launcher.start, until resolved
    failed: dict[int, str] = field(default_factory=dict)  # rank -> why it did not start
    signalled_at: float | None = None
    kill_at: float | None = None
    kill_mono: float | None = None
    killed_at: float | None = None
    terminating_at: float | None = None
    started: bool = False
    ended_mono: float | None = None
    dropped: bool = False  # warden killed its launchers itself (a failed start)
    orphaned_mono: float | None = None  # when a replica was first seen killed with its lost launcher
    revoked: str | None = None  # why ranks of an adopted attempt never start (their launches were revoked)
    planned: tuple[tuple[int, ...], ...] = ()  # per rank, the GPUs warden placed it on (empty: adopted)
    gpus: dict[int, tuple[int, ...]] = field(default_factory=dict)  # rank -> the GPUs Ray bound it to
    floor: float = 0.0  # the earliest an exit of it can be: its start (wall clock; 0 when adopted)
    running_at: dict[int, float] = field(default_factory=dict)  # rank -> the latest look that found no exit record
    gone_at: dict[int, float] = field(default_factory=dict)  # rank -> the first look that found one


class RayExecutor(RemoteAttemptTable[_Tracked]):
    """Runs attempts as placement groups and launcher actors on the Ray cluster at `address`
    (`host:port` of its head's GCS).

    `poll_s` is how often the nodes and the launchers' answers are read; `start_timeout_s` how
    long an attempt may take to run every replica (its group placed, its launchers created)
    before it fails and is torn down."""

    def __init__(
        self,
        *,
        address: str,
        base_env: Mapping[str, str] | None = None,
        identities: Identities | None = None,
        poll_s: float = 0.25,
        start_timeout_s: float = 120.0,
        trust_unauthenticated: bool = False,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        if identities is not None and identities.mode == "dynamic":
            raise RayError(
                "Ray runs jobs as the account of its workers, not as warden's dynamic uids: run jobs as their users' "
                "accounts (--run-as user, with --user-map USER=ACCOUNT or '*=ACCOUNT'; Ray's workers must be root)"
            )
        try:
            import ray
        except ImportError as err:
            raise RayError(f"Ray is not installed here: pip install 'gpu-warden[ray]' ({err})") from err

        self.address = address
        self.identities = identities
        self._base_env = base_env
        self._poll_s = poll_s
        self._start_timeout_s = start_timeout_s
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        probe(address)
        if not refuses_unauthenticated(address):
            if not trust_unauthenticated:
                raise RayError(UNAUTHENTICATED.format(address=address))
            log.warning(
                "governing it anyway (--ray-trust-unauthenticated): %s", UNAUTHENTICATED.format(address=address)
            )
        # ray.init makes SIGTERM (and SIGINT) exit the process; how this process stops is its own.
        main = threading.current_thread() is threading.main_thread()
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)} if main else {}
        try:
            ray.init(
                address=address,
                namespace=NAMESPACE,
                log_to_driver=False,
                logging_level=logging.WARNING,
                ignore_reinit_error=True,
                # Workers import the launcher from the installed package; the driver then never
                # exports its pickle to the GCS's function table.
                job_config=ray.job_config.JobConfig(code_search_path=[PACKAGE_ROOT]),
            )
        except Exception as err:  # ConnectionError, RuntimeError, TimeoutError, ...
            raise RayError(f"cannot connect to the Ray cluster at {address!r}: {err}") from err
        finally:
            for sig, handler in handlers.items():
                if handler is not None:
                    signal.signal(sig, handler)
        self._launcher: Any = ray.remote(Launcher)
        super().__init__(heartbeat_s)
        self._nodes: tuple[RayNode, ...] = ()
        self._foreign: dict[str, int] = {}  # node name -> GPUs held by what is not warden's
        self._known: dict[str, Node] = {}  # node id -> the node as last seen alive
        self._ended_seen: set[Key] = set()  # attempts the poller saw end, until `exits()` reports them
        self._polled_at = 0.0
        self._polled = threading.Condition(self._lock)
        self._poll_once()
        self._poller = threading.Thread(target=self._poll_loop, name="warden-ray-poll", daemon=True)
        self._poller.start()

    # -- the cluster -----------------------------------------------------------------------

    def inventory(self) -> Inventory:
        """The cluster's nodes as last polled (see `inventory_of`). Ray does not say which GPU
        ids an actor or placement group that is not warden's holds, only how many are taken:
        those are `foreign_unknown`, counted, never named."""
        with self._lock:
            held = {(name, node_id) for t in self._tracked.values() for name, node_id in zip(t.node_names, t.node_ids)}
            inventory = inventory_of(self._nodes, held, self._known)
            return dataclasses.replace(inventory, foreign_unknown=dict(self._foreign))

    def _alive(self) -> dict[str, RayNode]:
        with self._lock:
            return {n.node.name: n for n in self._nodes if n.alive}

    def _dead_ids(self) -> set[str]:
        """The nodes replicas are pinned to that are not alive: listed dead, or no longer
        listed at all."""
        with self._lock:
            alive = {n.node_id for n in self._nodes if n.alive}
            held = {node_id for t in self._tracked.values() for node_id in t.node_ids}
        return {node_id for node_id in held if node_id and node_id not in alive}

    # -- polling ---------------------------------------------------------------------------

    def _poll_loop(self) -> None:
        failing: str | None = None
        while True:
            with self._lock:
                if self._closed:
                    return
            try:
                before = self._nodes
                self._poll_once()
                resolved = self._check_starts()
                if resolved or self._nodes != before or self._newly_ended():
                    self._woken()
                if failing is not None:
                    log.warning("the Ray cluster answers again")
                failing = None
            except Exception as err:  # retried; the states stay as last read (logged once per cause)
                if str(err) != failing:
                    log.exception("reading the Ray cluster's nodes failed")
                failing = str(err)
            time.sleep(self._poll_s)

    def _poll_once(self) -> None:
        import ray

        began = time.monotonic()
        nodes = tuple(parse_nodes(ray.nodes(), self._known))
        foreign = _foreign_gpus(nodes)
        with self._lock:
            self._known.update((n.node_id, n.node) for n in nodes if n.alive)
            self._nodes = nodes
            self._foreign = foreign
            self._polled_at = began
            self._polled.notify_all()

    def wait_poll(self, timeout_s: float = 10.0) -> None:
        """Block until a poll that began after this call has finished (tests)."""
        asked = time.monotonic()
        with self._polled:
            self._polled.wait_for(lambda: self._polled_at >= asked or self._closed, timeout=timeout_s)

    def _newly_ended(self) -> bool:
        """Whether an attempt has every replica gone since the last poll said so (a cheap
        look: exit files, dead nodes, failed starts; `exits()` reads the records)."""
        dead = self._dead_ids()
        with self._lock:
            items = [(key, t) for key, t in self._tracked.items() if key not in self._ended_seen]
        found = False
        for key, t in items:
            if all(
                self._looked(t, i) or t.node_ids[i] in dead or r.rank in t.failed
                for i, r in enumerate(t.handle.replicas)
            ):
                with self._lock:
                    self._ended_seen.add(key)
                found = True
        return found

    def _check_starts(self) -> bool:
        """Take the launchers' answers to `start`; an attempt a replica of which failed to
        start, or that is not running in full after `start_timeout_s`, is killed. Whether any
        answer came."""
        import ray

        answered = False
        with self._lock:
            pending = [(key, t, dict(t.starts)) for key, t in self._tracked.items() if t.starts]
        for key, tracked, starts in pending:
            ready, _ = ray.wait(list(starts.values()), num_returns=len(starts), timeout=0)
            done = set(ready)
            answered = answered or bool(done)
            for rank, ref in starts.items():
                if ref not in done:
                    continue
                bound: tuple[int, ...] | None = None
                try:
                    status = ray.get(ref, timeout=CALL_TIMEOUT_S)
                    error = status.get("error") if status.get("pgid") is None else None
                    if status.get("gpus") is not None:
                        bound = tuple(int(g) for g in status["gpus"])
                except Exception as err:  # the actor died, could not be placed, or start raised
                    error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                with self._lock:
                    tracked.starts.pop(rank, None)
                    if error:
                        tracked.failed[rank] = error
                    elif bound is not None:
                        tracked.gpus[rank] = bound
            with self._lock:
                late = bool(tracked.starts) and time.monotonic() - tracked.submitted_mono > self._start_timeout_s
                failed = bool(tracked.failed)
                if late:
                    why = f"not running after {format_duration(self._start_timeout_s)} ({self._group_state(tracked)})"
                    for rank in tracked.starts:
                        tracked.failed[rank] = why
                    tracked.starts.clear()
                terminating = tracked.kill_at is not None  # its timer ends it; a rank stopped early is no failure
            if (late or failed) and not terminating:
                log.warning(
                    "attempt %s of job %s failed to start: %s", key[1], key[0], "; ".join(tracked.failed.values())
                )
                self._kill(tracked, drop_launchers=True)
        return answered

    def devices(self, job_id: str, attempt: int) -> Devices | None:
        """Per rank, the GPUs Ray reserved for the replica's bundle, as its launcher read them
        (`ray.get_gpu_ids()`) and gave them to the job as CUDA_VISIBLE_DEVICES: Ray picks the
        indices of a bundle itself. A rank whose launcher named none keeps warden's plan; not
        known for a rank still starting, nor for an attempt adopted from an earlier server."""
        with self._lock:
            tracked = self._tracked.get((job_id, attempt))
            if tracked is None:
                return ()
            out: list[tuple[int, ...] | None] = []
            for i, replica in enumerate(tracked.handle.replicas):
                rank = replica.rank
                if rank in tracked.gpus:
                    out.append(tracked.gpus[rank])
                elif tracked.planned and rank not in tracked.starts and rank not in tracked.failed:
                    out.append(tracked.planned[i])
                else:
                    out.append(None)
            return tuple(out)

    def _group_state(self, tracked: _Tracked) -> str:
        from ray.util.placement_group import placement_group_table

        try:
            table = placement_group_table(tracked.group) if tracked.group is not None else {}
        except Exception:
            return "its placement group is gone"
        stats = table.get("stats") or {}
        return f"placement group {table.get('state', '?')}, {stats.get('scheduling_state', '?')}"

    # -- start -----------------------------------------------------------------------------

    def _hand_over(self, spec: LaunchSpec, key: Key) -> Handle:
        """Reserve the gang (one placement group, a bundle per replica pinned to its node) and
        create its launchers."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        identity = self._identity(spec)
        alive = self._alive()
        ordered = sorted(spec.replicas, key=lambda r: r.rank)
        missing = sorted({r.node for r in ordered} - alive.keys())
        if missing:
            raise LaunchError(f"job {spec.job_id!r}: node(s) {', '.join(missing)} are not alive in the Ray cluster")
        make_dirs(spec.log_dir)
        make_dirs(spec.checkpoint_dir)
        handle = Handle(
            spec.job_id,
            spec.attempt,
            tuple(ReplicaHandle.in_dir(spec.log_dir, r.rank) for r in ordered),
            control_path=spec.log_dir / CONTROL_FILE,
            external=(group_name(spec.job_id, spec.attempt), *(alive[r.node].node_id for r in ordered)),
        )
        # A status file that exists is never removed: it is a revocation (`recover`, `adopt`) or an
        # earlier launch of this replica, and the shim refuses to start over it.
        earlier = [seen_path(spec.log_dir, r.rank) for r in handle.replicas if not r.status_path.exists()]
        for stale in [handle.control_path, *(r.exit_path for r in handle.replicas), *earlier]:
            if stale is not None:
                stale.unlink(missing_ok=True)
        if identity is not None:  # the job writes its checkpoints there
            os.chown(spec.checkpoint_dir, identity.uid, identity.gid, follow_symlinks=False)
            os.chmod(spec.checkpoint_dir, 0o700)
        launches = self._launches(spec, ordered, alive, identity)
        bundles = [_bundle(spec, len(r.gpus)) for r in ordered]
        floor = time.time()
        try:
            group = placement_group(
                bundles,
                strategy="PACK",
                name=group_name(spec.job_id, spec.attempt),
                lifetime="detached",
                bundle_label_selector=[{NODE_ID_LABEL: alive[r.node].node_id} for r in ordered],
            )
            launchers: list[Any] = [
                self._launcher.options(
                    name=launcher_name(spec.job_id, spec.attempt, r.rank),
                    namespace=NAMESPACE,
                    lifetime="detached",
                    max_concurrency=4,
                    max_restarts=0,
                    num_cpus=bundles[i].get("CPU", 0),
                    num_gpus=bundles[i].get("GPU", 0),
                    memory=bundles[i].get("memory"),
                    scheduling_strategy=PlacementGroupSchedulingStrategy(group, i),
                ).remote()
                for i, r in enumerate(ordered)
            ]
            port: Any = spec.master_port
            if len(ordered) > 1 and port is None:
                port = launchers[0].free_port.remote()  # Ray hands its answer to every rank's start
            starts = {
                r.rank: launchers[i].start.remote(
                    launches[i], port, {"node": r.node, "ray_node_id": alive[r.node].node_id}
                )
                for i, r in enumerate(ordered)
            }
        except Exception as err:
            self._remove(group_name(spec.job_id, spec.attempt), len(ordered))
            raise LaunchError(f"job {spec.job_id!r} attempt {spec.attempt}: Ray refused it: {err}") from err
        tracked = _Tracked(
            handle,
            tuple(alive[r.node].node_id for r in ordered),
            tuple(r.node for r in ordered),
            group,
            launchers,
            time.monotonic(),
            starts=starts,
            planned=tuple(r.gpus for r in ordered),
            floor=floor,
        )
        with self._lock:
            self._tracked[key] = tracked
        return handle

    def _identity(self, spec: LaunchSpec) -> Identity | None:
        if self.identities is None or self.identities.mode != "user":
            return None
        identity = self.identities.account(spec.user or "")
        if identity is None:
            raise LaunchError(
                f"job {spec.job_id!r}: warden user {spec.user!r} has no Unix account to run it as on the Ray nodes "
                "(map one with --user-map USER=ACCOUNT, or '*=ACCOUNT' for every user)"
            )
        return identity

    def _launches(
        self, spec: LaunchSpec, ordered: Sequence[Any], alive: Mapping[str, RayNode], identity: Identity | None
    ) -> list[dict[str, Any]]:
        """What each launcher hands its shim: the command, its directory, the environment of
        DESIGN §6 (MASTER_PORT added by the launcher when rank 0's node picks it)."""
        base = inherited_environment(os.environ) if self._base_env is None else dict(self._base_env)
        who = identity_environment(identity, spec.log_dir / "home")
        master = alive[ordered[0].node].addr or ordered[0].node
        out = []
        for r in ordered:
            log_path = spec.log_dir / f"rank-{r.rank}.log"
            env = job_environment(
                spec, r, master_port=spec.master_port, log_path=log_path, base=base, identity=who, master_addr=master
            )
            if spec.master_port is None:
                env.pop("MASTER_PORT", None)
            out.append(
                {
                    "argv": list(spec.command),
                    "cwd": str(spec.workdir),
                    "env": env,
                    "log": str(log_path),
                    "status": str(spec.log_dir / f"rank-{r.rank}.status.json"),
                    "exit": str(spec.log_dir / f"rank-{r.rank}.exit.json"),
                    "seen": str(seen_path(spec.log_dir, r.rank)),
                    "control": str(spec.log_dir / CONTROL_FILE),
                    "grace_s": spec.grace_s,  # the supervisor keeps the time limit while no server does
                    "time_limit_s": spec.time_limit_s,
                    "heartbeat_s": self.heartbeat_s,
                    "identity": None
                    if identity is None
                    else {"uid": identity.uid, "gid": identity.gid, "groups": list(identity.groups)},
                    "private_dirs": [],
                }
            )
        return out

    # -- signals ---------------------------------------------------------------------------

    def terminate(self, job_id: str, attempt: int, grace_s: float) -> float:
        """SIGTERM every replica's process group through its launcher (the calls leave
        together), and SIGKILL at the returned deadline by warden's own timer. A rank still
        starting is signalled the moment it runs."""
        if grace_s < 0:
            raise ValueError(f"grace_s must be >= 0, got {grace_s!r}")
        self._acting(f"SIGTERM attempt {attempt} of job {job_id}")
        key = (job_id, attempt)
        with self._lock:
            tracked = self._get(key)
            if tracked.kill_at is not None:
                return tracked.kill_at
            launchers = list(tracked.launchers)
            running = {i for i, r in enumerate(tracked.handle.replicas) if r.rank not in tracked.starts}
        dead = self._dead_ids()
        running = {i for i in running if tracked.node_ids[i] not in dead}  # no answer comes from a dead node
        self._announce(tracked)
        sent = time.time()
        _send(launchers, signal.SIGTERM, awaited=running)
        return self._arm(key, tracked, sent, grace_s)  # the grace counts from the last running rank's SIGTERM

    def _kill(self, tracked: _Tracked, drop_launchers: bool = False) -> None:
        """SIGKILL every replica now. A launcher that has not started its replica yet is
        killed instead (its rank then never runs); with `drop_launchers`, every launcher is."""
        self._acting(f"SIGKILL attempt {tracked.handle.attempt} of job {tracked.handle.job_id}")
        with self._lock:
            if not self._killing(tracked):
                return
            launchers = list(tracked.launchers)
            unstarted = set(tracked.starts)
            tracked.dropped = tracked.dropped or drop_launchers or bool(unstarted)
        _send(launchers, signal.SIGKILL, awaited=())  # a deadline due next must not wait on these answers
        for rank, launcher in enumerate(launchers):
            if launcher is not None and (drop_launchers or rank in unstarted):
                _kill_actor(launcher)  # its start fails; the shim, if it ran, kills the job with its owner
        self._persist(tracked)

    # -- exits -----------------------------------------------------------------------------

    def exits(self) -> list[Exit]:
        """Attempts every replica of which is gone: its exit record is written, its node is
        dead, or it never started. Each is reported once, once the removal of its placement
        group and launchers is asked for (Ray frees the GPUs within about 0.1 s; a group
        created meanwhile waits that long). Removing them is an action: a fenced executor
        raises `Fenced` here, before it reports (and forgets) any exit."""
        self._acting("collect exits (removing their placement groups)")
        dead = self._dead_ids()
        with self._lock:
            candidates = list(self._tracked.items())
        reported = []
        for key, tracked in candidates:
            ranks = [self._rank_end(tracked, i, dead) for i in range(len(tracked.handle.replicas))]
            if any(r is None for r in ranks):
                continue
            # A time limit the supervisors kept while no server did: warden's end, not another's.
            records = [read_job_json(r.exit_path) or {} for r in tracked.handle.replicas]
            now = time.time()
            timed_out_at, limit_deadline = kept_time_limit(records, tracked.signalled_at, now)
            ended_by = (
                self._ended_by(tracked, dead, [r.code for r in ranks if r is not None])
                if timed_out_at is None
                else None
            )
            if ended_by is _UNSETTLED:
                continue  # a launcher was lost, and Ray does not say yet how: asked again next time
            with self._lock:
                if self._tracked.pop(key, None) is None:
                    continue
                tracked.ended_mono = time.monotonic()
                self._ended_seen.discard(key)
            self._remove(tracked.handle.external[0], len(tracked.handle.replicas), tracked)
            limit_kills = (
                [record_killed_at(r, limit_deadline, now) for r in records] if timed_out_at is not None else []
            )
            reported.append(_exit(tracked, [r for r in ranks if r is not None], ended_by, timed_out_at, limit_kills))
        return reported

    def _ended_by(self, tracked: _Tracked, dead: set[str], codes: Sequence[int | None]) -> str | None:
        """What ended an attempt behind warden's back, once every replica is gone (`codes`, their
        exit codes): its node died, its placement group was removed, a launcher was killed by
        someone else (its shim then killed the replica), or a signal warden did not send killed
        a replica (`ended_outside`). None when warden ended it (a signal, a kill, a failed
        start) or its replicas ended by themselves. _UNSETTLED while a replica was killed with
        its lost launcher and Ray does not say yet why (a dead node is declared dead seconds
        after its workers are gone), for at most ORPHAN_SETTLE_S. An attempt adopted with ranks
        whose launch was revoked (`adopt`) ended so, whatever warden did to the rest of it."""
        if tracked.revoked is not None:
            return tracked.revoked
        if tracked.signalled_at is not None or tracked.killed_at is not None or tracked.dropped:
            return None
        with self._lock:
            reasons = {n.node_id: n.reason for n in self._nodes if not n.alive}
        for node_id, name in zip(tracked.node_ids, tracked.node_names):
            if node_id in dead:
                return f"node {name or node_id} died (Ray: {reasons.get(node_id) or 'no longer listed'})"
        name = tracked.handle.external[0] if tracked.handle.external else "?"
        if self._group_removed(tracked):
            return f"placement group {name} removed outside warden"
        orphans = [
            r.rank for r in tracked.handle.replicas if (read_job_json(r.exit_path) or {}).get("orphaned") is True
        ]
        if not orphans:
            lost = [
                r.rank
                for r in tracked.handle.replicas
                if (read_job_json(r.exit_path) or {}).get(SUPERVISOR_LOST) is True
            ]
            return ended_outside(tracked.handle.replicas, codes, lost)
        with self._lock:
            by_id = {n.node_id: n for n in self._nodes}
        index = {r.rank: i for i, r in enumerate(tracked.handle.replicas)}
        # A raylet that is gone: its node is dying, and Ray declares it dead soon.
        silent = [rank for rank in orphans if not _raylet_answers(by_id.get(tracked.node_ids[index[rank]]))]
        if not silent:
            job_id, attempt = tracked.handle.job_id, tracked.handle.attempt
            gone = [rank for rank in orphans if _actor(launcher_name(job_id, attempt, rank)) is None]
            if gone:
                return f"the launcher of rank {gone[0]} (Ray actor {name}.{gone[0]}) was killed outside warden"
        now = time.monotonic()
        with self._lock:
            if tracked.orphaned_mono is None:
                tracked.orphaned_mono = now
            waited = now - tracked.orphaned_mono
        if waited < ORPHAN_SETTLE_S:
            return _UNSETTLED
        if silent:
            node = tracked.node_names[index[silent[0]]]
            return f"node {node} was lost (its raylet no longer answers; Ray has not declared it dead)"
        return f"the launcher of rank {orphans[0]} (Ray actor {name}.{orphans[0]}) was lost"

    def _group_removed(self, tracked: _Tracked) -> bool:
        from ray.util.placement_group import placement_group_table

        if tracked.group is None:
            return False
        try:
            return placement_group_table(tracked.group).get("state") == "REMOVED"
        except Exception:  # Ray no longer knows it
            return True

    def _looked(self, tracked: _Tracked, index: int) -> bool:
        """Whether the replica's exit record is there, noting when it was looked for: the
        replica ended after the latest look that found none and before the first that found
        one (`_end_bounds`)."""
        rank = tracked.handle.replicas[index].rank
        before = time.time()
        there = tracked.handle.replicas[index].exit_path.exists()
        with self._lock:
            if not there:
                tracked.running_at[rank] = before
            else:
                tracked.gone_at.setdefault(rank, time.time())
        return there

    def _rank_end(self, tracked: _Tracked, index: int, dead: set[str]) -> _RankEnd | None:
        """How a replica that is gone ended, None while it may still run. Its end time is the
        one its record gives (the job's account may write it), kept inside `_end_bounds`."""
        replica = tracked.handle.replicas[index]
        record = read_job_json(replica.exit_path) if self._looked(tracked, index) else None
        if record is not None:
            now = time.time()
            earliest, latest = _end_bounds(tracked, replica.rank, now)
            error = str(record["error"])[:500] if record.get("error") else None
            return _RankEnd(
                record_exit_code(record),
                min(max(record_ended_at(record, latest), earliest), latest),
                error,
                record_killed_at(record, tracked.kill_at, now),
            )
        if tracked.node_ids[index] in dead:
            code = -9 if tracked.killed_at is not None else None
            return _RankEnd(code, time.time(), f"node {tracked.node_names[index]} is dead (Ray)")
        with self._lock:
            why = tracked.failed.get(replica.rank)
        if why is not None and not launched(read_job_json(replica.status_path)):
            return _RankEnd(None, time.time(), f"did not start: {why}")
        return None

    def replica_exit_codes(self, job_id: str, attempt: int) -> tuple[int | None, ...]:
        with self._lock:
            tracked = self._get((job_id, attempt))
        records = (read_job_json(r.exit_path) for r in tracked.handle.replicas)
        return tuple(None if record is None else record_exit_code(record) for record in records)

    def _remove(self, name: str, ranks: int, tracked: _Tracked | None = None) -> None:
        """Remove an attempt's placement group and launchers (those Ray still has)."""
        self._acting(f"remove placement group {name}")
        from ray.util.placement_group import get_placement_group, remove_placement_group

        launchers = (
            list(tracked.launchers) if tracked is not None else [_actor(f"{name}.{rank}") for rank in range(ranks)]
        )
        for launcher in launchers:
            if launcher is not None:
                _kill_actor(launcher)
        group = tracked.group if tracked is not None else None
        try:
            if group is None:
                group = get_placement_group(name)
            remove_placement_group(group)
        except Exception:  # already removed, never created
            pass
        if tracked is not None:
            tracked.group = None

    # -- restart ---------------------------------------------------------------------------

    def adopt(self, handle: Handle, kill_at: float | None = None) -> None:
        """Track an attempt an earlier server process started: its group and launchers are
        found by name; its SIGKILL is re-armed. A replica whose shim has not claimed its launch
        is revoked (`revoke_launch`): its `start` went out from the process that launched it,
        and a call that had not reached its launcher died with that process, so it may never
        come; one that comes later starts nothing. An attempt with such a rank never runs whole:
        the rest of it is killed, and it ends as evicted (`ended_by`), to be requeued."""
        from ray.util.placement_group import get_placement_group

        key = (handle.job_id, handle.attempt)
        control = self._control(handle)
        why = f"attempt {handle.attempt} of job {handle.job_id} was adopted unstarted"
        unended = [r for r in handle.replicas if not r.exit_path.exists()]
        revoke_unstarted([r.status_path for r in unended], why)
        revoked = [r.rank for r in unended if not launched(read_job_json(r.status_path))]
        name = handle.external[0] if handle.external else group_name(handle.job_id, handle.attempt)
        try:
            group = get_placement_group(name)
        except Exception:
            group = None
        launchers = [_actor(launcher_name(handle.job_id, handle.attempt, r.rank)) for r in handle.replicas]
        node_ids = tuple(handle.external[1:]) or tuple("" for _ in handle.replicas)
        with self._lock:
            names = {n.node_id: n.node.name for n in self._nodes}
            tracked = self._tracked.get(key)
            if tracked is None:
                tracked = _Tracked(
                    handle,
                    node_ids,
                    tuple(names.get(i, "") for i in node_ids),
                    group,
                    launchers,
                    submitted_mono=time.monotonic(),
                    signalled_at=control.get("signalled_at"),
                    kill_at=control.get("kill_at"),
                    killed_at=control.get("killed_at"),
                    started=True,  # the server recovered its state itself
                )
                for i, replica in enumerate(handle.replicas):
                    if replica.rank in revoked:
                        tracked.failed[replica.rank] = f"its launch was revoked ({why})"
                    elif launchers[i] is None and not replica.exit_path.exists():
                        tracked.failed[replica.rank] = "its launcher is gone"
                if revoked:
                    tracked.revoked = (
                        f"the launch of rank {revoked[0]} was revoked at adoption: the server that launched it "
                        "stopped before it started"
                    )
                self._tracked[key] = tracked
            self._rearm(key, tracked, kill_at)
        if 0 < len(revoked) < len(handle.replicas):
            self._kill(tracked, drop_launchers=True)  # the ranks that started: the gang never runs whole

    def recover(self, job_id: str, attempt: int, log_dir: Path, replicas: int) -> Handle | None:
        """The handle of an attempt whose start the server may not have seen return: its
        placement group, found by name. Every replica whose shim has not claimed its launch is
        revoked first (`revoke_unstarted`): a `start` still on its way then starts nothing. None
        when Ray has no group or no replica was claimed, and then none ever runs (a group and
        launchers it left are no attempt's: `cancel_unowned` removes them)."""
        from ray.util.placement_group import get_placement_group, placement_group_table

        name = group_name(job_id, attempt)
        ranks = tuple(ReplicaHandle.in_dir(Path(log_dir), rank) for rank in range(replicas))
        revoke_unstarted([r.status_path for r in ranks], f"attempt {attempt} of job {job_id} was recovered unstarted")
        try:
            table = placement_group_table(get_placement_group(name))
        except Exception:
            table = {"state": "REMOVED"}
        if table.get("state") == "REMOVED" or not any(launched(read_job_json(r.status_path)) for r in ranks):
            return None
        by_bundle = table.get("bundles_to_node_id") or {}
        return Handle(
            job_id,
            attempt,
            ranks,
            control_path=Path(log_dir) / CONTROL_FILE,
            external=(name, *(str(by_bundle.get(rank, "")) for rank in range(replicas))),
        )

    def cancel_unowned(self, owned: Iterable[tuple[str, int]]) -> list[str]:
        """Remove the placement groups and launchers named as warden's whose attempt is not in
        `owned` (their jobs die with their launchers). Returns their names."""
        import ray
        from ray.util.placement_group import placement_group_table

        self._acting("remove placement groups no attempt owns")
        keep = {group_name(j, a) for j, a in owned}
        with self._lock:
            keep |= {group_name(j, a) for j, a in self._tracked}
        strays: dict[str, int] = {}
        for entry in placement_group_table().values():
            name = str(entry.get("name") or "")
            match = NAME_RE.fullmatch(name)
            if match and match[3] is None and entry.get("state") != "REMOVED" and name not in keep:
                strays[name] = max(strays.get(name, 0), len(entry.get("bundles") or {}))
        for actor in ray.util.list_named_actors():
            match = NAME_RE.fullmatch(actor)
            if match and match[3] is not None:
                group = group_name(match[1], int(match[2]))
                if group not in keep:
                    strays[group] = max(strays.get(group, 0), int(match[3]) + 1)
        if strays:
            log.warning("removing Ray placement groups and launchers no attempt owns: %s", ", ".join(sorted(strays)))
        for name, ranks in strays.items():
            self._remove(name, ranks)
        return sorted(strays)

    def close(self) -> None:
        """Stop the poller and the timer, and leave the cluster. Jobs keep running (their
        groups and launchers are detached; an adopter re-arms SIGKILL)."""
        with self._lock:
            self._closed = True
            self._polled.notify_all()
        self._timer.close()
        self._poller.join(timeout=self._poll_s + CALL_TIMEOUT_S)


def _foreign_gpus(nodes: Sequence[RayNode]) -> dict[str, int]:
    """GPUs per live node held by work that is not warden's (a detached actor, a placement
    group warden did not make): the node's GPUs, less those Ray has free, less those of
    warden's placement groups placed there. warden's groups are read before and after the
    free GPUs, and a group in either read counts as warden's, so that a group of warden's
    created or removed meanwhile is never taken for foreign work (the count errs low, for one
    poll). A fraction of a GPU held counts as the whole GPU."""
    import ray._private.state
    from ray.util.placement_group import placement_group_table

    before = _warden_gpus(placement_group_table())
    free = ray._private.state.available_resources_per_node()
    after = _warden_gpus(placement_group_table())
    out: dict[str, int] = {}
    for n in nodes:
        if not n.alive or n.node.gpus <= 0:
            continue
        ours = max(before.get(n.node_id, 0.0), after.get(n.node_id, 0.0))
        held = n.node.gpus - float((free.get(n.node_id) or {}).get("GPU", 0.0)) - ours
        count = min(n.node.gpus, math.ceil(held - 1e-6))
        if count > 0:
            out[n.node.name] = count
    return out


def _warden_gpus(table: Mapping[str, Any]) -> dict[str, float]:
    """GPUs per Ray node id reserved by warden's placement groups (`warden.<job>.<attempt>`)."""
    out: dict[str, float] = {}
    for entry in table.values():
        match = NAME_RE.fullmatch(str(entry.get("name") or ""))
        if match is None or match[3] is not None or entry.get("state") != "CREATED":
            continue
        where = entry.get("bundles_to_node_id") or {}
        for index, bundle in (entry.get("bundles") or {}).items():
            node_id = where.get(index)
            if node_id:
                out[str(node_id)] = out.get(str(node_id), 0.0) + float(bundle.get("GPU", 0.0))
    return out


def _bundle(spec: LaunchSpec, gpus: int) -> dict[str, float]:
    bundle: dict[str, float] = {}
    if gpus:
        bundle["GPU"] = float(gpus)
    if spec.cpu:
        bundle["CPU"] = spec.cpu / 1000
    if spec.memory:
        bundle["memory"] = float(spec.memory << 20)
    if not bundle:
        bundle["CPU"] = CPU_FLOOR
    return bundle


def _send(launchers: Sequence[Any], signum: int, awaited: Iterable[int] | None = None) -> None:
    """Ask every launcher to signal its replica: the calls leave together. The answers of
    those in `awaited` (default: all), the launchers of running replicas, are waited for
    (briefly), so that the signal has arrived when this returns; one still being created
    answers only once it exists, and signals its replica the moment it starts it."""
    import ray

    refs = {i: launcher.signal.remote(int(signum)) for i, launcher in enumerate(launchers) if launcher is not None}
    chosen = None if awaited is None else set(awaited)
    wanted = [ref for i, ref in refs.items() if chosen is None or i in chosen]
    if not wanted:
        return
    ready, _ = ray.wait(wanted, num_returns=len(wanted), timeout=2.0)
    for ref in ready:
        try:
            ray.get(ref, timeout=0)
        except Exception as err:  # a launcher on a dead node: its replica is gone with it
            log.info("signal %d not delivered: %s", signum, type(err).__name__)


def _actor(name: str) -> Any:
    import ray

    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return None


def _raylet_answers(node: RayNode | None, timeout_s: float = 1.0) -> bool:
    """Whether the node's raylet takes a connection: a raylet that died refuses it at once,
    long before Ray declares its node dead."""
    if node is None or not node.alive or not node.addr or not node.port:
        return False
    try:
        socket.create_connection((node.addr, node.port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def _kill_actor(actor: Any) -> None:
    import ray

    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # already dead
        pass


def _end_bounds(tracked: _Tracked, rank: int, now: float) -> tuple[float, float]:
    """Between which times a replica ended, as warden saw it: not before the latest look that
    found no exit record (nor the attempt's start), not after the first look that found one,
    nor now. Ray keeps no end time of a replica's processes: its record, which the job's
    account can write, is believed only inside these bounds."""
    latest = min(tracked.gone_at.get(rank, now), now)
    return min(max(tracked.floor, tracked.running_at.get(rank, 0.0)), latest), latest


class _RankEnd(NamedTuple):
    """How one replica ended: its exit code, when, an error, and when its shim sent SIGKILL
    at the deadline itself (None: it did not, or a server did first)."""

    code: int | None
    at: float
    error: str | None
    killed_at: float | None = None


def _exit(
    tracked: _Tracked,
    ranks: Sequence[_RankEnd],
    ended_by: str | None,
    timed_out_at: float | None = None,
    limit_kills: Sequence[float | None] = (),
) -> Exit:
    """The attempt's exit; its kill the earliest SIGKILL at the deadline, the server's or one
    the shims sent while no server could (a takeover's adopter sends its own later), or at
    the time limit they kept (`timed_out_at`, `limit_kills`)."""
    now = time.time()
    errors = [f"rank {i}: {r.error}" for i, r in enumerate(ranks) if r.error]
    kills = [k for k in (tracked.killed_at, *(r.killed_at for r in ranks), *limit_kills) if k is not None]
    return Exit(
        job_id=tracked.handle.job_id,
        attempt=tracked.handle.attempt,
        exit_codes=tuple(r.code for r in ranks),
        ended_at=min(now, max(r.at for r in ranks)),
        signalled_at=tracked.signalled_at if timed_out_at is None else timed_out_at,
        killed=bool(kills),
        killed_at=min(kills, default=None),
        error="; ".join(errors) or None,
        ended_by=ended_by,
        timed_out_at=timed_out_at,
    )
