"""What the engine is told: nodes, jobs with their runtime facts, and the usage ledger.

All times are seconds on the caller's clock (wall clock in the server, virtual in the
simulator); the engine never reads a clock of its own. CPU is in millicores, memory in MiB.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

from warden.engine.accounting import wait_time

if TYPE_CHECKING:
    from warden.engine.policy import Policy

PlacementConstraint = Literal["pack", "block", "any"]
DEFAULT_FLAVOR = "default"


class JobState(str, Enum):
    """The lifecycle of DESIGN §5; names are stable and shown to users."""

    AWAITING_APPROVAL = "AWAITING_APPROVAL"
    PENDING = "PENDING"
    ADMITTED = "ADMITTED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    PREEMPTING = "PREEMPTING"
    REQUEUED = "REQUEUED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    """Ran out its time limit: SIGTERM, its grace and SIGKILL ended it, as Slurm's TIMEOUT."""

    @property
    def holds_resources(self) -> bool:
        return self in _HOLDING

    @property
    def waiting(self) -> bool:
        return self in _WAITING

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_HOLDING = frozenset({JobState.ADMITTED, JobState.STARTING, JobState.RUNNING, JobState.PREEMPTING})
_WAITING = frozenset({JobState.AWAITING_APPROVAL, JobState.PENDING, JobState.REQUEUED})
_TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT})


@dataclass(frozen=True, slots=True)
class Node:
    """One machine. `block` labels its topology block (rack, NVLink domain); None: its own.

    `unavailable` are GPU indices of the node that no job may be placed on (held by work that
    is not warden's, failed, drained), sorted, each in range(gpus): the engine places only on
    the others and counts only those as capacity (`usable_gpus`)."""

    name: str
    gpus: int
    cpu: int = 0
    memory: int = 0
    flavor: str = DEFAULT_FLAVOR
    block: str | None = None
    unavailable: tuple[int, ...] = ()

    @property
    def usable_gpus(self) -> int:
        """The GPUs a job may be placed on: all but the unavailable ones."""
        return self.gpus - len(self.unavailable)


@dataclass(frozen=True, slots=True)
class ReplicaPlacement:
    """Where one replica of a gang runs: a node and the GPU indices on it."""

    node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Attempt:
    """Facts about the run a job is in now, as reported by executors and the workload SDK."""

    number: int
    started_at: float
    assignment: tuple[ReplicaPlacement, ...]
    borrowing: bool = False
    startup_s: float | None = None
    """Measured startup time (None: not reported yet; the policy's restart overhead is assumed)."""
    checkpoint_s: float = 0.0
    """Total time this attempt has spent writing checkpoints."""
    last_checkpoint_at: float | None = None
    """End of the newest checkpoint that survives a preemption."""
    sigterm_save_s: float | None = None
    """Measured duration of a save on SIGTERM; None when the job does not checkpoint on SIGTERM."""
    sigterm_at: float | None = None
    """Set once the job was signalled to stop: it is terminating and frees its resources on exit."""
    kill_at: float | None = None
    """SIGKILL deadline of a terminating job: when its resources are certain to be free."""
    lent: bool = False
    """Admitted into capacity reserved for a higher-ranked job, which it would not leave before
    the reservation is due: that job may take it back whatever `scope` says (DESIGN §4.2)."""


@dataclass(frozen=True, slots=True)
class Job:
    """A gang: `replicas` × per-replica resources, admitted and evicted whole."""

    id: str
    queue: str
    tier: int
    submit: float
    state: JobState = JobState.PENDING
    replicas: int = 1
    gpus: int = 1
    cpu: int = 0
    memory: int = 0
    flavor: str | None = None
    placement: PlacementConstraint = "any"
    user: str = ""
    lease: float | None = None
    """Requested minimum runtime in seconds; None takes the tier's."""
    grace: float | None = None
    """Requested grace period in seconds; None takes the tier's."""
    time_limit: float | None = None
    """Seconds the current attempt may run from its start; None: no limit. The server stops an
    attempt that reaches it (TIMEOUT); the simulator gives each attempt its exact remaining
    runtime as its limit. Reservations, backfill and forecasts take the attempt's start plus
    its limit as when its capacity frees, the only end the engine can count on."""
    waited: float = 0.0
    """Seconds spent pending in earlier attempts (aging carries over a requeue)."""
    pending_since: float | None = None
    """When the job last entered PENDING; None means its submit time."""
    not_before: float | None = None
    """Requeue back-off: the job may not be admitted before this time."""
    preempted_at: tuple[float, ...] = ()
    """When each earlier preemption of this job began (the thrash guard's budget)."""
    claim: bool = False
    """A waiting job whose preemptions are freeing capacity for it (`Plan.claims` of the last
    pass): a pass considers such a job before every other waiting job, so what its victims
    free goes to it and to no other job. Set by the shell from the previous plan."""
    attempt: Attempt | None = None

    @property
    def total_gpus(self) -> int:
        return self.replicas * self.gpus

    def wait_at(self, now: float) -> float:
        """Seconds this job has spent pending in all attempts, up to `now`."""
        return wait_time(self.waited, self.pending_since, self.submit, now, self.state.waiting)


@dataclass(frozen=True, slots=True)
class UsageLedger:
    """Decayed usage per leaf queue: ∫ dominant-resource share dt, halved every half-life.

    `usage` holds the values as of `at`; `warden.engine.fairshare.accrue` advances it.
    """

    at: float = 0.0
    usage: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one scheduling pass needs. Jobs in terminal states are ignored."""

    nodes: tuple[Node, ...]
    jobs: tuple[Job, ...]
    policy: Policy
    ledger: UsageLedger = UsageLedger()
