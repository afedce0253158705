"""The executors a server can run, by name: each kind's line of help, the `warden server`
options it owns, the errors the CLI reports in one line, and how the server builds it.

The CLI reads this table to check its options before anything starts, so importing it loads
no executor: each factory imports its executor's module when it is called, and `warden
server --help` never loads Slurm's or Ray's code.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from warden.executors.identity import Identities

if TYPE_CHECKING:
    from warden.engine.model import Node
    from warden.executors.base import Executor, Inventory
    from warden.server.app import Settings

Say = Callable[[str], None]


@dataclass(frozen=True)
class ExecutorOption:
    """A `warden server` option that only one kind of executor reads.

    `required`: the refusal when that kind is chosen without it (None: it may be left out).
    `foreign`: the refusal when another kind is chosen with it, formatted with `executor` (the
    chosen kind) and `value`; None: the other kinds ignore it."""

    flag: str
    field: str  # the `Settings` field it sets, and its name in a config file
    default: object = None  # its value when not given
    required: str | None = None
    foreign: str | None = None


@dataclass(frozen=True)
class Containment:
    """How an executor bounds its jobs, in the one line the server says at start; `unbounded`
    when something is left unbounded (said as a warning)."""

    line: str
    unbounded: bool


@dataclass(frozen=True)
class Built:
    """What the server runs an executor with: the executor of its first term, where the nodes
    come from (`inventory`, followed each pass; None: `nodes` stay as they are), the nodes at
    start, a fresh executor for each later term of leadership, and its containment line (None:
    it says none)."""

    executor: Executor
    inventory: Callable[[], Inventory] | None
    nodes: tuple[Node, ...]
    make_executor: Callable[[], Executor]
    containment: Containment | None


Factory = Callable[["Settings", "Identities", Path, Say], Built]
"""Builds a kind from the server's settings, the job identities it chose, its state directory
and where it says what it does; raises one of the kind's `errors` when it cannot."""


@dataclass(frozen=True)
class ExecutorKind:
    """One kind of executor `--executor` names."""

    name: str
    description: str  # in `--executor`'s help: 'NAME' (DESCRIPTION)
    options: tuple[ExecutorOption, ...]
    errors: Callable[[], tuple[type[Exception], ...]]  # imported when asked: they live in its module
    build: Factory


class UnknownExecutor(ValueError):
    """A name no kind has."""


DEFAULT_FAKE_GPUS = 4


def local_node(fake_gpus: int | None, say: Say = print) -> tuple[Node, ...]:
    """This machine as one node: its GPUs (or `fake_gpus` fake ones; 4 when it has none and
    nothing was asked), cores and memory."""
    from warden.engine.model import Node
    from warden.executors.gpus import discover_gpus

    gpus = discover_gpus(fake_gpus)
    if not gpus and fake_gpus is None:
        gpus = discover_gpus(DEFAULT_FAKE_GPUS)
        say(f"no GPU found (nvidia-smi): pretending to have {DEFAULT_FAKE_GPUS} (--fake-gpus N to choose)")
    memory_mib = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    memory_mib = int(line.split()[1]) // 1024
    except OSError:
        pass
    return (Node(socket.gethostname() or "localhost", len(gpus), (os.cpu_count() or 1) * 1000, memory_mib),)


def cgroup_parent(state: Path) -> str:
    """Where the local executor puts its jobs' cgroups, under the server's own: `warden/` and an
    id of the state directory, so that servers of one machine never share one."""
    import hashlib

    return "warden/" + hashlib.sha256(str(Path(state).resolve()).encode()).hexdigest()[:12]


def fresh_identities(identities: Identities) -> Identities:
    """The same choice of job identities, with no uid held yet: each term's executor keeps
    its own (an adopted attempt claims its uid again)."""
    return Identities(identities.mode, identities.pool.uids, dict(identities.user_map))


def _build_local(settings: Settings, identities: Identities, state: Path, say: Say) -> Built:
    from warden.executors.local import LocalExecutor

    parent = cgroup_parent(state)
    local = LocalExecutor(identities=identities, cgroup_parent=parent)
    nodes = local_node(settings.fake_gpus, say)

    def make_executor() -> Executor:
        return LocalExecutor(identities=fresh_identities(identities), cgroup_parent=parent)

    return Built(local, None, nodes, make_executor, Containment(local.containment(), local.layout is None))


def _slurm_errors() -> tuple[type[Exception], ...]:
    from warden.executors.slurm import SlurmError

    return (SlurmError,)


def _build_slurm(settings: Settings, identities: Identities, state: Path, say: Say) -> Built:
    from warden.executors.slurm import SlurmExecutor

    slurm = SlurmExecutor(partition=settings.slurm_partition, identities=identities)
    nodes = slurm.inventory().nodes
    say(f"executor slurm: partition {slurm.partition!r}, {len(nodes)} node(s)")

    def make_executor() -> Executor:
        return SlurmExecutor(partition=slurm.partition, identities=fresh_identities(identities))

    containment = Containment(slurm.containment(), bool(slurm.unconstrained))
    return Built(slurm, slurm.inventory, nodes, make_executor, containment)


def _ray_errors() -> tuple[type[Exception], ...]:
    from warden.executors.ray import RayError

    return (RayError,)


def _build_ray(settings: Settings, identities: Identities, state: Path, say: Say) -> Built:
    from warden.executors.ray import RayError, RayExecutor

    if not settings.ray_address:
        raise RayError("no cluster address given (--ray-address)")
    address = settings.ray_address
    trust = settings.ray_trust_unauthenticated
    cluster = RayExecutor(address=address, identities=identities, trust_unauthenticated=trust)
    nodes = cluster.inventory().nodes
    say(f"executor ray: cluster {address}, {len(nodes)} node(s)")

    def make_executor() -> Executor:
        return RayExecutor(address=address, identities=fresh_identities(identities), trust_unauthenticated=trust)

    return Built(cluster, cluster.inventory, nodes, make_executor, None)


KINDS: tuple[ExecutorKind, ...] = (
    ExecutorKind(
        name="local",
        description="this machine",
        options=(
            ExecutorOption(
                "--fake-gpus",
                "fake_gpus",
                foreign="the {executor} executor takes its nodes and GPUs from the cluster",
            ),
        ),
        errors=lambda: (),
        build=_build_local,
    ),
    ExecutorKind(
        name="slurm",
        description="a Slurm cluster; see docs/slurm.md",
        options=(ExecutorOption("--slurm-partition", "slurm_partition"),),
        errors=_slurm_errors,
        build=_build_slurm,
    ),
    ExecutorKind(
        name="ray",
        description="a Ray cluster; see docs/ray.md",
        options=(
            ExecutorOption(
                "--ray-address",
                "ray_address",
                required="the ray executor needs the cluster's address (HOST:PORT, or $WARDEN_RAY_ADDRESS)",
                foreign="given {value!r}, but the executor is {executor!r} (add --executor ray)",
            ),
            ExecutorOption(
                "--ray-trust-unauthenticated",
                "ray_trust_unauthenticated",
                default=False,
                foreign="the executor is {executor!r} (add --executor ray)",
            ),
        ),
        errors=_ray_errors,
        build=_build_ray,
    ),
)
"""Every kind, in the order `--executor`'s help names them; the first is the default."""

DEFAULT = KINDS[0].name


def names() -> tuple[str, ...]:
    return tuple(k.name for k in KINDS)


def _either(words: list[str]) -> str:
    """'a', 'b' or 'c'."""
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def choices() -> str:
    """The names as a refusal lists them: 'local', 'slurm' or 'ray'."""
    return _either([repr(k.name) for k in KINDS])


def described() -> str:
    """The names with what each runs jobs on, for `--executor`'s help."""
    return _either([f"{k.name!r} ({k.description})" for k in KINDS])


def kind(name: str) -> ExecutorKind:
    """The kind `name` names; UnknownExecutor (saying which names there are) for any other."""
    for k in KINDS:
        if k.name == name:
            return k
    raise UnknownExecutor(f"expected {choices()}, got {name!r}")


def option_refusal(name: str, values: Mapping[str, object]) -> str | None:
    """Why `warden server --executor NAME` with these option values (by `Settings` field) is
    refused, as `--OPTION: why`; None when it is not. Options are checked in the table's
    order: the first refusal is the one said."""
    try:
        chosen = kind(name)
    except UnknownExecutor as err:
        return f"--executor: {err}"
    for k in KINDS:
        for option in k.options:
            value = values.get(option.field, option.default)
            if k is chosen and option.required is not None and not value:
                return f"{option.flag}: {option.required}"
            if k is not chosen and option.foreign is not None and value != option.default:
                return f"{option.flag}: " + option.foreign.format(executor=name, value=value)
    return None
